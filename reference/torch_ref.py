"""Attention in PyTorch.

attention(): in any dtype, computed as a plain framework user would (scores and softmax in the input dtype,
no upcast; no_tf32() for fp32): one of the independent correct formulations the tolerance is tested against.

softmax_parts(): numpy_ref.softmax_parts in float64 torch, on the inputs' device: the same definition (one
reference.problem.Problem), so that the oracle's reference and tolerance run where the kernel does (on a GPU,
large cases cost milliseconds instead of seconds of host time). tests/test_reference.py holds it to numpy_ref.
"""
import math

import torch

from flashcheck.reference.numpy_ref import Softmax
from flashcheck.reference.problem import plain


def _problem(q, k, v, causal, scale, align, problem):
    return problem if problem is not None else plain(tuple(q.shape), tuple(k.shape), tuple(v.shape), causal, scale,
                                                     align)


def expand_kv(t, problem):
    """k or v (B, Hkv, N, X) as (B, Hq, N, X): the kv head each query head reads."""
    if problem.Hkv == problem.Hq and problem.head_map == "grouped":
        return t
    return t[:, torch.as_tensor(problem.kv_heads(), device=t.device)]


def transform(s, problem):
    """Scaled scores (B, Hq, Nq, Nk) -> the problem's scores: softcapped, then ALiBi-biased (no masks)."""
    if problem.softcap is not None:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    bias = problem.bias()
    if bias is not None:
        s = s + torch.as_tensor(bias, device=s.device, dtype=s.dtype)
    return s


def attention(q, k, v, causal=False, scale=None, upcast=False, problem=None):
    """q: (B, Hq, Nq, D), k: (B, Hkv, Nk, D), v: (B, Hkv, Nk, Dv). Returns (out, lse); out in q's dtype (float64
    if upcast), lse float32 (float64 for float64 inputs or upcast). causal is bottom-right aligned; rows that see
    no key give 0, -inf. problem: a Problem with the optional features (window, softcap, ALiBi, GQA)."""
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    pb = _problem(q, k, v, causal, scale, "bottom-right", problem)
    k, v = expand_kv(k, pb), expand_kv(v, pb)
    s = transform(torch.matmul(q, k.transpose(-1, -2)) * pb.scale, pb)
    seen = torch.as_tensor(pb.visible(), device=q.device)
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s.float() if s.element_size() < 4 else s, dim=-1)   # lse is float32 or wider
    p = torch.softmax(s, dim=-1)
    out = torch.matmul(p, v)
    saw_no_key = (lse == float("-inf"))[..., None]   # softmax over all -inf is NaN; the protocol says 0
    return torch.where(saw_no_key, torch.zeros_like(out), out), lse


def softmax_parts(q, k, v, causal=False, scale=None, align="bottom-right", problem=None):
    """numpy_ref.softmax_parts for tensors (B, H, N, D) on one device: a Softmax of tensors there (float64: the
    definition; the backward's same-precision baseline runs it in the inputs' own dtype)."""
    pb = _problem(q, k, v, causal, scale, align, problem)
    k, v = expand_kv(k, pb), expand_kv(v, pb)
    seen = torch.from_numpy(pb.visible()).to(q.device)
    s = torch.where(seen, transform(torch.matmul(q, k.transpose(-1, -2)) * pb.scale, pb), -math.inf)
    m = s.amax(-1, keepdim=True) if s.shape[-1] else torch.full(s.shape[:-1] + (1,), float("-inf"),
                                                                 dtype=s.dtype, device=s.device)
    m = torch.where(torch.isneginf(m), 0.0, m)                # rows that see no key
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    empty = l == 0
    p = e / torch.where(empty, 1.0, l)
    out = torch.matmul(p, v)
    lse = torch.where(empty[..., 0], float("-inf"), m[..., 0] + torch.log(torch.where(empty, 1.0, l)[..., 0]))
    return Softmax(s, seen, p, lse, out)


