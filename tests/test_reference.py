"""The references against each other, against hand values and against torch's SDPA where conventions agree."""
import math

import numpy as np
import pytest
import torch

from flashcheck.reference import numpy_ref, torch_ref


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(7, 7), (5, 11), (11, 5), (1, 3)])
def test_numpy_matches_torch_float64(causal, nq, nk):
    q, k, v = _rand(2, 3, nq, 8, seed=1), _rand(2, 3, nk, 8, seed=2), _rand(2, 3, nk, 8, seed=3)
    out, lse = numpy_ref.attention(q.numpy(), k.numpy(), v.numpy(), causal)
    tout, tlse = torch_ref.attention(q, k, v, causal)
    np.testing.assert_allclose(out, tout.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, tlse.numpy(), rtol=1e-12, atol=1e-12)


def test_hand_values():
    q, k, v = np.ones((1, 1, 1, 1)), np.ones((1, 1, 2, 1)), np.array([5.0, 10.0]).reshape(1, 1, 2, 1)
    out, lse = numpy_ref.attention(q, k, v)
    assert out.item() == 7.5
    assert lse.item() == pytest.approx(1 + math.log(2))
    v3 = _rand(1, 1, 4, 3).numpy()
    out, _ = numpy_ref.attention(np.zeros((1, 1, 2, 3)), _rand(1, 1, 4, 3).numpy(), v3)
    np.testing.assert_allclose(out[0, 0], np.broadcast_to(v3[0, 0].mean(0), (2, 3)), rtol=1e-14)
    out, _ = numpy_ref.attention(_rand(1, 1, 3, 3).numpy(), _rand(1, 1, 1, 3).numpy(), v3[:, :, :1])
    np.testing.assert_array_equal(out[0, 0], np.broadcast_to(v3[0, 0, 0], (3, 3)))


def test_causal_is_bottom_right_and_empty_rows_are_zero():
    nq, nk = 5, 3
    seen = numpy_ref.visible(nq, nk, True)
    # query i sees key j iff j <= i + nk - nq: rows 0 and 1 see nothing, row 4 sees all three keys
    assert seen.sum(1).tolist() == [0, 0, 1, 2, 3]
    out, lse = numpy_ref.attention(_rand(1, 1, nq, 4).numpy(), _rand(1, 1, nk, 4).numpy(),
                                   _rand(1, 1, nk, 4).numpy(), causal=True)
    assert (out[0, 0, :2] == 0).all() and np.isneginf(lse[0, 0, :2]).all()
    assert np.isfinite(out).all()
    tout, tlse = torch_ref.attention(_rand(1, 1, nq, 4), _rand(1, 1, nk, 4), _rand(1, 1, nk, 4), causal=True)
    assert (tout[0, 0, :2] == 0).all() and torch.isneginf(tlse[0, 0, :2]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa(causal):
    """torch's SDPA aligns causal masks top-left; with Nq == Nk that equals bottom-right."""
    q, k, v = _rand(2, 2, 9, 16, seed=4), _rand(2, 2, 9, 16, seed=5), _rand(2, 2, 9, 16, seed=6)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out, _ = numpy_ref.attention(q.numpy(), k.numpy(), v.numpy(), causal)
    np.testing.assert_allclose(out, sdpa.numpy(), rtol=1e-10, atol=1e-10)
    q2, k2 = _rand(1, 2, 4, 8, seed=7), _rand(1, 2, 10, 8, seed=8)
    v2 = _rand(1, 2, 10, 8, seed=9)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, scale=0.3)
    np.testing.assert_allclose(numpy_ref.attention(q2.numpy(), k2.numpy(), v2.numpy(), scale=0.3)[0],
                               sdpa.numpy(), rtol=1e-10, atol=1e-10)


def test_nan_propagates_to_its_row_only():
    q = _rand(1, 1, 4, 3).numpy()
    q[0, 0, 2, 1] = np.nan
    out, _ = numpy_ref.attention(q, _rand(1, 1, 5, 3).numpy(), _rand(1, 1, 5, 3).numpy())
    assert np.isnan(out[0, 0, 2]).all() and np.isfinite(np.delete(out[0, 0], 2, axis=0)).all()


def test_large_scores_do_not_overflow():
    q = np.full((1, 1, 1, 1), 1e4)
    k = np.array([1.0, 0.999]).reshape(1, 1, 2, 1)
    out, lse = numpy_ref.attention(q, k, np.array([1.0, 2.0]).reshape(1, 1, 2, 1), scale=1.0)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    assert out.item() == pytest.approx(1.0 + 1 / (1 + math.exp(10)), rel=1e-9)


@pytest.mark.parametrize("align", numpy_ref.ALIGNS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(7, 7), (5, 11), (11, 5), (0, 3), (1, 1)])
def test_torch_softmax_parts_is_the_numpy_oracle(causal, align, nq, nk):
    """The oracle's reference runs in torch on the kernel's device (reference/torch_ref.softmax_parts); it must
    be numpy_ref's definition: same masks, same empty rows, same NaN rows, values to float64 rounding."""
    q, k, v = _rand(2, 3, nq, 8, seed=1) * 10, _rand(2, 3, nk, 8, seed=2) * 10, _rand(2, 3, nk, 8, seed=3)
    if nq > 2:
        q[1, 2, 2, 3] = float("nan")
    ref = numpy_ref.softmax_parts(q.numpy(), k.numpy(), v.numpy(), causal, None, align)
    got = torch_ref.softmax_parts(q, k, v, causal, None, align)
    np.testing.assert_array_equal(got.seen.numpy(), ref.seen)
    for name in ("s", "p", "lse", "out"):
        np.testing.assert_allclose(getattr(got, name).numpy(), getattr(ref, name), rtol=1e-12, atol=1e-300,
                                   err_msg=name)
    lo, hi, sees = torch_ref.visible_range(v, numpy_ref.plain(tuple(q.shape), tuple(k.shape), tuple(v.shape), causal,
                                                              None, align))
    for i in range(nq):
        keys = ref.seen[i]
        assert bool(sees[i]) == keys.any()
        if keys.any():
            np.testing.assert_array_equal(lo[:, :, i].numpy(), v.numpy()[:, :, keys].min(2))
            np.testing.assert_array_equal(hi[:, :, i].numpy(), v.numpy()[:, :, keys].max(2))


