"""The oracle of record: attention in float64 NumPy, exactly as DESIGN.md's protocol defines it.

    out[b, h, i] = sum_j softmax_j(scale * q_i . k_j) v_j   over the keys j that query i sees
    causal: query i sees key j iff j <= i + Nk - Nq (bottom-right alignment, as in FlashAttention)
    a row that sees no key: out = 0, lse = -inf
"""
import math

import numpy as np


def visible(Nq, Nk, causal):
    """(Nq, Nk) bool array: which keys each query row sees."""
    if not causal:
        return np.ones((Nq, Nk), dtype=bool)
    return np.arange(Nk)[None, :] <= np.arange(Nq)[:, None] + (Nk - Nq)


def attention(q, k, v, causal=False, scale=None):
    """q: (B, H, Nq, D), k, v: (B, H, Nk, D), any float arrays. Returns (out, lse) in float64:
    out (B, H, Nq, D), lse (B, H, Nq) natural-log log-sum-exp of the scaled scores."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    seen = visible(q.shape[2], k.shape[2], causal)
    s = np.where(seen, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    empty = ~seen.any(axis=-1)[:, None]                      # rows that see no key
    m = np.where(np.isneginf(m) & empty, 0.0, m)
    with np.errstate(invalid="ignore"):                      # NaN inputs propagate, as they should
        p = np.exp(s - m)
        l = p.sum(axis=-1, keepdims=True)
        out = np.einsum("bhij,bhjd->bhid", p, v) / np.where(l == 0, 1.0, l)
        lse = np.where(l[..., 0] == 0, -np.inf, m[..., 0] + np.log(np.where(l[..., 0] == 0, 1.0, l[..., 0])))
    return out, lse