def backward(q, k, v, dout, problem, magnitudes=False, weight=None, cap_err=0.0):
    """The gradients (dq, dk, dv) of out = attention(q, k, v) under `problem` for an output gradient dout, computed in
    the tensors' own dtype (float64: the definition; a half precision: what a plain framework user's autograd
    would give, scores and softmax in that dtype). q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), dout
    (B, Hq, Nq, Dv). With P the softmax, O the output and t the transformed scores:

        dV = P^T dO   (summed over the query heads that read a kv head, as dK)
        dP = dO V^T,  dt = P * (dP - rowsum(dO * O))   (a row that sees no key: P = 0, so every gradient is 0)
        ds = dt * sech(s / c)^2 with softcap c, i.e. 1 - tanh^2 (ALiBi's bias and the masks have no gradient)
        dQ = scale * ds K,  dK = scale * ds^T Q

    magnitudes=True also returns, for each gradient, the same sums over absolute values (|P| |dO|, ...): what one
    rounding per product and sum scales with, for the tolerance's floor; weight (B, Hq, Nq, 1), if given, multiplies
    P there (a relative error of each row's probabilities); cap_err, the absolute error a kernel's softcap derivative
    may carry (1 - tanh^2 in float32 is 0 where tanh rounds to 1, and 2 eps32 off next to it), added to the derivative
    there unweighted. Rows that see no key are 0, not NaN."""
    pb = problem
    parts = softmax_parts(q, k, v, problem=pb)     # the forward: P and O (0 on rows that see no key)
    p, out = parts.p, parts.out
    kx, vx = expand_kv(k, pb), expand_kv(v, pb)
    dvx = torch.matmul(p.transpose(-1, -2), dout)
    dp = torch.matmul(dout, vx.transpose(-1, -2))
    di = (dout * out).sum(-1, keepdim=True)
    # tanh' as sech^2, to its last bit where tanh saturates: 1 - tanh^2 is 0 there from |x| = 19 in float64 (about
    # 1e-16 under the truth), which gave the bound's floor 0 and failed a correct kernel's 1e-27
    cap = 1.0 if pb.softcap is None else torch.cosh(torch.matmul(q, kx.transpose(-1, -2)) * pb.scale
                                                    / pb.softcap).pow(-2)
    ds = p * (dp - di) * cap
    dqx = torch.matmul(ds, kx) * pb.scale
    dkx = torch.matmul(ds.transpose(-1, -2), q) * pb.scale
    grads = (dqx, _sum_heads(dkx, k, pb), _sum_heads(dvx, v, pb))
    if not magnitudes:
        return grads
    pw = p if weight is None else p * weight
    a_dp = torch.matmul(dout.abs(), vx.abs().transpose(-1, -2))
    a_di = (dout.abs() * out.abs()).sum(-1, keepdim=True)     # what rounding O or the products moves D_i by
    a_ds = (pw * cap.abs() + p * cap_err if torch.is_tensor(cap) else pw * cap) * (a_dp + a_di)
    mags = (torch.matmul(a_ds, kx.abs()) * abs(pb.scale),
            _sum_heads(torch.matmul(a_ds.transpose(-1, -2), q.abs()) * abs(pb.scale), k, pb),
            _sum_heads(torch.matmul(pw.transpose(-1, -2), dout.abs()), v, pb))
    return grads, mags


def _sum_heads(gx, like, problem):
    """A gradient per query head (B, Hq, N, X) summed onto the kv heads the query heads read (B, Hkv, N, X)."""
    if problem.Hkv == problem.Hq and problem.head_map == "grouped":
        return gx
    out = torch.zeros(like.shape[:1] + (problem.Hkv,) + gx.shape[2:], dtype=gx.dtype, device=gx.device)
    return out.index_add_(1, torch.as_tensor(problem.kv_heads(), device=gx.device), gx)


def visible_range(v, problem, chunk=1 << 22):
    """(lo, hi, sees) over the keys each query row sees: lo and hi (B, Hq, Nq, Dv) the min and max of each column
    of v (B, Hq, Nk, Dv, already expanded to the query heads) over those keys, sees (Nq,) bool whether the row sees
    any (where it does not, lo and hi are 0). A row's keys are the interval Problem.bounds gives."""
    B, H, Nk, Dv = v.shape
    lo_i, hi_i = problem.bounds()
    sees = torch.as_tensor(lo_i <= hi_i, device=v.device)
    if not problem.windowed:      # a prefix of the keys: running min and max
        idx = torch.as_tensor(hi_i, device=v.device).clamp(0, max(Nk - 1, 0))
        lo, hi = torch.cummin(v, 2).values[:, :, idx], torch.cummax(v, 2).values[:, :, idx]
    else:                         # any interval: the masked min and max, a block of rows at a time
        seen = torch.as_tensor(problem.visible(), device=v.device)
        lo = torch.zeros((B, H, problem.Nq, Dv), dtype=v.dtype, device=v.device)
        hi = torch.zeros_like(lo)
        rows = max(1, chunk // max(1, B * H * Nk * Dv))
        for i in range(0, problem.Nq, rows):
            m = seen[i:i + rows][None, None, :, :, None]                          # (1, 1, r, Nk, 1)
            x = v[:, :, None]                                                      # (B, H, 1, Nk, Dv)
            lo[:, :, i:i + rows] = torch.where(m, x, math.inf).amin(3)
            hi[:, :, i:i + rows] = torch.where(m, x, -math.inf).amax(3)
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    keep = sees[None, None, :, None]
    return torch.where(keep, lo, zero), torch.where(keep, hi, zero), sees


def no_tf32():
    """Context: fp32 matmuls in full precision while the baseline runs (restores the previous setting)."""
    return _Fp32Matmul()


class _Fp32Matmul:
    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved
