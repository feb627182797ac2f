"""The definition of record: attention in float64 NumPy, exactly as the protocol defines it (docs/design.md).

    out[b, h, i] = sum_j softmax_j(t_bhij) v[b, g(h), j]   over the keys j that query row i sees
    t_bhij = softcap(scale * q_bhi . k_b,g(h),j) - slope_bh |i + off - j|

with the query-to-kv head map g, the visible key interval of each row, the softcap and the ALiBi slopes all
given by one value, a reference.problem.Problem (plain calls with causal= and scale= only build one here).
causal: query i sees key j iff j <= i + Nk - Nq (bottom-right alignment, as in FlashAttention); align="top-left"
is j <= i (SDPA's is_causal, FlashAttention before 2.1), for kernels that declare it. A row that sees no key:
out = 0, lse = -inf.

The oracle computes this same definition in float64 torch on the kernel's device (reference/torch_ref.py, held to
this module by tests/test_reference.py): the numbers of record are float64, whichever library computes them.
"""
from dataclasses import dataclass

import numpy as np

from flashcheck.reference.problem import ALIGNS, Problem, plain  # noqa: F401  (re-exported: callers name them here)


def causal_shift(Nq, Nk, align="bottom-right"):
    """Causal: query i sees key j iff j <= i + shift (bottom-right: Nk - Nq; top-left: 0)."""
    if align not in ALIGNS:
        raise ValueError(f"causal alignment {align!r} not in {ALIGNS}")
    return Nk - Nq if align == "bottom-right" else 0


def visible(Nq, Nk, causal, align="bottom-right"):
    """(Nq, Nk) bool array: which keys each query row sees (causal masks only; Problem.visible has windows)."""
    return Problem.make(1, 1, 1, Nq, Nk, 1, causal=causal, align=align).visible()


@dataclass
class Softmax:
    """The pieces of one attention problem, in float64 (B, Hq leading everywhere).

    s: (Nq, Nk) transformed scores (-inf where a query does not see the key); p: the softmax weights (0 there,
    and 0 on rows that see no key); lse: (Nq,) natural-log log-sum-exp (-inf on rows that see no key);
    out: (Nq, Dv)."""
    s: object
    seen: object
    p: object
    lse: object
    out: object


def expand_kv(k, problem):
    """k or v (B, Hkv, N, X) as (B, Hq, N, X): the kv head each query head reads."""
    return k[:, problem.kv_heads()] if problem.Hkv != problem.Hq or problem.head_map != "grouped" else k


def _problem(q, k, v, causal, scale, align, problem):
    return problem if problem is not None else plain(q.shape, k.shape, v.shape, causal, scale, align)


def softmax_parts(q, k, v, causal=False, scale=None, align="bottom-right", problem=None):
    """q: (B, Hq, Nq, D), k: (B, Hkv, Nk, D), v: (B, Hkv, Nk, Dv), any float arrays; problem: the Problem (default:
    the plain one of causal, scale and align). Returns a Softmax in float64."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    pb = _problem(q, k, v, causal, scale, align, problem)
    k, v = expand_kv(k, pb), expand_kv(v, pb)
    seen = pb.visible()
    with np.errstate(invalid="ignore", over="ignore"):       # NaN inputs propagate, as they should
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * pb.scale
        if pb.softcap is not None:
            s = pb.softcap * np.tanh(s / pb.softcap)
        bias = pb.bias()
        if bias is not None:
            s = s + bias
        s = np.where(seen, s, -np.inf)
        m = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf)
        m = np.where(np.isneginf(m), 0.0, m)                  # rows that see no key
        e = np.exp(s - m)
        l = e.sum(axis=-1, keepdims=True)
        empty = l == 0
        p = e / np.where(empty, 1.0, l)
        out = np.matmul(p, v)
        lse = np.where(empty[..., 0], -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, l)[..., 0]))
    return Softmax(s, seen, p, lse, out)


def attention(q, k, v, causal=False, scale=None, align="bottom-right", problem=None):
    """q: (B, Hq, Nq, D), k: (B, Hkv, Nk, D), v: (B, Hkv, Nk, Dv), any float arrays. Returns (out, lse) in float64:
    out (B, Hq, Nq, Dv), lse (B, Hq, Nq) natural-log log-sum-exp of the transformed scores."""
    parts = softmax_parts(q, k, v, causal, scale, align, problem)
    return parts.out, parts.lse

