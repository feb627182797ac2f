"""Properties every correct attention kernel has, as plain functions: usable from pytest
(tests/test_properties.py), from `flashcheck verify --examples N` (through search()) and from cases/corpus/power.py.

Each property takes a kernel (the protocol of docs/design.md) and a Case and returns None when it holds, or a
PropertyFailure naming the property, the first bad element (b, h, row, col), got, expected, the tolerance,
and the case as a paste-ready catalogue entry (Case.source()).

  reference           the kernel equals the float64 reference within the dtype's tolerance: oracle.judge
                      with its reference, hand, poison and guard layers (its invariant layer is this module)
  agreement           two kernels (fused and unfused) agree within the sum of their tolerances
  permutation         permuting the key/value rows jointly leaves a non-causal output unchanged
  v_scaling           V -> a V gives a out
  v_shift             V -> V + c (c one vector for every value row) gives out + c on every row that sees a key
  scale_equivariance  Q -> c Q with scale -> scale / c gives the same output (a kernel that mishandles the
                      scale argument; every other relation holds at any softmax temperature)
  row_locality        new values in one query row (of one batch, head) change no other output row
  duplication         every key/value pair twice gives the same output (and lse + ln 2). Non-causal: the keys
                      concatenated with themselves. Causal: that does not hold in general (row i of the doubled
                      problem sees keys 0..i + 2Nk - Nq, not both copies of the keys it saw), but interleaving
                      a copy after every query AND every key/value does: query 2i+1 sees exactly both copies
                      of keys 0..i + Nk - Nq, so the odd output rows equal the original rows
  convex_hull         each output element lies between the min and max of V's column over the keys its row
                      sees (a softmax is a convex combination)
  causal_hidden_keys  causal: rows 0..r do not change when the keys row r cannot see get new values

Tolerances of the relations use no reference value: each run is within its own oracle tolerance of the
truth (oracle.expectation(case, inputs).tol, which the reference property demands), so runs related by
out' = a out + c differ by at most tol' + |a| tol, plus how far rounding the transformed inputs to the
dtype moves the truth: the output is a convex combination of value rows, so at most max|V' - (a V + c)|.
Inputs are finite (data="nan_input" only enters the reference property), so every output of every run
must be finite: an unwritten element (the poison) or a read from the NaN guard bands fails there.
"""
import time
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, Verbosity, assume, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from flashcheck.cases import features
from flashcheck.cases import inputs as inp
from flashcheck.cases import oracle
from flashcheck.cases.backend import backend as active_backend
from flashcheck.cases.backend import device as active_device
from flashcheck.cases.declarations import Declarations
from flashcheck.cases.generate import strategies as S
from flashcheck.cases.oracle.tolerance import Expectation


@dataclass
class PropertyFailure:
    prop: str
    target: str
    case: object              # flashcheck.cases.case.Case
    failure: oracle.Failure
    detail: str = ""          # the relation's parameters, e.g. "keys permuted by ('swap', 0, 3)"
    repro: str = ""           # how to re-check it

    def entry(self):
        """The failing case as a catalogue entry, named and explained (paste into cases/catalogue.py)."""
        return self.case.replace(name=f"found_{self.prop}",
                                 why=f"property {self.prop} ({self.failure.kind}) found by hypothesis")

    def report(self):
        lines = [f"property {self.prop} FAILED [{self.target}]", "  " + self.failure.line()]
        if self.detail:
            lines.append(f"  relation: {self.detail}")
        lines += ["  catalogue entry (paste into cases/catalogue.py):", "    " + self.entry().source()]
        if self.repro:
            lines.append(f"  re-check: {self.repro}")
        return "\n".join(lines)

    __str__ = report


class _Broken(Exception):
    """Internal: a run failed in a way that ends the property (exception, bad return, NaN, unwritten)."""

    def __init__(self, failure):
        super().__init__(failure.line())
        self.failure = failure


class _Declined(Exception):
    """Internal: a run of the relation was declined (unsupported input, out of memory, or transformed inputs
    beyond the dtype's range): nothing to check."""


@dataclass
class Run:
    """One kernel run: float64 output (B, H, Nq, D) and log-sum-exp (B, H, Nq), or None when the kernel
    does not return one."""
    out: np.ndarray
    lse: np.ndarray = None


