"""The oracle: judge one run (one case given to one kernel) and name what went wrong.

Layers (DESIGN.md), all on by default:
  1. reference   float64 NumPy on the same (dtype-rounded) inputs, with a tolerance derived per run
                 (see expectation()): FACTOR x the error of PyTorch doing the same computation in the same
                 dtype, plus a floor for the output's final rounding and for fp32 accumulation over D and Nk
                 terms. fp32 is judged against ieee PyTorch, so a tf32 dot (~1e-3) fails by ~100x.
  2. hand        hand-computed answers (7.5; the mean of V when all scores are equal; the one key's row).
  3. poison      the output starts as a NaN of a distinctive bit pattern: an element still holding it was
                 never written.
  4. guards      q, k, v sit in NaN-filled buffers (before, after, between rows and heads): a stray read
                 that reaches the output shows as NaN, and a re-run with zero-filled guards tells an
                 out-of-bounds read from a computed NaN. The output sits among sentinels: any change
                 outside it is an out-of-bounds write; any change to q, k or v is reported too.
  5. invariants  relations that need no reference: softmax rows sum to 1 (V = 1 gives 1), permuting
                 keys/values jointly changes nothing (non-causal), the output is affine in V
                 (2V - 1 gives 2 out - 1), and a causal row ignores the keys it cannot see.
A verdict names the case, the kind of failure, the first bad element (b, h, row, col), got, expected,
tolerance, and a one-line reproduction.
"""
import contextlib
import inspect
import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from flashcheck.cases import inputs as inp
from flashcheck.reference import numpy_ref, torch_ref

FACTOR = 2.0      # "at most about twice as wrong as PyTorch in the same precision" (FlashAttention's rule)
FP32_EPS = float(torch.finfo(torch.float32).eps)

KINDS = ("mismatch", "NaN", "unwritten", "out-of-bounds read", "out-of-bounds write", "input written",
         "exception", "compile error", "device fault", "crash", "bad return", "hand value", "lse", "invariant",
         "timeout")
LAYERS = ("reference", "hand", "poison", "guards", "invariants")


@dataclass
class Capabilities:
    """What a kernel's signature accepts beyond the core protocol."""
    out: bool = False
    lse: bool = False
    blocks: bool = False

    @classmethod
    def of(cls, kernel):
        try:
            params = inspect.signature(kernel).parameters
        except (TypeError, ValueError):
            return cls()
        return cls(out="out" in params, lse="return_lse" in params,
                   blocks="block_m" in params and "block_n" in params)


@dataclass
class Failure:
    kind: str
    message: str
    where: tuple = None       # (b, h, row, col) of the first bad element
    got: float = None
    expected: float = None
    tol: float = None

    def line(self):
        s = f"{self.kind}"
        if self.where is not None:
            b, h, i, d = self.where
            s += f" at (b={b}, h={h}, row={i}, col={d})"
        if self.got is not None:
            s += f": got {self.got:.7g}, expected {self.expected:.7g}"
            if self.tol is not None:
                s += f" (|err| {abs(self.got - self.expected):.3g} > tol {self.tol:.3g})"
        return s + (f"; {self.message}" if self.message else "")


@dataclass
class Verdict:
    case: object
    target: str
    failures: list = field(default_factory=list)
    max_err: float = 0.0
    tol: float = 0.0
    reduced: list = field(default_factory=list)   # checks that could not run in full, with why
    seconds: float = 0.0

    @property
    def passed(self):
        return not self.failures

    @property
    def kind(self):
        return self.failures[0].kind if self.failures else "pass"

    def repro(self):
        return f"flashcheck verify {self.target} --case \"{self.case.source(why=False)}\""

    def report(self):
        head = f"{'PASS' if self.passed else 'FAIL'} {self.case.name} [{self.target}]"
        if self.passed:
            return head + f" max err {self.max_err:.3g} <= tol {self.tol:.3g}"
        lines = [head] + ["  " + f.line() for f in self.failures]
        if self.case.why:
            lines.append(f"  guards against: {self.case.why}")
        lines.append(f"  repro: {self.repro()}")
        return "\n".join(lines)


