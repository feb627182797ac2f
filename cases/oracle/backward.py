"""The backward layer: for a kernel whose output carries autograd (the protocol's "differentiable in q, k, v"),
the gradients of one case against their float64 definition (reference/torch_ref.py backward).

The kernel is called again without out= on the case's guarded inputs made leaves that require grad (their
strides kept), and autograd is asked for (dq, dk, dv) under an output gradient dO drawn from the case's seed.
Each gradient must have its input's shape, dtype and device, be finite where the definition is, and stay within

    |g - g64| <= F x max |g_base - g64| + |g|w        (each element)

g64 the float64 definition on the same rounded inputs and dO; g_base the same formulas computed in the case's dtype
(scores and softmax in that dtype, as a plain framework user's autograd would give; full fp32 for fp32; in fp16
and bf16 the larger error of two such baselines, the scores rounded after the product and Q scaled in its dtype
before it, the two roundings the forward's tolerance allows), whose largest error is what FlashAttention's own
tests hold their backward to (at most twice it; F leaves room for a kernel that orders its sums differently);
|g|w the definition's sums over absolute values with each row's probabilities weighted by the relative error a
correct kernel may give them:

    w_i = FLOOR (eps + eps32 (sqrt(max(Nq, Nk)) + sqrt(max(D, Dv)))) + 4 kappa_i,
    kappa_i = eps32 (sqrt(D) + 2) max_j |s|_ij

(eps of the case's dtype: one rounding of each product's terms to it, as a kernel that feeds P and dS to its dots
in the dtype makes; eps32 of float32, where a correct kernel computes its scores and accumulates its sums;
|s|_ij = |scale| sum_d |q_id| |k_jd|, the bound of a score's size, so kappa_i is how far fp32 rounding may move
row i's scores, which the softmax turns into a relative error of its probabilities: on large scores a correct fp32
kernel's gradients moved 1e-3 where the baseline's moved 1e-7). A kernel that rounds its scores or sums to fp16 or
bf16 makes the errors the baseline makes, which F x its error covers. Under a softcap the derivative 1 - tanh^2 also
carries an absolute error of its own (CAP_ERR: 0 in float32 where tanh rounds to 1, however far from 0 the true
value is), which the floor adds unweighted. The floor keeps a case whose baseline happens
to be exact (one key: P = 1) from demanding exactness, and long rows and cancelling sums from failing a correct
order of summation. (Up to 2026-12, eps of the dtype stood in the score and length terms too: in bf16 the floor
came to 3 times the largest gradient, and a backward that did not sum dK over a GQA group passed.) Every bug class seen in public backward
kernels (a scale dropped, the rowsum(dO * O) term missing or taken from the wrong rows, dK and dV of a GQA group
not summed, a softcap's derivative left out, the gradients of keys no query sees left unwritten) moves some
gradient by a large part of its magnitude. Keys that no query sees and queries that see no key have gradient 0:
the floor there is 0, so they must be exactly 0.

A case whose scores are so large that float32 cannot resolve them (max kappa_i > 1: scores past about 1e6 at D = 32)
is not judged (said in the report): P is then known only to within a factor e^kappa, and a correct backward that
rebuilds P from the saved float32 lse (FlashAttention-2 and 3, Triton's tutorial) gives gradients off by factors
of 2^(tens) at scores of 1e9 (the lse's last bit is worth 64 there), while the linear bound above would accept
nearly anything from kappa = 1 on.
"""
import dataclasses
import math

import torch

from flashcheck.cases import features
from flashcheck.cases import inputs as inp
from flashcheck.cases.oracle.kinds import Kind, _chain, classify_exception
from flashcheck.cases.oracle.tolerance import reference_device
from flashcheck.cases.oracle.verdict import Failure
from flashcheck.reference import torch_ref

F = 4.0           # times the same-precision baseline's largest error
FLOOR = 4.0       # rounding steps per product and sum, times sqrt of the summed lengths
NAMES = ("dq", "dk", "dv")
UNRESOLVED = 1.0  # kappa (how far float32 may move a score) past which a case's backward is not judged
CAP_ERR = 4 * torch.finfo(torch.float32).eps   # a float32 softcap derivative's absolute error (1 - tanh^2 near 1)


def differentiable(result):
    """Whether a kernel's returned output carries an autograd graph (the inputs required grad)."""
    out = result[0] if isinstance(result, (tuple, list)) else result
    return isinstance(out, torch.Tensor) and out.requires_grad and out.grad_fn is not None


def output_gradient(case, device):
    """dO of a case: standard normal values from the case's seed, rounded to its dtype (contiguous); for
    data="gradient_sums" (cases/inputs.py), c_i (1, ..., 1) with c_i in [1, 2), so that no gradient's sum cancels,
    times 2^-e, Nq / Nk about 2^e, so that dK and dV, sums over every query, stay within fp16's range."""
    g = torch.Generator().manual_seed(case.seed * 7919 + 17)
    shape = (case.B, case.H, case.Nq, case.v_dim)
    dout = torch.randn(shape, generator=g, dtype=torch.float32)
    if case.data == "gradient_sums":
        e = max(0, round(math.log2(max(case.Nq, 1) / max(case.Nk, 1))))
        dout = (1.0 + torch.rand(shape[:-1] + (1,), generator=g)).expand(shape).contiguous() * 2.0 ** -e
    return dout.to(case.torch_dtype).to(device)


