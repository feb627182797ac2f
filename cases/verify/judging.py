"""Judging one case for verify, where the kernel lives (in the runner's child, or in-process):

  1. the oracle's layers (reference with its per-element tolerance, hand values, poison, guard bands);
  2. the properties every correct kernel has (cases/generate/properties.py, with parameters fixed by the
     case's seed): rows independent, keys permutable, linear in V, scale-equivariant, duplicated keys
     harmless, the output inside the convex hull of V, hidden keys ignored;
  3. with --repeat N, the same inputs N times: every output bit (and the log-sum-exp) must be the same;
  4. for a failing case, the error maps of the HTML report (cases/oracle/diagnose.py).
"""
import gc
from dataclasses import dataclass

import torch

from flashcheck.cases import inputs as inp
from flashcheck.cases import features, oracle, protocols
from flashcheck.cases.backend import backend, device
from flashcheck.cases.case import Case
from flashcheck.cases.declarations import Declarations
from flashcheck.cases.generate import properties
from flashcheck.cases.generate.strategies import _fit
from flashcheck.cases.oracle import Failure, Kind, backward, diagnose
from flashcheck.cases.verify import packed


@dataclass(frozen=True)
class Settings:
    """What verify asks of each case (sent to the worker with every case)."""
    target: str = "kernel"
    decl: Declarations = Declarations()
    properties: bool = True      # the metamorphic properties after the oracle's layers
    repeat: int = 1              # calls on the same inputs that must agree bitwise
    maps: bool = False           # error maps of failing cases (the HTML report)
    plain: bool = False          # also one call on plain, exact-size tensors (--sanitize: memcheck sees it)
    backward: bool = False       # the gradients through autograd too (cases/oracle/backward.py)


BIG = 2 ** 27      # B*H*Nq*Nk*D past which a case is judged by the oracle's layers alone (seconds of float64)


def big(case):
    return case.B * case.H * case.Nq * case.Nk * case.D > BIG


RELEASE = 2 ** 30      # device bytes of a case past which its process hands its cached memory back after it


def judge_case(kernel, case, settings):
    """The Verdict of one case; nothing raised here escapes (a kernel can surprise the oracle). A varlen or paged
    kernel has each sequence of the case judged as a dense case, through its adapter (cases/verify/packed.py)."""
    try:
        kernel = oracle.showing_keywords(kernel, settings.decl.keywords)     # --keywords, for a **kwargs signature
        kernel = oracle.as_declared(kernel, oracle.Conventions.of(settings.decl))   # --window-count, --lse-*
        protocol = protocols.of_kernel(kernel, settings.decl)
        if protocol != protocols.DENSE:
            verdict = packed.judge(kernel, protocol, case, settings, _judge)
        else:
            verdict = _judge(kernel, case, settings)
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        verdict = oracle.Verdict(case, settings.target)
        kind, text = oracle.classify_exception(exc)
        if oracle.is_out_of_memory(exc):
            # memory ran out outside the kernel call (the case's inputs, the reference, a gradient): nothing of
            # the kernel was judged, as when the call itself runs out (oracle.layers); never a failure of it
            verdict.status, verdict.note = "out of memory", f"outside the kernel call: {text.splitlines()[0][:300]}"
        else:
            verdict.fail(Failure(kind, f"escaped the oracle: {text.splitlines()[0][:500]}",
                                 location=oracle.where_raised(exc)))
    verdict.declared = settings.decl.flags()
    return _released(case, verdict)


