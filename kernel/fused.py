"""FlashAttention-2 forward pass, fused in one Triton kernel.

The story, as the founding note tells it (docs/design.md, "The seed's requirements"):
  * one program owns BLOCK_M query rows of one (batch, head); programs never talk to each other;
  * Q is loaded once, before the loop (and scaled in the fp32 scores, not in its own dtype: see below);
  * the program streams over K/V in blocks of BLOCK_N keys, keeping a running softmax state in fp32
    registers: m (row max), l (row denominator), acc (unnormalised output);
  * each step rescales BOTH l and acc by c = exp(m_old - m_new) <= 1, then adds the new block;
  * after the loop it divides by l once and stores.
The N x N score matrix never exists in memory: HBM traffic is Q, K, V and the output.

On Hopper and later, fp16/bf16 K and V in 16-byte-aligned layouts load through tensor descriptors (TMA), which
zero-fill rows past Nk and columns past D; every other input takes the pointer path with explicit load masks
(tma_eligible). The score mask, the online softmax and everything after the loads are the same on both paths.

Two lengths, never one N: Nq (query rows: grid, row mask, store) and Nk (keys: loop count, K/V load mask,
score mask). Every comment "guards:" names the catalogue case (cases/catalogue.py) or the mutant of the
bug corpus (cases/corpus/mutants.py) that proves the line is needed.

The protocol's optional features (docs/design.md, protocol v3), each behind a constexpr of its own so that a call
without it compiles to the kernel without it: GQA/MQA (KV_GROUP query heads read one kv head), V's own head dim
(BLOCK_DV, HEAD_DIM_V), a window of keys around the diagonal (WINDOW_LEFT, WINDOW_RIGHT; causal is its right
side 0), the softcap (SOFTCAP) and ALiBi (HAS_ALIBI) transforms of the scores.

Cost: reads B*Hq*Nq*D + B*Hkv*Nk*(D + Dv) elements, writes B*Hq*Nq*Dv (+ B*Hq*Nq for the log-sum-exp);
2*B*Hq*Nq*Nk*(D + Dv) flops (half that when causal and Nq == Nk; windows visit fewer key blocks).
"""
import inspect

import torch
import triton
import triton.language as tl

from flashcheck.kernel._protocol import (check_attention_inputs, check_features, check_launch, check_offsets,
                                        check_pages, interpreter_active, jit_unspecialised)

try:
    from triton.language.extra import libdevice
except ImportError:  # a triton without the backend-neutral libdevice module: the CUDA one has mul_rn too
    from triton.language.extra.cuda import libdevice

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # triton < 3.4: K and V always load through pointers
    TensorDescriptor = None

from triton.runtime.errors import OutOfResources

LOG2E = 1.4426950408889634  # exp(x) == exp2(x * log2(e)); exp2 is the cheaper instruction
# The integer arguments that are a call's lengths and counts, not a tensor's layout (see _lengths_at_run_time_jit).
RUNTIME_INTS = ("H", "Nq", "Nk", "splits", "keys_per_split", "window_left", "window_right", "page_size",
                "stride_tb", "stride_az", "stride_ah", "stride_lz", "stride_lh")
_STAGES_THAT_FIT = {}       # launch configuration -> the num_stages that compiled within shared memory


def _lengths_at_run_time_jit(fn):
    """triton.jit, except that the arguments named in RUNTIME_INTS are plain runtime integers to the compiler
    (jit_unspecialised). Specialised on == 1 and on divisibility by 16, the catalogue's deliberately awkward lengths
    (and the lse strides, which follow Nq), head counts and decode splits made many cases a compile of their own.
    None of these feeds a vector access: loads and stores vectorise along the head dim, through the pointers'
    alignment and the q/k/v/out strides, which stay specialised. H200, the GPU suite cold, paired on one machine:
    this module's compiles 774 -> 657 (1523 -> 1453 s of CPU; the ones that went were the cheap ones); the kernel
    against itself before, interleaved in one process, 12 shapes (dense, causal, decode split and not, GQA, window,
    softcap, fp32, varlen): median time ratio 0.993 (0.81 to 1.04)."""
    return jit_unspecialised(fn, [name for name in inspect.signature(fn).parameters if name in RUNTIME_INTS])


