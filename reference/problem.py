"""What attention means for one call: the one value every layer of the oracle takes (docs/design.md, protocol v3).

A Problem holds the shapes, the query-to-kv head map, each query row's visible key interval, and the score
transform. It is pure (NumPy only, nothing of the project): the references compute from it, and cases/ builds it
from a case and the conventions a kernel declares.

    out[b, h, i] = sum_j softmax_j(t_bhij) v[b, g(h), j]   over the keys j row i sees
    t_bhij = softcap(scale * q[b, h, i] . k[b, g(h), j]) - slope[b, h] * |i + off - j|
    softcap(s) = c tanh(s / c)   (no cap: s)
    row i sees key j iff  i + off - left <= j <= i + off + right  and  0 <= j < Nk
    off = Nk - Nq (bottom-right, the protocol) or 0 (top-left, declared); causal is right = 0; a side that is
    None is unbounded. A row that sees no key gives 0 and lse -inf.
    g(h) = h // (Hq // Hkv) (grouped, the protocol: FlashAttention, SDPA's enable_gqa) or h % Hkv (interleaved,
    declared).
"""
import dataclasses
import math
from dataclasses import dataclass

import numpy as np

ALIGNS = ("bottom-right", "top-left")
HEAD_MAPS = ("grouped", "interleaved")


class ProblemError(ValueError):
    """Inputs that describe no attention problem of the protocol (a usage error of the caller)."""


def _side(name, x):
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0:
        raise ProblemError(f"window {name} side must be None or an integer >= 0, got {x!r}")
    return int(x)


@dataclass(frozen=True)
class Problem:
    B: int
    Hq: int
    Hkv: int
    Nq: int
    Nk: int
    D: int
    Dv: int
    scale: float
    left: int = None             # the window's sides in keys (None: unbounded); causal folded into right = 0
    right: int = None
    align: str = "bottom-right"
    head_map: str = "grouped"
    softcap: float = None        # c > 0, or None
    slopes: tuple = None         # ALiBi: (B, Hq) nested tuples of float slopes, or None

    @classmethod
    def make(cls, B, Hq, Hkv, Nq, Nk, D, Dv=None, *, causal=False, scale=None, window=None, softcap=None,
             alibi_slopes=None, align="bottom-right", head_map="grouped"):
        """A Problem from a call's shapes and keywords (raises ProblemError for inputs outside the protocol)."""
        Dv = D if Dv is None else Dv
        if min(B, Hq, Hkv, Nq, Nk, D, Dv) < 0 or Hkv < 1 or Hq < 1:
            raise ProblemError(f"bad shape: B={B} Hq={Hq} Hkv={Hkv} Nq={Nq} Nk={Nk} D={D} Dv={Dv}")
        if Hq % Hkv:
            raise ProblemError(f"Hq = {Hq} is not a multiple of Hkv = {Hkv}")
        if align not in ALIGNS:
            raise ProblemError(f"causal alignment {align!r} not in {ALIGNS}")
        if head_map not in HEAD_MAPS:
            raise ProblemError(f"head map {head_map!r} not in {HEAD_MAPS}")
        left = right = None
        if window is not None:
            try:
                left, right = window
            except (TypeError, ValueError):
                raise ProblemError(f"window must be (left, right), got {window!r}") from None
            left, right = _side("left", left), _side("right", right)
        if causal:
            right = 0
        if softcap is not None:
            softcap = float(softcap)
            if not (softcap > 0 and math.isfinite(softcap)):
                raise ProblemError(f"softcap must be a finite number > 0, got {softcap!r}")
        slopes = None
        if alibi_slopes is not None:
            a = np.asarray(alibi_slopes, dtype=np.float64)
            if a.shape == (Hq,):
                a = np.broadcast_to(a, (B, Hq))
            if a.shape != (B, Hq):
                raise ProblemError(f"alibi_slopes must have shape ({Hq},) or ({B}, {Hq}), got {a.shape}")
            if not np.isfinite(a).all():
                raise ProblemError("alibi_slopes must be finite")
            slopes = tuple(tuple(float(x) for x in row) for row in a)
        scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
        return cls(B, Hq, Hkv, Nq, Nk, D, Dv, scale, left, right, align, head_map, softcap, slopes)

    # ---- visibility ----
    @property
    def offset(self):
        """Row i's diagonal key: i + offset (bottom-right: Nk - Nq; top-left: 0)."""
        return self.Nk - self.Nq if self.align == "bottom-right" else 0

    @property
    def causal(self):
        return self.right == 0

    @property
    def windowed(self):
        """Whether some row's visible keys are not a prefix of the keys (a left side, or a right side > 0)."""
        return self.left is not None or (self.right is not None and self.right > 0)

    def bounds(self):
        """(lo, hi): (Nq,) int arrays, the first and last key each row sees; lo > hi for a row that sees none."""
        i = np.arange(self.Nq)
        lo = np.zeros(self.Nq, dtype=np.int64) if self.left is None else np.maximum(i + self.offset - self.left, 0)
        hi = (np.full(self.Nq, self.Nk - 1, dtype=np.int64) if self.right is None
              else np.minimum(i + self.offset + self.right, self.Nk - 1))
        return lo, hi

    def visible(self):
        """(Nq, Nk) bool: which keys each row sees."""
        lo, hi = self.bounds()
        j = np.arange(self.Nk)[None, :]
        return (j >= lo[:, None]) & (j <= hi[:, None])

    # ---- heads ----
    @property
    def group(self):
        return self.Hq // self.Hkv

    def kv_heads(self):
        """(Hq,) int array: the kv head each query head reads."""
        h = np.arange(self.Hq)
        return h // self.group if self.head_map == "grouped" else h % self.Hkv

    # ---- the score transform ----
    def bias(self):
        """ALiBi's (B, Hq, Nq, Nk) float64 bias -slope |i + offset - j|, or None."""
        if self.slopes is None:
            return None
        dist = np.abs(np.arange(self.Nq)[:, None] + self.offset - np.arange(self.Nk)[None, :]).astype(np.float64)
        return -np.asarray(self.slopes, dtype=np.float64)[:, :, None, None] * dist

    def features(self):
        """The optional features this problem uses, by name (for reports and skip reasons)."""
        out = []
        if self.Hkv != self.Hq:
            out.append("gqa")
        if self.Dv != self.D:
            out.append("dv")
        if self.windowed:
            out.append("window")
        if self.softcap is not None:
            out.append("softcap")
        if self.slopes is not None:
            out.append("alibi")
        return out

    def with_lengths(self, Nq=None, Nk=None):
        """The same problem at other lengths (the window, map and transform kept)."""
        return dataclasses.replace(self, Nq=self.Nq if Nq is None else Nq, Nk=self.Nk if Nk is None else Nk)


def plain(q_shape, k_shape, v_shape=None, causal=False, scale=None, align="bottom-right"):
    """The Problem of a call with only causal= and scale= (the dense protocol without optional features)."""
    B, Hq, Nq, D = q_shape
    _, Hkv, Nk, _ = k_shape
    Dv = (v_shape or k_shape)[3]
    return Problem.make(B, Hq, Hkv, Nq, Nk, D, Dv, causal=causal, scale=scale, align=align)
