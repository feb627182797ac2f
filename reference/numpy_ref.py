"""The oracle of record: attention in float64 NumPy, exactly as the protocol defines it (docs/design.md).

    out[b, h, i] = sum_j softmax_j(scale * q_i . k_j) v_j   over the keys j that query i sees
    causal: query i sees key j iff j <= i + Nk - Nq (bottom-right alignment, as in FlashAttention);
            align="top-left" is j <= i (SDPA's is_causal, FlashAttention before 2.1), for kernels that declare it
    a row that sees no key: out = 0, lse = -inf
"""
import math
from dataclasses import dataclass

import numpy as np

ALIGNS = ("bottom-right", "top-left")


def causal_shift(Nq, Nk, align="bottom-right"):
    """Causal: query i sees key j iff j <= i + shift (bottom-right: Nk - Nq; top-left: 0)."""
    if align not in ALIGNS:
        raise ValueError(f"causal alignment {align!r} not in {ALIGNS}")
    return Nk - Nq if align == "bottom-right" else 0


def visible(Nq, Nk, causal, align="bottom-right"):
    """(Nq, Nk) bool array: which keys each query row sees."""
    if not causal:
        return np.ones((Nq, Nk), dtype=bool)
    return np.arange(Nk)[None, :] <= np.arange(Nq)[:, None] + causal_shift(Nq, Nk, align)


@dataclass
class Softmax:
    """The pieces of one attention problem, in float64 (B, H leading everywhere).

    s: (Nq, Nk) scaled scores (-inf where a query does not see the key); p: the softmax weights (0 there,
    and 0 on rows that see no key); lse: (Nq,) natural-log log-sum-exp (-inf on rows that see no key);
    out: (Nq, D)."""
    s: np.ndarray
    seen: np.ndarray
    p: np.ndarray
    lse: np.ndarray
    out: np.ndarray


def softmax_parts(q, k, v, causal=False, scale=None, align="bottom-right"):
    """q: (B, H, Nq, D), k, v: (B, H, Nk, D), any float arrays. Returns a Softmax in float64."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    seen = visible(q.shape[2], k.shape[2], causal, align)
    with np.errstate(invalid="ignore", over="ignore"):       # NaN inputs propagate, as they should
        s = np.where(seen, np.matmul(q, np.swapaxes(k, -1, -2)) * scale, -np.inf)
        m = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf)
        m = np.where(np.isneginf(m), 0.0, m)                  # rows that see no key
        e = np.exp(s - m)
        l = e.sum(axis=-1, keepdims=True)
        empty = l == 0
        p = e / np.where(empty, 1.0, l)
        out = np.matmul(p, v)
        lse = np.where(empty[..., 0], -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, l)[..., 0]))
    return Softmax(s, seen, p, lse, out)


def attention(q, k, v, causal=False, scale=None, align="bottom-right"):
    """q: (B, H, Nq, D), k, v: (B, H, Nk, D), any float arrays. Returns (out, lse) in float64:
    out (B, H, Nq, D), lse (B, H, Nq) natural-log log-sum-exp of the scaled scores."""
    parts = softmax_parts(q, k, v, causal, scale, align)
    return parts.out, parts.lse
