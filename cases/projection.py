"""Projection of a catalogue entry onto a kernel's declared limits.

Real kernels document limits (one length for queries and keys, lengths a multiple of 128, head dims of 16 and up,
dense tensors). An entry whose literal shape falls outside them usually still tests something that exists inside
them: cross-attention with Nq < Nk exists at (128, 256); a causal row that sees no key exists at lengths that are
multiples of 128; 7.5 exists at D = 16 (one query, two keys, the head dim padded with zero columns). So each entry
states its point as data (Case.point: names from POINTS below, what must stay true for the case to still test its
bug), and `project` derives the nearest admissible case that keeps every part of it: lengths rounded to the
declared multiple (their order kept), made equal, or clamped; the head dim moved to the nearest declared one (a
hand value padded with zero columns, so it stays exact), and a value head dim of its own with it, keeping its side
of D; the layout made dense. Its name says what changed:
`causal_nq_lt_nk[fp16, Nq=128, Nk=256]`. An entry is skipped only when its point cannot survive, with that reason.
"""
import math

from flashcheck.cases.features import problem, used
from flashcheck.cases.inputs import values

SMALLEST_BLOCK = 16      # no kernel's tile is narrower (tl.dot's minimum): a length of it is a whole block


def _pow2(n):
    return n > 0 and n & (n - 1) == 0


# name -> (holds(entry, case), what it says): entry is the catalogue's own instance, case the candidate
POINTS = {
    "lengths": (lambda e, c: (c.Nq, c.Nk) == (e.Nq, e.Nk), "these exact lengths"),
    "diagonal": (lambda e, c: c.Nk - c.Nq == e.Nk - e.Nq, "this offset Nk - Nq of the causal diagonal"),
    "nq_lt_nk": (lambda e, c: c.Nq < c.Nk, "Nq < Nk"),
    "nq_gt_nk": (lambda e, c: c.Nq > c.Nk, "Nq > Nk"),
    "nq_ne_nk": (lambda e, c: c.Nq != c.Nk, "Nq != Nk"),
    "one_query": (lambda e, c: c.Nq == 1, "one query"),
    "one_key": (lambda e, c: c.Nk == 1, "one key"),
    "empty_queries": (lambda e, c: c.Nq == 0, "no queries (Nq = 0)"),
    "few_queries": (lambda e, c: 0 < c.Nq < SMALLEST_BLOCK, f"fewer queries than a block (Nq < {SMALLEST_BLOCK})"),
    "few_keys": (lambda e, c: c.Nk < SMALLEST_BLOCK, f"fewer keys than a block (Nk < {SMALLEST_BLOCK})"),
    "partial_query_block": (lambda e, c: c.Nq % SMALLEST_BLOCK != 0, "a partial last query block (Nq not a multiple "
                                                                      f"of {SMALLEST_BLOCK})"),
    "partial_key_block": (lambda e, c: c.Nk % SMALLEST_BLOCK != 0, "a partial last key block (Nk not a multiple of "
                                                                    f"{SMALLEST_BLOCK})"),
    "several_key_blocks": (lambda e, c: c.Nk >= 64, "several key blocks (Nk >= 64)"),
    "many_key_blocks": (lambda e, c: c.Nk >= 128, "many key blocks (Nk >= 128)"),
    "long_rows": (lambda e, c: c.Nk >= 4096, "thousands of keys (Nk >= 4096)"),
    "queries_past_128": (lambda e, c: c.Nq > 128, "more queries than a 128-row block"),
    "hundreds_of_key_blocks": (lambda e, c: c.Nk >= 32768, "hundreds of key blocks of any tile (Nk >= 32768)"),
    "hundreds_of_query_blocks": (lambda e, c: c.Nq >= 32768, "hundreds of query blocks of any tile (Nq >= 32768)"),
    "causal": (lambda e, c: c.causal, "a causal mask"),
    "sees_no_key": (lambda e, c: c.causal and c.Nq > c.Nk, "causal rows that see no key (Nq > Nk)"),
    "whole_blocks_see_no_key": (lambda e, c: c.causal and c.Nq - c.Nk >= 64,
                                "whole query blocks that see no key (Nq - Nk >= 64)"),
    "head_dim": (lambda e, c: c.D == e.D, "this head dim"),
    "dv_lt_d": (lambda e, c: c.v_dim < c.D, "a value head dim below the query/key one (Dv < D)"),
    "dv_gt_d": (lambda e, c: c.v_dim > c.D, "a value head dim above the query/key one (Dv > D)"),
    "dv_ne_d": (lambda e, c: c.v_dim != c.D, "a value head dim of its own (Dv != D)"),
    "odd_dv": (lambda e, c: not _pow2(c.v_dim), "a value head dim that is not a power of two"),
    "odd_head_dim": (lambda e, c: not _pow2(c.D), "a head dim that is not a power of two"),
    "head_dim_past_16": (lambda e, c: c.D > 16, "a head dim past 16"),
    "head_dim_past_64": (lambda e, c: c.D > 64, "a head dim past 64"),
    "layout": (lambda e, c: c.layout == e.layout, "this layout"),
    "scale": (lambda e, c: c.scale == e.scale, "this scale"),
    "batch_heads": (lambda e, c: c.B > 1 and c.H > 1 and c.B != c.H, "B > 1 and H > 1 with B != H"),
    "offsets_past_2_31": (lambda e, c: c.B * c.H * max(c.Nq, c.Nk) * c.D > 2 ** 31, "more than 2^31 elements"),
    # the case's features composed: a projection keeps every one of them; a kernel that lacks some (or declares
    # them away) is judged on the others while two remain (verify's plan, engine._without_absent)
    "features_together": (lambda e, c: len(used(c)) >= 2 and {f.name for f in used(c)} >= {f.name for f in used(e)},
                          "its features together"),
}


