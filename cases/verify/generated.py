"""Generated cases for verify: hypothesis draws cases within everything the kernel declares (dtypes, head
dims, lengths, causal mode, strides), the first ones representative (B != H, D = 64 or the nearest declared,
a few hundred keys), and keeps going past a failure: each distinct kind of failure (mismatch, NaN,
exception, ...) is shrunk to its own minimal Case(...), up to MAX_KINDS of them, within the budget of
`examples` distinct cases judged. A case drawn twice is judged once.
"""
import random

from flashcheck.cases.case import Case

MAX_KINDS = 5
REPRESENTATIVE_DIMS = (64, 128, 32, 96, 16, 256)


class _Falsified(Exception):
    """Raised inside the hypothesis test: this example failed with a kind not reported yet."""


def _representative(decl, dtypes, backend, caps):
    """A few cases a kernel of these declarations surely supports, judged first: the common shapes, where a
    wrong answer is most telling."""
    from flashcheck.cases.generate.strategies import _fit, limits

    lim = limits(backend)
    D = next((d for d in REPRESENTATIVE_DIMS if decl.head_dim_ok(d)), None)
    if D is None:
        D = next(d for lo, hi in decl.head_dims for d in (lo, hi) if decl.head_dim_ok(d))
    n = _fit(decl, min(lim.max_len, 128 if backend == "gpu" else 48), 1)
    m = _fit(decl, max(1, n - 17), 1) if not decl.same_length else n
    shapes = [dict(B=2, H=3, Nq=n, Nk=n), dict(B=1, H=2, Nq=m, Nk=n)]
    out = []
    rng = random.Random(0)
    for dtype in dtypes:
        for i, shape in enumerate(shapes):
            causal = bool(decl.causal and caps.causal and i == 1 and not (decl.causal_same_length and m != n))
            layout = "bthd" if i == 1 and "bthd" in decl.layouts() else "contiguous"
            out.append(Case("hypothesis_example", D=D, dtype=dtype, causal=causal, layout=layout,
                            seed=rng.randrange(1 << 16), **shape))
    return out[:4]


def strategy(decl, dtypes, backend, caps):
    from flashcheck.cases.generate import strategies

    return strategies.cases(
        causal=None if (decl.causal and caps.causal) else False, dtypes=dtypes, layouts=decl.layouts(),
        max_len=decl.max_seq, head_dim_ok=decl.head_dim_ok if decl.head_dims else None, backend=backend,
        pin_blocks=caps.blocks, decl=decl, scale=caps.scale)


def run(examples, seed, decl, info, backend, judge, the_run, record, progress, start):
    """Judge up to `examples` generated cases (judge(case) -> Verdict), recording each distinct case's result
    with record(Result) and a summary in the_run.notes."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as seeded
    from hypothesis.errors import Flaky

    from flashcheck.cases import report
    from flashcheck.cases.generate.strategies import limits

    caps = info["caps"]
    dtypes = tuple(d for d in limits(backend).dtypes if decl.dtypes is None or d in decl.dtypes)
    if backend != "gpu" and not info.get("triton") and "bf16" in (decl.dtypes or ("bf16",)) and "bf16" not in dtypes:
        dtypes += ("bf16",)      # bf16 on the CPU is only wrong through Triton's interpreter
    if not dtypes:
        the_run.notes.append(f"hypothesis: no examples: the declared dtypes ({', '.join(decl.dtypes)}) cannot be "
                             f"judged on this backend ({backend}) for this kernel")
        return
    seen = {}            # case source (without its name) -> Verdict: a case drawn twice is judged once
    judged = []          # distinct cases judged outside shrinking, in order
    kinds = {}           # failure kind -> the minimal failing verdict
    state = {"hunting": None}   # the new kind the current search shrinks, once one is found

    def verdict_of(case):
        key = case.source(why=False).split(",", 1)[-1]
        if key not in seen:
            if state["hunting"] is None:
                progress.start(start + len(judged) + 1, f"generated example {len(judged) + 1}")
            seen[key] = judge(case)
            if state["hunting"] is None:
                judged.append(seen[key])
        return seen[key]

    def prop(case):
        if state["hunting"] is None and len(judged) >= examples and case.source(why=False).split(",", 1)[-1] \
                not in seen:
            return                      # the budget is spent: the rest of this search is a formality
        verdict = verdict_of(case)
        kind = str(verdict.kind) if verdict.failed else None
        if kind is None or kind in kinds:
            return
        if state["hunting"] in (None, kind):
            state["hunting"] = kind
            state["last"] = verdict     # hypothesis replays the minimal failing example last
            raise _Falsified()

    # the representative cases first, judged as they are (hypothesis does not shrink explicit examples; a
    # bug they show is also what the search below finds and shrinks)
    for case in _representative(decl, dtypes, backend, caps)[:max(1, examples // 4)]:
        verdict_of(case)
    test = prop
    while len(judged) < examples and len(kinds) < MAX_KINDS:
        before = len(judged)
        state["hunting"] = None
        # cases judged before come back first (derandomized: the same sequence), from the cache
        run_test = settings(max_examples=examples + len(seen), deadline=None, database=None, derandomize=seed is None,
                            suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False,
                            phases=(Phase.generate, Phase.shrink),
                            verbosity=Verbosity.quiet)(given(strategy(decl, dtypes, backend, caps))(test))
        if seed is not None:
            run_test = seeded(seed + len(kinds))(run_test)
        try:
            run_test()
        except (_Falsified, Flaky):
            pass
        if state["hunting"] is None:
            break                        # a whole search found nothing new
        kinds[state["hunting"]] = state["last"]
        if len(judged) == before:
            break
    for i, verdict in enumerate(judged, 1):
        if not verdict.failed or str(verdict.kind) not in kinds:   # failures: their kind's minimal case below
            verdict.case = verdict.case.replace(name=_example_name(f"hypothesis_{i}", verdict.case))
            record(report.Result.of(verdict.case, verdict, "hypothesis"))
    for kind, verdict in kinds.items():
        verdict.case = verdict.case.replace(name=_example_name("hypothesis_minimal", verdict.case))
        record(report.Result.of(verdict.case, verdict, "hypothesis"))
    failed = sum(v.failed for v in judged)
    line = f"hypothesis: {len(judged)} distinct example(s) judged, {len(judged) - failed} without a failure"
    if kinds:
        line += (f"; {len(kinds)} distinct failure kind(s), each shrunk to a minimal case: "
                 + ", ".join(f"{k} ({v.case.name})" for k, v in kinds.items()))
        if len(kinds) >= MAX_KINDS:
            line += f" (stopped at {MAX_KINDS} kinds)"
    the_run.notes.append(line + ("" if seed is None else f" (--seed {seed})"))


def _example_name(prefix, case):
    """A generated case's name that says its shape, so that the table reads without the JSON."""
    return (f"{prefix}_{case.B}x{case.H}x{case.Nq}x{case.Nk}x{case.D}_{case.dtype}"
            + ("_causal" if case.causal else "") + ("" if case.layout == "contiguous" else f"_{case.layout}"))