class Trial:
    """One kernel on one case: the case's inputs, their oracle expectation and the base run, each computed
    once and shared by every property checked on the case (verify hands over what the oracle's run already has:
    qkv, expect, base). without_out=True: every run without out= (the path a kernel that takes out= is called
    without most: verify's properties judge it there)."""

    def __init__(self, kernel, case, *, device=None, target="kernel", conventions=oracle.Conventions(), decl=None,
                 qkv=None, expect=None, base=None, without_out=False):
        self.kernel, self.case, self.target, self.conventions = kernel, case, target, conventions
        self.decl = decl    # the kernel's declarations: a transformed case outside them is no input it takes
        self.device = device or active_device()
        self.qkv = inp.values(case) if qkv is None else qkv
        self._expect = expect
        self._base = base
        self.without_out = without_out

    def expect(self, qkv=None, case=None):
        """oracle.expectation of the base inputs (cached) or of transformed ones (with their case when the
        shape changed). A relation reads only out, lse and their tolerances of a transformed run (lean), and where
        it changed only V (the same q and k tensors, the same case), the base's score side serves unchanged."""
        if qkv is None:
            if self._expect is None:
                self._expect = oracle.expectation(self.case, self.qkv, self.device, self.conventions)
            return self._expect
        same_scores = case is None and qkv[0] is self.qkv[0] and qkv[1] is self.qkv[1]
        return oracle.expectation(case or self.case, qkv, self.device, self.conventions,
                                  like=self.expect() if same_scores else None, lean=True)

    def run(self, qkv=None, case=None, kernel=None):
        """One run on guarded, poisoned buffers; the base run (no arguments) is cached. Raises _Broken when
        the call fails, an element is never written, or an output is not finite (the inputs are)."""
        if qkv is None and case is None and kernel is None:
            if self._base is None:
                self._base = self._run(self.kernel, self.case, self.qkv)
            return self._base
        if qkv is not None and any(bool(torch.isinf(t).any()) for t in qkv):
            # the relation's transformation left the dtype's range (huge scores): not a legal input
            raise _Declined("transformed inputs beyond the dtype's range")
        excluded = list(self.decl.reasons(case)) if case is not None and self.decl is not None else []
        if case is not None and case.scale is not None and not oracle.Capabilities.of(kernel or self.kernel).scale:
            # scale_equivariance's transformed case passes scale=: no input a kernel without scale= takes
            excluded.append("a scale (the signature has no scale=)")
        if excluded:
            # e.g. duplication doubles Nk past --max-seq, or makes Nk != Nq under --same-length
            raise _Declined("; ".join(excluded))
        return self._run(kernel or self.kernel, case or self.case, self.qkv if qkv is None else qkv)

    def _run(self, kernel, case, qkv):
        caps = oracle.Capabilities.of(kernel)
        try:
            call = oracle.call_kernel(kernel, case, caps, qkv, self.device, without_out=self.without_out)
        except oracle.RunFailed as stop:  # the oracle's own "this call failed" signal, carrying its Failure
            raise _Broken(stop.failure) from None
        except oracle.Outcome as other:   # unsupported, out of memory: the relation cannot be checked
            raise _Declined(other) from None
        result, lse = call.result, call.lse
        unwritten = inp.is_poison(result).cpu().numpy()
        if unwritten.any():
            raise _Broken(oracle.Failure("unwritten", f"{int(unwritten.sum())} output element(s) never written",
                                         where=_first(unwritten)))
        out = _f64(result).numpy()
        bad = ~np.isfinite(out)
        if bad.any():
            w = _first(bad)
            raise _Broken(oracle.Failure("NaN", f"{int(bad.sum())} non-finite output element(s) from finite "
                                                "inputs (a NaN guard band read, or an overflow)",
                                         where=w, got=float(out[w])))
        if lse is None:
            return Run(out)
        lse = _f64(lse).numpy()
        if np.isnan(lse).any():
            w = _first(np.isnan(lse)[..., None])
            raise _Broken(oracle.Failure("lse", "NaN log-sum-exp from finite inputs", where=w, got=float("nan")))
        return Run(out, lse)


def _first(mask):
    return tuple(int(x) for x in np.argwhere(mask)[0])


def _f64(t):
    return t.detach().to("cpu", torch.float64)


def _problem(case, conventions):
    return features.problem(case, conventions.causal_align, conventions.head_map)


def _sees_key(case, conventions):
    """(Nq, 1) bool: which query rows see at least one key."""
    return _problem(case, conventions).visible().any(axis=1)[:, None]


def _right_bounded(case):
    """Whether every row's keys end somewhere before the last (causal, or a window's right side)."""
    return case.causal or (case.window is not None and case.window[1] is not None)


def _left_bounded(case):
    return case.window is not None and case.window[0] is not None


def _relation(what, got, want, bound, compared=None, *, lse=None):
    """Failure when got and want (outputs) differ by more than bound on the compared elements (default all);
    then, when lse = (got_lse, want_lse, bound_lse) has both sides, the same for the log-sum-exp rows."""
    if compared is not None:
        want = np.where(compared, want, got)
    failure, _ = oracle.compare(got, want, bound, what="invariant")
    if failure is None and lse is not None and lse[0] is not None and lse[1] is not None:
        got_l, want_l, bound_l = lse
        if compared is not None:
            rows = np.broadcast_to(compared, got.shape)[..., 0]
            want_l = np.where(rows, want_l, got_l)
        failure, _ = oracle.compare(got_l[..., None], want_l[..., None], np.asarray(bound_l)[..., None],
                                    what="invariant")
        if failure is not None:
            failure.message = "log-sum-exp " + failure.message
    if failure is not None:
        failure.kind = "invariant"
        failure.message = f"{what}: {failure.message}"
    return failure


def _std(t):
    s = float(t.float().std()) if t.numel() > 1 else 1.0
    return s if np.isfinite(s) and s > 0 else 1.0


def _checked(name, kernel, case, trial, target, body, detail="", repro=""):
    trial = trial or Trial(kernel, case, target=target)
    try:
        failure = body(trial)
    except _Broken as broken:
        failure = broken.failure
    except _Declined:
        return None
    if failure is None:
        return None
    return PropertyFailure(name, trial.target, case, failure, detail, repro)


def _repro(fn, param=None):
    extra = "" if param is None else f", {param!r}"
    return f"flashcheck.cases.generate.properties.{fn}(kernel, <the case above>{extra})"


def _same_lse(got, base, e_got, e_base, shift=0.0):
    """The lse part of a relation: got's lse equals base's (+ shift) within the sum of the lse tolerances."""
    return got.lse, None if base.lse is None else base.lse + shift, e_got.tol_lse + e_base.tol_lse


# ---- the reference, and two kernels against each other ----

def reference(kernel, case, *, trial=None, target="kernel", device=None):
    """The kernel against the float64 reference, through the oracle (poisoned output and guard bands)."""
    verdict = oracle.judge(kernel, case, device=device or (trial.device if trial else None), target=target,
                           conventions=trial.conventions if trial else oracle.Conventions())
    if not verdict.failed:
        return None
    return PropertyFailure("reference", target, case, verdict.failures[0], repro=verdict.repro())


def agreement(kernel, other, case, *, trial=None, target="kernel"):
    """kernel and other on the same guarded inputs differ by at most the sum of their tolerances (both are
    held to the same derived tolerance of this case), in the output and in the log-sum-exp."""
    def body(t):
        e = t.expect()
        mine, theirs = t.run(), t.run(kernel=other)
        return _relation(f"{target} and {getattr(other, '__module__', 'the other kernel')} disagree",
                         theirs.out, mine.out, 2 * e.tol, lse=_same_lse(theirs, mine, e, e))
    return _checked("agreement", kernel, case, trial, target, body, repro=_repro("agreement"))


# ---- metamorphic relations ----

def permutation_index(perm, Nk):
    """The key order a description from strategies.key_permutations stands for."""
    if perm[0] == "swap":
        idx = list(range(Nk))
        i, j = perm[1] % Nk, perm[2] % Nk
        idx[i], idx[j] = idx[j], idx[i]
        return torch.tensor(idx)
    if perm[0] == "reverse":
        return torch.arange(Nk - 1, -1, -1)
    if perm[0] == "rotate":
        return torch.roll(torch.arange(Nk), perm[1])
    if perm[0] == "shuffle":
        return torch.randperm(Nk, generator=torch.Generator().manual_seed(perm[1]))
    raise ValueError(f"unknown permutation {perm!r}")


