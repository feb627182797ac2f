"""Attention written the obvious way in PyTorch, four ways. The first three are correct kernels that flashcheck
must accept with its default settings, in every dtype and layout (tests/test_tolerance.py runs them through
hundreds of generated cases; a false alarm on any of them is a defect of flashcheck's tolerance):

    flashcheck verify examples/plain_attention.py:matmul_softmax    # fp32 matmul, softmax, matmul
    flashcheck verify examples/plain_attention.py:einsum            # the same with einsum and an explicit max
    flashcheck verify examples/plain_attention.py:sdpa_math         # torch's SDPA, math backend, in fp32
    flashcheck verify examples/plain_attention.py:in_dtype          # no upcast: exit 1, fp16's range (below)

in_dtype rounds its scores to fp16/bf16, which the tolerance allows everywhere (tests/test_tolerance.py holds it
to that), but in fp16 its raw scores overflow past 65504 on inputs the protocol admits (any finite values): verify
rejects it in fp16 on the entries that score past that (huge_scores, huge_scores_negative_scale,
masked_keys_below_finite_masks) and on generated cases of huge magnitude, where it answers 0 or NaN for rows whose
answer is a value row. A wrong answer on legal inputs, found, not a false alarm.

Each follows the protocol: q (B, H, Nq, D), k and v (B, H, Nk, D), any strides, scale defaulting to
1/sqrt(D), causal aligned bottom-right (query i sees key j iff j <= i + Nk - Nq), a row that sees no key
gives 0. They materialise the (Nq, Nk) scores, so their memory grows like Nq x Nk (flashcheck verify --fused
fails them on the GPU, as it should).
"""
import math

import torch
import torch.nn.functional as F


def _visible(Nq, Nk, causal, device):
    """(Nq, Nk) bool: which keys each query sees (bottom-right causal), or None for all of them."""
    if not causal:
        return None
    return torch.ones(Nq, Nk, dtype=torch.bool, device=device).tril(Nk - Nq)


def _empty_rows_to_zero(out, sees):
    """A row that sees no key is a softmax over nothing (NaN); the protocol says 0."""
    return out if sees is None else out.masked_fill(~sees.any(-1, keepdim=True), 0.0)


def matmul_softmax(q, k, v, *, causal=False, scale=None):
    """Scores, softmax and P.V in fp32, whatever the input dtype; the output in q's dtype."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    sees = _visible(q.shape[-2], k.shape[-2], causal, q.device)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if sees is not None:
        s = s.masked_fill(~sees, float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = torch.matmul(torch.nan_to_num(p, nan=0.0), v.float())
    return _empty_rows_to_zero(out, sees).to(q.dtype)


def einsum(q, k, v, *, causal=False, scale=None):
    """The same with einsum, an explicit row max and an explicit normalisation."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    sees = _visible(q.shape[-2], k.shape[-2], causal, q.device)
    s = torch.einsum("bhid,bhjd->bhij", q.float(), k.float()) * scale
    if sees is not None:
        s = s.masked_fill(~sees, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    e = torch.exp(s - m)
    out = torch.einsum("bhij,bhjd->bhid", e, v.float()) / e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    return _empty_rows_to_zero(out, sees).to(q.dtype)


def sdpa_math(q, k, v, *, causal=False, scale=None):
    """torch's scaled_dot_product_attention, math backend, on fp32 copies (the bottom-right mask explicit:
    SDPA's is_causal is top-left)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sees = _visible(q.shape[-2], k.shape[-2], causal, q.device)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=sees, scale=scale)
    return _empty_rows_to_zero(torch.nan_to_num(out), sees).to(q.dtype)


def in_dtype(q, k, v, *, causal=False, scale=None):
    """No upcast: the scores, the softmax and P.V in q's own dtype, as plain PyTorch code does. In fp16 and bf16
    its scores are rounded to the dtype, which flashcheck allows (unless a kernel declares --fp32-scores)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    sees = _visible(q.shape[-2], k.shape[-2], causal, q.device)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if sees is not None:
        s = s.masked_fill(~sees, float("-inf"))
    out = torch.matmul(torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0), v)
    return _empty_rows_to_zero(out, sees)