def _released(case, verdict):
    """verdict, after a large case's memory went back to the device. verify --jobs lets a large case run beside
    others on what the light ones leave free (engine._heavy): the memory it took goes back to the device, not into
    this worker's cache for its next (light) case. Collected first: tensors held in reference cycles (an
    exception's frames, a kernel's autograd graph) are not free until then, and empty_cache hands back only free
    blocks (an H200, flash-attn-triton: the fp16 case of offsets_over_2_31 left 110 GiB held in its worker, and the
    bf16 case after it ran out). A CUDA error raised here is the case's kernel's, reported late (kernels run
    asynchronously): the case fails as a device fault (an H200, sageattention 1.0.6, offsets_over_2_31[bf16]: an
    illegal address surfaced in empty_cache and escaped as an exception of the oracle's own)."""
    try:
        if torch.cuda.is_initialized() and _device_bytes(case) > RELEASE:
            gc.collect()
            torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001
        kind, text = oracle.classify_exception(exc)
        verdict.fail(Failure(kind, f"after the case's calls, handing its memory back raised: "
                                   f"{text.splitlines()[0][:500]}"))
    return verdict


def _device_bytes(case):
    try:
        return inp.footprint(case)[0]
    except Exception:  # noqa: BLE001  (a bookkeeping figure: it must never replace the case's verdict)
        return 0


def _judge(kernel, case, settings, kept=None):
    conventions = oracle.Conventions.of(settings.decl)
    caps = oracle.Capabilities.of(kernel)
    kept = {} if kept is None else kept
    verdict = oracle.judge(kernel, case, target=settings.target, caps=caps, conventions=conventions,
                           measure=backend() == "gpu", keep=kept)
    if verdict.status in ("pass", "inconclusive"):
        base = None
        if kept:
            # a kernel that takes out= is judged on the path its users call most too: without out=, it allocates
            base = _without_out(kernel, case, caps, conventions, kept, verdict) if caps.out else properties.Run(kept["out"],
                                                                                                 kept["lse"])
        if not verdict.failed and settings.properties and case.data != "nan_input":
            _properties(kernel, case, settings, conventions, verdict, kept, base)
        if not verdict.failed and settings.repeat > 1:
            _repeat(kernel, case, caps, settings.repeat, verdict)
        if not verdict.failed and settings.backward:
            _backward(kernel, case, caps, conventions, verdict, kept, settings)
        if not verdict.failed and settings.plain:
            _plain_call(kernel, case, caps)
    if verdict.failed and settings.maps:
        verdict.maps = diagnose.error_maps(kernel, case, caps, conventions)
    return verdict


def _without_out(kernel, case, caps, conventions, kept, verdict):
    """The same case called without out= (the kernel allocates its result): the output contract (shape, dtype,
    device, every element written) and the values, against the expectation the oracle already has. Returns the
    run (the properties' base), or None when it failed (the verdict says so) or was declined."""
    try:
        call = oracle.call_kernel(kernel, case, caps, kept["qkv"], device(), without_out=True)
    except oracle.RunFailed as stop:
        f = stop.failure
        f.message = f"without out= (the kernel allocating its output): {f.message}"
        verdict.fail(f)
        return None
    except oracle.Outcome as other:
        verdict.reduced.append(f"the call without out= ended {other.status}: {other.note}")
        return None
    unwritten = inp.is_poison(call.result)
    if bool(unwritten.any()):
        verdict.fail(Failure(Kind.UNWRITTEN, f"without out=, {int(unwritten.sum())} output element(s) never written",
                             where=tuple(int(x) for x in torch.nonzero(unwritten)[0])))
        return None
    out = call.result.detach().to("cpu", torch.float64).numpy()
    lse = None if call.lse is None else call.lse.detach().to("cpu", torch.float64).numpy()
    e = kept["expect"]
    fail, _ = oracle.compare(out, e.out, e.tol)
    if fail is None and lse is not None:
        fail = oracle.lse_failure(lse, e, conventions.empty_lse)
    if fail is not None:
        fail.message = f"without out= (the kernel allocating its output): {fail.message}"
        verdict.fail(fail)
        return None
    return properties.Run(out, lse)


def judges_backward(info):
    """Whether a run judges the gradients (Settings.backward): the kernel has a backward (declared, or its output
    carries autograd: engine.support). A packed kernel's are judged sequence by sequence through its adapter
    (cases/protocols.py Packed places the sequence's q, k, v among the others without breaking the graph)."""
    return "backward" in info["caps"].features


