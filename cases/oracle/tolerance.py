"""The tolerance: how far a correct kernel may land from the float64 reference, element by element.

Derived, not guessed, and not measured on one baseline run (a baseline's error can be small by luck, or,
for PyTorch in half precision, large enough that wrong answers pass). The bound follows every rounding a
correct kernel is allowed to make, and how each one propagates into the output:

The numerics a correct kernel may use (the protocol's, as FlashAttention and the seed's kernel use them):
  * scores q.k accumulated in fp32, in any order (inputs in their own dtype: products of fp16/bf16 values
    are exact in fp32); the scale applied in fp32, also folded with log2(e) for exp2;
  * in fp16/bf16, Q scaled in its own dtype before the product (the seed's recipe), or the scores rounded
    to the input dtype (PyTorch's half-precision matmul);
  * the weights P rounded to the input dtype for the P.V product (tensor cores), fp16's subnormals of P
    flushed to 0; the running state l, acc in fp32 and rescaled once per key block;
  * the output rounded to its dtype.

Each rounding of a score moves it by at most delta_ij (natural-log units). Perturbing the scores by
|delta_ij| <= D_ij moves the softmax weights to p'_j = p_j e^{delta_j} / Z with Z = sum_k p_k e^{delta_k},
and for ANY centre c:  out' - out = sum_j (p'_j - p_j) (v_j - c). So, exactly (no first-order assumption,
which breaks down exactly where the scores are large):

    |out'_id - out_id| <= sum_j p_ij |p'_ij / p_ij - 1| |v_jd - out_id|,
    |p'_j / p_j - 1| <= max(e^{D_j} / Zlo - 1, 1 - e^{-D_j} / Zhi),  Zlo/hi = sum_k p_k e^{-+D_k}.

A rounding common to a whole row (Q scaled in its dtype: delta_ij = e_i . k_j) only matters through the
variation of k_j across keys, so it is bounded with k centred (k_j - c); an independent rounding of each
score (fp32 accumulation, half-precision scores) is not. The log-sum-exp moves by log sum_j p_j e^{delta_j}
(no centring: a common shift moves it). To all that come the roundings after the softmax: P to the dtype,
the fp32 accumulation over Nk terms, the division, and the final rounding of the output.

The model's worst cases are bounds, its accumulation terms (sqrt(n) roundings of a sum of n terms) are
probabilistic (Higham & Mary); SAFETY covers the gap. tests/test_tolerance.py runs several independent
correct formulations (fp32 matmul-softmax-matmul, einsum, SDPA, a blocked online softmax with Q pre-scaled
and P rounded, PyTorch in the input dtype, the project's kernels) through generated cases in every dtype
and layout: none may exceed the tolerance; mean(V) and zeros must not pass it where they are wrong.

Where the tolerance is so wide that a trivially wrong answer (zeros, or the plain mean of V) would pass,
the case cannot be judged tightly: discriminates() says so, and the verdict is "inconclusive", never PASS.
"""
import math
from dataclasses import dataclass

import numpy as np
import torch

from flashcheck.reference import numpy_ref

U32 = 2.0 ** -24                                  # fp32 unit roundoff
UNIT = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
SAFETY = 2.0
MAX_SHIFT = 40.0                                  # past this a score's weight may change by any factor
CHUNK = 1 << 22                                   # elements of one (rows, keys, D) block in the |v - out| sum
EXACT = 1 << 25                                   # up to this many B*H*Nq*Nk*D, that sum exactly (else a bound)


@dataclass
class Expectation:
    """The reference answer of one case and the tolerance derived for each element of it.

    out (B, H, Nq, D) and lse (B, H, Nq) are float64; tol has out's shape, tol_lse lse's. p is the reference's
    softmax weights (B, H, Nq, Nk), kept for the discrimination check."""
    out: np.ndarray
    lse: np.ndarray
    tol: np.ndarray
    tol_lse: np.ndarray
    mean_v: np.ndarray = None      # the plain mean of the visible values, per row (a trivially wrong answer)
    uniform: bool = False          # every row's softmax is uniform: its answer IS the mean of V
    spread: np.ndarray = None      # (B, H, 1, D): how much V varies over the keys (its scale, if constant)


