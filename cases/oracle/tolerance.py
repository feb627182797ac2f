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

    |out'_id - out_id| <= sum_j |p'_ij - p_ij| |v_jd - out_id|, and p'_j lies exactly between
    p_j e^{-D_j} / (p_j e^{-D_j} + sum_{k != j} p_k e^{+D_k})  and  p_j e^{D_j} / (p_j e^{D_j} + sum_{k != j} p_k e^{-D_k})
(computed from log-weights, uncapped: a dominant weight cannot grow past 1, and a weight that underflowed in
float64 still counts when the shifts could raise it).

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
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from flashcheck.reference import torch_ref
from flashcheck.reference.problem import plain

U32 = 2.0 ** -24                                  # fp32 unit roundoff
UNIT = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
SAFETY = 2.0
CHUNK = 1 << 22                                   # elements of one (rows, keys, D) block in the |v - out| sum
EXACT = 1 << 25                                   # up to this many B*H*Nq*Nk*D, that sum exactly (else a bound)


@dataclass
class Expectation:
    """The reference answer of one case and the tolerance derived for each element of it.

    out (B, H, Nq, D) and lse (B, H, Nq) are float64; tol has out's shape, tol_lse lse's."""
    out: np.ndarray
    lse: np.ndarray
    tol: np.ndarray
    tol_lse: np.ndarray
    mean_v: np.ndarray = None      # the plain mean of the visible values, per row (a trivially wrong answer)
    uniform: bool = False          # every row's softmax is uniform: its answer IS the mean of V
    spread: np.ndarray = None      # (B, H, 1, D): how much V varies over the keys (its scale, if constant)
    # the convex hull of the values each row sees, (B, H, Nq, Dv) each (0 on rows that see no key), and how far
    # outside it a correct output can land: only the roundings after the softmax (the score errors that make
    # most of tol only move the output inside the hull). Where tol is loose (scores the dtype cannot resolve)
    # the hull still judges tightly.
    hull_lo: np.ndarray = None
    hull_hi: np.ndarray = None
    tol_hull: np.ndarray = None
    # the score side (Scores) for a relation that changes only V, kept for small cases (KEEP_SCORES)
    scores: object = field(default=None, repr=False, compare=False)


HOST_BELOW = 2 ** 22    # multiply-adds (B * Hq * Nq * Nk * (D + Dv)) up to which a GPU case's reference is the host's


def reference_device(device, q_shape, k_shape, v_shape):
    """Where the float64 reference of a case of these shapes is computed when its tensors are on `device`: on the
    host for a small GPU case. There the reference is a few hundred tiny kernels, each launch dearer than its
    work, and verify --jobs (or pytest-xdist) has a dozen processes sharing the GPU: on an H200 with 16 workers,
    the fused kernel's cases took a median 0.33 s judged with the reference on the GPU and 0.10 s with it on the
    host (SDPA's 0.39 s and 0.34 s). $FLASHCHECK_HOST_REFERENCE sets the bound (0: always the device's)."""
    if torch.device(device).type == "cpu":
        return device
    below = int(os.environ.get("FLASHCHECK_HOST_REFERENCE", HOST_BELOW))
    B, Hq, Nq, D = q_shape
    return "cpu" if B * Hq * Nq * k_shape[-2] * (D + v_shape[-1]) <= below else device


def expectation(dtype, q, k, v, *, causal=False, scale=None, align="bottom-right", half_scores=True, device=None,
                problem=None, scores=None, lean=False):
    """The reference and the per-element tolerance for a kernel of `dtype` on these inputs.

    q, k, v: (B, Hq, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, Dv) tensors or arrays holding the dtype-rounded values the
    kernel was given. problem: the reference.problem.Problem (default: the plain one of causal, scale and align).
    Computed in float64 on `device` (default: q's device, or the CPU for arrays); the Expectation holds NumPy
    arrays. half_scores=False: the kernel keeps its scores in fp32 (declared --fp32-scores): no allowance for
    scores rounded to a half-precision dtype.

    scores: the Scores of another Expectation (its .scores) on the same q and k, where only v differs: its score
    side is taken as it is (q, k, device, problem and half_scores are then its own), so the result is bit for bit
    what the whole computation gives. lean=True leaves out what only a verdict on the case itself reads (mean_v,
    uniform, spread, the hull's allowance): what a relation between two runs needs is out, lse, tol and tol_lse."""
    if scores is None:
        device = device or (q.device if isinstance(q, torch.Tensor) else "cpu")
        q, k, v = (torch.as_tensor(t).to(device=device, dtype=torch.float64) for t in (q, k, v))
        if problem is None:
            problem = plain(tuple(q.shape), tuple(k.shape), tuple(v.shape), causal, scale, align)
        ref = torch_ref.softmax_parts(q, k, v, problem=problem)
        scores = _score_side(dtype, half_scores, q, k, ref, problem)
        return _value_side(scores, torch_ref.expand_kv(v, problem), ref.out, lean)
    v = torch_ref.expand_kv(torch.as_tensor(v).to(device=scores.p.device, dtype=torch.float64), scores.problem)
    return _value_side(scores, v, torch.matmul(scores.ref.p, v), lean)     # p v, as softmax_parts computes it


