"""The optional features of protocol v3 (docs/design.md), one record each: what a case needs of the kernel, how a
kernel shows that it has it, what the case passes to it, and what the feature does to the problem.

    gqa       k and v have Hkv heads, H a multiple of Hkv; query head h reads kv head h // (H // Hkv)
    dv        v and the output have their own head dim Dv
    window    window=(left, right): query i sees key j iff i + Nk - Nq - left <= j <= i + Nk - Nq + right
    softcap   softcap=c: a score s becomes c tanh(s / c), before the masks and the bias
    alibi     alibi_slopes (H,) or (B, H), float32: the scores get -slope |i + Nk - Nq - j|

A feature carried by a keyword (window=, softcap=, alibi_slopes=) is discovered from the kernel's signature; one
carried by the shapes alone (GQA, Dv != D) cannot be, so verify probes it (probe(): one small case, judged by the
oracle, in the runner's worker: cases/verify/judging.py probe_feature) unless the kernel declares it (--gqa yes|no, --dv yes|no). A case that uses a
feature the kernel lacks is skipped with the reason, never passed. What the feature does to attention is one value,
reference.problem.Problem (problem() builds it for a case under the kernel's declared conventions); which
metamorphic relations stay true under it is `keeps` (cases/generate/properties.py asks).

Adding a feature: one record here, its Problem effect (reference/problem.py), its case field (cases/case.py), its
catalogue cases and mutants.
"""
from dataclasses import dataclass

import numpy as np
import torch

from flashcheck.cases.case import Case
from flashcheck.reference.problem import Problem