def expectation(dtype, q, k, v, *, causal=False, scale=None, align="bottom-right", half_scores=True):
    """The reference and the per-element tolerance for a kernel of `dtype` on these inputs.

    q, k, v: float64 arrays (B, H, N, D) holding the dtype-rounded values the kernel was given.
    half_scores=False: the kernel keeps its scores in fp32 (declared --fp32-scores): no allowance for scores
    rounded to a half-precision dtype."""
    D, Nk = q.shape[-1], k.shape[-2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    ref = numpy_ref.softmax_parts(q, k, v, causal, scale, align)
    u = UNIT[dtype]
    half = dtype != torch.float32
    with np.errstate(invalid="ignore", over="ignore"):
        # --- how far each score may move (natural-log units) ---------------------------------------------
        s = np.where(ref.seen, ref.s, 0.0)
        absq = np.abs(q)
        # uncentred magnitude of each dot: its partial sums, and a relative rounding of q or k, scale with it
        dot_abs = abs(scale) * np.matmul(absq, np.swapaxes(np.abs(k), -1, -2))
        # fp32: the dot's partial sums rounded sqrt(D) times (any order), the scale (and log2 e) applied,
        # the row max subtracted, exp2 of the result: independent per score
        indep = SAFETY * 2.0 * math.sqrt(D) * U32 * dot_abs + 4.0 * U32 * (np.abs(s) + 1.0)
        if half:
            # the scores themselves rounded to the input dtype (PyTorch's half matmul: the product, then its
            # scaling): independent per score
            if half_scores:
                indep = indep + 2.0 * u * np.abs(s)
            # Q scaled in its own dtype: delta_ij = e_i . k_j, one error vector per row; only k's variation
            # across keys moves the weights (centre: the midrange of each column of k)
            kc = k - 0.5 * (np.nanmax(k, axis=2, keepdims=True) + np.nanmin(k, axis=2, keepdims=True)) \
                if Nk else k
            common = u * abs(scale) * np.matmul(absq, np.swapaxes(np.abs(kc), -1, -2))
            shift = indep + common                 # for the output
            shift_lse = indep + u * dot_abs        # for the lse, which a common shift does move
        else:
            shift = shift_lse = indep
        shift = np.where(ref.seen, np.minimum(shift, MAX_SHIFT), 0.0)
        shift_lse = np.where(ref.seen, np.minimum(shift_lse, MAX_SHIFT), 0.0)
        p = np.where(np.isnan(ref.p), 0.0, ref.p)

        # --- the weights' relative change, exactly (see the module docstring) --------------------------------
        grow, shrink = np.exp(shift), np.exp(-shift)
        z_hi = (p * grow).sum(-1, keepdims=True)
        z_lo = (p * shrink).sum(-1, keepdims=True)
        z_lo = np.where(z_lo > 0, z_lo, 1.0)
        z_hi = np.where(z_hi > 0, z_hi, 1.0)
        rel = np.maximum(grow / z_lo - 1.0, 1.0 - shrink / z_hi)
        del grow, shrink
        out = np.where(np.isnan(ref.out), 0.0, ref.out)
        moved = _weighted_spread(p * rel, v, out, ref.seen, causal, align)
        # --- after the softmax ------------------------------------------------------------------------------
        pv = np.matmul(p, np.abs(v))
        nk_seen = ref.seen.sum(-1)[None, None, :, None]
        after = SAFETY * 3.0 * np.sqrt(np.maximum(nk_seen, 1)) * U32 * pv + 2.0 * U32 * np.abs(out)  # fp32, 1/l
        if half:
            tiny = float(torch.finfo(dtype).tiny)
            after = after + u * pv                                                          # P to the dtype
            # a weight below the dtype's smallest normal: flushed to 0 when the kernel rounds it before
            # normalising (FlashAttention: exp(s - m) with m the running max, which is at most the row max,
            # so only keys with exp(s - max) < tiny can be flushed), or rounded to the subnormal grid (half its
            # spacing, u * tiny) when it rounds the normalised weight (PyTorch's softmax in the dtype)
            unnormalised = p * np.exp(np.where(np.isfinite(ref.lse), ref.lse, 0.0)[..., None]
                                      - np.where(ref.seen, s, -np.inf).max(-1, keepdims=True, initial=-np.inf))
            lost = np.where(unnormalised < tiny, p, 0.0) + np.where(p < tiny, np.minimum(p, u * tiny), 0.0)
            after = after + np.matmul(lost, np.abs(v))
        rounding = 2.0 * u * np.abs(out) + float(torch.finfo(dtype).smallest_normal) * u   # the output's own
        tol = moved + after + rounding

        # --- the log-sum-exp ----------------------------------------------------------------------------------
        lse_hi = np.log(np.maximum((p * np.exp(shift_lse)).sum(-1), 1.0))
        z = (p * np.exp(-shift_lse)).sum(-1)
        lse_lo = -np.log(np.where(z > 0, z, 1.0))
        fin_lse = np.where(np.isfinite(ref.lse), np.abs(ref.lse), 0.0)
        tol_lse = (np.maximum(lse_hi, lse_lo) + 4.0 * U32 * (fin_lse + 1.0)
                   + SAFETY * 3.0 * np.sqrt(np.maximum(nk_seen[..., 0], 1)) * U32)

        # --- the trivially wrong answers ----------------------------------------------------------------------
        counts = ref.seen.sum(-1, keepdims=True)
        mean_v = np.matmul(ref.seen / np.maximum(counts, 1), v)
        mean_v = np.where(counts[None, None] > 0, mean_v, 0.0)
        live = counts[..., 0] > 0
        pmax = np.where(ref.seen, ref.p, -np.inf).max(-1) if Nk else np.zeros(ref.lse.shape)
        pmin = np.where(ref.seen, ref.p, np.inf).min(-1) if Nk else np.zeros(ref.lse.shape)
        uniform = bool(np.all(~live[None, None] | ~np.isfinite(pmax) | (pmax - pmin <= 1e-9 * np.abs(pmax))))
        spread = np.abs(v - v.mean(2, keepdims=True)).mean(2, keepdims=True) if Nk else np.zeros_like(v[:, :, :1])
        spread = np.where(spread > 0, spread, np.abs(v).max(2, keepdims=True) if Nk else 0.0)
    return Expectation(ref.out, ref.lse, tol, tol_lse, mean_v, uniform, spread)


def _weighted_spread(w, v, out, seen, causal, align):
    """An upper bound of sum_j w_ij |v_jd - out_id|, (B, H, Nq, D): how far the weights' change moves the
    output. It is also at most max_{j seen} |v_jd - out_id|: a correct output is a convex combination of the
    values its row sees. Exact up to EXACT elements (in blocks of query rows: the (rows, keys, D) difference
    would not fit in memory); past that, the centred bound sum_j w_ij |v_jd - c_d| + |out_id - c_d| sum_j w_ij
    with c the mean value row, which costs one product."""
    B, H, Nq, Nk = w.shape
    D = v.shape[-1]
    if not (Nq and Nk and D):
        return np.zeros((B, H, Nq, D))
    if B * H * Nq * Nk * D <= EXACT:
        res = np.zeros((B, H, Nq, D))
        rows = max(1, CHUNK // (Nk * D))
        for b in range(B):
            for h in range(H):
                for i in range(0, Nq, rows):
                    diff = np.abs(v[b, h][None, :, :] - out[b, h, i:i + rows][:, None, :])   # (rows, Nk, D)
                    res[b, h, i:i + rows] = np.einsum("ij,ijd->id", w[b, h, i:i + rows], diff)
    else:
        c = v.mean(axis=2, keepdims=True)
        res = np.matmul(w, np.abs(v - c)) + np.abs(out - c) * w.sum(-1, keepdims=True)
    # the values a row sees are a prefix of the keys (all of them when not causal)
    last = np.full(Nq, Nk - 1) if not causal else np.arange(Nq) + (Nk - Nq if align == "bottom-right" else 0)
    sees = last >= 0
    idx = np.clip(last, 0, Nk - 1)
    hi = np.maximum.accumulate(v, axis=2)[:, :, idx]
    lo = np.minimum.accumulate(v, axis=2)[:, :, idx]
    reach = np.where(sees[None, None, :, None], np.maximum(np.abs(hi - out), np.abs(out - lo)), 0.0)
    return np.minimum(res, reach)


def loose_rows(expect, share):
    """(rows whose tolerance reaches `share` of V's spread in some column, rows with a finite reference)."""
    fin = np.isfinite(expect.out).all(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(expect.spread > 0, expect.tol / expect.spread, 0.0)
    loose = (np.nan_to_num(r, nan=0.0) >= share).any(-1) & fin
    return int(loose.sum()), int(fin.sum())


def discriminates(expect, judged=None):
    """None when the tolerance tells a wrong answer from the right one; else why it cannot (a trivially
    wrong answer, zeros or the plain mean of the visible values, would pass it everywhere).

    judged: a bool mask of the elements compared (default: every finite reference element)."""
    ref, tol = expect.out, expect.tol
    mask = np.isfinite(ref) if judged is None else judged & np.isfinite(ref)
    if not mask.any():
        return None
    if np.abs(ref[mask]).max() > 0 and np.all(np.abs(ref[mask]) <= tol[mask]):
        return "zeros would pass: the tolerance is as large as the output itself"
    if not expect.uniform and np.all(np.abs(expect.mean_v[mask] - ref[mask]) <= tol[mask]):
        return "the plain mean of the values would pass: the tolerance cannot tell the softmax from a uniform one"
    return None