def permutation(kernel, case, perm=("reverse",), *, trial=None, target="kernel"):
    """Non-causal: permuting the key/value rows jointly leaves the output (and the lse) unchanged."""
    def body(t):
        q, k, v = t.qkv
        idx = permutation_index(perm, case.Nk)
        moved = (q, k[:, :, idx], v[:, :, idx])
        base, got, e0, e1 = t.run(), t.run(moved), t.expect(), t.expect(moved)
        return _relation(f"keys/values permuted by {perm} must not change the output", got.out, base.out,
                         e0.tol + e1.tol, lse=_same_lse(got, base, e1, e0))
    return _checked("permutation", kernel, case, trial, target, body, f"keys permuted by {perm!r}",
                    _repro("permutation", perm))


def v_scaling(kernel, case, a=2.0, *, trial=None, target="kernel"):
    """V -> a V gives a out (a of any sign; rows that see no key stay 0 = a 0); the lse does not depend on V."""
    def body(t):
        q, k, v = t.qkv
        v2 = (_f64(v) * a).to(v.dtype)
        rounding = float((_f64(v2) - a * _f64(v)).abs().max()) if v.numel() else 0.0
        base, got, e0, e1 = t.run(), t.run((q, k, v2)), t.expect(), t.expect((q, k, v2))
        return _relation(f"V scaled by {a} must scale the output by {a}", got.out, a * base.out,
                         e1.tol + abs(a) * e0.tol + rounding, lse=_same_lse(got, base, e1, e0))
    return _checked("v_scaling", kernel, case, trial, target, body, f"V -> {a!r} * V", _repro("v_scaling", a))