@triton.jit
def _load_kv(ptrs, desc, off_b, off_hkv, start_n, kv_rows, COL: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """One block of K or V (kv head off_hkv): key rows [start_n, start_n + BLOCK_N) (kv_rows: which are < Nk) and
    head-dim columns [COL, COL + BLOCK_D) of HEAD_DIM (D for K, Dv for V), whose first column ptrs points at (or
    through the tensor descriptor desc)."""
    offs_d = COL + tl.arange(0, BLOCK_D)
    # K/V rows beyond Nk load as 0, never -inf: a -inf in K makes the dot NaN through 0 * inf.
    # The two conditions are combined with &, not +: a sum of booleans is an OR and reads out of bounds.
    # guards: mutants kv_other_neg_inf, kv_mask_plus, kv_mask_off_by_one, kv_mask_nq, unmasked_tail_block,
    # inner_lo_not_applied; cases partial_last_key_block, head_dim_17
    if USE_TMA:
        # Tensor descriptors (TMA): the hardware zero-fills rows past Nk and columns past HEAD_DIM, so no
        # block needs a load mask (the score mask still applies). guards: mutants
        # tma_coords_batch_head_swapped, tma_desc_rows_nq; cases half_descriptor_layout, half_descriptor_nq_gt_nk
        x = desc.load([off_b, off_hkv, start_n, COL]).reshape(BLOCK_N, BLOCK_D)
    elif MASKED:
        kv_mask = kv_rows & (offs_d[None, :] < HEAD_DIM)
        x = tl.load(ptrs, mask=kv_mask, other=0.0)
    elif COL + BLOCK_D <= HEAD_DIM:
        x = tl.load(ptrs)  # a whole block of keys, no padded columns: nothing to mask
    else:
        # padded head-dim columns: COL shifts the mask to this block's columns. guards: mutant
        # d_split_column_mask_unshifted; case head_dim_111
        x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return x


@triton.jit
def _q_tile(q, Q_IN_LOOP: tl.constexpr):
    """The queries' tile for one key block: q itself, or with Q_IN_LOOP, read again through the pointer tile q,
    whose pointers never leave the tensor (see _attn_fwd), so the load needs no mask."""
    if Q_IN_LOOP:
        x = tl.load(q)
    else:
        x = q
    return x


@triton.jit
def _mma(a, b, acc, INPUT_PRECISION: tl.constexpr):
    """a @ b (+ acc, None for none): tl.dot at input_precision; with INPUT_PRECISION "fp64" (fp32 "ieee" where
    dot_precision says so) the fp32 operands widened to fp64 on the fp64 tensor cores, whose products are exact
    and whose sums carry 53 bits, and the result (and acc) in fp64."""
    if INPUT_PRECISION == "fp64":
        x = tl.dot(a.to(tl.float64), b.to(tl.float64), acc, out_dtype=tl.float64)
    else:
        x = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return x


@triton.jit
def _times_scale(qk, qk_scale, EXACT: tl.constexpr, MUL_RN: tl.constexpr):
    """qk * qk_scale; in the EXACT pass rounded on its own (mul.rn), so that no later subtraction of the row max
    can fuse with it into one multiply-add (see _attn_fwd_keys). The interpreter never fuses (MUL_RN False)."""
    if EXACT and MUL_RN:
        x = libdevice.mul_rn(qk, qk_scale)
    else:
        x = qk * qk_scale
    return x


@triton.jit
def _softcap(s, cap):
    """cap * tanh(s / cap), for scores s in the loop's log2 units (cap = c * log2(e): c tanh(x / c) in natural
    units, scaled). tanh from e = exp(-2 |x|), which lies in (0, 1]: finite for every x, where the textbook
    (e^2x - 1) / (e^2x + 1) overflows to inf / inf = NaN from |x| ~ 44 on; exactly odd; near 0 the absolute
    error is a few ulps of 1, a few ulps of cap in the score, as the tolerance allows. Triton has no tl.tanh on
    every version (and libdevice's is slower). guards: mutants softcap_textbook_tanh, softcap_ratio_times_tanh"""
    x = s * (1.0 / cap)
    e = tl.math.exp2(-2.8853900817779268 * tl.abs(x))   # exp(-2 |x|) = exp2(-2 log2(e) |x|)
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(x < 0, -t, t)


@triton.jit
def _paged_rows(k_cols, v_cols, table, rows, Nk, page_size, stride_kp, stride_kn, stride_vp, stride_vn):
    """The K and V pointer tiles of key rows `rows` of a paged cache: key j is slot j % page_size of page
    table[j // page_size], the page's and the slot's strides apart, whatever the page size (a block may cross pages:
    every row looks up its own). The table is read only for keys < Nk: its entries past the sequence's pages may
    point anywhere, and its row may end before the block does (an unmasked read there changes no output, only
    `flashcheck sanitize` sees it). guards: mutants paged_pages_assumed_contiguous, paged_slot_from_block; cases
    paged_odd_page_size, paged_decode_page_16"""
    page = tl.load(table + rows // page_size, mask=rows < Nk, other=0).to(tl.int64)
    slot = (rows % page_size).to(tl.int64)
    return (k_cols + (page * stride_kp + slot * stride_kn)[:, None],
            v_cols + (page * stride_vp + slot * stride_vn)[:, None])


@triton.jit
def _attn_fwd_inner(acc, acc1, l_i, m_i, big, q, q1, k_ptrs, v_ptrs, stride_kn, stride_vn, stride_kk, stride_vk,
                    desc_k, desc_v, table, page_size, stride_kp, stride_vp, off_b, off_hkv, qk_scale, softcap, alibi, start_m, lo, hi, Nk, causal_shift,
                    left_shift, right_shift,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_DV: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                    MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, WINDOW_LEFT: tl.constexpr,
                    WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                    NEGATIVE_SCALE: tl.constexpr, INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
                    D_SPLIT: tl.constexpr, Q_IN_LOOP: tl.constexpr, EXACT: tl.constexpr, MUL_RN: tl.constexpr,
                    PAGED: tl.constexpr):
    """Fold key blocks [lo, hi) into the running state (m_i, l_i, acc; with D_SPLIT, acc1 holds the output's
    second half of head-dim columns and q1 the queries' second half). With Q_IN_LOOP, q and q1 are pointer tiles
    that every key block reads again (see attention). big marks the rows whose row max has reached the
    magnitude where the fused pass is no longer exact enough (see _attn_fwd_keys); EXACT is the pass that
    replaces them.

    Row i sees key j iff j < Nk and, where the constexprs say so, j <= i + right_shift (IS_CAUSAL, WINDOW_RIGHT)
    and j >= i + left_shift (WINDOW_LEFT); row i's diagonal key is i + causal_shift (Nk - Nq: bottom-right),
    from which ALiBi counts its distance. softcap (c log2 e) and alibi (the slope times log2 e) are in the
    loop's log2 units.

    MASKED=False is the fast path for blocks every row of this program fully sees: no key mask, no causal or
    window mask. MASKED=True handles the rest: the partial last key block and the blocks that cross the causal
    diagonal or a window's edge.

    PAGED: k_ptrs and v_ptrs hold only the head-dim columns; each block's rows are found through the sequence's
    block-table row `table` (pages of page_size keys, stride_kp and stride_vp apart: _paged_rows).
    """
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    k_cols = k_ptrs     # PAGED: the columns, to which each block adds its rows' page and slot offsets
    v_cols = v_ptrs
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        kv_rows = (start_n + offs_n)[:, None] < Nk   # the key rows that exist (the load masks' rows)
        if PAGED:
            k_ptrs, v_ptrs = _paged_rows(k_cols, v_cols, table, start_n + offs_n, Nk, page_size, stride_kp,
                                         stride_kn, stride_vp, stride_vn)
        k = _load_kv(k_ptrs, desc_k, off_b, off_hkv, start_n, kv_rows, 0, BLOCK_N, BLOCK_D, HEAD_DIM, MASKED,
                     USE_TMA)
        # V has its own head dim (BLOCK_DV, HEAD_DIM_V: Dv, which may differ from D). guards: mutant
        # dv_load_mask_head_dim
        v = _load_kv(v_ptrs, desc_v, off_b, off_hkv, start_n, kv_rows, 0, BLOCK_N, BLOCK_DV, HEAD_DIM_V, MASKED,
                     USE_TMA)
        # S = Q K^T, accumulated in fp32 (in fp64 under INPUT_PRECISION "fp64", then rounded once to fp32 below)
        # and scaled in fp32 (qk_scale = scale * log2(e): the loop works in base 2). fp32 operands need
        # input_precision="ieee": the default tf32 keeps 10 mantissa bits (~1e-3 relative error). guards: mutants
        # fp32_tf32_dot, scale_twice, scale_never, exp_instead_of_exp2, log2e_missing
        qk = _mma(_q_tile(q, Q_IN_LOOP), tl.trans(k), None, INPUT_PRECISION)
        if D_SPLIT:
            # S = Q_0 K_0^T + Q_1 K_1^T over the two halves of the head dim. guards: mutant
            # d_split_second_half_same_columns; cases fp32_precision, head_dim_111
            k1 = _load_kv(k_ptrs + BLOCK_D * stride_kk, desc_k, off_b, off_hkv, start_n, kv_rows, BLOCK_D, BLOCK_N,
                          BLOCK_D, HEAD_DIM, MASKED, USE_TMA)
            qk = _mma(_q_tile(q1, Q_IN_LOOP), tl.trans(k1), qk, INPUT_PRECISION)
        qk = qk.to(tl.float32)
        if MASKED or SOFTCAP or HAS_ALIBI:
            # The scores themselves, then their row max: a transformed score is no longer the raw one scaled, so
            # the fast path's max of the raw scores does not apply to it
            qk = _times_scale(qk, qk_scale, EXACT, MUL_RN)
            if SOFTCAP:
                # c tanh(s / c) of the scaled score, BEFORE the masks (a capped -inf would be a finite -c) and
                # before the bias. guards: mutant softcap_after_mask
                qk = _softcap(qk, softcap)
            if HAS_ALIBI:
                # -slope |i + Nk - Nq - j|: the distance from row i's diagonal key (bottom-right, like the
                # causal mask; for non-causal rows j lies on both sides of it). guards: mutants alibi_sign,
                # alibi_top_left, alibi_no_abs
                qk = qk - alibi * tl.abs(offs_m[:, None] + causal_shift - (start_n + offs_n)[None, :]).to(tl.float32)
            if MASKED:
                # The score mask varies along the KEY axis ([None, :] on S); the K/V load mask has the wrong
                # axes (key rows x head-dim columns). guards: mutant score_mask_wrong_axis, case block_m_gt_block_n
                # (and mutants score_mask_from_kv_mask, score_mask_nq)
                valid = (start_n + offs_n)[None, :] < Nk
                if IS_CAUSAL or WINDOW_RIGHT:
                    # bottom-right alignment: query i sees key j iff j <= i + (Nk - Nq) (+ the window's right side).
                    # guards: mutants causal_top_left, causal_shift_sign; cases causal_nq_lt_nk / causal_nq_gt_nk
                    valid = valid & ((start_n + offs_n)[None, :] <= offs_m[:, None] + right_shift)
                if WINDOW_LEFT:
                    # and j >= i + (Nk - Nq) - left (the side included). guards: mutant window_left_off_by_one
                    valid = valid & ((start_n + offs_n)[None, :] >= offs_m[:, None] + left_shift)
                # -inf on invalid scores: they lose the max and exp to exactly 0. guards: mutant no_score_mask
                qk = tl.where(valid, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row that has seen no valid key yet has m_new = -inf, and -inf - (-inf) is NaN.
            # Shift such rows by 0 instead: their p and c are then exactly 0.
            # guards: mutant causal_no_masked_row_guard, case causal_nq_gt_nk
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            qk = qk - m_shift[:, None]
        else:
            # Fast path: the row max of the raw scores, scaled once per row (scale < 0 turns the min into
            # the max), then qk * qk_scale - m per score: one fused multiply-add, except in the EXACT pass
            # (see _attn_fwd_keys). guards: cases negative_scale_large_scores, large_scores_whole_blocks; mutant
            # fast_path_max_ignores_sign
            if NEGATIVE_SCALE:
                m_new = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
            else:
                m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = m_new
            qk = _times_scale(qk, qk_scale, EXACT, MUL_RN) - m_shift[:, None]
        if not EXACT:
            # A fused multiply-add subtracts the ROUNDED row max from the UNROUNDED product: the max score lands
            # up to half an ulp of the row max off 0, not exactly at 0. Below 2^24 that is at most 0.5 (exp2 of
            # it within [0.7, 1.4]); from about 2^28 on it overflows P in fp16 or flushes the row to 0, and
            # from 2^31 on exp2 itself overflows. Every block's shift counts: the max only grows, so a hugely
            # negative first block is flagged although the last one is small. guards: mutants
            # big_rows_final_max_only, big_rows_threshold_2_31; cases huge_scores[fp16],
            # huge_negative_first_keys[fp16]
            big = big | (tl.abs(m_shift) >= 16777216.0)   # 2^24
        # c = exp(m_old - m_new) <= 1 rescales BOTH l and acc (the FA2 paper's printed 1/c for acc is wrong).
        # guards: mutants rescale_paper_inverse, l_not_rescaled, acc_not_rescaled; the state stays fp32 and the
        # new max keeps the old one: mutants acc_in_input_dtype, l_in_input_dtype, m_new_drops_old_max
        c = tl.math.exp2(m_i - m_shift)
        p = tl.math.exp2(qk)
        l_i = l_i * c + tl.sum(p, 1)
        acc = acc * c[:, None]
        acc = _mma(p.to(v.dtype), v, acc, INPUT_PRECISION)
        if D_SPLIT:
            # the second half of the output is rescaled like the first (D_SPLIT only runs with Dv == D: V's
            # halves are D's). guards: mutant d_split_second_half_not_rescaled; case fp32_precision
            v1 = _load_kv(v_ptrs + BLOCK_D * stride_vk, desc_v, off_b, off_hkv, start_n, kv_rows, BLOCK_D, BLOCK_N,
                          BLOCK_D, HEAD_DIM, MASKED, USE_TMA)
            acc1 = _mma(p.to(v1.dtype), v1, acc1 * c[:, None], INPUT_PRECISION)
        # the state keeps m_new (-inf while a row has seen no key), never the shift: 0 would outrank later scores
        m_i = m_new  # guards: mutants m_never_updated, masked_max_kept_as_zero; case window_very_negative_scores
        # each pointer advances by its own tensor's row stride. guards: mutant kv_advance_wrong_stride
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, acc1, l_i, m_i, big


@triton.jit
def _fresh_state(BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, D_SPLIT: tl.constexpr,
                 INPUT_PRECISION: tl.constexpr):
    """The running state before any key: (acc, acc1, l, m, big) = 0, 0, 0, -inf, no row flagged; the
    accumulators in fp64 under INPUT_PRECISION "fp64", else fp32."""
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    big = tl.zeros([BLOCK_M], dtype=tl.int1)
    acc_dtype: tl.constexpr = tl.float64 if INPUT_PRECISION == "fp64" else tl.float32
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=acc_dtype)
    if D_SPLIT:
        acc1 = tl.zeros([BLOCK_M, BLOCK_D], dtype=acc_dtype)
    else:
        acc1 = acc
    return acc, acc1, l_i, m_i, big


@triton.jit
def _attn_fwd_keys(q, q1, k_ptrs, v_ptrs, stride_kn, stride_vn, stride_kk, stride_vk, desc_k, desc_v, table,
                   page_size, stride_kp, stride_vp, off_b, off_hkv,
                   qk_scale, softcap, alibi, start_m, lead_lo, lead_hi, fast_lo, fast_hi, masked_lo, masked_hi, Nk,
                   causal_shift, left_shift, right_shift,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_DV: tl.constexpr, HEAD_DIM_V: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
                   HAS_ALIBI: tl.constexpr, NEGATIVE_SCALE: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                   USE_TMA: tl.constexpr, D_SPLIT: tl.constexpr, Q_IN_LOOP: tl.constexpr, EXACT: tl.constexpr,
                   MUL_RN: tl.constexpr, PAGED: tl.constexpr):
    """The whole key range of one program from a fresh state: with WINDOW_LEFT the masked blocks at the window's
    left edge [lead_lo, lead_hi), then the fast blocks [fast_lo, fast_hi), then the masked ones
    [masked_lo, masked_hi). Returns (acc, acc1, l, m, big).

    The kernel compiles with fp fusion on, so the first pass (EXACT False) scales and shifts each score in one
    fused multiply-add, which is only exact enough while the row max stays below 2^24 in magnitude (see the
    fast path); it marks the rows that reach it in big. _attn_fwd then runs the program's keys again with
    the product rounded on its own (one masked loop over them, not this function's two or three): every score
    minus the row max is then exact at the max, whatever the magnitude. No real workload reaches 2^24 (the
    scaled scores are log2 units), so the second pass costs nothing there. H200, fp16/bf16, D = 64 and 128:
    fusion off everywhere ran 2 to 8 % slower. fp32 "ieee" runs the exact pass alone, this function with EXACT
    True (TWO_PASS False: see attention)."""
    acc, acc1, l_i, m_i, big = _fresh_state(BLOCK_M, BLOCK_D, BLOCK_DV, D_SPLIT, INPUT_PRECISION)
    if WINDOW_LEFT:
        acc, acc1, l_i, m_i, big = _attn_fwd_inner(acc, acc1, l_i, m_i, big, q, q1, k_ptrs, v_ptrs, stride_kn,
                                                   stride_vn, stride_kk, stride_vk, desc_k, desc_v, table, page_size,
                                                   stride_kp, stride_vp, off_b, off_hkv,
                                                   qk_scale, softcap, alibi, start_m, lead_lo, lead_hi, Nk,
                                                   causal_shift, left_shift, right_shift,
                                                   BLOCK_M, BLOCK_N, BLOCK_D, HEAD_DIM, BLOCK_DV, HEAD_DIM_V, True,
                                                   IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, HAS_ALIBI,
                                                   NEGATIVE_SCALE, INPUT_PRECISION, USE_TMA, D_SPLIT, Q_IN_LOOP,
                                                   EXACT, MUL_RN, PAGED)
    acc, acc1, l_i, m_i, big = _attn_fwd_inner(acc, acc1, l_i, m_i, big, q, q1, k_ptrs, v_ptrs, stride_kn,
                                               stride_vn, stride_kk, stride_vk, desc_k, desc_v, table, page_size,
                                                   stride_kp, stride_vp, off_b, off_hkv,
                                               qk_scale, softcap, alibi, start_m, fast_lo, fast_hi, Nk,
                                               causal_shift, left_shift, right_shift,
                                               BLOCK_M, BLOCK_N, BLOCK_D, HEAD_DIM, BLOCK_DV, HEAD_DIM_V, False,
                                               IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, HAS_ALIBI,
                                               NEGATIVE_SCALE, INPUT_PRECISION, USE_TMA, D_SPLIT, Q_IN_LOOP,
                                               EXACT, MUL_RN, PAGED)
    acc, acc1, l_i, m_i, big = _attn_fwd_inner(acc, acc1, l_i, m_i, big, q, q1, k_ptrs, v_ptrs, stride_kn,
                                               stride_vn, stride_kk, stride_vk, desc_k, desc_v, table, page_size,
                                                   stride_kp, stride_vp, off_b, off_hkv,
                                               qk_scale, softcap, alibi, start_m, masked_lo, masked_hi, Nk,
                                               causal_shift, left_shift, right_shift,
                                               BLOCK_M, BLOCK_N, BLOCK_D, HEAD_DIM, BLOCK_DV, HEAD_DIM_V, True,
                                               IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, HAS_ALIBI,
                                               NEGATIVE_SCALE, INPUT_PRECISION, USE_TMA, D_SPLIT, Q_IN_LOOP,
                                               EXACT, MUL_RN, PAGED)
    return acc, acc1, l_i, m_i, big


@_lengths_at_run_time_jit
def _attn_fwd(Q, K, V, Out, Lse, qk_scale,
              stride_qz, stride_qh, stride_qm, stride_qk,
              stride_kz, stride_kh, stride_kn, stride_kk,
              stride_vz, stride_vh, stride_vn, stride_vk,
              stride_oz, stride_oh, stride_om, stride_ok,
              stride_lz, stride_lh, stride_lm,
              H, Nq, Nk, keys_per_split, DescK, DescV,
              window_left, window_right, softcap, Alibi, stride_az, stride_ah, CuQ, CuK,
              Table, stride_tb, Seqlens, page_size,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr,
              NEGATIVE_SCALE: tl.constexpr, INPUT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
              USE_TMA: tl.constexpr, D_SPLIT: tl.constexpr, Q_IN_LOOP: tl.constexpr, MUL_RN: tl.constexpr,
              TWO_PASS: tl.constexpr,
              KV_GROUP: tl.constexpr, BLOCK_DV: tl.constexpr, HEAD_DIM_V: tl.constexpr, WINDOW_LEFT: tl.constexpr,
              WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, VARLEN: tl.constexpr,
              PAGED: tl.constexpr):
    """One (query block, batch x head) program; with SPLIT, one (query block, batch x head, key split)
    program that folds only keys [split * keys_per_split, (split + 1) * keys_per_split) and writes its partial
    state (Out: fp32 (B*H, splits, Nq, HEAD_DIM_V) output normalised by its own l; Lse: fp32 (B*H, splits, 2, Nq),
    its log2-domain running max m and its l) for _attn_combine.
    With D_SPLIT, BLOCK_D is half the padded head dim and the program works on the two halves of columns
    separately (q and q1, acc and acc1): see default_blocks for why fp32 at D = 128 does.

    The optional features (the last constexprs; the host passes None for the arguments of a feature that is off,
    which Triton then compiles as constants: a call without features compiles to the kernel without them):
    H query heads, KV_GROUP of them per kv head (K and V have H // KV_GROUP heads); V and the output have head
    dim HEAD_DIM_V in blocks of BLOCK_DV; WINDOW_LEFT / WINDOW_RIGHT: row i sees keys from i + Nk - Nq -
    window_left / up to i + Nk - Nq + window_right (IS_CAUSAL is the right side 0); SOFTCAP: softcap is c log2 e;
    HAS_ALIBI: Alibi points at the fp32 slopes, one per (batch, query head) through stride_az, stride_ah.
    VARLEN (attention_varlen): batch b is packed sequence b, rows CuQ[b]:CuQ[b + 1] of Q, Out and Lse and rows
    CuK[b]:CuK[b + 1] of K and V (whose batch strides are 0); Nq and Nk arrive as the longest lengths, which size
    the grid, and become the sequence's own.
    PAGED (attention_paged): K and V are caches of pages (stride_kz, stride_vz: a page; stride_kn, stride_vn: a
    slot); batch b's keys are Seqlens[b] long, key j in slot j % page_size of page Table[b, j // page_size]; Nk
    arrives as the longest."""
    tl.static_assert(not (SPLIT and D_SPLIT), "split-KV and a split head dim are not combined")
    # One grid axis for (batch x head, query block), the query block varying fastest (the programs of one head
    # run together and share its K and V in L2): CUDA caps grid axes 1 and 2 at 65,535, so B*H on axis 1
    # failed to launch from B*H = 65,536 on (a decode batch of 1,024 sequences of 64 heads; the GPU test
    # tests/test_catalogue.py::test_fused_kernel_many_batch_heads). guards: mutant query_block_from_wrong_axis
    m_blocks = tl.cdiv(Nq, BLOCK_M)
    m_block = tl.program_id(0) % m_blocks
    if IS_CAUSAL:
        # Heaviest first: under the causal mask a query block's work grows with its index, so each head's last
        # block runs first and the light ones fill the grid's tail (H200, kernel / SDPA-cuDNN, fp16 and bf16,
        # N = 4k-16k, interleaved in one process: +0.5 to +1.5 % causal; fp16 D = 128, N = 16k, one run: 0.935 ->
        # 0.975). guards: mutant causal_heaviest_first_off_by_one; cases causal_square, causal_nq_gt_nk
        m_block = m_blocks - 1 - m_block
    start_m = m_block * BLOCK_M
    off_bh = tl.program_id(0) // m_blocks
    off_b = off_bh // H
    off_h = off_bh % H
    # GQA/MQA: KV_GROUP consecutive query heads share one kv head (grouped, as FlashAttention and SDPA's
    # enable_gqa map them: h // (Hq // Hkv)); K and V both. guards: mutants gqa_interleaved_map,
    # gqa_group_inverted, gqa_v_reads_query_head
    off_hkv = off_h // KV_GROUP
    # Batch/head offsets in int64: B*H*N*D passes 2^31 elements long before one head does.
    # guards: mutants int32_offsets (GPU case offsets_over_2_31), batch_head_swapped, k_batch_stride_from_q
    q_base = Q + off_b.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh
    o_base = Out + off_b.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    if VARLEN:
        # Packed sequences: this program's sequence starts at row CuQ[b] of Q and Out and at row CuK[b] of K and
        # V, and every bound below is its own length: a bound from the longest lengths lets a short sequence's
        # stores run into the next sequence's rows and its keys take the next sequence's keys. guards: mutants
        # varlen_rows_from_max_seqlen, varlen_keys_from_max_seqlen, varlen_key_start_from_q; cases
        # varlen_empty_sequences, varlen_cross_causal
        q_start = tl.load(CuQ + off_b).to(tl.int64)
        k_start = tl.load(CuK + off_b).to(tl.int64)
        Nq = (tl.load(CuQ + off_b + 1) - q_start).to(tl.int32)
        Nk = (tl.load(CuK + off_b + 1) - k_start).to(tl.int32)
        if start_m >= Nq:
            return      # the grid is sized by the longest sequence: this block holds no row of this one
        q_base += q_start * stride_qm
        k_base += k_start * stride_kn
        v_base += k_start * stride_vn
        o_base += q_start * stride_om
    if PAGED:
        # A paged KV cache: this batch's keys are its own cache length, found page by page through its row of the
        # block table (_paged_rows), so K and V start at the kv head only (no batch offset: pages are shared by
        # the pool). guards: mutants paged_keys_from_max_seqlen, paged_table_row_stride_from_b
        Nk = tl.load(Seqlens + off_b)
        k_base = K + off_hkv.to(tl.int64) * stride_kh
        v_base = V + off_hkv.to(tl.int64) * stride_vh
        table = Table + off_b.to(tl.int64) * stride_tb
    else:
        table = Table

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    # Masks compare logical coordinates (row, column) with their bounds; strides are applied separately.
    # Rows use Nq, columns use the true head dim (padded head-dim columns load as 0 and add 0 to every dot).
    q_mask = (offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_DIM)
    # Q is loaded once and stays in registers for the whole loop. The seed pre-scales it here to save one
    # multiply per score; this kernel scales the fp32 scores instead, because Q * scale rounded back to
    # fp16/bf16 loses bits that large scores need (fp16, raw scores ~1e4, D = 256: error 0.08 against 0.001).
    # guards: mutants q_head_dim_stride_assumed_1, query_block_from_wrong_axis; case layout_d_major
    q_rows = offs_m
    if Q_IN_LOOP:
        # A pointer tile that the loop reads again for every key block (tf32x3 at a split head dim, see attention):
        # unmasked, because Triton hoists a masked loop-invariant load out of the loop, and Q is held in registers
        # again (H200, D = 128: 1.18 of SDPA-efficient masked against 1.29 unmasked). So its pointers stay inside
        # the tensor instead: rows past Nq read the last row again (their output is never stored) and, below,
        # padded columns read column D - 1 (they meet K's zero-filled columns in the dot: finite values times 0
        # add 0). The row clamp only keeps the reads inside the tensor, which no output shows (compute-sanitizer,
        # as flashcheck sanitize runs it, sees a read past the tensor's end). guards: mutant
        # q_in_loop_columns_unclamped; case head_dim_111
        q_rows = tl.minimum(offs_m, Nq - 1)
    q = q_base + q_rows[:, None] * stride_qm + offs_d[None, :] * stride_qk
    if not Q_IN_LOOP:
        q = tl.load(q, mask=q_mask, other=0.0)

    if D_SPLIT:
        # the second half of the head dim (columns BLOCK_D .. 2 * BLOCK_D), masked past HEAD_DIM like the first;
        # its mask serves the load of Q and the store of the output alike (the host splits only with Dv == D)
        offs_d1 = BLOCK_D + offs_d
        mask1 = (offs_m[:, None] < Nq) & (offs_d1[None, :] < HEAD_DIM)
        q1_cols = offs_d1
        if Q_IN_LOOP:
            if HEAD_DIM < 2 * BLOCK_D:   # only padded columns are clamped (a clamp hides the columns' contiguity)
                q1_cols = tl.minimum(offs_d1, HEAD_DIM - 1)
        q1 = q_base + q_rows[:, None] * stride_qm + q1_cols[None, :] * stride_qk
        if not Q_IN_LOOP:
            q1 = tl.load(q1, mask=mask1, other=0.0)
    else:
        q1 = q

    k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vk
    if PAGED:
        # the columns only (broadcast over the block's rows): the rows come from the block table, block by block
        k_ptrs = k_base + tl.zeros([BLOCK_N, 1], dtype=tl.int64) + offs_d[None, :] * stride_kk
        v_ptrs = v_base + tl.zeros([BLOCK_N, 1], dtype=tl.int64) + offs_dv[None, :] * stride_vk
    # The loop runs over KEYS, so its bounds use Nk (a bound from Nq ignores extra keys: 1 query vs keys
    # [1, 1] and values [5, 10] gave 5, not 7.5). guards: mutant loop_bound_nq, case hand_one_query_two_keys
    # (and mutant one_length_nq: one length passed for both)
    causal_shift = Nk - Nq
    # Row i sees keys [i + left_shift, i + right_shift] of [0, Nk) (bottom-right: both sides count from the
    # diagonal key i + Nk - Nq; causal is the right side 0). guards: mutants window_right_off_by_one,
    # window_left_top_left
    left_shift = 0
    right_shift = causal_shift
    if WINDOW_RIGHT:
        right_shift = causal_shift + window_right
    if WINDOW_LEFT:
        left_shift = causal_shift - window_left
    if IS_CAUSAL or WINDOW_RIGHT:
        # Never visit a key block that no row of this program can see (causal block skipping): the last key
        # a query block sees is bounded by its BLOCK_M rows. guards: mutant causal_hi_block_n ...
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + right_shift, 0), Nk)
        # ... and skip the masks on blocks that every row sees entirely.
        full_hi = tl.minimum(tl.maximum(start_m + right_shift + 1, 0), hi) // BLOCK_N * BLOCK_N
    else:
        hi = Nk
        full_hi = Nk // BLOCK_N * BLOCK_N
    if WINDOW_LEFT:
        # Nor the blocks left of the window of the program's first row (the block holding its first key is the
        # first one visited), and the masks stay on up to the first block whole in the window of its last row:
        # the blocks [lo, full_lo) cross the window's left edge. lo <= full_lo <= full_hi <= hi.
        # guards: mutants window_lead_block_unmasked, window_lo_skips_partial_block
        lo = tl.maximum(start_m + left_shift, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.minimum((tl.maximum(start_m + BLOCK_M - 1 + left_shift, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N,
                             full_hi)
    else:
        lo = 0
        full_lo = 0
    if SPLIT:
        # This program's keys: [split_lo, split_hi), cut out of both ranges (keys_per_split is a multiple of
        # BLOCK_N, so every range still starts on a block). A split may hold no key a row sees (causal): the
        # loops then run zero times and the program still writes its (empty) partial state below.
        # guards: mutants split_keys_overlap, split_last_keys_dropped; cases split_kv_decode*
        split_lo = tl.program_id(2) * keys_per_split
        split_hi = split_lo + keys_per_split
        fast_lo, fast_hi = split_lo, tl.minimum(full_hi, split_hi)
        masked_lo, masked_hi = tl.maximum(full_hi, split_lo), tl.minimum(hi, split_hi)
        lead_lo, lead_hi = lo, full_lo
        if WINDOW_LEFT:
            lead_lo, lead_hi = tl.maximum(lo, split_lo), tl.minimum(full_lo, split_hi)
            fast_lo = tl.maximum(full_lo, split_lo)
        keys_lo, keys_hi = tl.maximum(lo, split_lo), tl.minimum(hi, split_hi)
    else:
        lead_lo, lead_hi, fast_lo, fast_hi, masked_lo, masked_hi = lo, full_lo, full_lo, full_hi, full_hi, hi
        keys_lo, keys_hi = lo, hi
    if HAS_ALIBI:
        # one slope per (batch, query head: slopes of shape (Hq,) come with stride_az = 0), in the loop's log2
        # units. guards: mutants alibi_batch_slopes_ignored, alibi_natural_units
        alibi = tl.load(Alibi + off_b.to(tl.int64) * stride_az + off_h.to(tl.int64) * stride_ah) * 1.4426950408889634
    else:
        alibi = 0.0
    acc, acc1, l_i, m_i, big = _attn_fwd_keys(q, q1, k_ptrs, v_ptrs, stride_kn, stride_vn, stride_kk, stride_vk,
                                              DescK, DescV, table, page_size, stride_kz, stride_vz, off_b,
                                              off_hkv, qk_scale, softcap, alibi, start_m,
                                              lead_lo, lead_hi, fast_lo, fast_hi, masked_lo, masked_hi, Nk,
                                              causal_shift, left_shift, right_shift, BLOCK_M, BLOCK_N, BLOCK_D,
                                              HEAD_DIM, BLOCK_DV, HEAD_DIM_V, IS_CAUSAL, WINDOW_LEFT, WINDOW_RIGHT,
                                              SOFTCAP, HAS_ALIBI, NEGATIVE_SCALE, INPUT_PRECISION, USE_TMA,
                                              D_SPLIT, Q_IN_LOOP, not TWO_PASS, MUL_RN, PAGED)
    if TWO_PASS:
        if tl.max(big.to(tl.int32), 0) > 0:
            # Some row's max reached 2^24: the fused pass is not exact enough there (see _attn_fwd_keys), so the
            # whole program runs its keys [keys_lo, keys_hi) again with the product rounded on its own. One masked
            # loop (on a block every row sees whole its masks keep every key): no workload reaches this pass, so it
            # need not be fast, and a second copy of the fast and masked loops made the kernel's largest code longer
            # (LLVM's and ptxas's time grow with it: 40 of the GPU suite's fp16/bf16 specialisations compiled for
            # sm_90 in 70.6 s of CPU with that copy and 56.3 s with this loop under triton 3.6, 45.4 and 31.7 s for
            # 30 of them under 3.9). Here the score mask's select stands between the product and the subtraction
            # as well. guards: mutant exact_pass_never (GPU); cases huge_scores[fp16], extreme_scores_bf16
            acc, acc1, l_i, m_i, big = _fresh_state(BLOCK_M, BLOCK_D, BLOCK_DV, D_SPLIT, INPUT_PRECISION)
            acc, acc1, l_i, m_i, big = _attn_fwd_inner(acc, acc1, l_i, m_i, big, q, q1, k_ptrs, v_ptrs, stride_kn,
                                                       stride_vn, stride_kk, stride_vk, DescK, DescV, table,
                                                       page_size, stride_kz, stride_vz, off_b, off_hkv, qk_scale,
                                                       softcap, alibi, start_m, keys_lo, keys_hi, Nk, causal_shift,
                                                       left_shift, right_shift, BLOCK_M, BLOCK_N, BLOCK_D, HEAD_DIM,
                                                       BLOCK_DV, HEAD_DIM_V, True, IS_CAUSAL, WINDOW_LEFT,
                                                       WINDOW_RIGHT, SOFTCAP, HAS_ALIBI, NEGATIVE_SCALE,
                                                       INPUT_PRECISION, USE_TMA, D_SPLIT, Q_IN_LOOP, True, MUL_RN,
                                                       PAGED)
    # The store is masked by ROW (< Nq) and head-dim column (< Dv): the last query block may be partial.
    # guards: mutants store_no_row_mask, store_row_mask_off_by_one; case partial_last_query_block
    o_mask = (offs_m[:, None] < Nq) & (offs_dv[None, :] < HEAD_DIM_V)
    if SPLIT:
        # Each split's running max m and its l go to the combine apart, not as their log-sum-exp m + log2(l)
        # (flash-decoding's partial state): in fp32 that sum drops log2(l) once |m| passes 2^24 or so, and the
        # combine then weighs a split holding three keys tied at the row max as one holding one (0.70 off at
        # scores of 2.5e8; tests/test_kernel_features.py test_split_kv_combine_keeps_each_splits_l).
        # The partial state of this split: its output normalised by its own l (l = 0 when no row key fell in
        # it: divide by 1, not 0, or 0/0 = NaN reaches the combine, where a zero weight times NaN is still
        # NaN), and its running max m (-inf for such rows) and l: (B*H, splits, 2, Nq).
        # guards: mutant split_partial_no_l_guard; case split_kv_decode_causal
        split = tl.program_id(2)
        l_part = tl.where(l_i == 0.0, 1.0, l_i)
        row = (off_bh.to(tl.int64) * tl.num_programs(2) + split) * Nq + offs_m
        # the partial rows are Dv wide. guards: mutant dv_split_partial_row_stride; case dv_split_decode
        tl.store(Out + row[:, None] * HEAD_DIM_V + offs_dv[None, :], acc / l_part[:, None], mask=o_mask)
        state = (off_bh.to(tl.int64) * tl.num_programs(2) + split) * 2 * Nq + offs_m
        tl.store(Lse + state, m_i, mask=offs_m < Nq)
        tl.store(Lse + state + Nq, l_i, mask=offs_m < Nq)
        return

    # Normalise once. A row that sees no key (causal, Nq > Nk, or a window that holds no key) has l = 0 and
    # acc = 0: its output is 0 (divide by 1, not 0) and its log-sum-exp is -inf. guards: mutants
    # causal_no_masked_row_guard, empty_row_zero_division
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_ok,
             out.to(Out.dtype.element_ty), mask=o_mask)
    if D_SPLIT:
        tl.store(o_base + offs_m[:, None] * stride_om + offs_d1[None, :] * stride_ok,
                 (acc1 / l_safe[:, None]).to(Out.dtype.element_ty), mask=mask1)
    if STORE_LSE:
        # lse = ln(sum_j exp(s_j)) = (m + log2 l) * ln 2 in the log2 domain the loop worked in.
        # A row that saw no key has lse = -inf (log2 of l_safe keeps log2(0) out of the computation).
        # guards: mutant lse_log2_domain
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)  # ln 2
        l_ptrs = Lse + off_b.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + offs_m * stride_lm
        if VARLEN:
            # lse is (Hq, total_q): the sequence's rows start at CuQ[b]. guards: mutant varlen_lse_rows_padded;
            # case varlen_block_edges
            l_ptrs += q_start * stride_lm
        tl.store(l_ptrs, lse, mask=offs_m < Nq)


@_lengths_at_run_time_jit
def _attn_combine(Opart, Lpart, Out, Lse,
                  stride_oz, stride_oh, stride_om, stride_ok,
                  stride_lz, stride_lh, stride_lm,
                  H, Nq, splits,
                  BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, STORE_LSE: tl.constexpr):
    """Merge the splits' partial states of _attn_fwd(SPLIT=True) into the output, in the same online way as
    the key loop: a running max of the splits' maxima, each split's output weighted by l_split exp2(m_split - max)
    (Lpart holds each split's m and l apart: see the SPLIT store in _attn_fwd)."""
    m_blocks = tl.cdiv(Nq, BLOCK_M)         # one grid axis, as in _attn_fwd
    offs_m = (tl.program_id(0) % m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    off_bh = tl.program_id(0) // m_blocks
    off_b = off_bh // H
    off_h = off_bh % H
    offs_d = tl.arange(0, BLOCK_D)
    rows = offs_m < Nq
    mask = rows[:, None] & (offs_d[None, :] < HEAD_DIM)
    m_c = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_c = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_c = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # last split first: any order is right, and this one makes a row's first splits empty ones under causal
    for i in range(0, splits):
        split = splits - 1 - i
        row = (off_bh.to(tl.int64) * splits + split) * Nq + offs_m
        state = (off_bh.to(tl.int64) * splits + split) * 2 * Nq + offs_m
        m_s = tl.load(Lpart + state, mask=rows, other=float("-inf"))
        l_s = tl.load(Lpart + state + Nq, mask=rows, other=0.0)
        part = tl.load(Opart + row[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0)
        m_new = tl.maximum(m_c, m_s)
        # A split whose keys a row never sees has m = -inf, l = 0: its weight must be exactly 0, and while every
        # split so far was such, the shift is 0, not -inf (-inf - -inf is NaN). In split_kv_decode_causal the
        # last split, combined first, holds one key that 15 of the 16 rows do not see.
        # guards: mutant split_combine_no_inf_guard; case split_kv_decode_causal
        m_shift_c = tl.where(m_new == float("-inf"), 0.0, m_new)
        c = tl.math.exp2(m_c - m_shift_c)
        w = tl.math.exp2(m_s - m_shift_c) * l_s
        l_c = l_c * c + w
        acc_c = acc_c * c[:, None] + w[:, None] * part
        m_c = m_new
    l_sum = tl.where(l_c == 0.0, 1.0, l_c)
    o_dst = Out + off_b.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    tl.store(o_dst + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok,
             (acc_c / l_sum[:, None]).to(Out.dtype.element_ty), mask=mask)
    if STORE_LSE:
        lse = tl.where(l_c == 0.0, float("-inf"), (m_c + tl.math.log2(l_sum)) * 0.6931471805599453)  # ln 2
        lse_ptrs = Lse + off_b.to(tl.int64) * stride_lz + off_h.to(tl.int64) * stride_lh + offs_m * stride_lm
        tl.store(lse_ptrs, lse, mask=rows)


# Split-KV (decode): few queries against many keys leave most of the GPU idle with one program per (query
# block, batch x head); splitting the keys over several programs, then combining, fills it.
SPLIT_MAX_QUERIES = 16     # decode-like: every query in one block of 16 rows
SPLIT_MIN_KEYS = 128       # no split holds fewer keys (a split's fixed cost is its Q load and its partial state)
SPLIT_MAX = 64             # bounds the combine's loop and the partial state (B*H*64*Nq*D floats)


def split_plan(B, H, Nq, Nk, block_m, block_n, device):
    """(splits, keys_per_split) of a call: splits = 1 unless the call is decode-like (Nq <= 16), its programs
    would leave at least half the SMs idle, and it has at least 2 * SPLIT_MIN_KEYS keys; then about 4 programs
    per SM. keys_per_split is a multiple of block_n, and splits is recomputed from it, so that every split
    holds at least one key (an empty split is never launched). The interpreter plays a 4-SM device.

    H200 (132 SMs), bf16, D = 128, against SDPA-flash in the same run: B*H = 32, Nq = 1, Nk = 32k: 0.38 of
    flash without splits, 0.98-1.01 with; B*H = 128 (the bench's decode shapes, 128 of 132 SMs busy): 1.03
    without splits, 0.94 with, so those stay unsplit. Decode reads K and V once: about 3.9 TB/s there, near
    the H200's 4.8 TB/s, for the kernel and flash alike."""
    if Nq > SPLIT_MAX_QUERIES or Nk < 2 * SPLIT_MIN_KEYS:   # most calls: decided before asking the device
        return 1, Nk
    programs = B * H * triton.cdiv(Nq, block_m)
    units = 4 if interpreter_active() else torch.cuda.get_device_properties(device).multi_processor_count
    if 2 * programs > units:
        return 1, Nk
    splits = min(triton.cdiv(4 * units, programs), Nk // SPLIT_MIN_KEYS, SPLIT_MAX)
    keys_per_split = triton.cdiv(triton.cdiv(Nk, splits), block_n) * block_n
    return triton.cdiv(Nk, keys_per_split), keys_per_split


def default_blocks(Nq, Nk, D, dtype, precision="ieee", tma=None, device=None):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a problem, by rule (the caller may override blocks).
    tma: whether K and V load through tensor descriptors (None: as contiguous inputs would, here); device: the
    GPU (None: the current one)."""
    block_d = head_dim_block(D)
    if interpreter_active():
        # The interpreter runs one program at a time in NumPy: fewer, larger programs are faster.
        return 64, 64, 4, 1
    if tma is None:
        tma = descriptors_available(dtype)
    if Nq <= SPLIT_MAX_QUERIES and dtype != torch.float32:
        # decode-like: one block of 16 rows (tl.dot's minimum) instead of 128 mostly empty ones. H200, bf16,
        # D = 128, B*H = 32, Nq = 1, Nk = 32k, split: 16 x 64, 4 warps, 3 stages 3.6 TFLOP/s (16 x 128: 3.5).
        # With tensor descriptors, 16 x 128, 4 stages (kernel / SDPA-flash in one run, Nk = 32k: B*H = 128,
        # Nq = 1 and 16: 1.04, 16 x 64, 3 stages 0.99; B*H = 32, Nk = 16k: 0.71 against 0.66)
        if block_d > 128:
            return 16, 32, 4, 2
        return (16, 128, 4, 4) if tma else (16, 64, 4, 3)
    if dtype == torch.float32 and precision == "tf32x3":
        # three tf32 tensor-core products per multiply. H200, N = 4k, TFLOP/s (SDPA-efficient fp32 in the
        # same run: 35.7 at D = 64, 45.8 at D = 128): D = 64: 128 x 64, 8 warps, 3 stages 53.1 (64 x 64, 4
        # warps: 39.6); D = 128: 128 x 32, 8 warps, 3 stages 40.3 (64 x 32, 4 warps, 2 stages: 25.6; 128 x 64
        # needs 320 KB of shared memory, the H200 has 227 KB; 128 x 32 takes 224 KB). D = 256: 32 x 32, 2 stages,
        # 136 KB (the 64 x 32, 2-stage tile asked for 256 KB and failed head_dim_256 on the H200).
        # D = 128 splits the head dim in two halves (head_dim_split): 128 x 64, 8 warps, 2 stages 1.29 of
        # SPDA-efficient (128 x 32, 3 stages: 1.07; 64 x 64, 4 warps: 0.86; 128 x 64, 3 stages needs 288 KB).
        if block_d <= 64:
            return 128, 64, 8, 3
        return (128, 64, 8, 2) if block_d <= 128 else (32, 32, 4, 2)
    if dot_precision(dtype, precision, device) == "fp64":
        # fp32 "ieee" on the fp64 tensor cores. H200, N = 4k, kernel / SDPA-efficient fp32 in one run, not causal
        # / causal: D = 64: 64 x 64, 4 warps, 2 stages 1.35 / 1.33 (128 x 64, 8 warps: 1.33 / 1.33; 64 x 32,
        # 4 warps: 1.26 / 1.31; 1 stage 1.17 / 1.18); D = 128 on two halves of the head dim: 64 x 32, 4 warps,
        # 2 stages 1.11 / 1.10 (128 x 32, 8 warps 1.12 / 1.09; 64 x 64: 0.70 / 0.71; the whole head dim at
        # 128 x 32: 1.08 / 1.05); D = 256, not causal: 32 x 32, 4 warps, 2 stages 0.48 (64 x 32: 0.29; on two
        # halves 64 x 32: 0.42; 128 x 32 needs 360 KB of shared memory).
        if block_d <= 64:
            return 64, 64, 4, 2
        return (64, 32, 4, 2) if block_d <= 128 else (32, 32, 4, 2)
    if dtype == torch.float32:
        # ieee fp32 dots as FMAs on CUDA cores (GPUs other than the H200's kind: see ieee_on_fp64_tensor_cores)
        # hold 2x the registers of fp16 tiles. H200, N = 4k, triton 3.6 (scripts/resources.py gives the stack):
        # D = 64: 64 x 64, 4 warps 19.6 TFLOP/s with 1 KB of spills; the spill-free 64 x 16 ran 10.8. D = 128:
        # 32 x 32, 2 stages 9.0 (1 KB of spills); the spill-free tiles ran 6.0-8.7 (64 x 16, 4 warps: 8.7; 128 x 16,
        # 8 warps: 8.1); 64 x 64 spills 16 KB a thread and ran 1.0. With the head dim split in halves
        # (head_dim_split), kernel / SDPA-efficient in one run: 32 x 64, 4 warps, 2 stages 0.27 (64 x 64, 8 warps:
        # 0.27; 128 x 32: 0.25; 64 x 64, 4 warps: 0.19); the whole-D 32 x 32 tile 0.20.
        if block_d <= 64:
            return 64, 64, 4, 1
        return (32, 64, 4, 2) if block_d <= 128 else (32, 32, 4, 2)
    if block_d == 128 and tma:
        # H200, fp16, kernel / SDPA-cuDNN in one run, medians over N = 4k and 16k: 128 x 128, 8 warps, 3 stages
        # 0.84 (not causal) and 0.91 (causal); 128 x 64 0.77 and 0.85 (pointer loads: 0.75 and 0.79); 4 stages
        # need 289 KB of shared memory (the H200 has 227 KB); 256 x 64, 16 warps 0.75
        return 128, 128, 8, 3
    if block_d == 64 and tma:
        # H200, fp16, kernel / SDPA-cuDNN in one run, N = 4k and 16k, not causal and causal: 128 x 128, 4 warps,
        # 3 stages 0.906, 0.920, 0.918, 0.929; 128 x 64, 8 warps 0.882, 0.912, 0.913, 0.915 (128 x 128, 8 warps,
        # 2 stages: 0.68-0.77). Triton's tutorial 06 autotunes to the same tile here.
        return 128, 128, 4, 3
    if block_d <= 128:
        # H200, bf16, N = 4k: D = 64 443 TFLOP/s (64 x 64, 4 warps: 407); D = 128 489 (64 x 64: 483).
        return 128, 64, 8, 3
    return 64, 32, 4, 2


def head_dim_block(D):
    """Padded head-dim block: a power of two (arange needs one) and at least 16 (tl.dot's minimum
    contraction on the GPU: D = 2 rounded to 2 does not compile). Hard-coding 16 would truncate D > 16.
    guards: mutants head_dim_block_no_floor (GPU), head_dim_block_fixed_16; cases head_dim_2, head_dim_17"""
    return max(triton.next_power_of_2(D), 16)


def head_dim_split(D, dtype, Dv=None):
    """Whether the kernel works on the head dim in two halves (D_SPLIT): fp32 with a padded head dim of 128.
    S = Q_0 K_0^T + Q_1 K_1^T and O = (P V_0, P V_1) are the same sums in another order; each dot holds half the
    operand registers and shared memory, which fp32 tiles run out of at D = 128 (default_blocks has the
    figures). fp16/bf16 dots at D = 128 fit whole and run faster whole. V's head dim Dv (default D) must be D:
    the halves of V and of the output are D's halves. A call with Dv != D runs the whole head dims instead (the
    same sums, slower: the path the split replaced)."""
    return dtype == torch.float32 and head_dim_block(D) == 128 and (Dv is None or Dv == D)


def fused_then_exact(dtype, precision):
    """Whether the kernel runs a fused pass and, where some row's max reaches 2^24, an exact one (TWO_PASS), or
    the exact pass alone: fp32 "ieee", whose FMA dots leave no registers for a second copy of the loop (measured
    on the FMA path; the fp64-tensor-core path keeps the rule, two passes there unmeasured)."""
    return not (dtype == torch.float32 and precision == "ieee")


def launch_block_d(D, dtype, Dv=None):
    """The BLOCK_D _attn_fwd is launched with: the padded head dim, or half of it under head_dim_split."""
    return head_dim_block(D) // (2 if head_dim_split(D, dtype, Dv) else 1)


def features_off(D, dtype):
    """The feature constexprs of _attn_fwd for a call without optional features (Hq == Hkv, Dv == D, no window,
    softcap or ALiBi), and None for the features' arguments: what a compile outside attention (scripts/resources.py)
    passes besides the story's constexprs."""
    return dict(KV_GROUP=1, BLOCK_DV=launch_block_d(D, dtype), HEAD_DIM_V=D, WINDOW_LEFT=False, WINDOW_RIGHT=False,
                SOFTCAP=False, HAS_ALIBI=False, window_left=None, window_right=None, softcap=None, Alibi=None,
                stride_az=None, stride_ah=None, CuQ=None, CuK=None, VARLEN=False,
                Table=None, stride_tb=None, Seqlens=None, page_size=None, PAGED=False)


PRECISIONS = ("ieee", "tf32x3")


def ieee_on_fp64_tensor_cores(device=None):
    """Whether fp32 "ieee" dots run on the fp64 tensor cores (INPUT_PRECISION "fp64") rather than as fp32 FMAs on
    the CUDA cores: an fp32 operand widens to fp64 exactly, so every product is exact and every sum rounds at 53
    bits; the result is at least as accurate as fp32 FMAs (H200, N = 4k, max |error| against float64: 1.4e-7
    against 7.4e-7) and the seed's "no tf32 rounding" holds. Measured on the H200 only, so only compute
    capability 9.0 (Hopper) takes it: kernel / SDPA-efficient fp32 (3xTF32 on tensor cores) in one run, not
    causal / causal, D = 64: 0.55 / 0.51 as FMAs, 1.35 / 1.33 on fp64 tensor cores (64 x 64, 4 warps, 2
    stages); D = 128 (head dim split): 0.27 / 0.28 against 1.11 / 1.10, 12.3 -> 51 TFLOP/s (64 x 32, 4 warps,
    2 stages); D = 256, not causal: 0.27 against 0.48 (32 x 32, 4 warps, 2 stages). Other GPUs keep the FMAs:
    consumer parts run fp64 at a small fraction of fp32's rate, and A100 / B200 were not measured. The
    interpreter takes it too, so that the CPU judges the path the H200 runs."""
    return interpreter_active() or fp64_dots_measured(torch.cuda.get_device_capability(device))


def fp64_dots_measured(capability):
    """Whether a GPU of this compute capability (major, minor) runs fp32 "ieee" on the fp64 tensor cores: the
    measured kind, Hopper (9, 0). scripts/resources.py asks it for the target it compiles for."""
    return tuple(capability) == (9, 0)


def dot_precision(dtype, precision, device=None):
    """The kernel's INPUT_PRECISION: "ieee" for fp16/bf16, whose products are exact in fp32 anyway; for fp32, the
    precision asked, except "ieee" as "fp64" where ieee_on_fp64_tensor_cores.
    guards: mutants fp32_tf32_dot, tf32x3_single_pass (GPU); case fp32_precision"""
    if dtype != torch.float32:
        return "ieee"
    if precision == "ieee" and ieee_on_fp64_tensor_cores(device):
        return "fp64"
    return precision


def descriptors_available(dtype, device=None):
    """Whether fp16/bf16 K and V may load through tensor descriptors here: Triton has them (>= 3.4) and the GPU
    has TMA (compute capability >= 9: Hopper and later), or Triton's interpreter emulates them (the CPU runs
    this path too). fp32 keeps the pointer path: its dots are not what tensor-descriptor loads speed up."""
    if TensorDescriptor is None or dtype == torch.float32:
        return False
    return interpreter_active() or torch.cuda.get_device_capability(device)[0] >= 9


def tma_eligible(t):
    """Whether K or V is read through a tensor descriptor: descriptors_available, and the layout a 4-D
    descriptor of shape (B, H, N, D) accepts: a unit stride along D, the base address and every other stride a
    multiple of 16 bytes. Its blocks are (BLOCK_N, BLOCK_D) at (batch, head, key, 0): rows past Nk and columns
    past D read as 0 within each (batch, head), whatever the layout, as the pointer path's load mask does.
    Other layouts (layout_gapped's odd row stride, layout_d_major, an unaligned base) take the pointer path.
    guards: mutant tma_no_alignment_check; case half_unaligned_rows"""
    if not descriptors_available(t.dtype, t.device):
        return False
    size = t.element_size()
    return (t.stride(3) == 1 and t.data_ptr() % 16 == 0
            and all((st * size) % 16 == 0 for st in t.stride()[:3]))


def _check_options(num_warps, num_stages, precision):
    """The launch overrides and the fp32 precision of a call of any entry point."""
    check_launch(num_warps, num_stages)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None, out=None,
              return_lse=False, block_m=None, block_n=None, num_warps=None, num_stages=None, precision="ieee"):
    """Fused FlashAttention-2 forward.

    q: (B, Hq, Nq, D); k: (B, Hkv, Nk, D); v: (B, Hkv, Nk, Dv); one dtype (float32, float16 or bfloat16), one
    device; any strides. Hq is a multiple of Hkv (GQA/MQA): query head h reads kv head h // (Hq // Hkv). Dv in
    1..256 may differ from D. scale defaults to 1/sqrt(D). causal=True is aligned bottom-right: query i sees key j
    iff j <= i + Nk - Nq; a row that sees no key gives 0 (lse -inf).
    window: None or (left, right), each None (unbounded) or an int >= 0: query i sees key j iff
    i + Nk - Nq - left <= j <= i + Nk - Nq + right (bottom-right aligned; causal=True makes right 0, whatever
    window says). softcap: None or c > 0: the scaled score s = scale q.k becomes c tanh(s / c), before the masks
    and the bias. alibi_slopes: None or float32 (Hq,) or (B, Hq) on q's device: the score of (i, j) gets
    -slope[b, h] |i + Nk - Nq - j| (after the softcap).
    out: optional (B, Hq, Nq, Dv) tensor of q's dtype and device, any strides, written in place.
    Returns out (B, Hq, Nq, Dv) in q's dtype, and with return_lse=True also lse (B, Hq, Nq) float32, the
    natural-log row log-sum-exp of the transformed scores.
    block_m, block_n: optional powers of two overriding the default tile (>= 16 on the GPU);
    num_warps, num_stages: optional launch overrides (for tuning; defaults from default_blocks()).
    precision: how fp32 inputs are multiplied: "ieee" (the default, the seed's: no product rounded to tf32; fp32
    FMAs on CUDA cores, or on an H200-class GPU exact products on the fp64 tensor cores, ieee_on_fp64_tensor_cores)
    or "tf32x3" (each product as three tf32 tensor-core products, a split of each operand into a tf32
    head and a tf32 tail: fp32's accuracy within the same oracle tolerance, at tensor-core speed). fp16 and
    bf16 products are exact in fp32 whatever it says. Plain "tf32" (10 mantissa bits) is not offered: it
    fails the fp32 oracle (mutant fp32_tf32_dot).

    Paths and features: every feature runs on every path (pointer or descriptor loads, split-KV, one or two
    passes, every precision) except the split head dim (fp32, D = 128), which needs Dv == D: another Dv runs the
    whole head dims (head_dim_split).
    """
    B, H, Nq, Nk, D, scale = check_attention_inputs(q, k, v, causal, scale, out, block_m, block_n)
    features = check_features(q, causal, window, softcap, alibi_slopes)
    _check_options(num_warps, num_stages, precision)
    if out is None:
        out = torch.empty((B, H, Nq, v.shape[3]), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    _forward(q, k, v, out, lse, B, Nq, Nk, scale, causal, features, return_lse, block_m, block_n, num_warps,
             num_stages, precision)
    return (out, lse) if return_lse else out


def _forward(q, k, v, out, lse, B, Nq, Nk, scale, causal, features, return_lse, block_m, block_n, num_warps,
             num_stages, precision, seqs=None, pages=None):
    """Launch _attn_fwd (and the split-KV combine) on checked (B, H, N, D) tensors, writing out and lse.
    seqs: (cu_seqlens_q, cu_seqlens_k) for packed sequences (attention_varlen): q, k, v, out and lse are then
    views with batch stride 0 over the packed rows, B the number of sequences and Nq, Nk the longest lengths.
    pages: (block_table, cache_seqlens, page_size) for a paged KV cache (attention_paged): k and v are the caches
    as (num_pages, Hkv, page_size, D) views and Nk the longest cache length."""
    H, D, Hkv, Dv = q.shape[1], q.shape[3], k.shape[1], v.shape[3]
    window_left, window_right, softcap, slopes = features
    if B * H * Nq > 0:
        # packed sequences load through pointers (a descriptor spans one dense tensor) and never split their keys
        use_tma = seqs is None and pages is None and tma_eligible(k) and tma_eligible(v)
        # the tile by the larger head dim: it sizes Q and K's tiles (D) or V's and the accumulator's (Dv)
        bm, bn, warps, stages = default_blocks(Nq, Nk, max(D, Dv), q.dtype, precision, use_tma, q.device)
        bm, bn = block_m or bm, block_n or bn
        fixed_stages = num_stages is not None
        num_warps, num_stages = num_warps or warps, num_stages or stages
        # a descriptor's box is at most 256 rows (TMA's limit): a wider pinned key block loads through pointers
        use_tma = use_tma and bn <= 256
        d_split = head_dim_split(D, q.dtype, Dv)
        # tf32x3 at a split head dim reads the Q tile again for every key block (from L1/L2) instead of holding
        # it, split in tf32 heads and tails, in registers for the whole loop (fewer spills). H200, D = 128, N = 4k,
        # kernel / SDPA-efficient in one process: Q held 1.19, causal 1.13; this clamped read 1.28 and 1.23. ieee:
        # 0.27 either way, so it keeps Q.
        q_in_loop = d_split and precision == "tf32x3"
        # fp32 "ieee" runs one exact pass (see _attn_fwd_keys) instead of a fused pass and an exact one (the rule
        # was measured on the FMA path, and the fp64-tensor-core path keeps it): the FMA dots hold so many
        # registers that the second copy of the loop spills them (triton 3.6, sm_90, D = 64: 1.9 KB of stack
        # against none), and fusing the scale into the shift saves nothing next to those dots (H200, kernel /
        # SDPA-efficient: D = 64 0.55 -> 0.41 with two passes). A plain multiply would fuse in this single pass
        # too. guards: mutant exact_pass_fused; case extreme_scores_fp32
        two_pass = fused_then_exact(q.dtype, precision)
        # a split head dim is not combined with split-KV (fp32 decode, rare, runs unsplit)
        splits, keys_per_split = (1, Nk) if d_split or seqs or pages else split_plan(B, H, Nq, Nk, bm, bn,
                                                                                         q.device)
        if splits > 1:
            # the partial states of the splits (every one written by its program, see _attn_fwd)
            o_dst = torch.empty((B * H, splits, Nq, Dv), dtype=torch.float32, device=q.device)
            l_dst = torch.empty((B * H, splits, 2, Nq), dtype=torch.float32, device=q.device)   # m and l
        else:
            o_dst, l_dst = out, lse
        grid = (triton.cdiv(Nq, bm) * B * H, 1, splits)
        desc_k = desc_v = None
        if use_tma:
            # K as (B, Hkv, Nk, D) and V as (B, Hkv, Nk, Dv) in their own strides, each with the box of its own head
            # dim, so blocks never cross into another head; V's descriptor has Dv's shape and box.
            # guards: mutants tma_desc_rows_nq, tma_desc_padded_head_dim, dv_descriptor_shape_from_d;
            # cases half_descriptor_layout, dv_half_descriptor
            desc_k = TensorDescriptor(k, [B, Hkv, Nk, D], list(k.stride()), [1, 1, bn, head_dim_block(D)])
            desc_v = TensorDescriptor(v, [B, Hkv, Nk, Dv], list(v.stride()), [1, 1, bn, head_dim_block(Dv)])
        # causal is the window's right side 0, and so is a window (left, 0): both take the causal kernel (its
        # block skipping and its heaviest-first order); WINDOW_RIGHT is a right side > 0 without causal
        is_causal = causal or window_right == 0
        if is_causal:
            window_right = None
        # the features' arguments in the kernel's log2 units (None for a feature that is off). guards: mutant
        # softcap_natural_units; case softcap_negative_scale
        softcap_log2 = None if softcap is None else softcap * LOG2E
        slope_strides = (None, None) if slopes is None else slopes.stride()
        # A tile the caller pins may not fit the default pipeline depth in shared memory (H200, fp16, D = 128,
        # descriptor loads: 64 x 128 with the decode default of 4 stages asks 273 KB of 227; found by a generated
        # case): it then runs with fewer stages, remembered per configuration. A depth the caller gave is kept.
        # guards: case block_override_decode_d128 (GPU)
        key = (q.device, q.dtype, D, Dv, bm, bn, num_warps, num_stages, use_tma, d_split, precision, is_causal,
               splits > 1, window_left is not None, window_right is not None, softcap is not None,
               slopes is not None, seqs is not None, pages is not None)
        num_stages = _STAGES_THAT_FIT.get(key, num_stages)
        while True:
            try:
                # every tensor passes its own strides. guards: mutants v_strides_from_k, out_strides_from_q
                _attn_fwd[grid](
                    q, k, v, o_dst, l_dst, scale * LOG2E,
                    *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
                    H, Nq, Nk, keys_per_split, desc_k, desc_v,
                    window_left, window_right, softcap_log2, slopes, *slope_strides, *(seqs or (None, None)),
                    *((pages[0], pages[0].stride(0), pages[1], pages[2]) if pages else (None, None, None, None)),
                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=launch_block_d(D, q.dtype, Dv), HEAD_DIM=D,
                    SPLIT=splits > 1, D_SPLIT=d_split, Q_IN_LOOP=q_in_loop, MUL_RN=not interpreter_active(),
                    TWO_PASS=two_pass,
                    IS_CAUSAL=is_causal, STORE_LSE=return_lse, NEGATIVE_SCALE=scale < 0, USE_TMA=use_tma,
                    # fp32 products as precision says (attention_tf32x3 is the verify entry of "tf32x3")
                    INPUT_PRECISION=dot_precision(q.dtype, precision, q.device),
                    # the optional features (features_off gives these for a call without them); H // Hkv query heads
                    # share a kv head, and V's block is Dv's. guards: mutants gqa_group_from_batch, dv_block_from_d;
                    # cases gqa_groups_of_four_causal, dv_larger_odd_causal
                    KV_GROUP=H // Hkv, BLOCK_DV=head_dim_block(Dv) // (2 if d_split else 1), HEAD_DIM_V=Dv,
                    WINDOW_LEFT=window_left is not None, WINDOW_RIGHT=window_right is not None,
                    SOFTCAP=softcap is not None, HAS_ALIBI=slopes is not None, VARLEN=seqs is not None,
                    PAGED=pages is not None, num_warps=num_warps, num_stages=num_stages,
                    # fused multiply-adds, made exact where they would not be by a second pass (_attn_fwd_keys).
                    # Only the GPU fuses: the interpreter computes in NumPy.
                    enable_fp_fusion=True)
                break
            except OutOfResources:
                if fixed_stages or num_stages == 1:
                    raise
                num_stages -= 1
        _STAGES_THAT_FIT[key] = num_stages
        if splits > 1:
            cm = 16
            _attn_combine[(triton.cdiv(Nq, cm) * B * H,)](
                o_dst, l_dst, out, lse, *out.stride(), *lse.stride(), H, Nq, splits,
                BLOCK_M=cm, BLOCK_D=head_dim_block(Dv), HEAD_DIM=Dv, STORE_LSE=return_lse, num_warps=4)


def attention_tf32x3(q, k, v, *, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None, out=None,
                     return_lse=False, block_m=None, block_n=None, num_warps=None, num_stages=None):
    """attention with precision="tf32x3": the entry point verify judges that mode through
    (flashcheck verify flashcheck.kernel.fused:attention_tf32x3), on the same fp32 tolerance as "ieee"."""
    return attention(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                     out=out, return_lse=return_lse, block_m=block_m, block_n=block_n, num_warps=num_warps,
                     num_stages=num_stages, precision="tf32x3")


def _packed(t):
    """(total, H, D) packed rows as the (1, H, total, D) view the dense kernel reads, with batch stride 0 (each
    program adds its own sequence's first row)."""
    return t.as_strided((1, t.shape[1], t.shape[0], t.shape[2]), (0, t.stride(1), t.stride(0), t.stride(2)),
                        t.storage_offset())


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, causal=False,
                     scale=None, window=None, softcap=None, alibi_slopes=None, out=None, return_lse=False,
                     block_m=None, block_n=None, num_warps=None, num_stages=None, precision="ieee"):
    """Fused FlashAttention-2 forward over packed sequences of different lengths (FlashAttention's varlen layout).

    q: (total_q, Hq, D); k: (total_k, Hkv, D); v: (total_k, Hkv, Dv); any strides. cu_seqlens_q, cu_seqlens_k:
    int32 (batch + 1,) on q's device, starting at 0, non-decreasing, ending at total_q and total_k: sequence b
    is rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v; either
    may be empty. max_seqlen_q/k: optional bounds of the lengths (the grid's size; a bound below a real length
    is an error, not a truncation). Every rule of attention holds within each sequence: GQA, Dv, the bottom-right
    causal mask and window, softcap, ALiBi (slopes (Hq,) or (batch, Hq)), a row without keys giving 0 (lse
    -inf). out: optional (total_q, Hq, Dv) in q's dtype. Returns out (total_q, Hq, Dv), and with return_lse=True
    also lse (Hq, total_q) float32. The same kernel as attention: its programs read their sequence's offsets.
    The offsets are checked on the host (one synchronisation per call)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dim() != 3:
            raise ValueError(f"{name} must have rank 3 (total, H, D) for packed sequences, got shape {tuple(t.shape)}")
    if out is not None and isinstance(out, torch.Tensor) and out.dim() != 3:
        raise ValueError(f"out must have rank 3 (total_q, Hq, Dv), got shape {tuple(out.shape)}")
    total_k = k.shape[0] if isinstance(k, torch.Tensor) else None
    if total_k == 0 and isinstance(v, torch.Tensor):
        # every key sequence empty (legal): one stand-in key row lets the dense checks run; every row gives 0
        k, v = k.new_zeros((1, *k.shape[1:])), v.new_zeros((1, *v.shape[1:]))
    q4, k4, v4 = _packed(q), _packed(k), _packed(v)
    given = None if out is None else _packed(out)
    _, H, total_q, _, D, scale = check_attention_inputs(q4, k4, v4, causal, scale, given, block_m, block_n)
    batch, most_q, most_k = check_offsets(cu_seqlens_q, cu_seqlens_k, q.shape[0], total_k, q.device,
                                          max_seqlen_q, max_seqlen_k)
    features = check_features(q4, causal, window, softcap, alibi_slopes, batch=batch)
    _check_options(num_warps, num_stages, precision)
    if out is None:
        out = torch.empty((total_q, H, v.shape[2]), dtype=q.dtype, device=q.device)
    lse = torch.empty((H, total_q), dtype=torch.float32, device=q.device)
    if total_k == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out
    lse3 = lse.as_strided((1, H, total_q), (0, lse.stride(0), lse.stride(1)))
    # the grid by the longest sequences (max_seqlen_q/k only bound them: a larger bound launches empty blocks)
    _forward(q4, k4, v4, _packed(out), lse3, batch, most_q, most_k, scale, causal, features, return_lse,
             block_m, block_n, num_warps, num_stages, precision, seqs=(cu_seqlens_q, cu_seqlens_k))
    return (out, lse) if return_lse else out


def attention_paged(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None, window=None,
                    softcap=None, alibi_slopes=None, out=None, return_lse=False, block_m=None, block_n=None,
                    num_warps=None, num_stages=None, precision="ieee"):
    """Fused FlashAttention-2 forward over a paged KV cache (decode and chunked prefill, as vLLM and FlashAttention's
    flash_attn_with_kvcache lay it out).

    q: (B, Hq, Nq, D); k_cache: (num_pages, page_size, Hkv, D); v_cache: (num_pages, page_size, Hkv, Dv); any
    strides; page_size any positive int (a power of two or not). block_table: int32 (B, max_pages);
    cache_seqlens: int32 (B,): batch b's key j is slot j % page_size of page block_table[b, j // page_size], for j
    < cache_seqlens[b] (at most the table's capacity; 0 is legal: its rows give 0, lse -inf). Slots and table
    entries beyond a sequence's keys may hold anything, NaN included: they are never read. Every rule of attention
    holds per batch with Nk = cache_seqlens[b] (the bottom-right causal mask and window, GQA, Dv, softcap,
    ALiBi). out: optional (B, Hq, Nq, Dv). Returns out, and with return_lse=True also lse (B, Hq, Nq) float32.
    The same kernel as attention: each block of keys looks its rows up in the table (_paged_rows). The table and
    lengths are checked on the host (one synchronisation per call)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if isinstance(t, torch.Tensor) and t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 (num_pages, page_size, Hkv, D), got shape {tuple(t.shape)}")
    if isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor):
        if k_cache.shape[:3] != v_cache.shape[:3]:
            raise ValueError(f"k_cache and v_cache must have the same (num_pages, page_size, Hkv), got "
                             f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
        if k_cache.shape[0] == 0 or k_cache.shape[1] == 0:
            raise ValueError(f"the cache has no slots: shape {tuple(k_cache.shape)}")
    # (num_pages, Hkv, page_size, D) views: a page is the kernel's batch stride, a slot its row stride
    k4, v4 = k_cache.permute(0, 2, 1, 3), v_cache.permute(0, 2, 1, 3)
    B = q.shape[0] if isinstance(q, torch.Tensor) and q.dim() == 4 else 0
    # the dense checks (dtypes, devices, heads, head dims, out) on one page per batch standing in for the keys
    _, H, Nq, _, D, scale = check_attention_inputs(q, k4[:1].expand(B, -1, -1, -1), v4[:1].expand(B, -1, -1, -1),
                                                   causal, scale, out, block_m, block_n)
    page_size = k_cache.shape[1]
    most_k = check_pages(block_table, cache_seqlens, B, k_cache.shape[0], page_size, q.device)
    features = check_features(q, causal, window, softcap, alibi_slopes)
    _check_options(num_warps, num_stages, precision)
    if out is None:
        out = torch.empty((B, H, Nq, v_cache.shape[3]), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    _forward(q, k4, v4, out, lse, B, Nq, max(most_k, 1), scale, causal, features, return_lse, block_m, block_n,
             num_warps, num_stages, precision, pages=(block_table, cache_seqlens, page_size))
    return (out, lse) if return_lse else out


# What flashcheck verify should know about this kernel (docs/design.md: declarations): its scores stay in fp32,
# so half-precision cases are judged without the allowance for scores rounded to the input dtype.
# each row is computed on its own, so a NaN in one query row stays in it (the case that tests it is judged only
# with the declaration: the protocol admits finite inputs)
_OWN = {"fp32_scores": True, "nan_stays_in_row": True}
attention.flashcheck_declarations = attention_tf32x3.flashcheck_declarations = dict(_OWN)
attention_varlen.flashcheck_declarations = attention_paged.flashcheck_declarations = dict(_OWN)
