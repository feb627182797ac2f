"""Where in the (row, column) plane a failing case goes wrong: the error maps of the HTML report.

A verdict names the first bad element; a kernel developer also wants the shape of the error: one partial
block, the causal diagonal, every second key block, the keys past Nq. Two maps, each of the (batch, head)
that is worst:

  out       |got - expected| / tol over (query row, head-dim column): the oracle's own comparison, every
            element, not just the first bad one.
  weights   |P_kernel - P_ref| / tol_p over (query row, key column): the attention weights the kernel
            actually used. They are recovered by probing: with V one-hot over a chunk of D keys (value row j
            is e_(j mod D) for the keys of the chunk, 0 for all others) the output IS P[:, chunk], because
            the softmax normalisation does not depend on V. ceil(Nk / D) calls of the kernel.

error_maps() runs where the kernel lives (the runner's child), only for failing cases, and never raises: the
report must not break judging. What it returns is small (arrays max-pooled to at most POOL x POOL cells) and
picklable (dicts of numpy arrays, numbers and strings), since it travels back to verify with the Verdict.
"""
import math
import sys
import time

import numpy as np
import torch

from flashcheck.cases import inputs as inp
from flashcheck.cases.backend import device as active_device
from flashcheck.cases.oracle import tolerance
from flashcheck.cases.oracle.layers import Outcome, RunFailed, _to_numpy, call_kernel, expectation
from flashcheck.reference import numpy_ref

POOL = 512              # a map is max-pooled down to at most this many cells a side (the plot has fewer pixels)
MAX_PROBES = 64         # kernel calls for the weights map; past that (Nk > 64 D) it is not drawn
PROBE_SECONDS = 30.0    # the probes' predicted time limit: the maps run inside the case's own timeout
# the exact tolerance of the probed weights costs about Nq * Nk * Nk float64 operations (a reference with Nk
# value columns); past this a per-row bound that costs one reference is used instead (see _weights_tol)
EXACT_WORK = 1 << 27
EXACT_KEYS = 1 << 22    # and its (Nk, Nk) identity value matrix (and the arrays of its shape) at most 32 MB each


def error_maps(kernel, case, caps, conventions):
    """The maps of one failing case (see the module docstring), or {"error": why} when they cannot be made.
    Never raises: a kernel that misbehaves differently on a second call must not turn a verdict into a crash."""
    try:
        return _maps(kernel, case, caps, conventions)
    except (Exception, SystemExit) as exc:  # noqa: BLE001  (the report never breaks judging)
        text = str(exc).strip().splitlines()
        return {"error": f"{type(exc).__name__}: {text[0][:300] if text else ''}"}


def blocks(kernel, case, caps):
    """(block_m, block_n) the kernel ran this case with, each None when unknown: the case's pins when the
    kernel takes them, else the project's own kernels' defaults (their rule, on this backend)."""
    pinned_m = case.block_m if caps.blocks else None
    pinned_n = case.block_n if caps.blocks else None
    rule = getattr(sys.modules.get(getattr(kernel, "__module__", "") or ""), "default_blocks", None)
    if rule is None or not str(getattr(kernel, "__module__", "")).startswith("flashcheck.kernel."):
        return pinned_m, pinned_n
    bm, bn = rule(case.Nq, case.Nk, case.D, case.torch_dtype)[:2]
    return pinned_m or bm, pinned_n or bn


def _maps(kernel, case, caps, conventions):
    if case.sample_heads:
        return {"error": "a huge case (sample_heads): its maps would need another tens of GB; not drawn"}
    if case.B * case.H * case.Nq == 0:
        return {"error": "the output is empty (B, H or Nq is 0): nothing to map"}
    device = active_device()
    bm, bn = blocks(kernel, case, caps)
    maps = {"B": case.B, "H": case.H, "Nq": case.Nq, "Nk": case.Nk, "D": case.D, "dtype": str(case.dtype or "fp32"),
            "causal": case.causal, "align": conventions.causal_align, "block_m": bm, "block_n": bn}
    qkv = inp.values(case, device)
    expect = expectation(case, qkv, device, conventions)
    t0 = time.perf_counter()
    try:
        got = _to_numpy(call_kernel(kernel, case, caps, qkv, device).result)
    except (RunFailed, Outcome) as stop:
        maps["error"] = f"the diagnostic call of the kernel failed: {stop}"
        return maps
    seconds = time.perf_counter() - t0
    ratio = _ratio(got, expect.out, expect.tol)
    b, h = _worst_head(ratio)
    maps.update(b=b, h=h, out=_summary(ratio[b, h], b, h, "query row", "head-dim column"))
    maps["weights"] = _weights(kernel, case, caps, conventions, qkv, device, seconds)
    maps["max"] = max(m["max"] for m in (maps["out"], maps["weights"]) if "max" in m)
    return maps