def v_shift(kernel, case, shift=(1.0, 0), *, trial=None, target="kernel"):
    """V -> V + c, with c = magnitude * randn(Dv) (seeded) added to every value row, gives out + c on every
    row that sees a key; a row that sees none stays 0. The lse does not depend on V."""
    magnitude, seed = shift

    def body(t):
        q, k, v = t.qkv
        c = magnitude * torch.randn(case.v_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        v2 = (_f64(v) + c).to(v.dtype)
        rounding = float((_f64(v2) - (_f64(v) + c)).abs().max()) if v.numel() else 0.0
        base, got, e0, e1 = t.run(), t.run((q, k, v2)), t.expect(), t.expect((q, k, v2))
        want = np.where(_sees_key(case, t.conventions), base.out + c.numpy(), base.out)
        return _relation(f"V + c (c = {magnitude} * randn(D), seed {seed}) must give out + c", got.out, want,
                         e1.tol + e0.tol + rounding, lse=_same_lse(got, base, e1, e0))
    return _checked("v_shift", kernel, case, trial, target, body,
                    f"V -> V + {magnitude!r} * randn(D, seed={seed})", _repro("v_shift", shift))


def scale_equivariance(kernel, case, c=2.0, *, trial=None, target="kernel"):
    """Q -> c Q with the softmax scale -> scale / c leaves the scores, so the output and the lse, unchanged.
    c is a power of two (or its negative), which scales exactly: the truth does not move at all. The other
    relations hold for any softmax temperature; this one sees a kernel that mishandles the scale argument."""
    def body(t):
        q, k, v = t.qkv
        scale = case.scale if case.scale is not None else 1.0 / np.sqrt(case.D)
        case2 = case.replace(scale=float(scale / c))
        q2 = (_f64(q) * c).to(q.dtype)
        base, got, e0, e1 = t.run(), t.run((q2, k, v), case2), t.expect(), t.expect((q2, k, v), case2)
        return _relation(f"Q scaled by {c} with the scale divided by {c} must not change the output", got.out,
                         base.out, e0.tol + e1.tol, lse=_same_lse(got, base, e1, e0))
    return _checked("scale_equivariance", kernel, case, trial, target, body,
                    f"Q -> {c!r} * Q, scale -> scale / {c!r}", _repro("scale_equivariance", c))


def row_locality(kernel, case, change=(0, 0, 0, 0), *, trial=None, target="kernel"):
    """New values in query row (b, h, row) change no other output row (nor its lse): rows are independent."""
    b, h, row, seed = change

    def body(t):
        q, k, v = t.qkv
        q2 = q.clone()
        fresh = torch.randn(case.D, generator=torch.Generator().manual_seed(seed)) * _std(q)
        q2[b, h, row] = fresh.to(q.dtype)
        others = np.ones((case.B, case.H, case.Nq, 1), dtype=bool)
        others[b, h, row] = False
        base, got, e0, e1 = t.run(), t.run((q2, k, v)), t.expect(), t.expect((q2, k, v))
        return _relation(f"new values in query (b={b}, h={h}, row={row}) must change only that output row",
                         got.out, base.out, e0.tol + e1.tol, others, lse=_same_lse(got, base, e1, e0))
    return _checked("row_locality", kernel, case, trial, target, body,
                    f"query (b={b}, h={h}, row={row}) replaced (seed {seed})", _repro("row_locality", change))


def duplication(kernel, case, *, trial=None, target="kernel"):
    """Every key/value pair twice leaves the output unchanged and adds ln 2 to the lse. Non-causal: the keys
    concatenated with themselves (Nk -> 2 Nk, a loop twice as long). Causal: queries and keys/values each
    interleaved with a copy (Nq -> 2 Nq, Nk -> 2 Nk); the odd rows must equal the original rows."""
    def body(t):
        q, k, v = t.qkv
        if case.causal:
            q2, k2, v2 = (x.repeat_interleave(2, dim=2) for x in (q, k, v))
            case2 = case.replace(Nq=2 * case.Nq, Nk=2 * case.Nk)
            run2 = t.run((q2, k2, v2), case2)
            got = Run(run2.out[:, :, 1::2], None if run2.lse is None else run2.lse[:, :, 1::2])
            e1 = t.expect((q2, k2, v2), case2)
            e1 = Expectation(e1.out[:, :, 1::2], e1.lse[:, :, 1::2], e1.tol[:, :, 1::2],
                                              e1.tol_lse[:, :, 1::2])
        else:
            q2, k2, v2 = q, torch.cat([k, k], dim=2), torch.cat([v, v], dim=2)
            case2 = case.replace(Nk=2 * case.Nk)
            got = t.run((q2, k2, v2), case2)
            e1 = t.expect((q2, k2, v2), case2)
        what = ("queries and keys/values interleaved with copies: odd rows must equal the original rows"
                if case.causal else "every key/value pair twice must not change the output")
        base, e0 = t.run(), t.expect()
        return _relation(what, got.out, base.out, e0.tol + e1.tol, lse=_same_lse(got, base, e1, e0, np.log(2.0)))
    detail = ("q, k, v rows each interleaved with a copy" if case.causal else "k, v concatenated with themselves")
    return _checked("duplication", kernel, case, trial, target, body, detail, _repro("duplication"))


def convex_hull(kernel, case, *, trial=None, target="kernel"):
    """Each output element lies within [min, max] of V's column over the keys its row sees, up to the roundings
    after the softmax only (Expectation.tol_hull): every score error a correct kernel may make moves the output
    inside the hull, so where the reference's tolerance is loose (scores the dtype cannot resolve) this still
    judges tightly."""
    def body(t):
        out = t.run().out
        if out.size == 0:
            return None
        e = t.expect()
        rows = np.isfinite(e.out).all(-1, keepdims=True) & (e.lse[..., None] > -np.inf)
        below = rows & (out < e.hull_lo - e.tol_hull)
        above = rows & (out > e.hull_hi + e.tol_hull)
        if not (below.any() or above.any()):
            return None
        w = _first(below | above)
        bound = e.hull_lo[w] if below[w] else e.hull_hi[w]
        side = "min" if below[w] else "max"
        return oracle.Failure("invariant", f"output outside the convex hull of the value rows it sees: beyond "
                                           f"the {side} of V's column over them by more than the roundings after "
                                           f"the softmax allow ({int((below | above).sum())} element(s))",
                              where=w, got=float(out[w]), expected=float(bound), tol=float(e.tol_hull[w]))
    return _checked("convex_hull", kernel, case, trial, target, body, repro=_repro("convex_hull"))


def _hidden(t, keys, rows, seed):
    """(k, v) with new values at `keys` (a slice): scores about 3x the others, so that a leaked key would dominate
    its row, and values 4x as spread; rows: the (B, H, Nq, 1) bool mask of the rows that must not change."""
    q, k, v = t.qkv
    g = torch.Generator().manual_seed(seed)
    k2, v2 = k.clone(), v.clone()
    n = len(range(*keys.indices(k.shape[2])))
    k2[:, :, keys] = (torch.randn(k.shape[0], k.shape[1], n, k.shape[3], generator=g) * 3 * _std(k)).to(k.dtype)
    v2[:, :, keys] = (torch.randn(v.shape[0], v.shape[1], n, v.shape[3], generator=g) * 4 * _std(v)).to(v.dtype)
    return (q, k2, v2)


def causal_hidden_keys(kernel, case, hidden=(0, 0), *, trial=None, target="kernel"):
    """Causal (or a window's right side): the keys row r cannot see (past the last it sees) get new values (larger
    scores, other values); rows 0..r see none of them (the last key a row sees only grows with the row), and
    neither their output nor their lse may change."""
    row, seed = hidden

    def body(t):
        lo, hi = _problem(case, t.conventions).bounds()
        first = max(int(hi[row]) + 1, 0)
        if first >= case.Nk:
            return None
        moved = _hidden(t, slice(first, None), None, seed)
        rows = np.zeros((case.B, case.H, case.Nq, 1), dtype=bool)
        rows[:, :, :row + 1] = True
        base, got, e0, e1 = t.run(), t.run(moved), t.expect(), t.expect(moved)
        return _relation(f"rows 0..{row} must ignore keys {first}..{case.Nk - 1}, which they cannot see",
                         got.out, base.out, e0.tol + e1.tol, rows, lse=_same_lse(got, base, e1, e0))
    return _checked("causal_hidden_keys", kernel, case, trial, target, body,
                    f"keys past the last row {row} sees replaced (seed {seed})", _repro("causal_hidden_keys", hidden))


def left_hidden_keys(kernel, case, hidden=(0, 0), *, trial=None, target="kernel"):
    """A window's left side: the keys before the first that row r sees get new values; rows r..Nq-1 see none of
    them (the first key a row sees only grows with the row), and neither their output nor their lse may change."""
    row, seed = hidden

    def body(t):
        lo, hi = _problem(case, t.conventions).bounds()
        last = min(int(lo[row]), case.Nk)
        if last <= 0:
            return None
        moved = _hidden(t, slice(0, last), None, seed)
        rows = np.zeros((case.B, case.H, case.Nq, 1), dtype=bool)
        rows[:, :, row:] = True
        base, got, e0, e1 = t.run(), t.run(moved), t.expect(), t.expect(moved)
        return _relation(f"rows {row}..{case.Nq - 1} must ignore keys 0..{last - 1}, left of their window",
                         got.out, base.out, e0.tol + e1.tol, rows, lse=_same_lse(got, base, e1, e0))
    return _checked("left_hidden_keys", kernel, case, trial, target, body,
                    f"keys before the first row {row} sees replaced (seed {seed})", _repro("left_hidden_keys", hidden))


def query_heads_in_group(kernel, case, *, trial=None, target="kernel"):
    """GQA: query heads that read the same kv head, permuted among themselves (each such set's order reversed),
    permute the output heads alike: a kernel whose head map depends on more than the kv head shows."""
    def body(t):
        q, k, v = t.qkv
        kv = _problem(case, t.conventions).kv_heads()
        perm = np.arange(case.H)
        for g in np.unique(kv):
            heads = np.flatnonzero(kv == g)
            perm[heads] = heads[::-1]
        moved = (q[:, torch.as_tensor(perm)], k, v)
        base, got, e0, e1 = t.run(), t.run(moved), t.expect(), t.expect(moved)
        want = Run(base.out[:, perm], None if base.lse is None else base.lse[:, perm])
        return _relation("query heads permuted within their kv group must permute the output heads alike", got.out,
                         want.out, e0.tol[:, perm] + e1.tol, lse=_same_lse(got, want, e1, _permuted(e0, perm)))
    return _checked("query_heads_in_group", kernel, case, trial, target, body,
                    "query heads reversed within each kv group", _repro("query_heads_in_group"))


def _permuted(e, perm):
    return Expectation(e.out[:, perm], e.lse[:, perm], e.tol[:, perm], e.tol_lse[:, perm])


# ---- all of them, for search() and cases/corpus/power.py ----

@dataclass(frozen=True)
class Property:
    name: str
    applies: object           # case -> bool


def _param_strategies():
    """Each parametrized property's parameter strategy (a function of the case). Imported late: the
    properties themselves need no hypothesis."""
    return {"permutation": lambda c: S.key_permutations(c.Nk), "v_scaling": lambda c: S.v_factors(),
            "v_shift": lambda c: S.v_shifts(), "scale_equivariance": lambda c: S.q_factors(),
            "row_locality": S.query_changes,
            "causal_hidden_keys": S.hidden_key_rows, "left_hidden_keys": S.hidden_key_rows}


def _finite(case):
    return case.data != "nan_input"


def _holds(name, extra=lambda c: True):
    """A relation applies to finite inputs, where every feature the case uses keeps it (cases/features.py)."""
    return lambda c: _finite(c) and features.keeps(c, name) and extra(c)


PROPERTIES = (
    Property("reference", lambda c: True),
    Property("agreement", _finite),
    Property("permutation", _holds("permutation", lambda c: not c.causal and c.Nk > 1)),
    Property("v_scaling", _holds("v_scaling")),
    Property("v_shift", _holds("v_shift")),
    Property("scale_equivariance", _holds("scale_equivariance")),
    Property("row_locality", _holds("row_locality", lambda c: c.Nq > 0)),
    Property("duplication", _holds("duplication")),
    Property("convex_hull", _holds("convex_hull")),
    Property("causal_hidden_keys", _holds("causal_hidden_keys", lambda c: _right_bounded(c) and c.Nq > 1)),
    Property("left_hidden_keys", _holds("left_hidden_keys", lambda c: _left_bounded(c) and c.Nq > 1)),
    Property("query_heads_in_group", _holds("query_heads_in_group", lambda c: c.kv_heads < c.H and c.Nq > 0)),
)
NAMES = tuple(p.name for p in PROPERTIES)


METAMORPHIC = tuple(n for n in NAMES if n not in ("reference", "agreement"))


def fixed_params(case):
    """A parameter for each parametrized property, derived from the case's seed (no hypothesis): what
    verify applies to every catalogue and generated case."""
    s = case.seed
    return {"permutation": ("shuffle", s), "v_scaling": -2.0, "v_shift": (3.0, s + 1),
            "scale_equivariance": 2.0, "row_locality": (case.B - 1, case.H - 1, case.Nq // 2, s + 2),
            "causal_hidden_keys": (max(case.Nq // 2 - 1, 0), s + 3), "left_hidden_keys": (case.Nq // 2, s + 4)}


def check_fixed(kernel, case, *, trial=None, names=METAMORPHIC, target="kernel", conventions=oracle.Conventions(),
                decl=None):
    """Every applicable property in `names` with fixed_params, sharing one Trial (given, or made here). Returns the
    first PropertyFailure, or None. decl: the kernel's declarations; a relation whose transformed case they
    exclude is not checked."""
    trial = trial or Trial(kernel, case, target=target, conventions=conventions, decl=decl)
    params = fixed_params(case)
    for prop in PROPERTIES:
        if prop.name in names and prop.applies(case):
            failure = check(prop.name, kernel, case, params.get(prop.name), trial=trial, target=target)
            if failure is not None:
                return failure
    return None


def check(name, kernel, case, param=None, *, other=None, trial=None, target="kernel"):
    """Run one property by name (param: its drawn parameter; other: the second kernel of agreement)."""
    if name not in NAMES:
        raise ValueError(f"no property named {name!r}; properties: {', '.join(NAMES)}")
    if name == "reference":
        return reference(kernel, case, trial=trial, target=target)
    if name == "agreement":
        return agreement(kernel, other, case, trial=trial, target=target)
    fn = globals()[name]
    if param is None:
        return fn(kernel, case, trial=trial, target=target)
    return fn(kernel, case, param, trial=trial, target=target)


def check_case(kernel, case, draw, *, other=None, names=None, target="kernel", device=None):
    """Every applicable property (or those in names) on one case, sharing the base run; parameters come
    from draw (hypothesis's data.draw), or are fixed_params(case) when draw is None. Returns the first
    PropertyFailure, or None."""
    trial = Trial(kernel, case, device=device, target=target)
    params = _param_strategies()
    fixed = fixed_params(case) if draw is None else {}
    for prop in PROPERTIES:
        if (names and prop.name not in names) or not prop.applies(case):
            continue
        if prop.name == "agreement" and other is None:
            continue
        if draw is None:
            param = fixed.get(prop.name)
        else:
            param = draw(params[prop.name](case), label=prop.name) if prop.name in params else None
        failure = check(prop.name, kernel, case, param, other=other, trial=trial, target=target)
        if failure is not None:
            return failure
    return None


def _within(case, options):
    """Whether a case keeps within the options of strategies.cases a search was given."""
    causal, dtypes, layouts, data = (options.get(k) for k in ("causal", "dtypes", "layouts", "data"))
    head_dim_ok, max_len = options.get("head_dim_ok"), options.get("max_len")
    return ((causal is None or case.causal == causal) and (dtypes is None or case.dtype in dtypes)
            and (layouts is None or case.layout in layouts) and (data is None or case.data in data)
            and (head_dim_ok is None or head_dim_ok(case.D)) and (max_len is None or max(case.Nq, case.Nk) <= max_len)
            and case.Nq >= options.get("min_nq", 0) and (options.get("scale", True) or case.scale is None)
            and (options.get("pin_blocks", True) or (case.block_m is None and case.block_n is None)))


@dataclass
class SearchResult:
    failure: PropertyFailure = None    # the first failure found (shrunk when shrink=True), or None
    examples: int = 0                  # cases tried (shrinking included)
    seconds: float = 0.0


def search(kernel, examples, *, other=None, names=None, target="kernel", shrink=True, seed=None,
           device=None, representative=True, **case_options):
    """Try up to `examples` cases (every applicable property on each) and stop at the first failure: first
    the representative cases verify judges first (strategies.representative, a quarter of the budget at
    most, with fixed_params), then distinct generated ones, a failure among those shrunk to a minimal case
    when shrink=True. Derandomized unless a seed is given: the same call tries the same cases. case_options
    go to strategies.cases (dtypes=, causal=, max_len=, ...); the representative cases keep within them
    (representative=False: none, the drawn cases alone)."""
    case_options.setdefault("kernels", ("fused", "unfused") if other is not None else ("fused",))
    found, tried, seen = [], [0], set()
    t0 = time.perf_counter()
    backend = case_options.get("backend") or active_backend()
    lim = S.limits(backend, case_options.get("profile"))
    dtypes = tuple(d for d in lim.dtypes if case_options.get("dtypes") is None or d in case_options["dtypes"])
    decl = case_options.get("decl") or Declarations()
    reps = [c for c in S.representative(decl, dtypes, backend, oracle.Capabilities.of(kernel))
            if _within(c, case_options)] if dtypes and representative else []
    for case in reps[:max(1, examples // 4)]:
        tried[0] += 1
        seen.add(case.key())
        failure = check_case(kernel, case, None, other=other, names=names, target=target, device=device)
        if failure is not None:
            return SearchResult(failure, tried[0], time.perf_counter() - t0)

    def explore(data):
        case = data.draw(S.cases(**case_options), label="case")
        key = case.key()
        if not found:                        # (shrinking may replay a case, and runs past the budget)
            assume(key not in seen)          # a case drawn twice is judged once
            if tried[0] >= examples:
                return
            seen.add(key)
            tried[0] += 1
        failure = check_case(kernel, case, data.draw, other=other, names=names, target=target, device=device)
        if failure is not None:
            found.append(failure)
            raise AssertionError(failure.report())

    def make(derandomize):
        return settings(max_examples=examples - tried[0], derandomize=derandomize, database=None, deadline=None,
                        phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
                        report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                        verbosity=Verbosity.quiet, print_blob=False)(given(st.data())(explore))

    # derandomized generation soon repeats itself: another seed while the budget is not spent
    for round_ in S.reseeded(make, seed):
        if found or tried[0] >= examples:
            break
        try:
            round_()
        except (AssertionError, Flaky):
            pass   # the failure is in `found`; its last entry is the example hypothesis replayed last (the minimal)
    return SearchResult(found[-1] if found else None, tried[0], time.perf_counter() - t0)
