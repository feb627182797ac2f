"""The three-kernel baseline the founding note (docs/design.md) fuses away: scores -> softmax -> weights x V.

  1. scores:  a 2-D grid of (BLOCK_M, BLOCK_N) tiles writes S = scale * Q K^T to an fp32 (Nq, Nk) buffer
              per (batch, query head) in HBM, softcapped and ALiBi-biased where asked (causal- and
              window-masked entries get -inf; GQA: query head h reads kv head h // (Hq // Hkv));
  2. softmax: one program per row loads the whole row (one register tile of next_power_of_2(Nk) lanes),
              subtracts the max, exponentiates, normalises and writes the weights back in place;
  3. PV:      a grid over query blocks loops over key chunks, acc += W_tile . V_tile in fp32 (V's own head
              dim Dv), and stores.

Cost: the O(Nq * Nk) buffer is written, read and rewritten, then read again: several passes over an
N^2 tensor and three launches, where the fused kernel touches only Q, K, V and the output. The softmax
row must fit one tile, so Nk is capped (MAX_ROW); beyond it this module refuses with NotImplementedError
(a limit of this kernel, not bad input: verify reports such a case as unsupported).

The lengths keep their roles: the buffer is (Nq, Nk); the scores grid's second axis, the softmax row
length, the S row stride, the S-column mask and the V row mask use Nk; only the first grid axis and the
output masks use Nq.
"""
import inspect

import torch
import triton
import triton.language as tl

from flashcheck.kernel._protocol import check_attention_inputs, check_features, interpreter_active, jit_unspecialised

MAX_ROW = 16384  # the softmax keeps a whole row of scores in one register tile
MAX_GRID_AXIS = 65535   # CUDA's cap on grid axes 1 and 2, where the scores and P.V grids put B*H


def _unspecialised(fn):
    """triton.jit, without Triton's specialisation on the values of the integer arguments (== 1, divisible by 16)
    and the alignment of the pointers: each distinct combination is a compile of its own, and the catalogue's
    deliberately awkward lengths, strides and views made nearly every case of this baseline three new compiles (an
    H200, the GPU suite cold: 650 of its 1687 compiles were this module's). For the same reason the head dim, the
    GQA group and the features are runtime values here, not constexprs (at f5e349d the suite still compiled 379 of
    this module's kernels, nearly all for those): only the dtypes, the tiles and the padded head-dim block
    specialise. The speed of the baseline matters little."""
    return jit_unspecialised(fn, [p.name for p in inspect.signature(fn).parameters.values()
                                  if p.annotation is inspect.Parameter.empty])