class RunFailed(Exception):
    """A failure that ends the judging of this run (raised by call_kernel; carries the Failure)."""

    def __init__(self, failure):
        self.failure = failure


def _eps(dtype):
    return torch.finfo(dtype).eps


def _first_bad(bad):
    """(b, h, row, col) of the first True element of a (B, H, N, D) bool array."""
    return tuple(int(x) for x in np.argwhere(bad)[0])


def classify_exception(exc):
    text = f"{type(exc).__name__}: {exc}"
    name = type(exc).__name__
    if "CompilationError" in name or "CompileTimeAssertionFailure" in name or "compil" in str(exc)[:200].lower():
        return "compile error", text
    if "illegal memory access" in text or "CUDA error" in text or "unspecified launch failure" in text:
        return "device fault", text
    return "exception", text


def _to_numpy(t):
    return t.detach().to("cpu", torch.float64).numpy()


def call_kernel(kernel, case, caps, qkv, device, guard_fill=float("nan")):
    """Run the kernel once on guarded inputs. Returns (inputs, out_tensor, lse_or_None, snapshots);
    raises RunFailed with the failure when the call itself fails."""
    g = inp.make_inputs(case, device, qkv=qkv, guard_fill=guard_fill)
    before = {name: getattr(g, name).flat.clone() for name in ("q", "k", "v", "out")}
    kwargs = {"causal": case.causal}
    if case.scale is not None:
        kwargs["scale"] = case.scale
    if caps.blocks and (case.block_m or case.block_n):
        kwargs.update(block_m=case.block_m, block_n=case.block_n)
    if caps.out:
        kwargs["out"] = g.out.t
    if caps.lse:
        kwargs["return_lse"] = True
    try:
        result = kernel(g.q.t, g.k.t, g.v.t, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # the kernel under test may raise anything
        kind, text = classify_exception(exc)
        raise RunFailed(Failure(kind, text.splitlines()[0][:500] if text else kind))
    lse = None
    if caps.lse:
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise RunFailed(Failure("bad return",
                                    f"return_lse=True must return (out, lse), got {type(result).__name__}"))
        result, lse = result
    B, H, Nq, D = case.B, case.H, case.Nq, case.D
    if not isinstance(result, torch.Tensor):
        raise RunFailed(Failure("bad return", f"expected a tensor, got {type(result).__name__}"))
    if tuple(result.shape) != (B, H, Nq, D) or result.dtype != case.torch_dtype \
            or result.device.type != torch.device(device).type:
        raise RunFailed(Failure("bad return", f"expected {(B, H, Nq, D)} {case.torch_dtype} on {device}, got "
                                               f"{tuple(result.shape)} {result.dtype} on {result.device}"))
    if lse is not None:
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, Nq):
            raise RunFailed(Failure("bad return", f"lse must be a ({B}, {H}, {Nq}) tensor, got "
                                                   f"{getattr(lse, 'shape', type(lse).__name__)}"))
    return g, result, lse, before


def _check_memory(g, result, before, caps):
    """Guards and poison: inputs untouched, nothing written outside the output, every output written."""
    for name in ("q", "k", "v"):
        gt = getattr(g, name)
        changed = torch.nonzero(gt.changed(before[name])).flatten()
        if len(changed):
            inside = bool(gt.inside[changed[0]])
            raise RunFailed(Failure("input written" if inside else "out-of-bounds write",
                                     f"{name} buffer changed at {len(changed)} element(s), first flat index "
                                     f"{int(changed[0])} ({'inside' if inside else 'outside'} the {name} view)"))
    if caps.out:
        stray = g.out.outside_changed(before["out"])
        if len(stray):
            raise RunFailed(Failure("out-of-bounds write",
                                     f"{len(stray)} element(s) outside the output view changed, first flat index "
                                     f"{int(stray[0])} of the guarded output buffer"))
        if result.data_ptr() != g.out.t.data_ptr() or result.stride() != g.out.t.stride():
            if not torch.equal(inp.int_view(result), inp.int_view(g.out.t)):
                raise RunFailed(Failure("bad return", "out= was given but the returned tensor is neither out nor "
                                                       "equal to it"))
    unwritten = inp.is_poison(result)
    if bool(unwritten.any()):
        first = tuple(int(x) for x in torch.nonzero(unwritten)[0])
        raise RunFailed(Failure("unwritten", f"{int(unwritten.sum())} output element(s) never written",
                                where=first))