def _ratio(got, exp, tol):
    """|got - exp| / tol elementwise, as the oracle compares (layers.compare). NaN marks a cell whose finiteness
    is wrong (non-finite where the reference is finite, or the wrong infinity): the plot shows those apart, and
    max-pooling keeps them (np.max propagates NaN). Where the reference is NaN (a NaN input, outside the
    protocol) the oracle does not judge the output: 0 there."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        both = np.isfinite(got) & np.isfinite(exp)
        r = np.where(both, np.abs(got - np.where(both, exp, 0.0)) / np.where(tol > 0, tol, np.inf), 0.0)
        r = np.where(both & (tol <= 0) & (got != exp), np.inf, r)
        wrong = (np.isfinite(exp) & ~np.isfinite(got)) | (np.isinf(exp) & (got != exp))
        return np.where(wrong, np.nan, r)


def _worst_head(ratio):
    """(b, h) with the largest ratio, non-finite cells counting as the worst of all."""
    score = np.where(np.isnan(ratio), np.inf, ratio).reshape(ratio.shape[0], ratio.shape[1], -1)
    flat = int(np.argmax(score.max(-1))) if score.size else 0
    return divmod(flat, ratio.shape[1])


def _pool(a, limit=POOL):
    """Max-pool a 2-D array to at most limit x limit cells; returns (pooled float32, (row factor, col factor))."""
    fr, fc = max(1, math.ceil(a.shape[0] / limit)), max(1, math.ceil(a.shape[1] / limit))
    a = np.minimum(a, 1e30)      # float32 keeps it finite (a leaked masked key's ratio is ~1e44); NaN stays
    if fr == 1 and fc == 1:
        return a.astype(np.float32), (1, 1)
    rows, cols = math.ceil(a.shape[0] / fr) * fr, math.ceil(a.shape[1] / fc) * fc
    padded = np.zeros((rows, cols))
    padded[:a.shape[0], :a.shape[1]] = a
    pooled = padded.reshape(rows // fr, fr, cols // fc, fc).max(axis=(1, 3))
    return pooled.astype(np.float32), (fr, fc)


def _summary(ratio, b, h, rows, cols):
    """One map of one head: the pooled ratios and what the plot and its caption need."""
    finite = np.where(np.isnan(ratio), 0.0, ratio)
    at = np.unravel_index(int(np.argmax(finite)), finite.shape)
    nonfinite = int(np.isnan(ratio).sum())
    pooled, pool = _pool(ratio)
    return {"b": int(b), "h": int(h), "ratio": pooled, "pool": pool, "shape": tuple(int(x) for x in ratio.shape),
            "max": float("inf") if nonfinite else float(finite[at]), "at": tuple(int(x) for x in at),
            "over": int((finite > 1).sum()), "nonfinite": nonfinite, "rows": rows, "cols": cols}


def _weights(kernel, case, caps, conventions, qkv, device, seconds):
    """The weights map (module docstring), or {"skipped": why}."""
    Nq, Nk, D = case.Nq, case.Nk, case.D
    calls = math.ceil(Nk / D)
    if calls > MAX_PROBES:
        return {"skipped": f"recovering the weights takes ceil(Nk / D) = {calls} calls of the kernel, more than "
                           f"{MAX_PROBES}"}
    if seconds > PROBE_SECONDS:
        return {"skipped": f"one call of the kernel took {seconds:.0f} s, and recovering the weights takes {calls} "
                           f"(over {PROBE_SECONDS:.0f} s)"}
    q, k, v = qkv
    got = np.zeros((case.B, case.H, Nq, Nk))
    for c in range(calls):
        keys = np.arange(c * D, min((c + 1) * D, Nk))
        probe = torch.zeros_like(v)
        probe[:, :, keys, keys % D] = 1      # exact in every dtype
        t0 = time.perf_counter()
        try:
            out = _to_numpy(call_kernel(kernel, case, caps, (q, k, probe), device).result)
        except (RunFailed, Outcome) as stop:
            return {"skipped": f"probe call {c + 1} of {calls} (V one-hot) failed: {stop}"}
        got[:, :, :, keys] = out[:, :, :, keys % D]
        # the output's call may have paid for a compilation (when nothing ran this kernel on these shapes in
        # this process before): the prediction takes the faster of the calls so far
        seconds = min(seconds, time.perf_counter() - t0)
        if c == 0 and (calls - 1) * seconds > PROBE_SECONDS:
            return {"skipped": f"recovering the weights takes {calls} calls of the kernel, about "
                               f"{calls * seconds:.0f} s at {seconds:.2g} s a call (over {PROBE_SECONDS:.0f} s)"}
    qn, kn = _to_numpy(q), _to_numpy(k)
    scale, align = case.scale, conventions.causal_align
    # the head whose weights are furthest off (non-finite first), one head at a time: (Nq, Nk) float64 each
    worst, where = -1.0, (0, 0)
    for b in range(case.B):
        for h in range(case.H):
            p = numpy_ref.softmax_parts(qn[b:b + 1, h:h + 1], kn[b:b + 1, h:h + 1], kn[b:b + 1, h:h + 1, :, :1],
                                        case.causal, scale, align).p[0, 0]
            with np.errstate(invalid="ignore"):
                d = np.where(np.isfinite(got[b, h]) == np.isfinite(p), np.abs(got[b, h] - p), np.inf)
            d = float(np.nan_to_num(d, nan=0.0).max())
            if d > worst:
                worst, where = d, (b, h)
    b, h = where
    qh, kh = qn[b:b + 1, h:h + 1], kn[b:b + 1, h:h + 1]
    ref = numpy_ref.softmax_parts(qh, kh, kh[..., :1], case.causal, scale, align)
    tol, how = _weights_tol(case, conventions, qh, kh, ref)
    ratio = _ratio(got[b, h], ref.p[0, 0], tol)
    m = _summary(ratio, b, h, "query row", "key column")
    # a key the row must see that got no weight at all: a loop bound, a mask or a skipped block dropped it; the
    # plot shows these apart (in the ratio alone they look like any other large error)
    with np.errstate(invalid="ignore"):
        dropped = (got[b, h] == 0) & (ratio > 1)
    m.update(calls=calls, tol=how, dropped=_pool(dropped)[0] > 0, dropped_count=int(dropped.sum()))
    return m


def _weights_tol(case, conventions, qh, kh, ref):
    """The tolerance of each probed weight of one head, (Nq, Nk), and how it was had ("exact" or "row bound").

    Exact: with V one-hot the probe's output IS the weights, so the oracle's own tolerance for those inputs
    (tolerance.expectation with V the identity: value column j is key j's one-hot column) is exactly what a
    correct kernel is held to there, element by element. It costs about Nq * Nk * Nk operations and a few
    (Nk, Nk) arrays.

    Row bound, past EXACT_WORK or EXACT_KEYS: one reference with two value columns, s and -s (s_j = +-1).
    Write W_i for the weight mass a correct kernel may move in row i (sum_j p_ij |p'_ij / p_ij - 1|,
    tolerance.py). Column s moves by sum_j w_ij (1 - s_j out_i), column -s by sum_j w_ij (1 + s_j out_i): their
    sum is 2 W_i, so the larger of the two tolerances T_i holds at least W_i (or the row's whole reach, >= 1,
    when that binds), and the roundings after the softmax of a unit value. A probed weight moves by at most
    w_ij (1 - 2 p_ij) + p_ij W_i <= W_i, and rounds (P to the dtype, the output's own rounding) by
    2 (u + u32) p_ij <= 4 u p_ij: T_i + 4 u p_ij holds it. A key the row does not see has weight 0 in any
    correct kernel, whatever the rounding: its tolerance is the output's floor (the smallest normal's
    rounding), so a masked key that leaks is never hidden by the row's slack. The bound is loose for the
    small weights of a peaked row (it is the row's, not the weight's): an error there shows in the out map.
    """
    dtype = case.torch_dtype
    Nq, Nk = ref.p.shape[-2:]
    half = not conventions.fp32_scores
    kwargs = dict(causal=case.causal, scale=case.scale, align=conventions.causal_align, half_scores=half)
    p = np.where(np.isnan(ref.p[0, 0]), 0.0, ref.p[0, 0])
    # A weight below fp32's smallest normal may come out as 0 from a correct kernel: its running state is fp32
    # in every dtype, and the GPU flushes fp32 subnormals (exp2.approx, -ftz arithmetic). The oracle's output
    # tolerance need not say so (such a weight moves an output by < 1e-38 |v|), but here the output IS the
    # weight: seen on an H200, fp32 cases with large scores came out at ~1e3 of the exact tolerance without it.
    flushed = np.where(p < float(torch.finfo(torch.float32).smallest_normal), p, 0.0)
    if Nq * Nk * Nk <= EXACT_WORK and Nk * Nk <= EXACT_KEYS:
        eye = np.broadcast_to(np.eye(Nk), (1, 1, Nk, Nk))
        return tolerance.expectation(dtype, qh, kh, eye, **kwargs).tol[0, 0] + flushed, "exact"
    s = np.where(np.arange(Nk) % 2 == 0, 1.0, -1.0)
    two = np.broadcast_to(np.stack([s, -s], axis=-1), (1, 1, Nk, 2))
    row = tolerance.expectation(dtype, qh, kh, two, **kwargs).tol[0, 0].max(-1, keepdims=True)
    floor = float(torch.finfo(dtype).smallest_normal) * tolerance.UNIT[dtype]
    return np.where(ref.seen, row + 4.0 * tolerance.UNIT[dtype] * p + flushed, floor), "row bound"