@_unspecialised
def _scores(Q, K, S, scale,
            stride_qz, stride_qh, stride_qm, stride_qk,
            stride_kz, stride_kh, stride_kn, stride_kk,
            stride_sz, stride_sh, stride_sm, stride_sn,
            H, Nq, Nk, window_left, window_right, softcap, Alibi, stride_az, stride_ah,
            head_dim, kv_group, is_causal, has_window_left, has_window_right, has_softcap, has_alibi,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """S[b, h] = the transformed scores of query head h against kv head h // kv_group: scale Q K^T, then the
    softcap, then the ALiBi bias, then -inf where a query does not see the key (causal, the window's sides). The
    has_* and is_causal flags are 0 or 1, branched on at run time."""
    off_b = tl.program_id(2) // H
    off_h = tl.program_id(2) % H
    off_hkv = off_h // kv_group   # GQA/MQA: kv_group consecutive query heads read one kv head
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = Q + off_b.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh \
        + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    k_ptrs = K + off_b.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh \
        + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk
    # Boolean masks combine with &: a + of booleans is an OR and reads out of bounds. guards: mutant
    # unfused_kv_mask_plus
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < head_dim), other=0.0)
    k = tl.load(k_ptrs, mask=(offs_n[:, None] < Nk) & (offs_d[None, :] < head_dim), other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale
    if has_softcap:
        # c tanh(s / c), before the masks and the bias; tanh from exp(-2 |x|), finite for every score. guards:
        # mutant unfused_softcap_textbook_tanh; case softcap_tanh_region
        x = s * (1.0 / softcap)
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        s = softcap * tl.where(x < 0, -t, t)
    if has_alibi:
        # -slope |i + Nk - Nq - j|: the distance from row i's diagonal key (bottom-right). guards: mutant
        # unfused_alibi_top_left; case alibi_batch_heads_cross
        slope = tl.load(Alibi + off_b.to(tl.int64) * stride_az + off_h.to(tl.int64) * stride_ah)
        s = s - slope * tl.abs(offs_m[:, None] + (Nk - Nq) - offs_n[None, :]).to(tl.float32)
    if is_causal:
        # bottom-right: query i sees key j iff j <= i + Nk - Nq. guards: mutant unfused_causal_top_left
        s = tl.where(offs_n[None, :] <= offs_m[:, None] + (Nk - Nq), s, float("-inf"))
    if has_window_right:
        # a window's right side: j <= i + Nk - Nq + right
        s = tl.where(offs_n[None, :] <= offs_m[:, None] + (Nk - Nq) + window_right, s, float("-inf"))
    if has_window_left:
        # and its left side: j >= i + Nk - Nq - left. guards: mutant unfused_window_left_off_by_one
        s = tl.where(offs_n[None, :] >= offs_m[:, None] + (Nk - Nq) - window_left, s, float("-inf"))
    s_ptrs = S + off_b.to(tl.int64) * stride_sz + off_h.to(tl.int64) * stride_sh \
        + offs_m[:, None] * stride_sm + offs_n[None, :] * stride_sn
    tl.store(s_ptrs, s, mask=(offs_m[:, None] < Nq) & (offs_n[None, :] < Nk))


@_unspecialised
def _softmax(S, Lse, stride_sr, stride_sn, Nk, BLOCK: tl.constexpr):
    """One program per row of the (rows, Nk) score buffer, in place."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # The mask compares the COLUMN index with the row length; a flat offset row * Nk + col compared with
    # Nk masks every row but the first. guards: mutant unfused_softmax_flat_mask
    col_ok = cols < Nk
    s = tl.load(S + row * stride_sr + cols * stride_sn, mask=col_ok, other=float("-inf"))
    m = tl.max(s, 0)
    # a row that sees no key (causal, Nq > Nk): shift by 0 so exp gives 0, not NaN; weights 0, lse -inf
    m_shift = tl.where(m == float("-inf"), 0.0, m)
    # the row max subtracted before exp. guards: mutant unfused_softmax_no_max
    p = tl.exp(s - m_shift)
    l = tl.sum(p, 0)
    l_safe = tl.where(l == 0.0, 1.0, l)
    tl.store(S + row * stride_sr + cols * stride_sn, p / l_safe, mask=col_ok)  # guards: unfused_no_normalise
    tl.store(Lse + row, tl.where(l == 0.0, float("-inf"), m_shift + tl.log(l_safe)))


@_unspecialised
def _weights_v(W, V, Out,
               stride_wz, stride_wh, stride_wm, stride_wn,
               stride_vz, stride_vh, stride_vn, stride_vk,
               stride_oz, stride_oh, stride_om, stride_ok,
               H, Nq, Nk, head_dim, kv_group,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Out[b, h] = W[b, h] V[b, h // kv_group]; BLOCK_D and head_dim are V's (and the output's) head dim Dv."""
    off_b = tl.program_id(1) // H
    off_h = tl.program_id(1) % H
    off_hkv = off_h // kv_group   # V at the kv head, not the query head. guards: unfused_gqa_v_reads_query_head
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    w_base = W + off_b.to(tl.int64) * stride_wz + off_h.to(tl.int64) * stride_wh
    v_base = V + off_b.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, Nk, BLOCK_N):
        cols = start_n + offs_n
        w = tl.load(w_base + offs_m[:, None] * stride_wm + cols[None, :] * stride_wn,
                    mask=(offs_m[:, None] < Nq) & (cols[None, :] < Nk), other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vk,
                    mask=(cols[:, None] < Nk) & (offs_d[None, :] < head_dim), other=0.0)
        acc += tl.dot(w.to(v.dtype), v, input_precision=INPUT_PRECISION)
    o_ptrs = Out + off_b.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh \
        + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < head_dim))