def _brute(q, k, v, *, causal=False, scale=None, window=None, softcap=None, slopes=None, align="bottom-right",
           head_map="grouped"):
    """The protocol's definition, one element at a time (no shared code with reference/problem.py)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    scale = 1 / math.sqrt(D) if scale is None else scale
    off = Nk - Nq if align == "bottom-right" else 0
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0
    out, lse = np.zeros((B, Hq, Nq, Dv)), np.full((B, Hq, Nq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            g = h // (Hq // Hkv) if head_map == "grouped" else h % Hkv
            for i in range(Nq):
                keys = [j for j in range(Nk) if (left is None or j >= i + off - left)
                        and (right is None or j <= i + off + right)]
                if not keys:
                    continue
                t = []
                for j in keys:
                    s = scale * float(np.dot(q[b, h, i], k[b, g, j]))
                    if softcap is not None:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        s -= slopes[b][h] * abs(i + off - j)
                    t.append(s)
                m = max(t)
                w = [math.exp(x - m) for x in t]
                lse[b, h, i] = m + math.log(sum(w))
                out[b, h, i] = sum(wj * v[b, g, j] for wj, j in zip(w, keys)) / sum(w)
    return out, lse


FEATURES = [
    dict(),
    dict(causal=True),
    dict(window=(2, 1)),
    dict(window=(0, 0)),
    dict(window=(None, 3)),
    dict(window=(4, None), causal=True),
    dict(softcap=2.5),
    dict(slopes=((0.5, 0.25, 0.125, 0.0625), (1.0, 0.5, 0.3, 0.1))),
    dict(window=(3, 2), softcap=1.5, slopes=((0.5, 0.25, 0.125, 0.0625),) * 2, causal=True),
    dict(head_map="interleaved", causal=True),
    dict(align="top-left", causal=True, window=(2, None)),
]


@pytest.mark.parametrize("features", FEATURES, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()) or "plain")
@pytest.mark.parametrize("nq,nk,hkv,dv", [(5, 9, 2, 3), (9, 5, 1, 6), (6, 6, 4, 5)])
def test_reference_is_the_definition_with_every_feature(features, nq, nk, hkv, dv):
    """numpy_ref and torch_ref (what the oracle computes) against the definition element by element: GQA head maps,
    a value head dim of its own, windows of both sides with either alignment, softcap and ALiBi, alone and
    together."""
    from flashcheck.reference.problem import Problem

    q, k, v = _rand(2, 4, nq, 3, seed=1) * 2, _rand(2, hkv, nk, 3, seed=2) * 2, _rand(2, hkv, nk, dv, seed=3)
    want_out, want_lse = _brute(q.numpy(), k.numpy(), v.numpy(), **features)
    kw = dict(features)
    slopes = kw.pop("slopes", None)
    pb = Problem.make(2, 4, hkv, nq, nk, 3, dv, alibi_slopes=slopes, **kw)
    out, lse = numpy_ref.attention(q.numpy(), k.numpy(), v.numpy(), problem=pb)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))
    np.testing.assert_allclose(lse[np.isfinite(lse)], want_lse[np.isfinite(want_lse)], rtol=1e-12)
    got = torch_ref.softmax_parts(q.double(), k.double(), v.double(), problem=pb)
    np.testing.assert_allclose(got.out.numpy(), want_out, rtol=1e-12, atol=1e-14)
    tout, tlse = torch_ref.attention(q.double(), k.double(), v.double(), problem=pb)
    np.testing.assert_allclose(tout.numpy(), want_out, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bad, text", [
    (dict(Hq=6, Hkv=4), "not a multiple"),
    (dict(window=(-1, 0)), "integer >= 0"),
    (dict(window=(1,)), r"\(left, right\)"),
    (dict(softcap=0.0), "softcap"),
    (dict(alibi_slopes=(1.0, 2.0)), "alibi_slopes must have shape"),
])
def test_problem_refuses_what_is_outside_the_protocol(bad, text):
    from flashcheck.reference.problem import Problem, ProblemError

    args = dict(B=2, Hq=4, Hkv=2, Nq=3, Nk=5, D=8)
    args.update({k: v for k, v in bad.items() if k in args})
    with pytest.raises(ProblemError, match=text):
        Problem.make(**args, **{k: v for k, v in bad.items() if k not in args})


def test_visible_range_over_windows_is_the_masked_min_and_max():
    from flashcheck.reference.problem import Problem

    pb = Problem.make(1, 2, 2, 7, 9, 4, window=(2, 1))
    v = _rand(1, 2, 9, 4, seed=5).double()
    lo, hi, sees = torch_ref.visible_range(v, pb)
    seen = pb.visible()
    for i in range(7):
        assert bool(sees[i]) == seen[i].any()
        if seen[i].any():
            np.testing.assert_array_equal(lo[:, :, i].numpy(), v.numpy()[:, :, seen[i]].min(2))
            np.testing.assert_array_equal(hi[:, :, i].numpy(), v.numpy()[:, :, seen[i]].max(2))