KEEP_SCORES = 1 << 22   # score elements (B * Hq * Nq * Nk) up to which an Expectation keeps its Scores for reuse


@dataclass
class Scores:
    """The half of an Expectation that depends on q and k alone: the scores and their softmax (ref), how far each
    weight may move (w), the log-sum-exp's tolerance, and what the roundings after the softmax read of the weights.
    A relation that changes only V (V scaled, V shifted) reuses its base run's, which is most of the work."""
    dtype: object
    problem: object
    ref: object          # torch_ref.Softmax of the base inputs (its out is the base's)
    p: torch.Tensor      # the weights, NaN (NaN inputs) as 0
    w: torch.Tensor      # the largest change of each weight (_weight_change)
    nk_seen: torch.Tensor
    lost: object         # half precision: the weights a kernel may flush or round to the subnormal grid
    tol_lse: torch.Tensor
    uniform: bool


def _score_side(dtype, half_scores, q, k, ref, problem):
    """Scores of q and k (float64, on their device; k as stored, expanded here to the query heads)."""
    # every quantity below is per query head: k as the query heads read it
    k = torch_ref.expand_kv(k, problem)
    D, Nk = q.shape[-1], k.shape[-2]
    scale = problem.scale
    u = UNIT[dtype]
    half = dtype != torch.float32
    kt = k.transpose(-1, -2)
    # --- how far each score may move (natural-log units) -------------------------------------------------
    s = torch.where(ref.seen, ref.s, 0.0)
    absq = q.abs()
    # uncentred magnitude of each dot: its partial sums, and a relative rounding of q or k, scale with it
    dot_abs = abs(scale) * torch.matmul(absq, kt.abs())
    p = torch.where(ref.p.isnan(), 0.0, ref.p)
    if problem.softcap is None and problem.slopes is None:
        shift, shift_lse = _score_shifts(dtype, half_scores, s, q, k, p, dot_abs, scale, D, Nk)
    else:
        shift, shift_lse = _transformed_shifts(dtype, half_scores, ref, s, q, k, dot_abs, problem, D)
    shift = torch.where(ref.seen, shift, 0.0)
    shift_lse = torch.where(ref.seen, shift_lse, 0.0)
    log_p = _log_weights(ref)
    w = _weight_change(ref, shift, log_p)
    nk_seen = ref.seen.sum(-1)[None, None, :, None].to(torch.float64)
    lost = None
    if half:
        tiny = float(torch.finfo(dtype).tiny)
        # a weight below the dtype's smallest normal: flushed to 0 when the kernel rounds it before
        # normalising (FlashAttention: exp(s - m) with m the running max, which is at most the row max,
        # so only keys with exp(s - max) < tiny can be flushed), or rounded to the subnormal grid (half its
        # spacing, u * tiny) when it rounds the normalised weight (PyTorch's softmax in the dtype)
        row_max = torch.where(ref.seen, s, -math.inf).amax(-1, keepdim=True) if Nk else 0.0
        unnormalised = p * torch.exp(torch.where(ref.lse.isfinite(), ref.lse, 0.0)[..., None] - row_max)
        lost = torch.where(unnormalised < tiny, p, 0.0) + torch.where(p < tiny, p.clamp(max=u * tiny), 0.0)

    # --- the log-sum-exp --------------------------------------------------------------------------------------
    # log sum_j p_j e^{+-D_j}, with log p_j from the scores (exact where p_j underflows)
    lse_hi = torch.logsumexp(log_p + shift_lse, -1).clamp(min=0.0).nan_to_num(nan=0.0) if Nk else torch.zeros_like(ref.lse)
    lse_lo = (-torch.logsumexp(log_p - shift_lse, -1)).clamp(min=0.0).nan_to_num(nan=0.0) if Nk else torch.zeros_like(ref.lse)
    fin_lse = torch.where(ref.lse.isfinite(), ref.lse.abs(), 0.0)
    tol_lse = (torch.maximum(lse_hi, lse_lo) + 4.0 * U32 * (fin_lse + 1.0)
               + SAFETY * 3.0 * nk_seen[..., 0].clamp(min=1).sqrt() * U32)
    # a row that sees no key: its lse is -inf exactly (compare judges non-finite references exactly); lse_lo
    # came out +inf there, which the properties' sums of two tolerances overflowed
    tol_lse = torch.where(ref.lse.isfinite(), tol_lse, 0.0)

    # --- is every row's softmax uniform (then its answer IS the mean of V) ---------------------------------------
    live = ref.seen.sum(-1) > 0
    if Nk:
        pmax = torch.where(ref.seen, ref.p, -math.inf).amax(-1)
        pmin = torch.where(ref.seen, ref.p, math.inf).amin(-1)
    else:
        pmax = pmin = torch.zeros(ref.lse.shape, dtype=torch.float64, device=ref.lse.device)
    uniform = bool(torch.all(~live[None, None] | ~pmax.isfinite() | (pmax - pmin <= 1e-9 * pmax.abs())))
    return Scores(dtype, problem, ref, p, w, nk_seen, lost, tol_lse, uniform)


def _value_side(sc, v, ref_out, lean):
    """The Expectation of the scores sc with values v (float64, expanded to the query heads) whose reference
    output is ref_out (p v, NaN on NaN inputs)."""
    dtype, ref, p, problem = sc.dtype, sc.ref, sc.p, sc.problem
    u = UNIT[dtype]
    half = dtype != torch.float32
    Nk = v.shape[-2]
    out = torch.where(ref_out.isnan(), 0.0, ref_out)
    hull = torch_ref.visible_range(v, problem)
    moved = _weighted_spread(sc.w, v, out, hull)
    # --- after the softmax ----------------------------------------------------------------------------------
    pv = torch.matmul(p, v.abs())
    nk_seen = sc.nk_seen
    after = SAFETY * 3.0 * nk_seen.clamp(min=1).sqrt() * U32 * pv + 2.0 * U32 * out.abs()  # fp32, 1/l
    if half:
        after = after + u * pv                                                              # P to the dtype
        after = after + torch.matmul(sc.lost, v.abs())                                      # flushed weights
    rounding = 2.0 * u * out.abs() + float(torch.finfo(dtype).smallest_normal) * u   # the output's own
    tol = moved + after + rounding
    fields = dict(out=ref_out, lse=ref.lse, tol=tol, tol_lse=sc.tol_lse, hull_lo=hull[0], hull_hi=hull[1])
    if not lean:
        # the hull's allowance: the roundings after the softmax, with the largest |v| a row sees in place of the
        # weighted sum (the kernel's own weights, whatever its score errors, are what P is rounded and summed
        # from), and in fp16 the weight of every key flushed to 0 (each below the smallest normal, the row's l >= 1)
        vmax = torch.maximum(hull[0].abs(), hull[1].abs())
        tol_hull = SAFETY * 3.0 * nk_seen.clamp(min=1).sqrt() * U32 * vmax + 2.0 * U32 * out.abs() + rounding
        if half:
            tol_hull = tol_hull + (u + nk_seen * float(torch.finfo(dtype).tiny)) * vmax
        # --- the trivially wrong answers ------------------------------------------------------------------------
        seen = ref.seen.to(torch.float64)
        counts = seen.sum(-1, keepdim=True)
        mean_v = torch.matmul(seen / counts.clamp(min=1), v)
        mean_v = torch.where(counts[None, None] > 0, mean_v, 0.0)
        if Nk:
            spread = (v - v.mean(2, keepdim=True)).abs().mean(2, keepdim=True)
            spread = torch.where(spread > 0, spread, v.abs().amax(2, keepdim=True))
        else:
            spread = torch.zeros_like(v[:, :, :1])
        fields.update(mean_v=mean_v, spread=spread, tol_hull=tol_hull)
    host = {name: t.cpu().numpy() for name, t in fields.items()}
    keep = sc if ref.s.numel() <= KEEP_SCORES else None
    return Expectation(**host, uniform=sc.uniform, scores=keep)