def default_blocks(Nq, Nk, D, dtype):
    """(BLOCK_M, BLOCK_N) of the scores and P.V tiles, by rule (the caller may override them): larger on the
    interpreter, which runs one program at a time in NumPy."""
    return (64, 64) if interpreter_active() else (32, 32)


def attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None, out=None,
              return_lse=False, block_m=None, block_n=None):
    """Unfused attention, same protocol as flashcheck.kernel.fused.attention (see its docstring for shapes, dtypes
    and the optional features: GQA/MQA, Dv != D, window, softcap, alibi_slopes).
    Needs an fp32 (B, Hq, Nq, Nk) scratch buffer; Nk is capped at MAX_ROW."""
    B, H, Nq, Nk, D, scale = check_attention_inputs(q, k, v, causal, scale, out, block_m, block_n)
    Hkv, Dv = k.shape[1], v.shape[3]
    window_left, window_right, softcap, slopes = check_features(q, causal, window, softcap, alibi_slopes)
    if Nk > MAX_ROW:
        raise NotImplementedError(f"Nk = {Nk} exceeds the unfused softmax's one-tile row limit {MAX_ROW}; "
                         "use flashcheck.kernel.fused (online softmax) for long rows")
    if B * H > MAX_GRID_AXIS:
        # its grids put B*H on axis 1 or 2, which CUDA caps (the fused kernel folds it into axis 0)
        raise NotImplementedError(f"B*H = {B * H} exceeds the unfused baseline's grid limit of {MAX_GRID_AXIS}; "
                                  "use flashcheck.kernel.fused")
    if out is None:
        out = torch.empty((B, H, Nq, Dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    if B * H * Nq == 0:
        return (out, lse) if return_lse else out
    bm, bn = default_blocks(Nq, Nk, D, q.dtype)
    bm, bn = block_m or bm, block_n or bn
    block_d = max(triton.next_power_of_2(D), 16)  # tl.dot needs >= 16 on the GPU; masks keep D exact
    # causal is the window's right side 0 (check_features folded it in): the causal mask does it, once
    is_causal = causal or window_right == 0
    if is_causal:
        window_right = None
    # absent features are flags of 0 with placeholder values: a None would be a constexpr, so a compile of its own
    alibi, slope_strides = (lse, (0, 0)) if slopes is None else (slopes, slopes.stride())
    # the scores buffer is (Nq, Nk), every tile of it written: the grid's key axis rounds up.
    # guards: mutants unfused_scores_nq_by_nq, unfused_scores_unwritten
    s = torch.empty((B, H, Nq, Nk), dtype=torch.float32, device=q.device)
    _scores[(triton.cdiv(Nq, bm), triton.cdiv(Nk, bn), B * H)](
        q, k, s, scale, *q.stride(), *k.stride(), *s.stride(), H, Nq, Nk,
        window_left or 0, window_right or 0, softcap or 1.0, alibi, *slope_strides,
        D, H // Hkv, int(is_causal), int(window_left is not None), int(window_right is not None),
        int(softcap is not None), int(slopes is not None),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, INPUT_PRECISION="ieee")
    rows = s.view(B * H * Nq, Nk)
    _softmax[(B * H * Nq,)](rows, lse, *rows.stride(), Nk, BLOCK=triton.next_power_of_2(Nk))
    _weights_v[(triton.cdiv(Nq, bm), B * H)](
        s, v, out, *s.stride(), *v.stride(), *out.stride(), H, Nq, Nk, Dv, H // Hkv,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=max(triton.next_power_of_2(Dv), 16), INPUT_PRECISION="ieee")
    return (out, lse) if return_lse else out


# What flashcheck verify should know about this kernel (docs/design.md: declarations): its scores stay in fp32,
# so half-precision cases are judged without the allowance for scores rounded to the input dtype.
attention.flashcheck_declarations = {"fp32_scores": True, "nan_stays_in_row": True}