def _backward(kernel, case, caps, conventions, verdict, kept, settings):
    """The backward layer (cases/oracle/backward.py) on a case whose forward held. Not on cases too large for the
    float64 gradients (BIG, like the properties), sampled heads, NaN inputs or a case with no gradient to judge."""
    if case.sample_heads or big(case):
        verdict.reduced.append(f"backward not judged on cases of more than {BIG:.0e} multiply-adds (float64 "
                               "gradients of every score)")
        return
    if case.data == "nan_input" or "qkv" not in kept:
        return
    try:
        fail = backward.judge(kernel, case, caps, kept["qkv"], device(), conventions,
                              oracle.protocol_kwargs(case, caps, device()), required=settings.decl.backward == "yes",
                              notes=verdict.reduced)
    except backward.Declined as why:
        verdict.reduced.append(f"backward not judged: {why}")
        return
    if fail is not None:
        verdict.fail(fail)


def probe_backward(kernel, dtype, conventions, protocol=protocols.DENSE, shape=None, layout="bhnd"):
    """(has a backward, why): one small call with q, k and v that require grad (a packed kernel's through its
    adapter); its output must carry an autograd graph. A kernel that raises on such inputs has none (a Triton
    forward-only kernel returns a plain tensor)."""
    s = shape or features.PROBE_SHAPE          # the head dim and length the kernel declares it takes
    case = Case("probe_backward", H=2, Nq=s["Nq"], Nk=s["N"], D=s["D"], dtype=dtype, causal=s["causal"], seed=1)
    kernel = oracle.as_declared(kernel, conventions)
    if protocol != protocols.DENSE:
        kernel = protocols.Packed(kernel, protocol, case, 0, layout=layout)
    q, k, v = backward.leaves(case, inp.values(case), device())
    try:
        result = kernel(q, k, v, **oracle.protocol_kwargs(case, oracle.Capabilities.of(kernel), device()))
    except Exception as exc:  # noqa: BLE001
        return False, f"probed, raised with inputs that require grad: {str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}"
    if backward.differentiable(result):
        return True, "probed: its output carries autograd"
    return False, "probed: its output carries no autograd graph"


def _properties(kernel, case, settings, conventions, verdict, kept, base):
    if case.sample_heads or big(case):
        verdict.reduced.append(f"properties not checked on cases of more than {BIG:.0e} multiply-adds (each relation "
                               "would judge the case again)")
        return
    caps = oracle.Capabilities.of(kernel)
    trial = properties.Trial(kernel, case, target=settings.target, conventions=conventions, decl=settings.decl,
                             qkv=kept.get("qkv"), expect=kept.get("expect"), base=base, without_out=caps.out)
    found = properties.check_fixed(kernel, case, trial=trial, target=settings.target)
    if found is not None:
        f = found.failure
        f.message = f"property {found.prop}: {f.message}" + (f" ({found.detail})" if found.detail else "")
        verdict.fail(f)


def _repeat(kernel, case, caps, times, verdict):
    """The same inputs `times` times: outputs (and lse) must be bitwise identical; a race shows like this."""
    qkv = inp.values(case, device())
    first = None
    for i in range(times):
        try:
            call = oracle.call_kernel(kernel, case, caps, qkv, device())
        except (oracle.RunFailed, oracle.Outcome) as stop:
            verdict.fail(getattr(stop, "failure", None) or Failure(Kind.NONDETERMINISTIC, f"call {i + 1} of "
                                                                   f"{times} ended differently: {stop}"))
            return
        bits = inp.int_view(call.result).cpu().clone()
        lse = None if call.lse is None else call.lse.detach().cpu().view(torch.int32).clone()
        if first is None:
            first = (bits, lse, call.result.detach().cpu().double())
            continue
        differs = bits != first[0]
        if bool(differs.any()):
            w = tuple(int(x) for x in torch.nonzero(differs)[0])
            got = call.result.detach().cpu().double()
            apart = float(torch.nan_to_num((got - first[2]).abs(), nan=float("inf")).max())
            verdict.fail(Failure(Kind.NONDETERMINISTIC, f"call {i + 1} of {times} on the same inputs differs from "
                                                        f"call 1 in {int(differs.sum())} output element(s), by up to "
                                                        f"{apart:.3g} (a race, or an order that depends on scheduling)",
                                 where=w, got=float(got[w]), expected=float(first[2][w])))
            return
        if lse is not None and first[1] is not None and not torch.equal(lse, first[1]):
            verdict.fail(Failure(Kind.NONDETERMINISTIC, f"call {i + 1} of {times} on the same inputs gives another "
                                                        "log-sum-exp than call 1"))
            return


