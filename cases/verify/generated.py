"""Generated cases for verify: hypothesis draws cases within everything the kernel declares (dtypes, head
dims, lengths, causal mode, strides), after a few representative ones (strategies.representative: common shapes,
then a causal decode, many key blocks in half precision, the largest scores the dtype holds under a negative
scale), and judges `examples` distinct cases, whatever fails among them. Then each distinct kind of failure
(mismatch, NaN, exception, ...) is shrunk on its own to a minimal Case(...) (MAX_KINDS of them at most): field
by field towards the simplest case that still fails with that kind (B = H = 1, fp32, contiguous, no causal,
default scale, fewer keys, queries and head dims), always within the declarations. A case drawn twice is
judged once.
"""
import time
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, Verbosity, given, settings

from flashcheck.cases import protocols, report
from flashcheck.cases.verify import shard
from flashcheck.cases.generate import strategies
from flashcheck.cases.generate.strategies import _fit, limits, representative, reseeded

MAX_KINDS = 5
SHRINK_STEPS = 80          # judged cases a shrink may spend at most
SHRINK_SECONDS = 90.0      # and seconds: past them a shrink keeps the simplest failing case it has (each candidate
                           # of a slow kernel may take many seconds; a flaky failure makes most of them pass)


def strategy(decl, dtypes, backend, caps):
    return strategies.cases(
        causal=True if decl.causal_only else None if (decl.causal and caps.causal) else False, dtypes=dtypes, layouts=decl.layouts(),
        max_len=decl.max_seq, head_dim_ok=decl.head_dim_ok if decl.head_dims else None, backend=backend,
        pin_blocks=caps.blocks, decl=decl, scale=caps.scale, features=caps.features, any_dtype=True)