def check_points(case):
    """Raise ValueError for a point name POINTS does not have (the catalogue is checked at import)."""
    unknown = [p for p in case.point if p not in POINTS]
    if unknown:
        raise ValueError(f"case {case.name}: unknown point(s) {unknown}; known: {', '.join(POINTS)}")


def kept(entry, case):
    """The parts of entry's point the candidate case loses (empty: it keeps them all)."""
    return [POINTS[p][1] for p in entry.point if not POINTS[p][0](entry, case)]


def _length_pairs(case, decl):
    """Candidate (Nq, Nk), nearest first: each rounded to the declared multiple and clamped, their order kept (the
    larger one a multiple further when rounding made them equal); made equal when the kernel needs Nq == Nk (the
    larger first, then the smaller); with --nk-ge-nq, Nq > Nk also made Nk >= Nq (the keys raised, then the queries
    lowered). Where the queries are capped on their own (--max-seq-q), also Nq clamped with
    Nk moved by as much, which keeps the causal diagonal's offset Nk - Nq (a square causal case stays square)."""
    m = decl.seq_multiple
    equal = decl.same_length or (decl.causal_same_length and case.causal)
    out = []
    if equal:
        for n in (max(case.Nq, case.Nk), min(case.Nq, case.Nk)):
            for up in (True, False):
                f = decl.fit_length(n, "Nq", up)
                if f:
                    out.append((f, f))
        return list(dict.fromkeys(out))
    for up in (True, False):
        q, k = decl.fit_length(case.Nq, "Nq", up), decl.fit_length(case.Nk, "Nk", up)
        if q is None or k is None:
            continue
        if case.Nq < case.Nk and q >= k:
            k = q + m
        elif case.Nq > case.Nk and q <= k:
            q = k + m
        if any(hi is not None and n > hi for n, hi in ((q, decl.longest("Nq")), (k, decl.longest("Nk")))):
            continue      # the order kept by moving one a multiple further took it past its axis's longest
        out.append((q, k))
        if decl.nk_ge_nq and q > k:       # the keys raised to the queries, or the queries lowered to the keys
            out += [(q, f) for f in [decl.fit_length(q, "Nk", up)] if f is not None and f >= q]
            out += [(f, k) for f in [decl.fit_length(k, "Nq", up)] if f is not None and f <= k]
        offset = case.Nk - case.Nq
        if decl.max_seq_q is not None and q != case.Nq and q + offset >= 1 and decl.fit_length(q + offset, "Nk", up) == q + offset:
            out.append((q, q + offset))
    return list(dict.fromkeys(out))


def _nearest(n, ok, grow=False, most=4):
    """The `most` declared head dims nearest to n (n itself first when declared); grow: only n and above."""
    dims = [d for d in range(1, 257) if ok(d) and (not grow or d >= n)]
    return sorted(dims, key=lambda d: (abs(math.log(d / n)), d))[:most]