@dataclass
class _Expect:
    """The reference answer of one case and the tolerances derived for it."""
    out: np.ndarray
    lse: np.ndarray
    tol: float
    tol_lse: float


def expectation(case, qkv, device):
    """float64 reference + tolerance derived from PyTorch's error in the case's dtype (same inputs)."""
    q, k, v = qkv
    qn, kn, vn = (_to_numpy(t) for t in qkv)
    ref, ref_lse = numpy_ref.attention(qn, kn, vn, case.causal, case.scale)
    with torch_ref.no_tf32():
        base, base_lse = torch_ref.attention(q.to(device), k.to(device), v.to(device), case.causal, case.scale)
    finite = np.isfinite(ref)
    err = np.abs(_to_numpy(base) - ref)[finite]
    base_err = float(err.max()) if err.size and np.isfinite(err).all() else 0.0
    lfin = np.isfinite(ref_lse)
    lerr = np.abs(_to_numpy(base_lse)[lfin] - ref_lse[lfin])
    base_lerr = float(lerr.max()) if lerr.size and np.isfinite(lerr).all() else 0.0
    vmax = float(np.nanmax(np.abs(vn))) if vn.size and not np.isnan(vn).all() else 1.0
    eps = _eps(case.torch_dtype)
    omax = float(np.abs(ref[finite]).max()) if finite.any() else 0.0
    # The floor, three terms. (a) The output's own rounding to its dtype: eps * max|out|. (b) fp32
    # accumulation: a kernel sums D products per score and Nk terms per output in fp32, in whatever order its
    # tiles dictate, and a sum of n terms carries about sqrt(n) roundings (Higham & Mary's probabilistic
    # bound); an output moves by at most 2 max|V| per unit of score error. PyTorch's own error (cuBLAS,
    # blocked and split sums) can be well below a correct tiled kernel's in fp32, which (b) covers; tf32
    # (2^-11 per operand) stays far above it. (c) Large scores: an fp32 score cannot be closer than about
    # eps x its largest partial sum, bounded by scale * sum_d |q_d k_d|; with raw scores of 1e4 that is 1e-4
    # and more, whatever the kernel does.
    accumulate = np.sqrt(case.D + case.Nk) * FP32_EPS * vmax
    scale = case.scale if case.scale is not None else 1.0 / np.sqrt(case.D)
    qa, ka = np.abs(qn), np.abs(kn)
    smax = abs(scale) * float(np.nanmax(np.einsum("bhid,bhjd->bhij", qa, ka))) if qa.size and ka.size else 0.0
    smax = smax if np.isfinite(smax) else 0.0
    tol = FACTOR * base_err + eps * max(omax, 1.0) + accumulate + 2 * vmax * FP32_EPS * smax
    lmax = float(np.abs(ref_lse[lfin]).max()) if lfin.any() else 1.0
    tol_lse = (FACTOR * base_lerr + eps * max(lmax, 1.0) + np.sqrt(case.D + case.Nk) * FP32_EPS * max(lmax, 1.0)
               + FP32_EPS * smax)
    return _Expect(ref, ref_lse, tol, tol_lse)


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
    if heads is not None and failure.where is not None:
        s = failure.where[0]
        failure.where = (int(heads[0][s]), int(heads[1][s])) + tuple(failure.where[2:])
    return failure