def _slopes(case):
    """ALiBi's slopes as float32-rounded numbers, (B, H): the geometric 2^(-8 (h + 1) / H) of the ALiBi paper for
    "heads", and for "batch_heads" each batch's own multiple of them (so that a kernel reading the slopes of the
    wrong batch shows)."""
    H = case.H
    base = np.array([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=np.float32)
    if case.alibi == "heads":
        return np.broadcast_to(base, (case.B, H))
    return np.stack([base * np.float32(1.0 + 0.5 * b) for b in range(case.B)]).astype(np.float32)


def alibi_tensor(case, device):
    """The alibi_slopes a case passes: (H,) for "heads", (B, H) for "batch_heads", float32 on `device`."""
    s = _slopes(case)
    return torch.tensor(s[0] if case.alibi == "heads" else s, dtype=torch.float32, device=device)


@dataclass(frozen=True)
class Feature:
    name: str
    label: str                   # its short name in the report's capabilities line
    what: str                    # what it is, for skip reasons
    uses: object                 # case -> bool
    keyword: str = None          # the call keyword that carries it; None: the shapes do (probed)
    kwargs: object = None        # (case, device) -> {keyword: value} it passes to the kernel
    keeps: frozenset = frozenset()   # the metamorphic relations that stay true when a case uses it
    probe: object = None         # a small case that uses it alone, for kernels whose signature cannot tell
    drop: object = None          # case -> the same case without the feature


# relations that hold whatever the feature (the output's linearity in V, rows independent, the hull, Q's scale)
_ALWAYS = frozenset({"v_scaling", "v_shift", "row_locality", "convex_hull", "scale_equivariance",
                     "causal_hidden_keys", "left_hidden_keys"})

FEATURES = (
    Feature("gqa", "GQA", "grouped-query heads (k and v with Hkv < H heads)", lambda c: c.kv_heads != c.H,
            drop=lambda c: c.replace(Hkv=None), keeps=_ALWAYS | {"permutation", "duplication", "query_heads_in_group"}),
    Feature("dv", "Dv != D", "a value head dim of its own (Dv != D)", lambda c: c.v_dim != c.D,
            drop=lambda c: c.replace(Dv=None), keeps=_ALWAYS | {"permutation", "duplication", "query_heads_in_group"}),
    Feature("window", "window", "a sliding window (window=)", lambda c: c.window is not None, keyword="window",
            kwargs=lambda c, device: {"window": tuple(c.window)}, drop=lambda c: c.replace(window=None), keeps=_ALWAYS | {"query_heads_in_group"}),
    Feature("softcap", "softcap", "logit softcapping (softcap=)", lambda c: c.softcap is not None, keyword="softcap",
            kwargs=lambda c, device: {"softcap": c.softcap}, drop=lambda c: c.replace(softcap=None),
            keeps=_ALWAYS | {"permutation", "duplication", "query_heads_in_group"}),
    Feature("alibi", "ALiBi", "ALiBi biases (alibi_slopes=)", lambda c: c.alibi is not None, keyword="alibi_slopes",
            kwargs=lambda c, device: {"alibi_slopes": alibi_tensor(c, device)}, drop=lambda c: c.replace(alibi=None),
            keeps=_ALWAYS),
)
BY_NAME = {f.name: f for f in FEATURES}
PROBED = tuple(f.name for f in FEATURES if f.keyword is None)


def used(case):
    """The features a case uses."""
    return [f for f in FEATURES if f.uses(case)]


def without(case, names):
    """The case without the named features (each record's drop), named for what it left out:
    every_feature_at_once[fp16, without Dv != D]."""
    out = case
    for name in names:
        out = BY_NAME[name].drop(out)
    left = "without " + ", ".join(BY_NAME[n].label for n in names)
    return out.replace(name=f"{case.name[:-1]}, {left}]" if case.name.endswith("]") else f"{case.name}[{left}]")


def composed_without(case, names):
    """without(case, names) for a case about its features composed (point features_together), while two or more of
    them remain; else None. names it does not use are not counted."""
    names = [n for n in names if BY_NAME[n].uses(case)]
    return without(case, names) if names and len(used(case)) - len(names) >= 2 else None


def kwargs(case, device):
    """The keywords a case's features pass to the kernel."""
    out = {}
    for f in used(case):
        if f.kwargs is not None:
            out.update(f.kwargs(case, device))
    return out


def keeps(case, relation):
    """Whether a metamorphic relation stays true for this case, whatever features it uses."""
    return all(relation in f.keeps for f in used(case))


def problem(case, align="bottom-right", head_map="grouped"):
    """The reference.problem.Problem of a case, under the conventions a kernel declares."""
    return Problem.make(case.B, case.H, case.kv_heads, case.Nq, case.Nk, case.D, case.v_dim, causal=case.causal,
                        scale=case.scale, window=case.window, softcap=case.softcap,
                        alibi_slopes=None if case.alibi is None else _slopes(case), align=align, head_map=head_map)


def from_signature(params):
    """The features a signature's parameters show (an explicit keyword; **kwargs shows none)."""
    return frozenset(f.name for f in FEATURES if f.keyword is not None and f.keyword in params)


def missing(case, caps):
    """[why] for each feature the case uses that the kernel does not have (caps.features, caps.notes)."""
    out = []
    for f in used(case):
        if f.name in caps.features:
            continue
        note = (caps.notes.get(f.name) if caps.notes else None) or "not declared"
        if f.keyword is not None and getattr(caps, "var_kw", False):
            out.append(f"{f.what} (its **kwargs shows no {f.keyword}=: --keywords {f.keyword} declares it)")
        elif f.keyword is not None:
            out.append(f"{f.what} (the signature has no {f.keyword}=)")
        elif note.startswith("probed, "):     # the whole answer is on the capabilities line
            out.append(f"{f.what} ({note.split(':', 1)[0]}; --{f.name} yes judges it anyway)")
        else:
            out.append(f"{f.what} ({note})")
    return out


# ---- probing the shape-carried features ----

PROBE_SHAPE = {"D": 16, "Dv": 32, "N": 8, "Nq": 8, "causal": False}   # N: the keys; Nq: the queries; causal
                                                                       # for a kernel that always masks


def probe_case(name, dtype, shape=None):
    """The small case a probe of feature `name` judges: the feature alone, in awkward shapes (kv heads past Hkv
    sit in the NaN guard band, so a kernel that reads head h of k for query head h shows it). shape: the head dims
    and lengths the kernel declares it takes (cases/verify/engine.py probe_shape), else PROBE_SHAPE."""
    s = shape or PROBE_SHAPE
    if name == "gqa":
        return Case("probe_gqa", B=1, H=4, Hkv=2, Nq=s["Nq"], Nk=s["N"], D=s["D"], dtype=dtype, causal=s["causal"],
                    seed=1)
    return Case("probe_dv", H=2, Nq=s["Nq"], Nk=s["N"], D=s["D"], Dv=s["Dv"], dtype=dtype, causal=s["causal"], seed=1)


def probe_dtype(decl, backend, triton):
    """The dtype a probe runs in: fp32 where the kernel takes it, else a half precision the backend can judge."""
    dtypes = decl.dtypes or ("fp32", "fp16", "bf16")
    for d in ("fp32", "fp16", "bf16"):
        if d in dtypes and not (d == "bf16" and backend != "gpu" and triton):
            return d
    return None


def gqa_group_perm(case):
    """A permutation of the query heads that keeps each inside its kv group (each group's order reversed)."""
    g = case.H // case.kv_heads
    return [grp * g + (g - 1 - i) for grp in range(case.kv_heads) for i in range(g)]