def _head_dims(case, ok):
    """Candidate (D, Dv) pairs, nearest first (Dv None: v's head dim follows D). D stays when declared, unless the
    case has a Dv of its own, whose relation to D (below it, above it) may need D to move too. A hand value
    (explicit data) can only grow: its extra columns are zeros."""
    if case.Dv is None:
        return [(d, None) for d in ([case.D] if ok(case.D) else _nearest(case.D, ok, case.data == "explicit"))]
    grow = case.data == "explicit"
    pairs = [(d, dv) for d in _nearest(case.D, ok, grow) for dv in _nearest(case.Dv, ok, grow)]
    return sorted(pairs, key=lambda p: (abs(math.log(p[0] / case.D)) + abs(math.log(p[1] / case.Dv)), p))


def _padded(rows, d):
    return tuple(tuple(r) + (0.0,) * (d - len(r)) for r in rows)


def _with_head_dim(case, d, dv=None):
    change = {"D": d} if d != case.D else {}
    if dv is not None and dv != case.Dv:
        change["Dv"] = dv
    if change and case.data == "explicit":
        # zero columns add nothing to q . k and nothing to the output's first columns: the answer keeps its value
        # (both keys still score alike at the new default scale), its new columns are 0
        vd = dv if dv is not None else case.Dv or d
        change.update(q=_padded(case.q, d), k=_padded(case.k, d), v=_padded(case.v, vd))
        if isinstance(case.expected, tuple):
            change["expected"] = _padded(case.expected, vd)
    return change


def _named(name, shown):
    """name with `shown` added inside its brackets: name[fp16] -> name[fp16, shown]; name -> name[shown]."""
    base, _, inside = name.partition("[")
    inside = inside.rstrip("]")
    return f"{base}[{inside}, {shown}]" if inside else f"{base}[{shown}]"


def _name(case, changes):
    return _named(case.name, ", ".join(f"{k}={v}" for k, v in changes.items()
                                       if k in ("B", "H", "Nq", "Nk", "D", "Dv", "layout")))


def made_causal(case):
    """The case with the causal mask on, for a kernel that always masks (--causal-only), named so
    (`partial_last_key_block[fp16, causal]`). A hand value stays only where the mask hides no key a row saw (one
    query against its keys, a window whose right side is 0 already); elsewhere the reference judges it alone."""
    changes = {"causal": True}
    if case.expected is not None and case.seqlens is None:
        if not (problem(case).visible() == problem(case.replace(causal=True)).visible()).all():
            changes.update(expected=None, exact=False)
    return case.replace(name=_named(case.name, "causal"), **changes)


def project(case, decl, admissible, head_dim_ok=None):
    """(the nearest case inside the declarations that keeps case's point, None) or (None, why not).

    admissible(candidate) -> [reasons it is still excluded] (the declarations, the signature); head_dim_ok: which
    head dims the kernel takes (default: the declarations')."""
    ok = head_dim_ok or decl.head_dim_ok
    layouts = decl.layouts()
    layout = case.layout if case.layout in layouts else "contiguous" if "contiguous" in layouts else None
    if layout is None:
        return None, "no declared layout"
    lost = set()
    for d, dv in _head_dims(case, ok):
        for nq, nk in _length_pairs(case, decl) or [(case.Nq, case.Nk)]:
            changes = {k: n for k, n in (("Nq", nq), ("Nk", nk)) if n != getattr(case, k)}
            changes.update(_with_head_dim(case, d, dv))
            if layout != case.layout:
                changes["layout"] = layout
            if not changes:
                continue
            candidate = case.replace(**changes)
            missing = kept(case, candidate)
            if missing:
                lost.update(missing)
                continue
            if admissible(candidate):
                continue
            try:
                values(candidate)          # a magnitude the new head dim's inputs cannot hold
            except ValueError:
                continue
            return candidate.replace(name=_name(case, changes)), None
    # what the declarations take away (lengths, head dims, layouts it could move did not keep it), or, where no
    # move was left to try (a causal mask, a dtype, a scale: projection never changes those), the whole point
    lost = lost or {POINTS[p][1] for p in case.point}
    if not lost:
        return None, "it has no point a projection keeps"
    return None, f"its point ({'; '.join(sorted(lost))}) cannot survive the declarations"
