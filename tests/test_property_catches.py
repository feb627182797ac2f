"""Each property of cases/generate/properties.py catches a kernel that breaks the relation it states: a test
that could not fail would let a property be deleted silently (scripts/prove_tests.py deletes each in a
scratch copy and checks that its test here goes red)."""
import pytest
import torch

from flashcheck.cases.case import Case
from flashcheck.cases.generate import properties as P
from flashcheck.kernel import fused

CASE = Case("probe", B=2, H=2, Nq=12, Nk=20, D=16, seed=5, dtype="fp32")
CAUSAL = CASE.replace(name="probe_causal", causal=True, Nq=20)


def drops_last_key(q, k, v, **kw):
    return fused.attention(q, k[:, :, :-1], v[:, :, :-1], **kw)


def offset(q, k, v, **kw):
    return fused.attention(q, k, v, **kw) + 0.1


def stretched(q, k, v, **kw):
    return fused.attention(q, k, v, **kw) * 1.1


def ignores_scale(q, k, v, *, causal=False, scale=None):
    return fused.attention(q, k, v, causal=causal)


def rows_leak(q, k, v, **kw):
    return fused.attention(q + 0.5 * q.mean(dim=2, keepdim=True), k, v, **kw)


def doubled(q, k, v, **kw):
    return 2 * fused.attention(q, k, v, **kw)


def ignores_causal(q, k, v, *, causal=False, scale=None):
    return fused.attention(q, k, v, scale=scale)


CATCHES = [
    ("permutation", drops_last_key, CASE, ("reverse",)),
    ("v_scaling", offset, CASE, -2.0),
    ("v_shift", stretched, CASE, (3.0, 1)),
    ("scale_equivariance", ignores_scale, CASE, 2.0),
    ("row_locality", rows_leak, CASE, (1, 1, 3, 2)),
    ("duplication", drops_last_key, CASE, None),
    ("convex_hull", doubled, CASE, None),
    ("causal_hidden_keys", ignores_causal, CAUSAL, (5, 3)),
]


@pytest.mark.parametrize("name, kernel, case, param", CATCHES, ids=[c[0] for c in CATCHES])
def test_property_catches_the_kernel_that_breaks_it(name, kernel, case, param):
    found = P.check(name, kernel, case, param, target=f"tests:{kernel.__name__}")
    assert found is not None and found.prop == name, f"{name} did not catch {kernel.__name__}"
    assert found.failure.kind == "invariant" and found.failure.where is not None
    assert P.check(name, fused.attention, case, param) is None      # and the real kernel holds it


def test_trivial_answers_are_never_a_pass():
    """In a regime too wide to judge (bf16 scores of about -150 with the allowance for rounded scores), zeros
    or the mean of V must be inconclusive, never pass; where the tolerance is tight they fail."""
    from flashcheck.cases import oracle

    def mean_v(q, k, v, **kw):
        return v.mean(dim=2, keepdim=True).expand(*q.shape[:3], v.shape[-1]).contiguous()

    def zeros(q, k, v, **kw):
        return torch.zeros_like(q)

    for case in (Case("wide", Nq=8, Nk=30, D=16, dtype="bf16", data="very_negative", seed=3),
                 Case("tight", Nq=8, Nk=30, D=16, dtype="fp16", seed=3)):
        for kernel in (mean_v, zeros):
            verdict = oracle.judge(kernel, case, conventions=oracle.Conventions())
            assert verdict.status in ("fail", "inconclusive"), (case.name, kernel.__name__, verdict.report())
            if case.name == "tight":
                assert verdict.failed, verdict.report()


def test_convex_hull_judges_tightly_where_the_reference_is_loose():
    """fp16 scores of about +-1e3 leave rows the dtype cannot resolve, where the reference's tolerance is wide: an
    output pushed past the largest value its row sees, by half that room, still passes the reference. The hull
    allows only the roundings after the softmax, so it fails that output."""
    import numpy as np

    from flashcheck.cases import inputs, oracle

    case = Case("hull_probe", Nq=16, Nk=40, D=32, dtype="fp16", data="large", seed=1)
    e = oracle.expectation(case, inputs.values(case), "cpu")
    room = e.tol - (e.hull_hi - e.out)                 # how far above the hull the reference would still pass
    w = np.unravel_index(int(np.nanargmax(room / e.tol_hull)), room.shape)
    assert room[w] > 20 * e.tol_hull[w]                # a loose row: the reference allows far more than the hull
    past = float(e.hull_hi[w] + room[w] / 2)

    def beyond_the_hull(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        out[w] = past
        return out

    assert oracle.judge(beyond_the_hull, case).status in ("pass", "inconclusive")
    found = P.convex_hull(beyond_the_hull, case)
    assert found is not None and found.failure.where == tuple(int(x) for x in w), found
    assert P.convex_hull(fused.attention, case) is None