def strided(dout, case):
    """The same dO laid out as the case lays out its output (strided, inside NaN guards)."""
    buf = inp.guarded(tuple(dout.shape), dout.dtype, dout.device, inp.tensor_layout(case.layout, "out"),
                      float("nan"))
    buf.t.copy_(dout)
    return buf.t


def leaves(case, qkv, device):
    """q, k, v as the case lays them out (guarded views, strides kept), each a leaf that requires grad."""
    g = inp.make_inputs(case, device, qkv=qkv)
    return tuple(getattr(g, n).t.detach().requires_grad_(True) for n in ("q", "k", "v"))


class Declined(Exception):
    """The kernel's backward declined this input (NotImplementedError, flashcheck.Unsupported): not judged, said."""


def judge(kernel, case, caps, qkv, device, conventions, kwargs, required=False, notes=None):
    """None when the gradients hold, else a Failure (kind GRADIENT, or the kind of what the call raised or returned);
    raises Declined when the backward declines the input, or when this case's output carries no autograd graph and
    the backward is not `required` (declared: --backward yes): a forward-only kernel that falls back on PyTorch for
    some shapes (its probe's) is not failed for the others. kwargs: the keywords the forward call of this case passes
    (protocol_kwargs). notes: a list that receives what was not judged (a layout case's strided dO, when the kernel
    raises on it); with it, a case of a strided layout is judged again with its dO laid out as its output."""
    q, k, v = leaves(case, qkv, device)
    pb = features.problem(case, conventions.causal_align, conventions.head_map)
    where = reference_device(q.device, q.shape, k.shape, v.shape)
    exact = [t.detach().to(where, torch.float64) for t in (q, k, v)]
    kappa = _kappa(pb, *exact[:2])
    most = float(kappa.max()) if kappa.numel() else 0.0
    if most > UNRESOLVED:
        raise Declined(f"scores too large for float32 to resolve (probabilities known only to within a factor "
                       f"e^kappa, kappa > {UNRESOLVED:g}): a correct backward that rebuilds P from the saved float32 "
                       "lse, as FlashAttention's does, has gradients no bound can tell from wrong ones")
    dout = output_gradient(case, device)
    got = _gradients(kernel, case, device, qkv, kwargs, dout, required)
    if isinstance(got, Failure):
        return got
    q, k, v = got[3:]
    got = got[:3]
    # the float64 gradients where the forward's reference is computed (a small GPU case's on the host); the
    # baseline stays where the kernel ran: its rounding is the dtype's there
    want, floors = torch_ref.backward(*exact, dout.to(where, torch.float64), pb, magnitudes=True,
                                      weight=_row_weights(case, pb, *exact[:2], kappa=kappa), cap_err=CAP_ERR)
    with torch_ref.no_tf32():
        rounded = tuple(t.detach() for t in (q, k, v))
        base = [torch_ref.backward(*rounded, dout, pb)]
        if q.dtype != torch.float32:
            base.append(_prescaled_baseline(*rounded, dout, pb))
    fail = _held(got, want, base, floors, case, where)
    if fail is not None or case.layout == "contiguous" or notes is None:
        return fail
    # the same dO strided as the case lays out its output (as a caller's transpose or slice leaves it): a backward
    # that raises on it is said in the report (cuDNN's SDPA backward raised on rows with gaps on an H200, a Triton
    # tutorial backward asserts a contiguous dO); one that gives other gradients, reading dO as if it were
    # contiguous, fails
    again = _gradients(kernel, case, device, qkv, kwargs, strided(dout, case), required)
    if isinstance(again, Failure):
        notes.append(f"backward with a strided dO (the case's output layout) not judged: "
                     f"{again.message.split(': ', 1)[-1][:200]}")
        return None
    fail = _held(again[:3], want, base, floors, case, where)
    if fail is not None:
        fail.message = f"with dO strided as the case lays out its output (contiguous, it held): {fail.message}"
    return fail


