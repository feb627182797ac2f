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


def _packed(device, lens_q=(3, 0, 5), lens_k=(4, 2, 6), d=8, h=2):
    cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=device)
          for n in (lens_q, lens_k)]
    q = torch.randn(sum(lens_q), h, d, device=device)
    return q, torch.randn(sum(lens_k), h, d, device=device), torch.randn(sum(lens_k), h, d, device=device), *cu


def _ints(device, *xs):
    return torch.tensor(xs, dtype=torch.int32, device=device)


@pytest.mark.parametrize("change, error, words", [
    (lambda d: {"cu_seqlens_q": _ints(d, 1, 4, 4, 8)}, ValueError, "cu_seqlens_q must start at 0"),
    (lambda d: {"cu_seqlens_k": _ints(d, 0, 4, 3, 12)}, ValueError, "cu_seqlens_k must be non-decreasing"),
    (lambda d: {"cu_seqlens_q": _ints(d, 0, 3, 3, 7)}, ValueError, "last entry must be the packed row count 8"),
    (lambda d: {"cu_seqlens_q": _ints(d, 0, 3, 8)}, ValueError, "one length"),
    (lambda d: {"cu_seqlens_q": _ints(d, 0, 3, 3, 8).long()}, TypeError, "int32"),
    (lambda d: {"cu_seqlens_q": _ints(d, 0, 3, 3, 8).to("meta")}, ValueError, "device"),
    (lambda d: {"cu_seqlens_q": [0, 3, 3, 8]}, TypeError, "torch.Tensor"),
    (lambda d: {"max_seqlen_q": 4}, ValueError, "max_seqlen_q = 4 is smaller than sequence 2's length 5"),
    (lambda d: {"max_seqlen_k": 2.5}, TypeError, "max_seqlen_k"),
])
def test_varlen_offsets_rejected(device, change, error, words):
    """attention_varlen's offsets and bounds are checked before any launch: a wrong one is named, never a silent
    truncation or a read of another sequence's rows."""
    q, k, v, cq, ck = _packed(device)
    args = {"cu_seqlens_q": cq, "cu_seqlens_k": ck, **change(device)}
    with pytest.raises(error, match=words):
        fused.attention_varlen(q, k, v, args.pop("cu_seqlens_q"), args.pop("cu_seqlens_k"), **args)


def test_varlen_rank_and_empty_keys(device):
    q, k, v, cq, ck = _packed(device)
    with pytest.raises(ValueError, match="rank 3"):
        fused.attention_varlen(q[None], k, v, cq, ck)
    # every key sequence empty is legal: each row sees no key, so 0 and lse -inf
    out, lse = fused.attention_varlen(q, k[:0], v[:0], cq, _ints(device, 0, 0, 0, 0), return_lse=True)
    assert out.shape == (8, 2, 8) and not out.any() and bool((lse == float("-inf")).all())


def _paged(device, lens=(5, 0, 9), page=4, pages=8, d=8, h=2):
    q = torch.randn(len(lens), h, 2, d, device=device)
    kc, vc = (torch.randn(pages, page, h, d, device=device) for _ in range(2))
    table = torch.arange(len(lens) * 3, dtype=torch.int32, device=device).reshape(len(lens), 3) % pages
    return q, kc, vc, table, torch.tensor(lens, dtype=torch.int32, device=device)


@pytest.mark.parametrize("change, error, words", [
    (lambda a: {"cache_seqlens": _ints(a[0].device, 5, 0, 13)}, ValueError, r"cache_seqlens\[2\] = 13 is outside 0..12"),
    (lambda a: {"cache_seqlens": _ints(a[0].device, 5, -1, 9)}, ValueError, "outside 0..12"),
    (lambda a: {"block_table": a[3].clone().fill_(8)}, ValueError, r"block_table\[0, 0\] = 8 is outside the pool of 8"),
    (lambda a: {"block_table": a[3].long()}, TypeError, "block_table must be int32"),
    (lambda a: {"block_table": a[3][:2]}, ValueError, "block_table must have shape"),
    (lambda a: {"cache_seqlens": a[4].to("meta")}, ValueError, "device"),
    (lambda a: {"k_cache": a[1][0]}, ValueError, "rank 4"),
    (lambda a: {"v_cache": a[2][:, :3]}, ValueError, "same"),
])
def test_paged_table_and_lengths_rejected(device, change, error, words):
    """attention_paged checks its block table and lengths before any launch: a length past the table's capacity or
    a used page outside the pool is named, never read."""
    q, kc, vc, table, lens = args = _paged(device)
    kw = {"k_cache": kc, "v_cache": vc, "block_table": table, "cache_seqlens": lens, **change(args)}
    with pytest.raises(error, match=words):
        fused.attention_paged(q, kw.pop("k_cache"), kw.pop("v_cache"), kw.pop("block_table"), kw.pop("cache_seqlens"))


def test_paged_unused_table_entries_are_never_read(device):
    """Entries past a sequence's pages may hold anything (here, pages far outside the pool)."""
    q, kc, vc, table, lens = _paged(device)
    table[0, 2:] = 10 ** 6
    table[1, :] = -7          # an empty sequence uses no page
    out, lse = fused.attention_paged(q, kc, vc, table, lens, return_lse=True)
    assert torch.isfinite(out).all() and not out[1].any() and bool((lse[1] == float("-inf")).all())
