"""A small FlashAttention-style forward kernel in Triton, in the attention protocol of docs/design.md, with a
realistic bug left in on purpose (examples/README.md walks through what `flashcheck verify` says about it):

    flashcheck verify examples/buggy_attention.py:attention

The kernel is the textbook one: one program per block of query rows, an online softmax over key blocks
(running max m, denominator l, accumulator acc, both rescaled by exp(m_old - m_new)), fp32 state, ieee
fp32 dots, masked loads and store, padded head dim. It is right whenever Nq == Nk, which is all that a
self-attention test ever tries.

The bug is the one the note the project comes from (docs/design.md) reports first: the host passes ONE sequence length, read off q, and the
kernel uses it for both roles: query rows (grid, row mask, store) and keys (loop bound, K/V load mask,
score mask, causal offset). With Nq < Nk the keys past Nq are silently ignored (1 query vs keys [1, 1] and
values [5, 10] gives 5, not 7.5); with Nq > Nk the loop reads key rows that do not exist.
"""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _attn_fwd(Q, K, V, Out, scale,
              stride_qb, stride_qh, stride_qn, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_on, stride_od,
              H, N,
              IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < N) & d_ok, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if IS_CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, N)   # no row of this block sees a key past its last row
    else:
        hi = N
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols[:, None] < N) & d_ok
        k = tl.load(K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=kv_mask, other=0.0)
        v = tl.load(V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        valid = cols[None, :] < N
        if IS_CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        c = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * c + tl.sum(p, 1)
        acc = acc * c[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < N) & d_ok)


def attention(q, k, v, *, causal=False, scale=None):
    """q: (B, H, Nq, D); k, v: (B, H, Nk, D); one dtype, one device, any strides. Returns (B, H, Nq, D)."""
    B, H, N, D = q.shape
    if v.shape[-1] != D:
        # a kernel without a value head dim of its own declines it (its output would be sized by D)
        raise NotImplementedError(f"v's head dim {v.shape[-1]} != {D}: Dv != D is not supported")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    BLOCK_M, BLOCK_N = 32, 32
    grid = (triton.cdiv(N, BLOCK_M), B * H)
    _attn_fwd[grid](q, k, v, out, scale, *q.stride(), *k.stride(), *v.stride(), *out.stride(), H, N,
                    IS_CAUSAL=causal, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                    BLOCK_D=max(triton.next_power_of_2(D), 16), HEAD_DIM=D)
    return out