def _gradients(kernel, case, device, qkv, kwargs, dout, required):
    """(dq, dk, dv, q, k, v) of one call on fresh leaves under dout, or the Failure of that call; raises Declined."""
    q, k, v = leaves(case, qkv, device)
    try:
        result = kernel(q, k, v, **kwargs)
        result = result[0] if isinstance(result, (tuple, list)) else result
        if not differentiable(result):
            if not required:
                raise Declined("this case's output carries no autograd graph, though the probe's did")
            return Failure(Kind.GRADIENT, "backward: the output of this case carries no autograd graph (called with q, "
                                          "k and v that require grad), and the kernel declares a backward "
                                          "(--backward yes): a caller's backward would raise")
        got = torch.autograd.grad(result, (q, k, v), dout, allow_unused=True)
    except Declined:
        raise
    except Exception as exc:  # noqa: BLE001  (a kernel's backward can raise anything)
        declined = next((e for e in _chain(exc) if isinstance(e, NotImplementedError)), None)
        if declined is not None:
            text = str(declined).strip().splitlines()[0][:300] if str(declined).strip() else type(declined).__name__
            raise Declined(f"the kernel's backward declined the input ({text})") from None
        kind, text = classify_exception(exc)
        if kind == Kind.EXCEPTION:
            kind = Kind.GRADIENT
        return Failure(kind, f"backward raised: {text.splitlines()[0][:400]}")
    # an empty tensor (no queries, or a sequence without keys) has nothing to differentiate: no path to it is right
    got = tuple(torch.zeros_like(x) if g is None and x.numel() == 0 else g for g, x in zip(got, (q, k, v)))
    for name, g, x in zip(NAMES, got, (q, k, v)):
        if g is None:
            return Failure(Kind.GRADIENT, f"backward: no gradient for {name[1:]} (autograd found no path from the "
                                          f"output to it)")
        if g.shape != x.shape or g.dtype != x.dtype or g.device != x.device:
            return Failure(Kind.GRADIENT, f"backward: {name} is {tuple(g.shape)} {g.dtype} on {g.device}, expected "
                                          f"{tuple(x.shape)} {x.dtype} on {x.device}")
    return got + (q, k, v)


def _prescaled_baseline(q, k, v, dout, pb):
    """The same-precision baseline's other recipe: Q scaled in its own dtype before the product, as plain PyTorch
    written matmul(q * scale, k^T) runs it (the forward's tolerance allows both roundings of half-precision scores).
    Its gradient of Q is scale times that of the scaled Q. A bf16 kernel of that recipe (scores in bf16, softmax in
    fp32) landed 4.7 times the other baseline's largest error from dV's definition on large_scores_whole_blocks,
    past F: a false alarm on a correct kernel."""
    dq, dk, dv = torch_ref.backward(q * pb.scale, k, v, dout, dataclasses.replace(pb, scale=1.0))
    return dq * pb.scale, dk, dv


def _held(got, want, bases, floors, case, where):
    """None when every gradient is within its bound (the module docstring; the baseline's error is the largest of
    the baselines'), else the Failure."""
    for i, (name, g, w, floor) in enumerate(zip(NAMES, got, want, floors)):
        g = g.detach().to(where, torch.float64)
        finite = torch.isfinite(w)
        bad = finite & ~torch.isfinite(g)
        if bool(bad.any()):
            return _failure(name, "non-finite gradient element(s) where the definition is finite", bad, g, w, None)
        err = torch.where(finite, (g - w).abs(), 0.0)
        base_err = max(float(torch.where(finite, (b[i].to(where, torch.float64) - w).abs(), 0.0).max())
                       for b in bases) if w.numel() else 0.0
        bound = F * base_err + floor
        over = err > bound
        if bool(over.any()):
            return _failure(name, f"|err| up to {float(err.max()):.3g}, over {F:g} x the {case.dtype} baseline's largest "
                                  f"error {base_err:.3g} plus the rounding floor", over, g, w, bound)
    return None


def _kappa(pb, q, k):
    """kappa_i of the module docstring, (B, Hq, Nq, 1) float64: how far float32 rounding may move row i's scores."""
    eps32 = torch.finfo(torch.float32).eps
    kx = torch_ref.expand_kv(k, pb)
    s_abs = torch.matmul(q.abs(), kx.abs().transpose(-1, -2)) * abs(pb.scale)
    seen = torch.as_tensor(pb.visible(), device=q.device)
    most = torch.where(seen, s_abs, 0.0).amax(-1, keepdim=True) if pb.Nk else s_abs.sum(-1, keepdim=True)
    return eps32 * (pb.D ** 0.5 + 2) * most


def _row_weights(case, pb, q, k, kappa=None):
    """w_i of the module docstring, (B, Hq, Nq, 1) float64."""
    eps, eps32 = torch.finfo(case.torch_dtype).eps, torch.finfo(torch.float32).eps
    kappa = _kappa(pb, q, k) if kappa is None else kappa
    steps = FLOOR * (eps + eps32 * (max(pb.Nq, pb.Nk) ** 0.5 + max(pb.D, pb.Dv) ** 0.5))
    return steps + 4 * kappa


def _failure(name, text, bad, got, want, bound):
    where = tuple(int(x) for x in torch.nonzero(bad)[0])
    n = int(bad.sum())
    tol = None if bound is None else float(bound[where])
    worst = None
    if bound is not None:       # the element furthest past its bound, when the first is not it
        over = torch.where(bad, (got - want).abs() / bound.clamp(min=torch.finfo(torch.float64).tiny), 0.0)
        worst = tuple(int(x) for x in torch.unravel_index(torch.argmax(over), over.shape))
    # dK and dV are K's and V's shape: their element is a kv head's key, not a query head's row
    axes = None if name == "dq" else ("b", "kv_head", "key", "col")
    return Failure(Kind.GRADIENT, f"backward: {name}: {n} element(s) wrong, {text}", where=where,
                   got=float(got[where]), expected=float(want[where]), tol=tol, axes=axes, worst=worst)
