"""The engine behind every door to verify: the `flashcheck verify` command, flashcheck.verify() in Python, and
the pytest plugin. It plans the cases (the catalogue expanded into the declared dtypes, each case checked
against the declarations, the signature and the backend), judges each one in the runner's worker
(cases/runner/worker.py; with --jobs N, N cases at once in N workers, results in the plan's order), then the
generated cases (cases/verify/generated.py), and keeps the report's files current as it goes.
"""
import collections
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from flashcheck.cases import catalogue, features, protocols, report
from flashcheck.cases.backend import backend as active_backend
from flashcheck.cases.case import Case, parse_case
from flashcheck.cases.declarations import BY_NAME, DeclarationError, Declarations, ranges_text
from flashcheck.cases.generate.strategies import _fit, _fit_dim
from flashcheck.cases.errors import UsageError
from flashcheck.cases.inputs import footprint
from flashcheck.cases.oracle import Conventions, Failure, Kind, Verdict, classify_escaped
from flashcheck.cases.projection import made_causal, project
from flashcheck.cases.report import html
from flashcheck.cases.report.files import Files
from flashcheck.cases.runner import sanitize, slots
from flashcheck.cases.runner.cache import Cache
from flashcheck.cases.runner.target import split_target
from flashcheck.cases.runner.worker import Died, Hung, InProcess, Raised, Worker
from flashcheck.cases.verify import generated, shard
from flashcheck.cases.verify.defaults import DEFAULT_EXAMPLES, DEFAULT_TARGET, MAX_AUTO_JOBS
from flashcheck.cases.verify.judging import MEMORY_CASE, Settings, judges_backward, memory_case

DEFAULT_TIMEOUT = {"cpu": 120.0, "gpu": 60.0}   # seconds per case; the interpreter is much slower
JUDGE = "flashcheck.cases.verify.judging:judge_case"
TRITON_BF16 = "Triton's interpreter reads bfloat16 wrongly (triton 3.9): bf16 of a Triton kernel needs the GPU"


class NothingToVerify(UsageError):
    """Every selected case is skipped here; .skipped holds (case name, reason) for each."""

    def __init__(self, message, skipped):
        super().__init__(message)
        self.skipped = skipped


@dataclass
class Request:
    """One verify run, as a user asks for it (CLI flags, keyword arguments or plugin options)."""
    target: object = DEFAULT_TARGET          # "MODULE:FUNCTION", "path.py:FUNCTION", or a callable
    declarations: dict = field(default_factory=dict)   # overrides of the kernel's own declarations
    only: tuple = ()                         # catalogue names (entries or instances such as name[fp16])
    keyword: tuple = ()                      # substrings of catalogue names
    exclude: tuple = ()                      # names or substrings to leave out
    cases: tuple = ()                        # Case objects or their source text (--case)
    examples: int = None                     # generated cases; None: DEFAULT_EXAMPLES after the whole catalogue
    seed: int = None
    repeat: int = 1
    sanitize: bool = False
    properties: bool = True
    timeout: float = None                    # seconds: each kernel call whose inputs ran before, and the oracle's work
    compile_timeout: float = None            # seconds: a kernel call with inputs new to its worker (compiling)
    cache: bool = True                       # share compiled kernels across workers and runs (runner/cache.py)
    shard: object = None                     # (I, N) or "I/N": judge only the I-th of N parts (verify/shard.py)
    isolate: bool = True
    jobs: int = None                         # cases judged at once, each in a worker process (--jobs; None: auto)
    max_failures: int = None
    max_memory: int = None                   # bytes of device memory a case may need (--max-memory)
    json: str = None
    junit: str = None
    html: str = None
    progress: bool = True


def _spec(target):
    """The spec a worker can import, for a target given as a string or a callable (None: judge in-process)."""
    if isinstance(target, str):
        return target
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if module and module != "__main__" and "<" not in name:
        return f"{module}:{name}"
    return None


def _name(target):
    if isinstance(target, str):
        return target
    return _spec(target) or getattr(target, "__qualname__", None) or repr(target)


def _check(req, backend):
    if req.examples is not None and req.examples < 0:
        raise UsageError(f"--examples must be >= 0, got {req.examples}")
    if req.repeat < 1:
        raise UsageError(f"--repeat must be >= 1, got {req.repeat}")
    if req.jobs is not None and req.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {req.jobs}")
    if req.jobs is not None and req.jobs > 1 and not req.isolate:
        raise UsageError("--jobs judges cases in several worker processes: not with --no-isolate")
    if req.jobs is not None and req.jobs > 1 and _spec(req.target) is None:
        raise UsageError("jobs > 1 needs a kernel that worker processes can import (MODULE:FUNCTION, a .py path, "
                         "or a function defined at the top level of an importable module), not "
                         f"{_name(req.target)}")
    if req.max_failures is not None and req.max_failures < 1:
        raise UsageError(f"--max-failures must be >= 1, got {req.max_failures}")
    if req.timeout is not None and req.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, got {req.timeout}")
    if req.compile_timeout is not None and req.compile_timeout <= 0:
        raise UsageError(f"--compile-timeout must be > 0, got {req.compile_timeout}")
    if req.max_memory is not None and req.max_memory <= 0:
        raise UsageError(f"--max-memory must be > 0, got {req.max_memory}")
    if req.sanitize and backend != "gpu":
        raise UsageError("--sanitize runs compute-sanitizer memcheck, which needs the GPU backend (this run is on "
                         "the CPU: Triton's interpreter)")
    if req.sanitize and not req.isolate:
        raise UsageError("--sanitize runs the kernel in a worker under compute-sanitizer: not with --no-isolate")
    for flag, path in (("--json", req.json), ("--junit", req.junit), ("--html", req.html)):
        # checked now: a run can take minutes, and its results must not be lost at the end
        if path and path != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"{flag} {path}: its directory does not exist")
    if req.html:

        missing = html.missing()
        if missing:
            raise UsageError(missing)
    if req.html == "-" or req.junit == "-":
        raise UsageError("only --json can go to stdout ('-'); --junit and --html need a file")


