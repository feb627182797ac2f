"""Judge one run (one case given to one kernel) and name what went wrong.

Layers (docs/design.md), all on by default:
  1. reference   the float64 definition (reference/numpy_ref.py, computed in float64 torch on the kernel's device
                 by reference/torch_ref.py) on the same dtype-rounded inputs, each element against its own derived
                 tolerance (cases/oracle/tolerance.py): fp32 is tight enough that a tf32 dot fails by ~100x
  2. hand        an exact hand-computed answer (7.5), bit-exact where the dtype represents it (the other hand
                 values, the mean of V and one key's row, are checks of the reference: tests/test_oracle.py)
  3. poison      the output starts as a NaN of a distinctive bit pattern: an element still holding it was
                 never written
  4. guards      q, k, v sit in NaN-filled buffers (before, after, between rows and heads): a stray read
                 that reaches the output shows as NaN, and a re-run with zero-filled guards tells an
                 out-of-bounds read from a computed NaN. The output sits among sentinels: any change outside
                 it is an out-of-bounds write; any change to q, k or v is reported too.
The relations every correct kernel satisfies (rows sum to 1, key permutation, linearity in V, causal rows
ignoring hidden keys, ...) are the properties of cases/generate/properties.py, which verify runs after these
layers: one implementation of them, not a weaker copy here.

A verdict names the case, the kind of failure, the first bad element (b, h, row, col), got, expected, its
tolerance, and a one-line reproduction; or says why the case could not be judged (inconclusive, unsupported,
out of memory).
"""
import contextlib
import fcntl
import gc
import math
import os
import re
import tempfile
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch

from flashcheck.cases import features
from flashcheck.cases import inputs as inp
from flashcheck.cases.backend import device as active_device
from flashcheck.cases.declarations import DeclarationError, Declarations
from flashcheck.cases.oracle import tolerance
from flashcheck.cases.oracle.kinds import Kind, _chain, classify_exception, is_out_of_memory
from flashcheck.cases.oracle.verdict import LN2, Capabilities, Failure, Outcome, RunFailed, Verdict, lse_layout_hint

LOOSE = 0.1     # a row whose tolerance reaches this fraction of V's spread is judged only loosely


@dataclass(frozen=True)
class Conventions:
    """What the judgement depends on besides the case: where the causal diagonal sits (and so the window's and
    ALiBi's distances), which kv head a query head reads, and whether the kernel keeps its scores in fp32
    (declared; cases/declarations.py)."""
    causal_align: str = "bottom-right"
    fp32_scores: bool = False
    head_map: str = "grouped"
    empty_lse: str = "-inf"          # the log-sum-exp of a row that sees no key: -inf (the protocol) or +inf
    # how the kernel is called and answers (as_declared bridges them, so the judgement itself never sees them):
    window_count: str = "distance"   # window=(left, right) as the farthest key on each side, or as counts of keys
    lse_layout: str = "heads-first"  # (B, H, Nq), varlen (H, total_q); or tokens-first, the last two axes swapped
    lse_base: str = "e"              # the natural log, or log2

    @classmethod
    def of(cls, decl):
        if decl is None:
            return cls()
        return cls(decl.causal_align, decl.fp32_scores, decl.head_map, decl.empty_lse, decl.window_count,
                   decl.lse_layout, decl.lse_base)


def _first_bad(bad):
    """(b, h, row, col) of the first True element of a (B, H, N, D) bool array."""
    return tuple(int(x) for x in np.argwhere(bad)[0])


def _to_numpy(t):
    return t.detach().to("cpu", torch.float64).numpy()