def _score_shifts(dtype, half_scores, s, q, k, p, dot_abs, scale, D, Nk):
    """(shift, shift_lse): how far each score s_ij (no softcap, no bias) may move, for the output and the lse."""
    u = UNIT[dtype]
    half = dtype != torch.float32
    absq = q.abs()
    # fp32: the dot's partial sums rounded sqrt(D) times (any order), the scale (and log2 e) applied,
    # the row max subtracted, exp2 of the result: independent per score
    indep = SAFETY * 2.0 * math.sqrt(D) * U32 * dot_abs + 4.0 * U32 * (s.abs() + 1.0)
    if half:
        # the scores themselves rounded to the input dtype (PyTorch's half matmul: the product, then its
        # scaling): independent per score
        if half_scores:
            indep = indep + 2.0 * u * s.abs()
        # Q scaled in its own dtype: delta_ij = e_i . k_j, one error vector per row; only k's variation
        # across keys moves the weights, so |delta_ij - e_i . c| <= u |q_i| . |k_j - c| for any centre c of the
        # row (e_i . c shifts the whole row). Two centres, the tighter one per row (by its p-weighted sum):
        # the midrange of each column of k (NaNs left out), which bounds every key alike, and the keys' mean
        # weighted by the attention they get (mean over the rows of p), which is tight where keys that get
        # no weight lie far away in some direction (keys scoring hugely negative: their own bound there is
        # loose, and harmless)
        common = 0.0
        if Nk:
            def centred(c):
                return u * abs(scale) * torch.matmul(absq, (k - c).transpose(-1, -2).abs())

            nan = k.isnan()
            common = centred(0.5 * (torch.where(nan, -math.inf, k).amax(2, keepdim=True)
                                    + torch.where(nan, math.inf, k).amin(2, keepdim=True)))
            common_w = centred(torch.matmul(p.mean(2, keepdim=True), k))
            tighter = (p * common_w).sum(-1, keepdim=True) < (p * common).sum(-1, keepdim=True)
            common = torch.where(tighter, common_w, common)
        shift = indep + common                 # for the output
        shift_lse = indep + u * dot_abs        # for the lse, which a common shift does move
    else:
        shift = shift_lse = indep
    return shift, shift_lse


def _transformed_shifts(dtype, half_scores, ref, s, q, k, dot_abs, problem, D):
    """(shift, shift_lse) when the scores are softcapped (t = c tanh(s / c)) or ALiBi-biased (t = s - slope |d|).

    The raw score s = scale q.k moves as in _score_shifts (its partial sums; Q scaled in its dtype; in half
    precision the product rounded), and a softcap passes that through its derivative: |c tanh((s + e) / c) -
    c tanh(s / c)| <= |e| max sech^2 over [s - |e|, s + |e|]. That no longer shifts a whole row alike (the
    derivative differs per key), so Q's rounding is not centred here. The transform adds its own roundings: tanh
    to a few ulps of c, the bias's product and sum in fp32, and in half precision the capped or biased score
    rounded to the dtype (PyTorch computes each step in the input dtype)."""
    u = UNIT[dtype]
    half = dtype != torch.float32
    raw = torch.where(ref.seen, problem.scale * torch.matmul(q, k.transpose(-1, -2)), 0.0)
    moved = SAFETY * 2.0 * math.sqrt(D) * U32 * dot_abs
    if half:
        moved = moved + u * dot_abs + (2.0 * u * raw.abs() if half_scores else 0.0)
    post = 4.0 * U32 * (s.abs() + 1.0)
    if problem.softcap is not None:
        c = problem.softcap
        slope = torch.cosh(torch.clamp(raw.abs() - moved, min=0.0) / c).pow(-2)
        capped = c * torch.tanh(raw / c)
        moved = moved * slope
        post = post + 8.0 * U32 * c + (2.0 * u * capped.abs() if half and half_scores else 0.0)
    if problem.slopes is not None:
        bias = torch.as_tensor(problem.bias(), device=s.device)
        post = post + 2.0 * U32 * bias.abs() + (2.0 * u * s.abs() if half and half_scores else 0.0)
    shift = moved + post
    return shift, shift