def _plain_call(kernel, case, caps):
    """One call on plain, exact-size tensors (no guard bands around them): under compute-sanitizer memcheck
    a read or write past an allocation is reported even when its value never reaches the output."""
    q, k, v = (t.to(device()).contiguous() for t in inp.values(case, device()))
    try:
        kernel(q, k, v, **oracle.protocol_kwargs(case, caps, q.device))
        if q.is_cuda:
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001  (the guarded run already judged the kernel; memcheck says the rest)
        pass


def probe_feature(kernel, name, dtype, conventions, protocol=protocols.DENSE, shape=None, layout="bhnd"):
    """(supported, why) for the shape-carried feature `name` (cases/features.py PROBED) on this kernel, from one
    small case judged by the oracle (the engine asks it through the runner): a kernel that raises, declines or reads
    outside k and v lacks the feature (why says how); one that answers has it, and a wrong answer then fails the
    feature's cases. An answer of the wrong shape is an answer: a kernel without a value head dim of its own
    asserts it (as Triton's tutorial does), while output sized by D is a bug class of its own."""
    case = features.probe_case(name, dtype, shape)
    kernel = oracle.as_declared(kernel, conventions)
    if protocol != protocols.DENSE:
        kernel = protocols.Packed(kernel, protocol, case, 0, layout=layout)
    verdict = oracle.judge(kernel, case, target="probe", conventions=conventions)
    if verdict.status in ("pass", "inconclusive"):
        return True, "probed"
    if verdict.status == "fail" and str(verdict.kind) in ("mismatch", "lse", "hand value"):
        return True, "probed: finite and of the right shape (its cases judge whether right)"
    if verdict.status == "fail" and str(verdict.kind) == "bad return":
        return True, "probed: it answers, in the wrong shape or dtype; its cases judge it"
    if verdict.failures:
        first = verdict.failures[0]
        kind, detail = str(first.kind), first.line()[len(str(first.kind)):].lstrip(" ;:")
    else:
        kind, detail = str(verdict.status), str(verdict.note or "")
    return False, f"probed, {kind}: {detail[:200]}; --{name} yes judges it anyway"


ANSWERED = ("mismatch", "NaN", "lse", "hand value", "unwritten", "out-of-bounds read", "leak")  # values, right shape