def _listed(texts):
    """The names of repeatable, comma-separated options (--only a,b --only c)."""
    return [n.strip() for text in texts for n in str(text).split(",") if n.strip()]


def select(req):
    """[(entry or case, origin)] from only/keyword/exclude/cases (the whole catalogue when none is given)."""
    names, keywords, excluded = _listed(req.only), _listed(req.keyword), _listed(req.exclude)
    bases = {n.partition("[")[0] for n in names}
    unknown = [n for n in names if n.partition("[")[0] not in catalogue.BY_NAME]
    if unknown:
        raise UsageError(f"--only: no catalogue case named {', '.join(unknown)} (see `flashcheck cases`)")
    picked = []
    if names or keywords or not req.cases:
        for c in catalogue.CATALOGUE + catalogue.PACKED:
            if (not names and not keywords) or c.name in bases or any(k in c.name for k in keywords):
                picked.append((c, "catalogue"))
        if not picked:
            raise UsageError(f"-k {','.join(keywords)}: no catalogue case name contains any of it")
    instance_names = {n for n in names if "[" in n}
    for text in req.cases:
        try:
            picked.append((text if isinstance(text, Case) else parse_case(text), "--case"))
        except (ValueError, SyntaxError, TypeError) as exc:
            raise UsageError(f"--case {text!r}: {exc}") from None
    return picked, instance_names, excluded


def _excluded(name, excluded):
    return any(name == x or name.partition("[")[0] == x or (x in name and not x.isidentifier()) for x in excluded)


def skip_reason(case, decl, info, backend, max_memory=None):
    """(reason, group) when this case cannot be judged here, else ("", "")."""
    caps = info["caps"]
    declared = decl.reasons(case)
    if case.causal and not caps.causal:
        declared.append("causal (the signature has no causal=; treated as --no-causal)")
    if case.scale is not None and not caps.scale:
        declared.append("a scale (the signature has no scale=)")
    if declared:
        return "not declared: " + "; ".join(declared), "not declared"
    absent = features.missing(case, caps)
    if absent:
        return "the kernel lacks " + "; ".join(absent), "feature absent"
    other = protocols.skip_reason(case, caps.protocol)
    if other:
        return other, "protocol"
    # a case too slow for Triton's interpreter is judged on the CPU where the kernel is not Triton (a kernel of
    # plain PyTorch runs long_cross_decode's 4099 keys in well under a second there)
    if case.gpu_only and backend != "gpu" and not (case.gpu_only_interpreted and not info.get("triton")):
        return f"GPU only: {case.gpu_only}", "GPU only"
    if case.dtype == "bf16" and backend != "gpu" and info.get("triton"):
        return f"GPU only: {TRITON_BF16}", "GPU only"
    device_bytes, host_bytes = footprint(case)
    limit = max_memory or info.get("device_free")
    if limit and device_bytes > limit:
        source = "--max-memory" if max_memory else "free device memory"
        return (f"too large: needs about {device_bytes / 2 ** 30:.1f} GiB of device memory, {source} is "
                f"{limit / 2 ** 30:.1f} GiB"), "too large"
    host = info.get("host_free")
    if host and host_bytes > host:
        return (f"too large: the float64 reference needs about {host_bytes / 2 ** 30:.1f} GiB of host memory, "
                f"{host / 2 ** 30:.1f} GiB are free"), "too large"
    return "", ""


def plan(selected, instance_names, excluded, decl, info, backend, max_memory=None):
    """The catalogue entries expanded into the dtypes they are about that the kernel declares: a list of
    (case, origin, skip reason, skip group), in catalogue order."""
    out = []
    for entry, origin in selected:
        if origin == "catalogue":
            instances = entry.instances(decl.dtypes)
            if not instances:   # every dtype it is about is undeclared: listed once, as skipped
                instances = entry.instances()[:1]
            if instance_names and entry.name not in instance_names:
                chosen = [i for i in instances if i.name in instance_names]
                instances = chosen or instances
        else:
            instances = [entry if entry.dtype in ("fp32", "fp16", "bf16") else entry.replace(dtype="fp32")]
        for case in instances:
            if _excluded(case.name, excluded):
                continue
            reason, group = skip_reason(case, decl, info, backend, max_memory)
            if group == "feature absent" and origin == "catalogue":
                case, reason, group = _without_absent(case, reason, decl, info, backend, max_memory)
            if group == "not declared" and origin == "catalogue" and case.dtype in (decl.dtypes or (case.dtype,)):
                case, reason, group = _projected(case, reason, decl, info, backend, max_memory)
            out.append((case, origin, reason, group))
    return out