_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def where_raised(exc):
    """"file:line" of the innermost frame of a traceback outside flashcheck; when that frame is inside a
    library, also the innermost frame of the user's own code that led there."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not os.path.abspath(f.filename).startswith(_OWN)]
    if not frames:
        return ""
    last = frames[-1]
    text = f"{last.filename}:{last.lineno}"
    library = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python")
    if any(s in last.filename for s in library):
        own = [f for f in frames if not any(s in f.filename for s in library) and not f.filename.startswith("<")]
        if own:
            text += f", called from {own[-1].filename}:{own[-1].lineno}"
    return text


@dataclass
class Call:
    """One call of the kernel on guarded inputs."""
    inputs: object            # cases.inputs.Inputs
    result: torch.Tensor
    lse: torch.Tensor
    before: dict              # the guarded buffers' bits before the call
    peak_bytes: int = None    # device memory the call took beyond its inputs and its output (GPU)


def protocol_kwargs(case, caps, device="cpu"):
    """The keywords a case passes to a kernel: causal= (unless the signature has none and the case is not causal),
    scale= when the case sets one, the block pins when the kernel takes them, and the keywords of the optional
    features it uses (window=, softcap=, alibi_slopes= on `device`: cases/features.py)."""
    kwargs = {}
    if case.causal or caps.causal:
        kwargs["causal"] = case.causal
    if case.scale is not None:
        kwargs["scale"] = case.scale
    if caps.blocks:
        # only what the case pins: a kernel's own default stands for the other (None would replace it: a kernel
        # whose block_m=16 default met block_m=None raised on a case pinning block_n alone)
        kwargs.update({name: b for name, b in (("block_m", case.block_m), ("block_n", case.block_n)) if b})
    kwargs.update(features.kwargs(case, device))
    return kwargs


def _kwargs(case, caps, g, without_out=False):
    kwargs = protocol_kwargs(case, caps, g.q.t.device)
    if caps.out and not without_out:
        kwargs["out"] = g.out.t
    if caps.lse:
        kwargs["return_lse"] = True
    return kwargs


def call_kernel(kernel, case, caps, qkv, device, guard_fill=float("nan"), measure=False, without_out=False):
    """Run the kernel once on guarded inputs. Returns a Call; raises RunFailed with the failure when the
    call itself fails, Outcome when the kernel declines the input or runs out of memory. without_out=True: no out=
    even to a kernel that takes it (the path its users call most: the kernel allocates its result), with the memory
    its allocation is likely to reuse poisoned first."""
    try:
        g = inp.make_inputs(case, device, qkv=qkv, guard_fill=guard_fill)
    except Exception as exc:  # noqa: BLE001  (only memory is expected here; anything else is re-raised)
        if is_out_of_memory(exc):
            raise Outcome("out of memory", f"the case's own inputs do not fit: {_first_line(exc)}") from None
        raise
    before = {name: getattr(g, name).flat.clone() for name in ("q", "k", "v", "out")}
    kwargs = _kwargs(case, caps, g, without_out)
    if without_out and caps.out:
        _prepoison(case, device)
    if kwargs.get("return_lse"):
        inp.prepoison_lse(case.B * case.H * case.Nq, device)
    cuda = torch.device(device).type == "cuda"
    if cuda and measure:
        _libraries_ready(device)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    try:
        result = kernel(g.q.t, g.k.t, g.v.t, **kwargs)
        if cuda:
            torch.cuda.synchronize()
    except RunFailed:
        raise          # an adapter's own finding (cases/protocols.py: a packed guard, a packed shape)
    except Exception as exc:  # noqa: BLE001  (the kernel under test may raise anything)
        # NotImplementedError (flashcheck.Unsupported is one) declines the input, also when a compiler wraps it
        # (torch.compile's "NYI: ..." inside an InductorError)
        declined = next((e for e in _chain(exc) if isinstance(e, NotImplementedError)), None)
        if declined is not None:
            wrapped = "" if declined is exc else f" (raised as {type(exc).__name__})"
            raise Outcome("unsupported", (_first_line(declined) or type(declined).__name__) + wrapped) from None
        if is_out_of_memory(exc):
            raise Outcome("out of memory", _memory_note(exc, g, device)) from None
        kind, text = classify_exception(exc)
        raise RunFailed(Failure(kind, _first_line(text) or kind.value, location=where_raised(exc))) from None
    peak = None
    if cuda and measure:
        own = sum(t.untyped_storage().nbytes() for t in _returned(result)
                  if t.untyped_storage().data_ptr() != g.out.flat.untyped_storage().data_ptr())
        peak = max(0, torch.cuda.max_memory_allocated() - base - own)
    lse = None
    if caps.lse:
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise RunFailed(Failure(Kind.BAD_RETURN,
                                    f"return_lse=True must return (out, lse), got {type(result).__name__}"))
        result, lse = result
    if result is None and "out" in kwargs:
        result = kwargs["out"]      # given out=, a kernel may answer in it alone (as torch's out= variants may)
    B, H, Nq, D = case.B, case.H, case.Nq, case.v_dim
    if not isinstance(result, torch.Tensor):
        raise RunFailed(Failure(Kind.BAD_RETURN, f"expected a tensor, got {type(result).__name__}"))
    if tuple(result.shape) != (B, H, Nq, D) or result.dtype != case.torch_dtype \
            or result.device.type != torch.device(device).type:
        raise RunFailed(Failure(Kind.BAD_RETURN, f"expected {(B, H, Nq, D)} {case.torch_dtype} on {device}, "
                                                 f"got {tuple(result.shape)} {result.dtype} on {result.device}"))
    if lse is not None:
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, Nq) or lse.dtype != torch.float32 \
                or lse.device.type != torch.device(device).type:
            got = (f"{tuple(lse.shape)} {lse.dtype} on {lse.device}" if isinstance(lse, torch.Tensor)
                   else type(lse).__name__)
            hint = lse_layout_hint(lse.shape, (B, H, Nq)) if isinstance(lse, torch.Tensor) else ""
            raise RunFailed(Failure(Kind.BAD_RETURN, f"lse must be a ({B}, {H}, {Nq}) torch.float32 tensor on "
                                                     f"{device}, got {got}{hint}"))
    return Call(g, result, lse, before, peak)


_READY = set()


def _libraries_ready(device):
    """Once per process and device: cuBLAS's workspaces, which the first matrix product of a process allocates
    (32 MiB on an H200) and keeps, exist before the kernel's memory is measured, so that they are not counted as
    the kernel's own (the float64 reference of a small case runs on the host, so the kernel's product may be the
    process's first)."""
    if device in _READY:
        return
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = torch.ones(16, 16, device=device, dtype=dtype)
        torch.matmul(a, a)
    torch.cuda.synchronize()
    _READY.add(device)