def probe_paged_layout(kernel, dtype, conventions, shape=None):
    """(layout, why) for a paged kernel that does not declare --paged-q: one small case judged by the oracle through
    the adapter with q and out as (B, H, Nq, D), then as (B, Nq, H, D) (FlashAttention's flash_attn_with_kvcache).
    H does not divide Nq, so read the wrong way round the query heads are no multiple of the kv heads: a kernel then
    raises or answers in the wrong shape. The first layout that passes is the kernel's; where neither does (a buggy
    kernel), the one in which it answers with values of the right shape; else the protocol's, (B, H, Nq, D)."""
    s = shape or features.PROBE_SHAPE
    # (with one query, --max-seq-q 1, the two layouts are the same memory: either answer holds)
    H = next(h for h in (3, 2, 5, 7) if s["Nq"] % h)
    case = Case("probe_paged_layout", H=H, Nq=s["Nq"], Nk=s["N"], D=s["D"], dtype=dtype, causal=s["causal"], seed=3)
    kernel = oracle.as_declared(kernel, conventions)
    answered = []
    for layout in protocols.PAGED_Q:
        verdict = oracle.judge(protocols.Packed(kernel, protocols.PAGED, case, 0, layout=layout), case,
                               target="probe", conventions=conventions)
        if verdict.status in ("pass", "inconclusive"):
            return layout, "probed"
        if verdict.status == "fail" and str(verdict.kind) in ANSWERED:
            answered.append(layout)
    if len(answered) == 1:
        return answered[0], "probed: it answers (wrongly) only so"
    return protocols.PAGED_Q[0], "probed: right in neither layout, judged as (B, H, Nq, D)"


MEMORY_CASE = "memory_complexity"
MEMORY_WHY = ("a fused kernel never materialises the Nq x Nk scores (--fused): its extra device memory grows like "
              "the sequence, not like its square (the unfused baseline's does, by design)")


def memory_case(decl, length=1024):
    """The case of the --fused check: B = 1, H = 4, Nq = Nk = 2 * length (fitted to the declarations), in the
    first declared half-precision dtype (or the first declared one), D = 64 or the nearest declared."""
    dtypes = decl.dtypes or ("fp16",)
    dtype = next((d for d in ("fp16", "bf16", "fp32") if d in dtypes), dtypes[0])
    D = next((d for d in (64, 128, 32, 16, 256) if decl.head_dim_ok(d)), None) or decl.head_dims[0][0]
    n = _fit(decl, 2 * length, 1)
    return Case(f"{MEMORY_CASE}[{dtype}]", why=MEMORY_WHY, H=4, Nq=n, Nk=n, D=D, dtype=dtype, causal=decl.causal_only)


def memory_probe(kernel, case, settings):
    """The --fused check: the kernel's own device memory (beyond its inputs and output) at Nq = Nk = N and at
    N / 2. It fails as "memory complexity" when it is at least a quarter byte per score at N and grew about
    fourfold from N / 2: the scores are materialised."""
    protocol = protocols.of_kernel(kernel, settings.decl)
    kernel = oracle.as_declared(kernel, oracle.Conventions.of(settings.decl))
    verdict = oracle.Verdict(case, settings.target)
    half = case.replace(Nq=max(case.Nq // 2, 1), Nk=max(case.Nk // 2, 1))
    peaks = []
    for c in (half, case):
        # a varlen or paged kernel through its adapter, whose packed copies grow like the sequence, not its square
        fn = kernel if protocol == protocols.DENSE else protocols.Packed(kernel, protocol, c, 0,
                                                                          layout=settings.decl.paged_q)
        caps = oracle.Capabilities.of(fn)
        try:
            call = oracle.call_kernel(fn, c, caps, inp.values(c, device()), device(), measure=True)
        except oracle.RunFailed as stop:
            verdict.fail(stop.failure)
            return verdict
        except oracle.Outcome as other:
            verdict.status, verdict.note = other.status, other.note
            return verdict
        peaks.append(call.peak_bytes)
        del call
    small, large = peaks
    verdict.peak_bytes = large
    scores = case.B * case.H * case.Nq * case.Nk
    mib = 2.0 ** 20
    figures = (f"extra device memory {small / mib:.1f} MiB at Nq = Nk = {half.Nq}, {large / mib:.1f} MiB at "
               f"{case.Nq}")
    if large >= scores / 4 and large >= 2.5 * max(small, 1):
        verdict.fail(Failure(Kind.MEMORY, f"{figures} (x{large / max(small, 1):.1f} for twice the length, "
                                          f"{large / scores:.2f} bytes per score): the kernel materialises the "
                                          "Nq x Nk scores"))
    else:
        verdict.note = figures
    return verdict
