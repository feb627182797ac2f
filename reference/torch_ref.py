"""Attention in PyTorch in any dtype: the same-precision baseline. Its error against the float64
reference, on the same inputs, sets the tolerance for a kernel working in that dtype (the rule of the
FlashAttention tests: a kernel may be at most about twice as wrong as PyTorch in the same precision).

Computed as a plain framework user would: scores and softmax in the input dtype, no upcast, tf32 off.
"""
import math

import torch


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