def _returned(result):
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [t for t in items if isinstance(t, torch.Tensor) and t.device.type == "cuda"]


def _first_line(exc_or_text):
    text = str(exc_or_text)
    return text.strip().splitlines()[0][:500] if text.strip() else ""


def _gib(n):
    return f"{n / 2 ** 30:.2f} GiB"


def _memory_note(exc, g, device):
    """The figures of an out-of-memory: what the kernel asked for, what the case's inputs hold, the device."""
    held = sum(getattr(g, name).flat.numel() * getattr(g, name).flat.element_size() for name in ("q", "k", "v", "out"))
    text = _first_line(exc)

    found = re.search(r"Tried to allocate ([\d.]+ ?[KMGT]?i?B)", text)
    asked = f"asked for {found.group(1)}; " if found else ""
    total = ""
    if torch.device(device).type == "cuda":
        total = f"; device total {_gib(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)}"
    return f"{asked}the case's guarded inputs and output hold {_gib(held)}{total}"


def _check_memory(call, caps):
    """Guards and poison: inputs untouched, nothing written outside the output, every output written."""
    g, result, before = call.inputs, call.result, call.before
    for name in ("q", "k", "v"):
        gt = getattr(g, name)
        changed = torch.nonzero(gt.changed(before[name])).flatten()
        if len(changed):
            inside = bool(gt.inside[changed[0]])
            raise RunFailed(Failure(Kind.INPUT_WRITTEN if inside else Kind.OOB_WRITE,
                                    f"{name} buffer changed at {len(changed)} element(s), first flat index "
                                    f"{int(changed[0])} ({'inside' if inside else 'outside'} the {name} view)"))
    if caps.out:
        stray = g.out.outside_changed(before["out"])
        if len(stray):
            raise RunFailed(Failure(Kind.OOB_WRITE,
                                    f"{len(stray)} element(s) outside the output view changed, first flat index "
                                    f"{int(stray[0])} of the guarded output buffer"))
        check_returned_out(result, g.out.t)
    unwritten = inp.is_poison(result)
    if bool(unwritten.any()):
        first = tuple(int(x) for x in torch.nonzero(unwritten)[0])
        raise RunFailed(Failure(Kind.UNWRITTEN, f"{int(unwritten.sum())} output element(s) never written",
                                where=first))


def check_returned_out(result, out, what="the returned tensor"):
    """The out= contract: what a kernel given out= returns is out itself, or equal to it bit for bit (a kernel that
    writes its answer elsewhere and leaves out as it was fails here, whatever it returns)."""
    if result.data_ptr() != out.data_ptr() or result.stride() != out.stride():
        if tuple(result.shape) != tuple(out.shape) or not torch.equal(inp.int_view(result), inp.int_view(out)):
            raise RunFailed(Failure(Kind.BAD_RETURN, f"out= was given but {what} is neither out nor equal to it"))


def expectation(case, qkv, device=None, conventions=Conventions(), *, like=None, lean=False):
    """The float64 reference of a case on these inputs (torch tensors of its dtype) and the per-element
    tolerance a kernel following `conventions` is held to (cases/oracle/tolerance.py), computed on `device`
    (default: where the tensors are; the host for a small case, tolerance.reference_device), or on the host when the
    device has no room for it. like: the Expectation of the same case on the same q and k (only v differs), whose
    score side is reused where it kept it (bit for bit the same result); lean: tolerance.expectation's."""
    q, k, v = qkv
    if like is not None and like.scores is not None:
        return tolerance.expectation(case.torch_dtype, q, k, v, scores=like.scores, lean=lean)
    # the problem at the tensors' own (B, H): a huge case's sampled heads are (S, 1) (such cases use no feature)
    pb = features.problem(case.replace(B=q.shape[0], H=q.shape[1], Hkv=k.shape[1]), conventions.causal_align,
                          conventions.head_map)

    def on(where):
        return tolerance.expectation(case.torch_dtype, *qkv, device=where, problem=pb,
                                     half_scores=not conventions.fp32_scores, lean=lean)

    device = tolerance.reference_device(device or q.device, q.shape, k.shape, v.shape)
    try:
        return on(device)
    except Exception as exc:  # noqa: BLE001
        if not is_out_of_memory(exc) or str(device).startswith("cpu"):
            raise
    torch.cuda.empty_cache()
    return on("cpu")


def _heads(case):
    """The (b, h) pairs judged, as two index arrays: None for all, or a spread sample of
    case.sample_heads pairs, first and last included (a 64-bit offset bug lives in the last ones)."""
    if not case.sample_heads or case.sample_heads >= case.B * case.H:
        return None
    flat = np.unique(np.linspace(0, case.B * case.H - 1, case.sample_heads).round().astype(np.int64))
    return flat // case.H, flat % case.H


def _select(t, heads):
    """(B, H, ...) -> (S, 1, ...): the judged heads only (all when heads is None)."""
    if heads is None:
        return t
    b, h = (torch.as_tensor(x, device=t.device) for x in heads)
    return t[b, h].unsqueeze(1)


def _unselect(failure, heads):
    """Map a failure's (s, 0, row, col) in the selection back to (b, h, row, col)."""
    def back(where):
        return None if where is None else (int(heads[0][where[0]]), int(heads[1][where[0]])) + tuple(where[2:])
    if heads is not None:
        failure.where, failure.worst = back(failure.where), back(failure.worst)
    return failure


def compare(got, exp, tol, what=Kind.MISMATCH):
    """Elementwise check of got against exp (float64 arrays): no non-finite value where exp is finite, and
    |got - exp| <= tol there (tol: a scalar or an array of exp's shape). Where exp is NaN (a NaN input: outside
    the protocol, which admits any FINITE values) the output is not judged. Returns (failure or None,
    (worst err/tol, |err| there, tol there))."""
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), exp.shape)
    nan_exp = np.isnan(exp)
    finite = np.isfinite(exp)
    nonfinite = finite & ~np.isfinite(got)
    if nonfinite.any():
        w = _first_bad(nonfinite)
        return Failure(Kind.NAN, f"{int(nonfinite.sum())} non-finite output element(s) where the reference is "
                                 f"finite", where=w, got=float(got[w]), expected=float(exp[w])), \
            (float("inf"), float("inf"), 0.0)
    inf_mismatch = ~finite & ~nan_exp & (got != exp)
    if inf_mismatch.any():
        w = _first_bad(inf_mismatch)
        return Failure(what, "", where=w, got=float(got[w]), expected=float(exp[w])), (float("inf"), float("inf"), 0.0)
    err = np.where(finite, np.abs(got - np.where(finite, exp, 0)), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err > 0, err / tol, 0.0)
    worst, at = (0.0, 0.0, 0.0), None
    if ratio.size:
        at = tuple(int(x) for x in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
        worst = (float(ratio[at]), float(err[at]), float(tol[at]))
    bad = err > tol
    if bad.any():
        w = _first_bad(bad)
        return Failure(what, f"{int(bad.sum())} element(s) out of tolerance, max err/tol {worst[0]:.3g}",
                       where=w, got=float(got[w]), expected=float(exp[w]), tol=float(tol[w]), worst=at), worst
    return None, worst


def _hand_value(case, qkv, conventions=Conventions()):
    """The case's hand-computed answer as a (B, H, Nq, Dv) float64 array, or None (v as the query heads read it).
    None too where a declared convention changes the answer: a hand value is worked out under the protocol's (a
    top-left kernel's window (1, 0) at Nq = 2, Nk = 4 gives 1, not the bottom-right 3); the reference, computed
    under the declared conventions, still judges the case."""
    if case.expected is None:
        return None
    moved = (conventions.causal_align != "bottom-right" and case.Nq != case.Nk
             and (case.causal or case.window is not None or case.alibi is not None))
    regrouped = conventions.head_map != "grouped" and case.Hkv not in (None, 1, case.H)
    if moved or regrouped:
        return None
    v = _to_numpy(qkv[2])[:, features.problem(case).kv_heads()]
    shape = (case.B, case.H, case.Nq, case.v_dim)
    if case.expected == "mean_v":
        return np.broadcast_to(v.mean(axis=2, keepdims=True), shape)
    if case.expected == "v_row0":
        return np.broadcast_to(v[:, :, :1, :], shape)
    return np.broadcast_to(np.asarray(case.expected, dtype=np.float64), shape)


def _exact_in(case, hand):
    """A hand value is held bit-exact only where the case says so and the dtype represents it."""
    if not case.exact:
        return False
    rounded = torch.from_numpy(np.array(hand, dtype=np.float64)).to(case.torch_dtype).double().numpy()
    return bool(np.array_equal(rounded, hand))


def _lse_check(lse, expect, heads, empty_lse="-inf"):
    return lse_failure(_to_numpy(_select(lse, heads)), expect, empty_lse)


def lse_failure(got, expect, empty_lse="-inf"):
    """None when a kernel's lse (a float64 array, the expectation's shape) holds, else the Failure; empty_lse: the
    lse of a row that sees no key under the kernel's conventions (-inf, the protocol's; +inf declared)."""
    want = expect.lse
    if empty_lse == "+inf":      # a declared convention (FlashAttention's): rows that see no key give +inf
        want = np.where(np.isneginf(want), np.inf, want)
    fail, _ = compare(got[..., None], want[..., None], expect.tol_lse[..., None], what=Kind.LSE)
    if fail is not None:
        fail.kind = Kind.LSE
        fail.message = ("log-sum-exp " + fail.message).strip()
        if np.isinf(fail.got or 0.0) and np.isinf(fail.expected or 0.0) and fail.got == -fail.expected:
            fail.message += ("; the row sees no key: +inf expected, as declared (--empty-lse +inf)" if empty_lse == "+inf"
                             else "; the row sees no key: -inf expected, the protocol's (a kernel that gives +inf, as "
                                  "FlashAttention's do, declares --empty-lse +inf)")
        elif fail.got and fail.expected and math.isfinite(fail.got) and math.isfinite(fail.expected) \
                and abs(fail.got * LN2 / fail.expected - 1.0) < 1e-3:
            fail.message += ("; got is the expected times log2(e): a log-sum-exp in base 2 (a kernel that returns "
                             "one, as FlashInfer's do, declares --lse-base 2)")
    return fail


def judge(kernel, case, *, device=None, target="kernel", caps=None, conventions=None,
          measure=False, keep=None):
    """Judge one run of `kernel` on `case`. Returns a Verdict. conventions: default, those the kernel
    declares itself (flashcheck.declare). measure=True also records the kernel's own device memory (GPU).
    keep: a dict that receives what the run computed, for the properties to reuse: "qkv" (the case's inputs),
    "expect" (their Expectation) and "out", "lse" (the kernel's output and log-sum-exp, float64 arrays)."""
    if conventions is None:

        try:
            conventions = Conventions.of(Declarations.of(kernel))
        except DeclarationError:
            conventions = Conventions()
    if case.sample_heads:
        with _one_huge_case_at_a_time():
            return _judge(kernel, case, device, target, caps, conventions, measure, keep)
    return _judge(kernel, case, device, target, caps, conventions, measure, keep)


@contextlib.contextmanager
def _one_huge_case_at_a_time():
    """Huge cases take tens of GB of device memory: under pytest-xdist (or several verify runs) on one
    machine, judge them one at a time, across processes (an advisory lock on a file in the temp dir)."""
    with open(os.path.join(tempfile.gettempdir(), "flashcheck-huge-case.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if torch.cuda.is_initialized():
                gc.collect()                      # tensors in reference cycles are held until collected
                torch.cuda.empty_cache()          # hand the tens of GB back to the other processes
            fcntl.flock(lock, fcntl.LOCK_UN)


def _judge(kernel, case, device, target, caps, conventions, measure, keep):
    device = device or active_device()
    caps = caps or Capabilities.of(kernel)
    verdict = Verdict(case, target)
    if not caps.out:
        verdict.reduced.append("no out=: output guard not checked; unwritten check relies on reused memory")
    t0 = time.perf_counter()
    try:
        try:
            qkv = inp.values(case, device)
        except Exception as exc:  # noqa: BLE001
            if is_out_of_memory(exc):
                raise Outcome("out of memory", f"the case's inputs do not fit: {_first_line(exc)}") from None
            raise
        heads = _heads(case)
        expect = expectation(case, tuple(_select(t, heads) for t in qkv), device, conventions)
        if not caps.out:
            _prepoison(case, device)
        call = call_kernel(kernel, case, caps, qkv, device, measure=measure)
        verdict.peak_bytes = call.peak_bytes
        _check_memory(call, caps)
        got = _to_numpy(_select(call.result, heads))
        lse = call.lse
        del call
        if keep is not None and heads is None:
            keep.update(qkv=qkv, expect=expect, out=got, lse=None if lse is None else _to_numpy(lse))
        fail, (verdict.ratio, verdict.max_err, verdict.tol) = compare(got, expect.out, expect.tol)
        if fail is not None and fail.kind == Kind.NAN:
            fail = _diagnose_nan(kernel, case, caps, qkv, device, fail, heads)
        if fail is not None:
            raise RunFailed(_unselect(fail, heads))
        if lse is not None:
            fail = _lse_check(lse, expect, heads, conventions.empty_lse)
            if fail is not None:
                raise RunFailed(_unselect(fail, heads))
        # an exact hand value (7.5) is held bit-exact: a job the reference's tolerance, a few ulps wide, cannot do.
        # The others (the mean of V, one key's row) equal the float64 reference to its rounding, so against the
        # kernel they would add nothing to it: tests/test_oracle.py holds the reference to them instead
        hand = _hand_value(case, qkv, conventions)
        if hand is not None and heads is None and _exact_in(case, hand):
            fail, _ = compare(got, hand, 0.0, what=Kind.HAND_VALUE)
            if fail is not None:
                fail.kind = Kind.HAND_VALUE
                raise RunFailed(fail)
        why = tolerance.discriminates(expect)
        if why:
            verdict.status, verdict.note = "inconclusive", f"tolerance cannot discriminate: {why}"
        else:
            loose, rows = tolerance.loose_rows(expect, LOOSE)
            if loose:
                hint = ("; a kernel that keeps its scores in fp32 can declare --fp32-scores"
                        if case.dtype != "fp32" and not conventions.fp32_scores else "")
                verdict.reduced.append(f"some rows judged loosely (tolerance >= {LOOSE:g} of V's spread: "
                                       f"scores the dtype cannot resolve{hint})")
                verdict.note = f"{loose} of {rows} rows judged loosely"
    except RunFailed as stop:
        verdict.fail(stop.failure)
    except Outcome as other:
        verdict.status, verdict.note = other.status, other.note
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    verdict.seconds = time.perf_counter() - t0
    return verdict


def _diagnose_nan(kernel, case, caps, qkv, device, fail, heads):
    """A NaN where the reference is finite: re-run with zero-filled guard bands. If the NaN goes away it
    came from memory outside the inputs: an out-of-bounds (or wrong-stride) read."""
    try:
        res = call_kernel(kernel, case, caps, qkv, device, guard_fill=0.0).result
    except (RunFailed, Outcome):
        return fail
    if np.isfinite(_to_numpy(_select(res, heads))[fail.where]):
        fail.kind = Kind.OOB_READ
        fail.message = ("NaN from the NaN guard bands (finite when the guards hold 0): a read outside q, k or "
                        "v, or with a wrong stride")
    return fail


def _prepoison(case, device):
    """Without out=, the poison where the kernel's own (B, H, Nq, Dv) output is likely to be allocated."""
    inp.prepoison(case.B * case.H * case.Nq * case.v_dim, case.torch_dtype, device)
