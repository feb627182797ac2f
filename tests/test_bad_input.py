"""Bad input gets a ValueError/TypeError that names the problem, from both kernels."""
import pytest
import torch

from flashcheck.kernel import fused, unfused


@pytest.fixture(params=["fused", "unfused"])
def attention(request):
    return {"fused": fused.attention, "unfused": unfused.attention}[request.param]


def _qkv(device, nq=4, nk=5, d=8, dtype=torch.float32, b=1, h=2):
    return (torch.randn(b, h, nq, d, device=device, dtype=dtype), torch.randn(b, h, nk, d, device=device, dtype=dtype),
            torch.randn(b, h, nk, d, device=device, dtype=dtype))


@pytest.mark.parametrize("mutate, error, words", [
    (lambda q, k, v: (q, k[..., :4], v[..., :4]), ValueError, "head dim"),
    # Hkv = 1 (MQA) and Hkv = 2 of 2 are legal; 3 query heads cannot share 2 kv heads
    (lambda q, k, v: (torch.cat([q, q[:, :1]], 1), k, v), ValueError, "batch/heads"),
    (lambda q, k, v: (torch.cat([q, q]), k, v), ValueError, "batch/heads"),
    (lambda q, k, v: (q, k, v[:, :, :3]), ValueError, "same shape"),
    (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0]), ValueError, "Nk = 0"),
    (lambda q, k, v: (q, k.half(), v.half()), TypeError, "one dtype"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "dtype"),
    (lambda q, k, v: (q.int(), k.int(), v.int()), TypeError, "dtype"),
    (lambda q, k, v: (q[0], k[0], v[0]), ValueError, "rank 4"),
    (lambda q, k, v: (q.numpy() if q.device.type == "cpu" else q.cpu().numpy(), k, v), TypeError, "torch.Tensor"),
])
def test_rejected(attention, device, mutate, error, words):
    with pytest.raises(error, match=words):
        attention(*mutate(*_qkv(device)))


def test_head_dim_over_256(attention, device):
    with pytest.raises(ValueError, match="head dim D = 257"):
        attention(*_qkv(device, d=257))


def test_wrong_device(attention, device):
    other = "meta"
    q, k, v = _qkv(device)
    with pytest.raises(ValueError, match="device"):
        attention(q.to(other), k.to(other), v.to(other))
    with pytest.raises(ValueError, match="one device"):
        attention(q, k.to(other), v)


@pytest.mark.parametrize("bad", [
    lambda q: torch.empty(q.shape[0], q.shape[1], q.shape[2] + 1, q.shape[3], device=q.device),
    lambda q: torch.empty_like(q, dtype=torch.float16),
    lambda q: torch.empty(q.shape, device="meta"),
])
def test_bad_out(attention, device, bad):
    q, k, v = _qkv(device)
    with pytest.raises(ValueError, match="out must match q"):
        attention(q, k, v, out=bad(q))


@pytest.mark.parametrize("kwargs, words", [
    ({"scale": float("nan")}, "scale"), ({"scale": "0.5"}, "scale"), ({"causal": 1}, "causal"),
    ({"block_m": 24}, "power of two"), ({"block_n": 0}, "power of two"),
])
def test_bad_arguments(attention, device, kwargs, words):
    with pytest.raises((ValueError, TypeError), match=words):
        attention(*_qkv(device), **kwargs)


def test_empty_queries_give_empty_output(attention, device):
    q, k, v = _qkv(device, nq=0)
    out, lse = attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and lse.shape == (1, 2, 0)


def test_unfused_refuses_rows_beyond_one_tile(device):
    q, k, v = _qkv(device, nq=1, nk=unfused.MAX_ROW + 1, d=1, h=1)
    with pytest.raises(NotImplementedError, match="one-tile row limit"):
        unfused.attention(q, k, v)


def test_nan_input_propagates(attention, device):
    q, k, v = _qkv(device)
    q[0, 1, 2, 3] = float("nan")
    out = attention(q, k, v)
    assert torch.isnan(out[0, 1, 2]).all()
    assert torch.isfinite(out[0, 0]).all() and torch.isfinite(out[0, 1, :2]).all()


@pytest.mark.parametrize("kwargs", [{"num_warps": 3}, {"num_warps": 0}, {"num_stages": 0}, {"num_stages": 1.5}])
def test_bad_launch_overrides(device, kwargs):
    with pytest.raises(ValueError, match="num_"):
        fused.attention(*_qkv(device), **kwargs)


def test_unknown_precision_is_named(device):
    from flashcheck.kernel import fused

    q, k, v = _qkv(device)
    with pytest.raises(ValueError, match="precision must be one of ieee, tf32x3, got 'tf32'"):
        fused.attention(q, k, v, precision="tf32")