def _without_absent(case, reason, decl, info, backend, max_memory):
    """(case, reason, group): a catalogue instance whose point is its features together (point features_together),
    judged without the features the kernel lacks while two or more remain (its name says which it left out); any
    other, skipped as before."""
    if "features_together" not in case.point:
        return case, reason, "feature absent"
    reduced = features.composed_without(case, [f.name for f in features.used(case)
                                               if f.name not in info["caps"].features])
    if reduced is None:
        return case, f"{reason}; fewer than two of its features would remain", "feature absent"
    why, group = skip_reason(reduced, decl, info, backend, max_memory)
    return reduced, why, group


def _projected(case, reason, decl, info, backend, max_memory):
    """(case, reason, group): a catalogue instance the declarations exclude, projected onto them where its point
    survives (cases/projection.py; its name then says what changed), else skipped as before with why not."""
    def admissible(candidate):
        why, group = skip_reason(candidate, decl, info, backend, max_memory)
        return [why] if group == "not declared" else []

    if decl.causal_only and not case.causal:
        # every mask rule holds under the causal one too, and the reference applies it: the case is judged causal
        case = made_causal(case)
        reason, group = skip_reason(case, decl, info, backend, max_memory)
        if group != "not declared":
            return case, reason, group
    if case.seqlens is not None:
        return case, f"{reason}; a packed case is not projected (its sequences' lengths are its point)", "not declared"
    if "features_together" in case.point:
        # the features the declarations refuse (--dv no, --gqa no) go, as absent ones do, while two remain
        reduced = features.composed_without(case, [f.name for f in features.used(case)
                                                   if getattr(decl, f.name, None) == "no"])
        if reduced is not None:
            case = reduced
            reason, group = skip_reason(case, decl, info, backend, max_memory)
            if group != "not declared":
                return case, reason, group
    projected, why = project(case, decl, admissible)
    fewer = features.composed_without(case, ["dv"]) if projected is None and "features_together" in case.point \
        else None
    if fewer is not None:
        # declared head dims that leave no value head dim of its own (--head-dims 64) refuse Dv != D too
        projected, _ = project(fewer, decl, admissible)
    if projected is None:
        return case, f"{reason}; {why}", "not declared"
    reason, group = skip_reason(projected, decl, info, backend, max_memory)
    return projected, reason, group


def _declarations(info, overrides):
    try:
        own = info.get("declarations") or {}
        return Declarations.make(**{**own, **{k: v for k, v in overrides.items() if v is not None}})
    except DeclarationError as exc:
        raise UsageError(str(exc)) from None


def _check_head_dims(decl):
    if decl.head_dims and not any(decl.head_dim_ok(d) for d in range(1, 257)):
        raise UsageError(f"--head-dims {ranges_text(decl.head_dims)}: the head dims {ranges_text(decl.head_dims)} "
                         "are outside 1..256, the range of flashcheck's catalogue and generated cases")


def auto_jobs(req, most):
    """How many cases to judge at once when --jobs is not given: one per core this process may use (at most
    MAX_AUTO_JOBS, shared out among pytest-xdist's workers when verify runs under them; $FLASHCHECK_JOBS overrides),
    never more than `most` (the cases there can be), and 1 for what cannot run in several workers (a kernel no
    worker can import, --no-isolate, --sanitize). run() then keeps to the cores other flashcheck runs leave free
    (cases/runner/slots.py)."""
    if not req.isolate or req.sanitize or _spec(req.target) is None:
        return 1
    forced = os.environ.get("FLASHCHECK_JOBS")
    if forced:
        try:
            return max(1, int(forced))
        except ValueError:
            raise UsageError(f"FLASHCHECK_JOBS must be a whole number, got {forced!r}") from None
    sharing = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return max(1, min(_cores() // max(sharing, 1), MAX_AUTO_JOBS, most))


def take_slots(req, jobs):
    """(jobs, the slots.Slots this run holds, or None): the default (no --jobs, no $FLASHCHECK_JOBS) keeps to the
    cores other flashcheck runs on this machine leave free, never fewer than one worker (cases/runner/slots.py);
    an explicit count stands, and takes what is free so that later runs count it."""
    held = slots.claim(jobs, _cores()) if jobs > 1 else None
    if held is not None and not req.jobs and not os.environ.get("FLASHCHECK_JOBS") and len(held) < jobs:
        if req.progress:
            print(f"flashcheck: {max(1, len(held))} worker(s), not {jobs}: other flashcheck runs hold the other "
                  "cores' slots", file=sys.stderr, flush=True)
        jobs = max(1, len(held))
    return jobs, held


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


PROBE = "flashcheck.cases.verify.judging:probe_feature"


def _needs(selected, examples):
    """The shape-carried features (cases/features.py PROBED) a run may meet: those its selected cases use, and
    every one when generated cases are drawn (they draw what the kernel has)."""
    if examples:
        return set(features.PROBED)
    return {f.name for entry, _ in selected for case in entry.instances() for f in features.used(case)
            if f.name in features.PROBED}


def support(runner, info, decl, backend, needed):
    """The kernel's Capabilities with the shape-carried features it has: declared (--gqa yes|no, --dv yes|no) or,
    where it says nothing and the run may meet them, probed with one small case each in the runner (a kernel that
    raises, declines, returns the wrong shape or reads outside k and v has not got it); and whether it has a
    backward (--backward yes|no, or probed). runner may be a list: the probes then run at once, one per runner (on
    a cold cache each compiles a kernel of its own)."""
    caps = info["caps"]
    if decl.protocol != "auto":
        caps = replace(caps, protocol=decl.protocol)
    if decl.keywords:
        lacking = caps.lacks(decl.keywords)
        if lacking:
            raise UsageError(f"--keywords {','.join(decl.keywords)}: the kernel's signature has no "
                             f"{', '.join(n + '=' for n in lacking)} and no **kwargs to take them")
        caps = caps.with_keywords(decl.keywords)
    conventions = Conventions.of(decl)
    shape = probe_shape(decl)
    runners = runner if isinstance(runner, list) else [runner]
    if caps.protocol == protocols.PAGED and "paged_q" not in decl.given:
        # q's layout first: the feature probes go through the adapter in it
        layout, why = _paged_layout(runners[0], info, decl, backend, conventions, shape)
        caps = replace(caps, paged_q=layout, notes={"paged_q": why})
    else:
        caps = replace(caps, paged_q=decl.paged_q)
    layout = caps.paged_q
    asks = [(name, getattr(decl, name), (PROBE, name, _DTYPE, conventions, caps.protocol, shape, layout))
            for name in features.PROBED if getattr(decl, name) != "auto" or name in needed]
    # the backward (cases/oracle/backward.py): judged when declared, or when one small call's output carries autograd
    asks.append(("backward", decl.backward, (BACKWARD_PROBE, _DTYPE, conventions, caps.protocol, shape, layout)))

    n = min(len(asks), len(runners))

    def serve(r):       # runner r asks probes r, r + n, ... one after the other (a runner serves one call at a time)
        return [_declared_or_probed(*asks[i], runners[r], info, decl, backend) for i in range(r, len(asks), n)]
    if n > 1:
        with ThreadPoolExecutor(n) as pool:
            parts = list(pool.map(serve, range(n)))
    else:
        parts = [serve(0)]
    found = [parts[i % n][i // n] for i in range(len(asks))]
    have, notes = set(caps.features), dict(caps.notes or {})
    for (name, _, _), (has, note) in zip(asks, found):
        if has:
            have.add(name)
        notes[name] = note
    return replace(caps, features=frozenset(have), notes=notes)


def probe_shape(decl):
    """The head dims and length of the probes (features.probe_case, judging.probe_backward), within what the kernel
    declares it takes: D the declared head dim nearest 16, Dv another declared one (twice D when none is), N the
    declared length nearest above 8. A kernel declared for head dims 64 and 128 was probed at D = 16, raised, and
    lost its GQA cases and its backward to "probed: raised"."""
    D = _fit_dim(decl, features.PROBE_SHAPE["D"])
    Dv = next((d for d in (2 * D, D // 2, 32, 64, 128, 16, 256, 96, 80, 8) if d != D and d and decl.head_dim_ok(d)),
              2 * D)
    Nq = _fit(decl, features.PROBE_SHAPE["Nq"], 1, "Nq")     # a decode kernel's queries (--max-seq-q) may be fewer
    same = decl.same_length or decl.causal_only and decl.causal_same_length
    return {"D": D, "Dv": Dv, "N": Nq if same else _fit(decl, features.PROBE_SHAPE["N"], 1), "Nq": Nq,
            "causal": decl.causal_only}


BACKWARD_PROBE = "flashcheck.cases.verify.judging:probe_backward"
_DTYPE = object()       # in a probe's arguments: the dtype it is judged in (features.probe_dtype)


def _paged_layout(runner, info, decl, backend, conventions, shape):
    """(layout, why) of a paged kernel that does not declare --paged-q: judging.probe_paged_layout in the runner;
    the protocol's (B, H, Nq, D) when it cannot tell (no dtype to judge, or the probe hung, died or raised)."""
    answer, why = _probe_answer((PAGED_LAYOUT_PROBE, _DTYPE, conventions, shape), runner, info, decl, backend)
    return ("bhnd", why) if answer is None else tuple(answer)


PAGED_LAYOUT_PROBE = "flashcheck.cases.verify.judging:probe_paged_layout"


def _declared_or_probed(name, said, probe, runner, info, decl, backend):
    """(has it, how that was found out) for one capability the signature cannot show: `said` (--NAME yes|no) or,
    for auto, runner.call(*probe) in a dtype the backend can judge for the kernel (in place of _DTYPE), which answers
    (has it, why)."""
    if said != "auto":
        return said == "yes", f"--{name} {said}"
    answer, why = _probe_answer(probe, runner, info, decl, backend)
    if answer is None:
        return False, why + (f"; declare --{name} yes" if why.startswith("not probed")
                             else f"; --{name} yes judges it anyway")
    ok, why = answer
    return ok, why or "probed"


def _probe_answer(probe, runner, info, decl, backend):
    """(runner.call(*probe)'s answer, "") with a dtype the backend can judge for the kernel in place of _DTYPE; or
    (None, why not): no such dtype ("not probed: ..."), or the probe hung, its worker died, or it raised
    ("probed, ...")."""
    dtype = features.probe_dtype(decl, backend, info.get("triton"))
    if dtype is None:
        return None, "not probed: no dtype this backend can judge for the kernel"
    try:
        return runner.call(*(dtype if x is _DTYPE else x for x in probe)), ""
    except (Hung, Died, Raised) as exc:
        how = {Hung: "hung", Died: "the worker died"}.get(type(exc), "raised")
        return None, f"probed, {how}: {str(exc).splitlines()[0][:200]}"


def with_probed(decl, info):
    """The declarations a paged kernel is judged under: its probed q layout where it declared none (the repro lines
    then carry it as --paged-q)."""
    caps = info["caps"]
    if caps.protocol == protocols.PAGED and caps.paged_q != decl.paged_q:
        return replace(decl, paged_q=caps.paged_q)
    return decl


def declared_flags(decl):
    """decl.flags() less a probed --paged-q (the capabilities line says it was probed; repro lines carry it)."""
    return [f for f in decl.flags() if "paged_q" in decl.given or not f.startswith("--paged-q")]


def prepare(req, runner, info, decl, backend, selected, examples):
    """(info, selected) once the kernel is open: its capabilities with the probed features and its protocol
    (support), the protocol checked against its signature, and for a dense kernel the packed entries left out of
    the selection unless named (--only). verify and the pytest plugin both start so."""
    info = dict(info, caps=support(runner, info, decl, backend, _needs(selected, examples)))
    _check_protocol(info, _name(req.target))
    if info["caps"].protocol == protocols.DENSE:
        named = {n.partition("[")[0] for n in _listed(req.only)}
        kept = [(c, o) for c, o in selected
                if not (o == "catalogue" and c.name in catalogue.PACKED_NAMES and c.name not in named)]
        if selected and not kept:
            raise UsageError(f"nothing to verify: the selected entries ({', '.join(c.name for c, _ in selected)}) "
                             "are packed-sequence cases, and the kernel is dense (its signature has no cu_seqlens_q "
                             "or block_table; --protocol declares one)")
        selected = kept
    return info, selected


def _check_protocol(info, name):
    """A usage error when the kernel's positional arguments cannot be its protocol's (a varlen kernel whose offsets
    have other names, judged as dense, would fail every case on a missing argument)."""
    protocol = info["caps"].protocol
    required, most = info.get("positional") or (None, None)
    n = len(protocols.POSITIONAL[protocol])
    if required is None:
        return
    if required > n or (most is not None and most < n):
        hint = ("; a varlen or paged kernel whose arguments have other names declares --protocol varlen or paged"
                if protocol == protocols.DENSE else "")
        raise UsageError(f"{name} takes {required} positional argument(s) (at most {most}); the {protocol} protocol "
                         f"passes {n}: {protocols.CALL[protocol]}{hint}")


def _runner(req, backend, env=None):
    timeout = req.timeout or DEFAULT_TIMEOUT[backend]
    spec = _spec(req.target)
    if not req.isolate or spec is None:
        return InProcess(), req.target        # it takes a callable as well as a spec
    if req.sanitize:

        return sanitize.worker(timeout, req.compile_timeout, env), spec
    return Worker(timeout, compile_timeout=req.compile_timeout, env=env), spec


def _open(runners, spec):
    """Open every runner on spec (at once: each imports the kernel and, on the GPU, starts its own CUDA
    context); returns the first one's target info. The first error raised is raised."""
    if len(runners) == 1:
        return runners[0].open(spec)
    with ThreadPoolExecutor(len(runners)) as pool:
        infos = list(pool.map(lambda r: r.open(spec), runners))
    return infos[0]


def close_all(runners, kill=False):
    """Close every runner (kill=True: kill those that can be), all at once: each waits for its worker to exit, and
    a worker's exit tears down its CUDA context. One after the other, 16 workers took 11 s of a 28 s verify on an
    H200."""
    ends = [getattr(r, "kill", r.close) if kill and len(runners) > 1 else r.close for r in runners]
    if len(ends) == 1:
        ends[0]()
        return
    with ThreadPoolExecutor(len(ends)) as pool:
        list(pool.map(lambda end: end(), ends))


def in_order(items, runners, work, heavy=lambda item: False, stopped=lambda: False, key=lambda item: None,
             family=lambda item: None):
    """(item, work(runner, item)) for each item, in the items' order, until stopped() says so.

    With one runner, one item after the other. With several (--jobs), up to one item per runner at once, each
    runner serving one item at a time. heavy(item) says how an item shares the machine (a case's memory):
    falsy, with any others; "one", with light items but never beside another "one" item; "alone" (or True), with
    nothing: it waits until the items before it are done and runs by itself. key(item): what a kernel specialises
    on for that item (its shapes, dtype, flags); family(item): what items with different keys may still share (the
    compiled kernels: the same code for other lengths). A runner that becomes free takes, among the next items,
    one whose key it has met (its compile and autotune caches are warm for it), else one of a family it has met
    (its compiles are), else one whose family and key no runner has met (a compile no other runner is doing), else
    the next one. The results' order never changes."""
    if len(runners) == 1:
        for item in items:
            if stopped():
                return
            yield item, work(runners[0], item)
        return
    items = iter(items)
    lookahead = 8 * len(runners)        # how far past the oldest unfinished item a free runner may look
    cond = threading.Condition()
    # [item, key, state, outcome, one, family] not yet yielded, oldest first; state new/run/done, outcome
    # ("ok", value) or ("raised", exception) once done; one: heavy(item) said "one"
    window = collections.deque()
    met = {r: set() for r in runners}   # the keys each runner has judged
    kin = {r: set() for r in runners}   # the families each runner has judged
    closing = [False]

    def pick(runner):
        warm = fresh = first = None
        one_running = any(e[4] and e[2] == "run" for e in window)
        for entry in window:
            if entry[2] != "new" or (entry[4] and one_running):
                continue
            if entry[1] is not None and entry[1] in met[runner]:
                return entry
            if warm is None and entry[5] is not None and entry[5] in kin[runner]:
                warm = entry
            if first is None:
                first = entry
            if fresh is None and not any(entry[1] in keys for keys in met.values()) \
                    and not any(entry[5] in fams for fams in kin.values()):
                fresh = entry
        return warm or fresh or first

    def serve(runner):
        while True:
            with cond:
                entry = None
                while not closing[0] and (entry := pick(runner)) is None:
                    cond.wait()
                if closing[0]:
                    return
                entry[2] = "run"
                if entry[1] is not None:
                    met[runner].add(entry[1])
                if entry[5] is not None:
                    kin[runner].add(entry[5])
            try:
                outcome = ("ok", work(runner, entry[0]))
            except BaseException as exc:     # handed to the caller with its item
                outcome = ("raised", exc)
            with cond:
                entry[2], entry[3] = "done", outcome
                cond.notify_all()

    threads = [threading.Thread(target=serve, args=(r,), daemon=True, name="flashcheck-job") for r in runners]
    for t in threads:
        t.start()
    ended, exhausted, waiting_heavy = False, False, None

    def take(entry):
        kind, value = entry[3]
        if kind == "raised":
            raise value
        return entry[0], value

    try:
        while not stopped():
            with cond:
                # refill the window (a heavy item waits outside it until the window has drained)
                while not exhausted and waiting_heavy is None and len(window) < lookahead:
                    try:
                        item = next(items)
                    except StopIteration:
                        exhausted = True
                        break
                    how = heavy(item)
                    if how and how != "one":
                        waiting_heavy = item
                        break
                    window.append([item, key(item), "new", None, how == "one", family(item)])
                    cond.notify_all()
                if window:
                    while window[0][2] != "done" and not stopped():
                        cond.wait(0.1)
                    if window[0][2] != "done":
                        break
                    entry = window.popleft()
                else:
                    entry = None
            if entry is not None:
                yield take(entry)
                continue
            if waiting_heavy is not None:
                item, waiting_heavy = waiting_heavy, None
                yield item, work(runners[0], item)      # every runner is idle now
                continue
            if exhausted:
                break
        ended = True
    finally:
        # done or stopped: the cases still running finish before the caller closes their runners (their results
        # are dropped); an interrupt, or a caller that drops the generator, does not wait (the caller kills them)
        with cond:
            closing[0] = True
            cond.notify_all()
        if ended:
            for t in threads:
                t.join()


def _divisibility(n):
    """How Triton specialises an integer argument: 1, a multiple of 16, or neither."""
    return 1 if n == 1 else 16 if n % 16 == 0 else 0


def compiled_alike(case):
    """What cases of other shapes may share of a kernel's compiles (in_order's family): dtype, head dims, layout,
    flags, tiles, and the lengths only as Triton specialises them (1, a multiple of 16, neither). A compile takes
    seconds of one core, and a new specialisation met by several runners at once is compiled by each (the compile
    cache is shared only once written): so a free runner first takes the cases of compiles no other runner is
    doing."""
    return (case.dtype, _divisibility(case.Nq), _divisibility(case.Nk), case.D, case.v_dim, case.H != case.kv_heads,
            case.causal, case.layout, case.window is not None, case.softcap is not None, case.alibi is not None,
            case.seqlens is not None, case.page_size, case.block_m, case.block_n, (case.scale or 0) < 0)


def specialisation(case):
    """What a kernel is likely to compile or autotune anew for: what compiles alike (compiled_alike) and the exact
    shapes (a Triton kernel specialises on its constexprs and its integers' divisibility, an autotuner keys on lengths
    and head dims). Cases with one value share a warm worker under --jobs (in_order)."""
    return compiled_alike(case) + (case.B, case.H, case.kv_heads, case.Nq, case.Nk, case.window, case.seqlens)


def _heavy(info, jobs):
    """heavy(case) for in_order. A case that needs more than a 2 * jobs-th share of the free device or host memory
    is "one": it runs beside light cases (together they need at most half the free memory) but never beside
    another such case; one that needs more than half the free memory runs "alone" (it gets what a run without
    --jobs would give it). Before, every heavy case ran alone, and the others waited: 10 s of a 90 s cold verify
    on an H200."""
    device, host = info.get("device_free"), info.get("host_free")

    def heavy(case):         # asked by in_order only when it has several runners
        need_device, need_host = footprint(case)

        def past(share):
            return bool((device and need_device * share > device) or (host and need_host * share > host))
        return "alone" if past(2) else "one" if past(2 * jobs) else None
    return heavy


def judge(runner, case, settings, fn=JUDGE):
    """The Verdict of fn(kernel, case, settings) through the runner (by default: judge the case); a hang or a
    death is a failure of that case."""
    t0 = time.perf_counter()
    try:
        # the float64 reference of a long case takes seconds on the host: a longer limit for it
        extra = case.B * case.H * case.Nq * case.Nk * case.D // 10 ** 7 if not case.sample_heads else 60
        base = getattr(runner, "timeout", None)      # None in-process: no limit there
        verdict = runner.call(fn, case, settings, timeout=base and base + extra)
    except Hung as exc:
        verdict = Verdict(case, settings.target, [Failure(Kind.TIMEOUT, str(exc))])
    except Died as exc:
        verdict = Verdict(case, settings.target, [Failure(exc.kind, str(exc))])
    except Raised as exc:
        verdict = Verdict(case, settings.target, [Failure(classify_escaped(str(exc)), f"escaped the oracle: {exc}")])
    if hasattr(runner, "memcheck"):
        errors = runner.memcheck()
        if errors and not verdict.failed:
            verdict.fail(Failure(Kind.MEMCHECK, errors))
    t1 = time.perf_counter()
    verdict.seconds = verdict.seconds or t1 - t0
    # the whole judging (oracle and layers), on the run's clock
    verdict.timing = (t0 - getattr(runner, "t0", t0), t1 - t0, getattr(runner, "number", 0))
    return verdict


def _memory(runner, decl, settings, backend):
    """The --fused check (cases/verify/judging.py memory_probe) as a result of its own."""
    case = memory_case(decl)
    if backend != "gpu":
        return report.Result(case, "skip", reason="GPU only: the kernel's own memory is measured with torch.cuda's "
                                                  "allocator statistics", skip_group="GPU only", origin="--fused")
    return report.Result.of(case, judge(runner, case, settings, "flashcheck.cases.verify.judging:memory_probe"),
                            "--fused")


def run(req, on_result=None):
    """Run a verify request; returns the report's Run. Raises UsageError or TargetError (exit status 2)."""
    t0 = time.perf_counter()
    backend = active_backend()
    _check(req, backend)
    # the declarations given here, each parsed before any worker starts (seconds each: a bad value was a usage error
    # only after them); how they combine with the kernel's own is checked once those are known
    try:
        Declarations.parse({k: v for k, v in req.declarations.items() if v is not None})
    except DeclarationError as exc:
        raise UsageError(str(exc)) from None
    if req.declarations.get("head_dims") is not None:
        _check_head_dims(_declarations({}, {"head_dims": req.declarations["head_dims"]}))
    the_shard = shard.parse(req.shard)
    if isinstance(req.target, str):
        split_target(req.target)
    selected, instance_names, excluded = select(req)
    examples = req.examples
    if examples is None:
        examples = 0 if (req.only or req.keyword or req.cases) else DEFAULT_EXAMPLES
    jobs = req.jobs or auto_jobs(req, len(selected) * 3 + examples)
    jobs, held = take_slots(req, jobs)
    cache = Cache.open(req.cache)
    env = dict(cache.env)
    if jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
        # each worker's host threads (torch's float64 reference, a CPU kernel) get their share of the cores: N
        # workers each taking every core ran 5x slower than one (2 cores, SDPA's whole catalogue: 58 s against 8)
        env["OMP_NUM_THREADS"] = str(max(1, _cores() // jobs))
    made = [_runner(req, backend, env) for _ in range(jobs)]
    runners, spec = [r for r, _ in made], made[0][1]
    for i, r in enumerate(runners):
        r.number, r.t0 = i, t0    # a case's timing names its worker and starts from the run's start (the JSON)
    isolated = not isinstance(runners[0], InProcess)   # in this process, the caches are this process's own
    runner = runners[0]
    files = Files(req.json, req.junit, req.html)
    interrupted = None
    try:
        info = _open(runners, spec)
        decl = _declarations(info, req.declarations)
        info, selected = prepare(req, runners, info, decl, backend, selected, examples)
        decl = with_probed(decl, info)
        _check_head_dims(decl)
        name = _name(req.target)
        settings = Settings(target=name, decl=decl, properties=req.properties, repeat=req.repeat,
                            maps=bool(req.html), plain=req.sanitize, backward=judges_backward(info))
        the_run = report.Run(name, info["describe"], info["caps"], declared=declared_flags(decl), shard=the_shard)
        planned = plan(selected, instance_names, excluded, decl, info, backend, req.max_memory)
        every = len(planned)            # the generated cases' places in the plan come after every planned one
        entries_total = {c.name.partition("[")[0] for c, origin, _, _ in planned if origin == "catalogue"}
        planned = [(i, entry) for i, entry in enumerate(planned) if shard.owns(the_shard, entry[0].name)]
        todo = sum(not reason for _, (_, _, reason, _) in planned)
        if not todo and not examples and the_shard is None:
            reasons = "".join(f"\n  {c.name}: {r}" for _, (c, _, r, _) in planned)
            raise NothingToVerify(f"nothing to verify: every selected case is skipped on {backend}:{reasons}",
                                  [(c.name, r) for _, (c, _, r, _) in planned])
        progress = report.Progress(todo + (examples if the_shard is None else -(-examples // the_shard[1])),
                                   enabled=req.progress)
        entries_judged = set()

        def record(result, counted=False):
            the_run.results.append(result)
            if not counted:
                progress.finish(result)
            if result.status not in ("skip",) and result.origin == "catalogue":
                entries_judged.add(result.case.name.partition("[")[0])
            the_run.entries = (len(entries_judged), len(entries_total))
            the_run.seconds = time.perf_counter() - t0
            files.update(the_run)
            if on_result is not None:
                on_result(result)
            if req.max_failures and the_run.count("fail") >= req.max_failures:
                the_run.stopped = f"--max-failures {req.max_failures} reached"
        heavy = _heavy(info, len(runners))
        numbered, n = [], 0           # (the case's number in the progress line, its place in the plan, entry)
        for index, entry in planned:
            n += not entry[2]
            numbered.append((n, index, entry))
        # the generated cases are drawn while the catalogue's first cases run, and judged in the same stream: no
        # worker waits for the catalogue's last (slowest) cases before they start
        drawing = None
        if examples:
            pool = ThreadPoolExecutor(1, thread_name_prefix="flashcheck-draw")
            drawing = pool.submit(generated.draw, examples, req.seed, decl, info, backend, the_run, the_shard)
            pool.shutdown(wait=False)         # the draw still runs; its thread ends with it

        def items():
            for x in numbered:
                yield "catalogue", x, x[2]
            drawn = drawing and drawing.result()
            for i, case in enumerate(drawn.cases if drawn else (), 1):
                yield "generated", (n + i, i), (case, "hypothesis", "", "")

        def work(runner, item):
            what, x, (case, origin, reason, group) = item
            if what == "generated":
                progress.start(x[0], f"generated example {x[1]}")
                return judge(runner, case, settings)
            if reason:
                return report.Result(case, "skip", reason=reason, skip_group=group, origin=origin, index=x[1])
            progress.start(x[0], case.name)
            return report.Result.of(case, judge(runner, case, settings), origin, x[1])

        try:
            verdicts = []             # the generated cases', in drawn order
            for item, value in in_order(items(), runners, work, lambda item: not item[2][2] and heavy(item[2][0]),
                                        lambda: the_run.stopped,
                                        lambda item: None if item[2][2] else specialisation(item[2][0]),
                                        lambda item: None if item[2][2] else compiled_alike(item[2][0])):
                if item[0] == "generated":
                    verdicts.append(value)
                    progress.judged(value.failed)
                else:
                    record(value)
            if decl.fused and not the_run.stopped and shard.owns(the_shard, MEMORY_CASE):
                result = _memory(runner, decl, settings, backend)
                result.index = every
                record(result)
            if drawing and not the_run.stopped and drawing.result():
                generated.finish(drawing.result(), verdicts, req.seed, decl, lambda c: judge(runner, c, settings),
                                 the_run, lambda result: record(result, counted=True), progress, n, every + 1)
        except KeyboardInterrupt:
            the_run.stopped = interrupted = "interrupted"
        progress.close()
    finally:
        # after an interrupt, jobs may still run on the other runners: those are killed, not asked to stop
        close_all(runners, kill=bool(interrupted))
        cache_line = cache.line() if isolated and (backend == "gpu" or cache.kernels()) else ""   # (the interpreter
        cache.close()                                                                            # compiles nothing)
        if held is not None:
            held.release()
    the_run.cache = cache_line
    the_run.seconds = time.perf_counter() - t0
    files.finish(the_run, partial=bool(the_run.stopped == "interrupted"))
    return the_run


def request(target=DEFAULT_TARGET, **options):
    """A Request from keyword arguments: the declarations (cases/declarations.py FIELDS) and the options of
    Request, in any order."""
    decl = {k: options.pop(k) for k in list(options) if k in BY_NAME}
    unknown = [k for k in options if k not in Request.__dataclass_fields__]
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; declarations: {', '.join(BY_NAME)}; options: "
                         f"{', '.join(f for f in Request.__dataclass_fields__ if f not in ('target', 'declarations'))}")
    for key in ("only", "keyword", "exclude", "cases"):
        if key in options and isinstance(options[key], str):
            options[key] = (options[key],)
    return replace(Request(target=target), declarations=decl, **options)
