"""Attention in PyTorch.

attention(): in any dtype, computed as a plain framework user would (scores and softmax in the input dtype,
no upcast; no_tf32() for fp32): one of the independent correct formulations the tolerance is tested against.

softmax_parts(): numpy_ref.softmax_parts in float64 torch, on the inputs' device: the same definition, so
that the oracle's reference and tolerance run where the kernel does (on a GPU, large cases cost milliseconds
instead of seconds of host time). tests/test_reference.py holds it to numpy_ref, the oracle of record.
"""
import math

import torch

from flashcheck.reference.numpy_ref import Softmax, causal_shift, visible


def attention(q, k, v, causal=False, scale=None, upcast=False):
    """q: (B, H, Nq, D), k, v: (B, H, Nk, D). Returns (out, lse); out in q's dtype (float64 if upcast),
    lse float32 (float64 for float64 inputs or upcast). causal is bottom-right aligned; rows that see no key give 0, -inf."""
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    Nq, Nk = q.shape[2], k.shape[2]
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        rows = torch.arange(Nq, device=q.device)[:, None]
        cols = torch.arange(Nk, device=q.device)[None, :]
        s = s.masked_fill(cols > rows + (Nk - Nq), float("-inf"))
    lse = torch.logsumexp(s.float() if s.element_size() < 4 else s, dim=-1)   # lse is float32 or wider
    p = torch.softmax(s, dim=-1)
    out = torch.matmul(p, v)
    saw_no_key = (lse == float("-inf"))[..., None]   # softmax over all -inf is NaN; the protocol says 0
    return torch.where(saw_no_key, torch.zeros_like(out), out), lse


def softmax_parts(q, k, v, causal=False, scale=None, align="bottom-right"):
    """numpy_ref.softmax_parts for float64 tensors (B, H, N, D) on one device: a Softmax of tensors there."""
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    seen = torch.from_numpy(visible(q.shape[2], k.shape[2], causal, align)).to(q.device)
    s = torch.where(seen, torch.matmul(q, k.transpose(-1, -2)) * scale, -math.inf)
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


def prefix_range(v, Nq, causal, align="bottom-right"):
    """(lo, hi, last) over the keys each of Nq query rows sees, which are a prefix of the keys (all of them when
    not causal): lo and hi (B, H, Nq, D) the min and max of each column of v (B, H, Nk, D) over them, last (Nq,)
    the index of the last key a row sees (below 0: none, and lo, hi there are key 0's)."""
    Nk = v.shape[2]
    if causal:
        last = torch.arange(Nq, device=v.device) + causal_shift(Nq, Nk, align)
    else:
        last = torch.full((Nq,), Nk - 1, device=v.device)
    idx = last.clamp(0, Nk - 1)
    return torch.cummin(v, 2).values[:, :, idx], torch.cummax(v, 2).values[:, :, idx], last


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