def compare(got, exp, tol, what="mismatch"):
    """Elementwise check of got against exp (float64 arrays): NaN where exp is NaN, non-finite where exp is
    finite, |got - exp| <= tol elsewhere. Returns (failure or None, max error)."""
    nan_exp = np.isnan(exp)
    finite = np.isfinite(exp)
    bad_nan = nan_exp & ~np.isnan(got)
    if bad_nan.any():
        w = _first_bad(bad_nan)
        return Failure(what, "expected NaN (the input holds NaN)", where=w, got=float(got[w]),
                       expected=float("nan")), float("inf")
    nonfinite = finite & ~np.isfinite(got)
    if nonfinite.any():
        w = _first_bad(nonfinite)
        return Failure("NaN", f"{int(nonfinite.sum())} non-finite output element(s) where the reference is "
                              f"finite", where=w, got=float(got[w]), expected=float(exp[w])), float("inf")
    err = np.where(finite, np.abs(got - np.where(finite, exp, 0)), 0.0)
    inf_mismatch = ~finite & ~nan_exp & (got != exp)
    if inf_mismatch.any():
        w = _first_bad(inf_mismatch)
        return Failure(what, "", where=w, got=float(got[w]), expected=float(exp[w])), float("inf")
    max_err = float(err.max()) if err.size else 0.0
    bad = err > tol
    if bad.any():
        w = _first_bad(bad)
        return Failure(what, f"{int(bad.sum())} element(s) out of tolerance, max err/tol "
                             f"{max_err / tol if tol else float('inf'):.3g}",
                       where=w, got=float(got[w]), expected=float(exp[w]), tol=tol), max_err
    return None, max_err


def _hand_value(case, qkv):
    """The case's hand-computed answer as a (B, H, Nq, D) float64 array, or None."""
    if case.expected is None:
        return None
    v = _to_numpy(qkv[2])
    shape = (case.B, case.H, case.Nq, case.D)
    if case.expected == "mean_v":
        return np.broadcast_to(v.mean(axis=2, keepdims=True), shape)
    if case.expected == "v_row0":
        return np.broadcast_to(v[:, :, :1, :], shape)
    return np.broadcast_to(np.asarray(case.expected, dtype=np.float64), shape)


def _lse_check(lse, expect, heads):
    got = _to_numpy(_select(lse, heads))
    fail, _ = compare(got[..., None], expect.lse[..., None], expect.tol_lse, what="lse")
    if fail is not None:
        fail.kind = "lse"
        fail.message = "log-sum-exp " + fail.message
    return fail


def _invariants(kernel, case, caps, qkv, out, device, expect):
    """Metamorphic checks that need no reference. Returns a Failure or None."""
    q, k, v = qkv
    tol = 2 * expect.tol
    sees_key = np.isfinite(expect.lse)[..., None]           # (B, H, Nq, 1)

    def run(qkv2):
        _, res, _, _ = call_kernel(kernel, case, caps, qkv2, device)
        return _to_numpy(res)

    def check(name, got, want, mask=None, slack=1.0):
        if mask is not None:
            want = np.where(mask, want, got)
        fail, _ = compare(got, want, tol * slack, what="invariant")
        if fail is not None:
            fail.kind = "invariant"
            fail.message = f"{name}: {fail.message}"
        return fail

    # softmax rows sum to 1: V = 1 gives 1 wherever a row sees a key (0 where it sees none)
    ones = torch.ones_like(v)
    want = np.broadcast_to(np.where(sees_key, 1.0, 0.0), out.shape)
    fail = check("softmax rows sum to 1 (V = 1 must give 1)", run((q, k, ones)), want)
    if fail:
        return fail
    # affine in V: 2V - 1 gives 2 out - 1 on rows that see a key
    fail = check("output affine in V (2V - 1 must give 2 out - 1)", run((q, k, 2 * v - 1)),
                 np.where(sees_key, 2 * out - 1, 0.0), slack=2.0)   # both sides carry the kernel's error
    if fail:
        return fail
    if not case.causal and case.Nk > 1:
        g = torch.Generator().manual_seed(case.seed + 1)
        perm = torch.randperm(case.Nk, generator=g)
        fail = check("permuting keys/values jointly must not change the output",
                     run((q, k[:, :, perm], v[:, :, perm])), out)
        if fail:
            return fail
    if case.causal:
        r = case.Nq // 2
        first_hidden = r + case.Nk - case.Nq + 1               # keys row r (and all rows above it) cannot see
        if 0 < first_hidden < case.Nk:
            k2, v2 = k.clone(), v.clone()
            g = torch.Generator().manual_seed(case.seed + 2)
            k2[:, :, first_hidden:] = (torch.randn(k2[:, :, first_hidden:].shape, generator=g) * 3).to(k.dtype)
            v2[:, :, first_hidden:] = (torch.randn(v2[:, :, first_hidden:].shape, generator=g) * 100).to(v.dtype)
            rows = np.zeros(out.shape, dtype=bool)
            rows[:, :, :r + 1] = True
            fail = check(f"causal rows 0..{r} must ignore keys >= {first_hidden}", run((q, k2, v2)), out, rows)
            if fail:
                return fail
    return None


def judge(kernel, case, *, device=None, target="kernel", caps=None, layers=LAYERS):
    """Judge one run of `kernel` on `case`. Returns a Verdict (passed, or the failures found)."""
    if case.sample_heads:
        with _one_huge_case_at_a_time():
            return _judge(kernel, case, device, target, caps, layers)
    return _judge(kernel, case, device, target, caps, layers)


@contextlib.contextmanager
def _one_huge_case_at_a_time():
    """Huge cases take tens of GB of device memory: under pytest-xdist (or several verify runs) on one
    machine, judge them one at a time, across processes (an advisory lock on a file in the temp dir)."""
    import fcntl

    with open(os.path.join(tempfile.gettempdir(), "flashcheck-huge-case.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()          # hand the tens of GB back to the other processes
            fcntl.flock(lock, fcntl.LOCK_UN)


def _judge(kernel, case, device, target, caps, layers):
    from flashcheck.cases.backend import device as active_device

    device = device or active_device()
    caps = caps or Capabilities.of(kernel)
    verdict = Verdict(case, target)
    if not caps.out:
        verdict.reduced.append("no out=: output guard not checked; unwritten check relies on reused memory")
    t0 = time.perf_counter()
    qkv = inp.values(case, device)
    heads = _heads(case)
    try:
        expect = expectation(case, tuple(_select(t, heads) for t in qkv), device)
        verdict.tol = expect.tol
        if not caps.out:
            _prepoison(case, device)
        g, result, lse, before = call_kernel(kernel, case, caps, qkv, device)
        if "guards" in layers or "poison" in layers:
            _check_memory(g, result, before, caps)
        got = _to_numpy(_select(result, heads))
        del g, before
        if "reference" in layers:
            fail, verdict.max_err = compare(got, expect.out, expect.tol)
            if fail is not None and fail.kind == "NaN":
                fail = _diagnose_nan(kernel, case, caps, qkv, device, fail, heads)
            if fail is not None:
                raise RunFailed(_unselect(fail, heads))
            if lse is not None:
                fail = _lse_check(lse, expect, heads)
                if fail is not None:
                    raise RunFailed(_unselect(fail, heads))
        hand = _hand_value(case, qkv)
        if "hand" in layers and hand is not None and heads is None:
            fail, _ = compare(got, hand, 0.0 if case.exact else expect.tol, what="hand value")
            if fail is not None:
                fail.kind = "hand value"
                raise RunFailed(fail)
        if "invariants" in layers and case.data not in ("nan_input", "large") and heads is None:
            fail = _invariants(kernel, case, caps, qkv, _to_numpy(result), device, expect)
            if fail is not None:
                raise RunFailed(fail)
    except RunFailed as stop:
        verdict.failures.append(stop.failure)
    verdict.seconds = time.perf_counter() - t0
    return verdict


def _diagnose_nan(kernel, case, caps, qkv, device, fail, heads):
    """A NaN where the reference is finite: re-run with zero-filled guard bands. If the NaN goes away it
    came from memory outside the inputs: an out-of-bounds (or wrong-stride) read."""
    try:
        _, res, _, _ = call_kernel(kernel, case, caps, qkv, device, guard_fill=0.0)
    except RunFailed:
        return fail
    if np.isfinite(_to_numpy(_select(res, heads))[fail.where]):
        fail.kind = "out-of-bounds read"
        fail.message = ("NaN from the NaN guard bands (finite when the guards hold 0): a read outside q, k or "
                        "v, or with a wrong stride")
    return fail


def _prepoison(case, device):
    """Without out=, fill memory the kernel's own output allocation is likely to reuse with the poison
    pattern (the caching allocator hands back a freed block of the same size)."""
    dt = case.torch_dtype
    n = case.B * case.H * case.Nq * case.D
    if n == 0:
        return
    block = torch.empty(n, dtype=dt, device=device)
    inp.int_view(block).fill_(inp.poison_bits(dt))
    del block