def _log_weights(ref):
    """log p_ij from the scores (B, H, Nq, Nk): finite for every seen key, even where p_ij underflows to 0 in
    float64 (a score error of hundreds can still make such a key count); -inf for unseen keys; 0 rows (NaN
    inputs) stay NaN."""
    a = torch.where(ref.seen, ref.s, -math.inf)
    return a - torch.logsumexp(a, -1, keepdim=True).nan_to_num(neginf=0.0)


def _leave_one_out(t):
    """sum over k != j of t_ik, for each j (last axis), without cancellation at the row's largest term."""
    total = t.sum(-1, keepdim=True)
    top = t.argmax(-1, keepdim=True)
    without_top = t.scatter(-1, top, 0.0).sum(-1, keepdim=True)
    at_top = torch.arange(t.shape[-1], device=t.device) == top
    return torch.where(at_top, without_top, (total - t).clamp(min=0.0))


def _weight_change(ref, shift, log_p):
    """The largest |p'_ij - p_ij| when every score s_ik may move by up to shift_ik (B, H, Nq, Nk), exactly:
    p'_j = x / (x + R) with x = p_j e^{delta_j} and R = sum_{k != j} p_k e^{delta_k} is increasing in x and
    decreasing in R, so p'_j lies between p_j e^{-D_j} / (p_j e^{-D_j} + sum_{k != j} p_k e^{D_k}) and
    p_j e^{D_j} / (p_j e^{D_j} + sum_{k != j} p_k e^{-D_k}). Computed from log-weights, in a frame where no
    exponential overflows: a dominant weight (p_j = 1) cannot grow, and a key whose weight underflowed to 0
    in float64 still counts when the shifts are large enough to raise it."""
    if not ref.p.shape[-1]:
        return torch.zeros_like(ref.p)
    p = torch.where(log_p.isnan(), 0.0, log_p.exp())
    up, down = log_p + shift, log_p - shift                  # log of p_k e^{+D_k}, p_k e^{-D_k}
    c_up = up.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
    c_down = down.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
    rest_down = _leave_one_out((down - c_down).exp())       # sum_{k != j} p_k e^{-D_k}, / e^{c_down}
    rest_up = _leave_one_out((up - c_up).exp())             # sum_{k != j} p_k e^{+D_k}, / e^{c_up}
    hi = torch.where(rest_down > 0, 1.0 / (1.0 + (rest_down.log() + c_down - up).exp()), 1.0)
    lo = torch.where(rest_up > 0, 1.0 / (1.0 + (rest_up.log() + c_up - down).exp()), 1.0)
    dev = torch.maximum(hi - p, p - lo).clamp(min=0.0)
    return torch.where(ref.seen & ~log_p.isnan(), dev, 0.0)


def _weighted_spread(w, v, out, hull):
    """An upper bound of sum_j w_ij |v_jd - out_id|, (B, H, Nq, D): how far the weights' change moves the
    output. It is also at most max_{j seen} |v_jd - out_id|: a correct output is a convex combination of the
    values its row sees. Exact up to EXACT elements (in blocks of query rows: the (rows, keys, D) difference
    would not fit in memory); past that, the centred bound sum_j w_ij |v_jd - c_d| + |out_id - c_d| sum_j w_ij
    with c the mean value row, which costs one product."""
    B, H, Nq, Nk = w.shape
    D = v.shape[-1]
    if not (Nq and Nk and D):
        return torch.zeros((B, H, Nq, D), dtype=torch.float64, device=w.device)
    if B * H * Nq * Nk * D <= EXACT:
        res = torch.zeros((B, H, Nq, D), dtype=torch.float64, device=w.device)
        rows = max(1, CHUNK // (Nk * D))
        for b in range(B):
            for h in range(H):
                for i in range(0, Nq, rows):
                    diff = (v[b, h][None, :, :] - out[b, h, i:i + rows][:, None, :]).abs()   # (rows, Nk, D)
                    res[b, h, i:i + rows] = torch.einsum("ij,ijd->id", w[b, h, i:i + rows], diff)
    else:
        c = v.mean(2, keepdim=True)
        res = torch.matmul(w, (v - c).abs()) + (out - c).abs() * w.sum(-1, keepdim=True)
    lo, hi, sees = hull
    sees = sees[None, None, :, None]
    return torch.minimum(res, torch.where(sees, torch.maximum((hi - out).abs(), (out - lo).abs()), 0.0))


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
