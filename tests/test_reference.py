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
    lo, hi, last = torch_ref.prefix_range(v, nq, causal, align)
    for i in range(nq):
        keys = ref.seen[i]
        assert (last[i].item() >= 0) == keys.any()
        if keys.any():
            np.testing.assert_array_equal(lo[:, :, i].numpy(), v.numpy()[:, :, keys].min(2))
            np.testing.assert_array_equal(hi[:, :, i].numpy(), v.numpy()[:, :, keys].max(2))
