"""Attention computed in ways the tolerance must accept, and in slightly wrong ways it must reject, for
tests/test_tolerance.py. The correct ones are examples/plain_attention.py's four and this module's two blocked
online softmaxes (Q pre-scaled in its dtype; the scale and max in one fused multiply-add); the wrong ones each make
one small mistake a real kernel makes."""
import math

import torch

from examples.plain_attention import _visible, einsum, in_dtype, matmul_softmax, sdpa_math

LOG2E = 1.4426950408889634


def online_blocked(q, k, v, *, causal=False, scale=None, block_n=16):
    """FlashAttention's numerics: Q pre-scaled by scale * log2(e) in its own dtype (the seed's recipe), fp32
    scores, exp2, the running max, sum and accumulator in fp32, P rounded to the input dtype for P.V."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    qs = (q.float() * (scale * LOG2E)).to(q.dtype).float()
    m = torch.full((B, H, Nq, 1), float("-inf"), device=q.device)
    l = torch.zeros((B, H, Nq, 1), device=q.device)
    acc = torch.zeros((B, H, Nq, D), device=q.device)
    rows = torch.arange(Nq, device=q.device)[:, None]
    for start in range(0, Nk, block_n):
        kb, vb = k[:, :, start:start + block_n].float(), v[:, :, start:start + block_n]
        s = qs @ kb.transpose(-1, -2)
        if causal:
            cols = torch.arange(start, start + kb.shape[2], device=q.device)[None, :]
            s = s.masked_fill(cols > rows + Nk - Nq, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        c = torch.exp2(m - shift)
        p = torch.exp2(s - shift)
        l = l * c + p.sum(-1, keepdim=True)
        acc = acc * c + p.to(q.dtype).float() @ vb.float()
        m = m_new
    return (acc / torch.where(l == 0, torch.ones_like(l), l)).to(q.dtype)


def online_fused_shift(q, k, v, *, causal=False, scale=None, block_n=16):
    """FlashAttention-2/3's numerics as kernel/fused.py has them: fp32 scores, the scale (with log2(e)) and the row
    max applied in one fused multiply-add (emulated: exact in float64, rounded once to fp32), so a row's largest
    weight is 2^d with |d| up to half an ulp of the row max instead of exactly 1; P rounded to the input dtype for
    P.V, the running state in fp32. As the kernel does, everything is computed again with the product rounded on
    its own once some row's shift reaches 2^24 (there the fused form is not exact enough)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    sl2 = torch.tensor(scale * LOG2E, dtype=torch.float32)
    rows = torch.arange(Nq, device=q.device)[:, None]

    def run(exact):
        m = torch.full((B, H, Nq, 1), float("-inf"), device=q.device)
        l = torch.zeros((B, H, Nq, 1), device=q.device)
        acc = torch.zeros((B, H, Nq, D), device=q.device)
        big = torch.zeros((B, H, Nq, 1), dtype=torch.bool, device=q.device)
        for start in range(0, Nk, block_n):
            kb, vb = k[:, :, start:start + block_n].float(), v[:, :, start:start + block_n]
            s = q.float() @ kb.transpose(-1, -2)
            seen = torch.ones_like(s, dtype=torch.bool)
            if causal:
                cols = torch.arange(start, start + kb.shape[2], device=q.device)[None, :]
                seen = seen & (cols <= rows + Nk - Nq)
            scaled = torch.where(seen, s * sl2, float("-inf"))
            m_new = torch.maximum(m, scaled.amax(-1, keepdim=True))
            shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            big = big | (shift.abs() >= 2.0 ** 24)
            if exact:
                e = scaled - shift
            else:
                e = torch.where(seen, (s.double() * float(sl2) - shift.double()).float(), float("-inf"))
            c = torch.exp2(m - shift)
            p = torch.exp2(e)
            l = l * c + p.sum(-1, keepdim=True)
            acc = acc * c + p.to(q.dtype).float() @ vb.float()
            m = m_new
        return acc, l, big

    acc, l, big = run(False)
    if bool(big.any()):
        acc, l, _ = run(True)
    return (acc / torch.where(l == 0, torch.ones_like(l), l)).to(q.dtype)


CORRECT = {"matmul_softmax": matmul_softmax, "einsum": einsum, "sdpa_math": sdpa_math, "in_dtype": in_dtype,
           "online_blocked": online_blocked, "online_fused_shift": online_fused_shift}


def last_key_dropped(q, k, v, *, causal=False, scale=None):
    """An off-by-one in the key loop's bound: the last key is never seen."""
    if k.shape[2] < 2:
        return matmul_softmax(q, k, v, causal=causal, scale=scale)
    Nq = q.shape[2]
    out = matmul_softmax(q, k[:, :, :-1], v[:, :, :-1], causal=False, scale=scale)
    if causal:   # keep bottom-right alignment for the keys that remain
        sees = torch.ones(Nq, k.shape[2] - 1, dtype=torch.bool, device=q.device).tril(k.shape[2] - Nq)
        s = (q.float() @ k[:, :, :-1].float().transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))
        p = torch.softmax(s.masked_fill(~sees, float("-inf")), -1).nan_to_num(0.0)
        out = (p @ v[:, :, :-1].float()).to(q.dtype)
    return out


def natural_log_temperature(q, k, v, *, causal=False, scale=None):
    """exp where exp2 was meant (or the other way round): the softmax at the wrong temperature, by log2(e)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return matmul_softmax(q, k, v, causal=causal, scale=scale * LOG2E)


def softmax_over_queries(q, k, v, *, causal=False, scale=None):
    """The softmax normalised over the wrong axis (the queries, not the keys), masked as the right one: the
    issue-12 complaint was that loose half-precision tolerances let exactly this pass."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    sees = _visible(q.shape[2], k.shape[2], causal, q.device)
    if sees is not None:
        s = s.masked_fill(~sees, float("-inf"))
    p = torch.softmax(s, dim=-2).nan_to_num(0.0)
    return (p @ v.double()).to(q.dtype)


WRONG = {"last_key_dropped": last_key_dropped, "natural_log_temperature": natural_log_temperature,
         "softmax_over_queries": softmax_over_queries}