def _simpler(case, decl, dtypes):
    """Candidates one step simpler than `case`, simplest first, each within the declarations."""
    def lengths(n, lo):
        return [x for x in dict.fromkeys(_fit(decl, m, lo) for m in (lo, 1, 2, n // 2, n - 1)) if x < n]

    steps = [dict(seqlens=None, page_size=None), dict(B=1), dict(H=1, Hkv=None), dict(Hkv=None), dict(Dv=None), dict(window=None), dict(softcap=None),
             dict(alibi=None), dict(magnitude=None), dict(data="randn", magnitude=None),
             dict(layout="contiguous"), dict(causal=False),
             dict(scale=None), dict(block_m=None, block_n=None), dict(dtype=dtypes[0]), dict(seed=0)]
    if decl.same_length:
        steps += [dict(Nq=n, Nk=n) for n in lengths(case.Nk, 1)]
    else:
        steps += [dict(Nk=n) for n in lengths(case.Nk, 1)] + [dict(Nq=n) for n in lengths(case.Nq, 0)]
    steps += [dict(D=d) for d in dict.fromkeys((1, 2, 16, case.D // 2, case.D - 1)) if 0 < d < case.D]
    for change in steps:
        if all(getattr(case, k) == v for k, v in change.items()):
            continue
        cand = case.replace(**change)
        if cand.data == "nan_input" and cand.Nq == 0:
            continue
        if decl.causal_same_length and cand.causal and cand.Nq != cand.Nk:
            continue
        if not decl.reasons(cand):
            yield cand


def shrink(case, kind, verdict_of, decl, dtypes, steps=SHRINK_STEPS, seconds=SHRINK_SECONDS, clock=time.monotonic):
    """The simplest case reached from `case` that still fails with `kind`, greedily, one field at a time, within
    `steps` judged candidates and `seconds`. Returns (case, whether the time ran out before no step was simpler)."""
    best, deadline = case, clock() + seconds
    improved = True
    while improved:
        improved = False
        for cand in _simpler(best, decl, dtypes):
            if steps <= 0:
                return best, False      # the step budget: a shrink's usual end on a kernel of fast calls, not said
            if clock() > deadline:
                return best, True
            steps -= 1
            verdict = verdict_of(cand)
            if verdict.failed and str(verdict.kind) == kind:
                best, improved = cand, True
                break
    return best, False


@dataclass
class Drawn:
    """The generated cases of a run, drawn before any is judged: `cases` this shard owns, in drawn order, each
    case's place among every shard's (`place`, by case key), how many there are in all, the dtypes drawn from."""
    cases: list
    place: dict
    n_all: int
    dtypes: tuple


def draw(examples, seed, decl, info, backend, the_run, the_shard=None):
    """Draw up to `examples` distinct cases within the declarations (representative ones first); None, with a
    note in the_run, when no dtype can be judged. Drawing never depends on a verdict: the same cases every run,
    and in every shard."""
    caps = info["caps"]
    dtypes = tuple(d for d in limits(backend).dtypes if decl.dtypes is None or d in decl.dtypes)
    if backend != "gpu" and not info.get("triton") and "bf16" in (decl.dtypes or ("bf16",)) and "bf16" not in dtypes:
        dtypes += ("bf16",)      # bf16 on the CPU is only wrong through Triton's interpreter
    if not dtypes:
        the_run.notes.append(f"hypothesis: no examples: the declared dtypes ({', '.join(decl.dtypes)}) cannot be "
                             f"judged on this backend ({backend}) for this kernel")
        return None
    drawn = {}           # case source (without its name) -> case: a case drawn twice is judged once
    for case in representative(decl, dtypes, backend, caps)[:max(1, examples // 4)]:
        drawn.setdefault(case.key(), case)

    def prop(case):      # (its source seeds the derandomized draws: changing it changes every run's cases)
        if len(drawn) < examples:
            drawn.setdefault(case.key(), case)

    def make(derandomize):
        return settings(max_examples=examples + len(drawn), deadline=None, database=None, derandomize=derandomize,
                        suppress_health_check=list(HealthCheck), phases=(Phase.generate,),
                        verbosity=Verbosity.quiet)(given(strategy(decl, dtypes, backend, caps))(prop))

    for round_ in reseeded(make, seed):     # another seed when a search repeats itself before the budget is spent
        if len(drawn) >= examples:
            break
        round_()
    # a varlen or paged kernel gets each drawn case as packed sequences of drawn lengths (cases/protocols.py)
    drawn_all = list({c.key(): c for c in (protocols.segmented(c, caps.protocol, decl, _fit)
                                            for c in drawn.values())}.values())
    place = {case.key(): i for i, case in enumerate(drawn_all)}        # 0-based, over every shard's cases
    return Drawn([c for c in drawn_all if shard.owns(the_shard, c.key())], place, len(drawn_all), dtypes)


def run(examples, seed, decl, info, backend, judge, the_run, record, progress, start, judge_many=None, the_shard=None,
        base=0):
    """Judge up to `examples` generated cases (judge(case) -> Verdict), recording each distinct case's result
    with record(Result), then a minimal failing case per kind of failure, and a summary in the_run.notes.

    The cases are drawn first (draw) and judged after: judge_many(cases, start) yields their verdicts in order
    (verify --jobs judges several at once); without it, one after the other with judge. Then finish."""
    drawn = draw(examples, seed, decl, info, backend, the_run, the_shard)
    if drawn is None:
        return

    def one_by_one(cases, first):
        for i, case in enumerate(cases, 1):
            progress.start(first + i, f"generated example {i}")
            yield judge(case)
    finish(drawn, (judge_many or one_by_one)(drawn.cases, start), seed, decl, judge, the_run, record, progress,
           start, base)


def finish(drawn, verdicts, seed, decl, judge, the_run, record, progress, start, base=0):
    """Record the drawn cases' verdicts (an iterable in drawn.cases' order; it may end early, when a run is cut
    short), then shrink each distinct kind of failure (MAX_KINDS at most) to a minimal case with judge, and add
    the summary to the_run.notes. Each result's index is its place in the report of an unsharded run, from base
    on (passes in drawn order, then the failures left unshrunk, then each kind's minimal case after the failure it
    was shrunk from), so that merged shards read as one run."""
    cases, place, n_all = drawn.cases, drawn.place, drawn.n_all
    seen = {}            # case key -> Verdict
    judged = []          # distinct generated cases, in order

    def _record(verdict, prefix, index):
        verdict.case = verdict.case.replace(name=_example_name(prefix, verdict.case))
        record(report.Result.of(verdict.case, verdict, "hypothesis", index))

    for case, verdict in zip(cases, verdicts):
        seen[case.key()] = verdict
        judged.append(verdict)
        i = place[case.key()]
        if not verdict.failed:      # recorded now: a run cut short still shows how far it got
            _record(verdict, f"hypothesis_{i + 1}", base + i)

    def verdict_of(case):           # the shrinking's judge: a case met before is not judged again
        key = case.key()
        if key not in seen:
            seen[key] = judge(case)
        return seen[key]

    first = {}
    for case, verdict in zip(cases, judged):
        if verdict.failed:
            first.setdefault(str(verdict.kind), (place[case.key()], verdict))
    kinds, cut = {}, []
    for kind, (i, verdict) in list(first.items())[:MAX_KINDS]:
        progress.start(start + len(judged), f"shrinking a {kind} failure")
        small, out_of_budget = shrink(verdict.case, kind, verdict_of, decl, drawn.dtypes)
        kinds[kind] = (i, verdict_of(small))
        if out_of_budget:
            cut.append(kind)
    for case, verdict in zip(cases, judged):
        if verdict.failed and str(verdict.kind) not in kinds:    # failures: their kind's minimal case below
            i = place[case.key()]
            _record(verdict, f"hypothesis_{i + 1}", base + n_all + i)
    for kind, (i, verdict) in kinds.items():
        _record(verdict, "hypothesis_minimal", base + 2 * n_all + i)
    failed = sum(v.failed for v in judged)
    line = f"hypothesis: {len(judged)} distinct example(s) judged, {len(judged) - failed} without a failure"
    stood_for = sum(v.failed and str(v.kind) in kinds for v in judged)
    if stood_for:     # not each a row of the table: its kind's minimal case is
        line += f" (the {stood_for} failing one(s) reported as their kind's minimal case)"
    if kinds:
        line += (f"; {len(kinds)} distinct failure kind(s), each shrunk to a minimal case: "
                 + ", ".join(f"{k} ({v.case.name})" for k, (_, v) in kinds.items()))
        if len(first) > MAX_KINDS:
            line += f" ({len(first) - MAX_KINDS} more kind(s) not shrunk)"
        if cut:
            line += (f" (the shrink of {', '.join(cut)} stopped at its time budget, {SHRINK_SECONDS:g} s: a smaller "
                     "failing case may exist)")
    the_run.notes.append(line + ("" if seed is None else f" (--seed {seed})"))


def _example_name(prefix, case):
    """A generated case's name that says its shape, so that the table reads without the JSON."""
    tags = "".join((f"_gqa{case.Hkv}" if case.Hkv is not None else "", f"_dv{case.Dv}" if case.Dv is not None else "",
                    f"_window{case.window[0]}-{case.window[1]}" if case.window is not None else "",
                    f"_softcap{case.softcap:g}" if case.softcap is not None else "",
                    f"_alibi-{case.alibi}" if case.alibi is not None else "",
                    f"_seqs{len(case.seqlens)}" if case.seqlens is not None else "",
                    f"_page{case.page_size}" if case.page_size is not None else ""))
    return (f"{prefix}_{case.B}x{case.H}x{case.Nq}x{case.Nk}x{case.D}_{case.dtype}"
            + ("_causal" if case.causal else "") + ("" if case.layout == "contiguous" else f"_{case.layout}") + tags)
