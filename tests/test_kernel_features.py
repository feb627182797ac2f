"""The protocol-v3 optional features of the project's kernels (kernel/fused.py and kernel/unfused.py): GQA/MQA,
V's own head dim Dv, windows, softcap and ALiBi, alone and together, against the float64 reference with the
oracle's own per-element tolerance (both kernels keep their scores in fp32: half_scores=False).

Shapes are awkward on purpose (Nq != Nk both ways, partial blocks, several key blocks, windows crossing block edges
or leaving rows with no key, group sizes that are not squares, Dv below, above and not a power of two), and run
through the kernel's paths: pinned blocks (the interpreter takes blocks down to 4), non-contiguous layouts with
NaN in the gaps, a NaN-poisoned output (every element must be written), tensor descriptors (fp16 in aligned
layouts), split-KV decode, the split head dim of fp32 at D = 128 (also as tf32x3, which reads Q in the loop),
fp16's exact second pass for row maxes past 2^24. Interpreter time is about 2.5 ms per (query block, key block)
step, so the shapes stay small.
"""
import math
from dataclasses import dataclass

import pytest
import torch

from flashcheck.cases.oracle import compare, tolerance
from flashcheck.kernel import fused, unfused
from flashcheck.reference.problem import Problem

KERNELS = {"fused": fused.attention, "unfused": unfused.attention}
# fp32 also as tf32x3, whose split head dim reads Q again in every key block (Q_IN_LOOP)
FP32_KERNELS = dict(KERNELS, fused_tf32x3=fused.attention_tf32x3)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# the kernels compute -inf - -inf on purpose only in dead lanes; NumPy's warnings about them are noise here
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@dataclass(frozen=True)
class Spec:
    """One call: shapes, the features, the data's scale, block pins and the layout of q, k, v and out."""
    B: int = 1
    Hq: int = 2
    Hkv: int = 2
    Nq: int = 16
    Nk: int = 16
    D: int = 16
    Dv: int = None
    causal: bool = False
    scale: float = None
    window: tuple = None
    softcap: float = None
    alibi: str = None            # "h": slopes of shape (Hq,) (ALiBi's geometric ones); "bh": (B, Hq), random
    q_mult: float = 1.0          # q scaled up: scores far into the softcap's tanh region
    block_m: int = None
    block_n: int = None
    layout: str = "contiguous"   # contiguous, bthd, mixed (q bthd, k gapped, v d_major, out bthd)
    seed: int = 0

    @property
    def dv(self):
        return self.D if self.Dv is None else self.Dv


SPECS = {
    # --- GQA / MQA: group sizes that are not squares, B != Hq -------------------------------------------
    "gqa_6_2": Spec(B=2, Hq=6, Hkv=2, Nq=19, Nk=37, block_m=8, block_n=16),
    "gqa_8_2_causal_nq_gt_nk": Spec(B=3, Hq=8, Hkv=2, Nq=21, Nk=13, D=8, causal=True, block_m=8, block_n=4),
    "mqa": Spec(B=2, Hq=4, Hkv=1, Nq=13, Nk=29, D=24, block_m=16, block_n=8),
    # --- Dv != D ---------------------------------------------------------------------------------------
    "dv_lt_d": Spec(Nq=17, Nk=33, D=32, Dv=8, block_m=8, block_n=8),
    "dv_gt_d_not_pow2": Spec(B=2, Hkv=1, Nq=20, Nk=41, D=16, Dv=40, block_m=16, block_n=8),
    "dv_gt_d_causal": Spec(Hq=3, Hkv=1, Nq=9, Nk=23, D=24, Dv=72, causal=True, block_m=4, block_n=8),
    # --- windows -----------------------------------------------------------------------------------------
    "window_crossing_blocks": Spec(Hkv=1, Nq=33, Nk=47, window=(5, 3), block_m=8, block_n=8),
    "window_rows_without_keys": Spec(Nq=40, Nk=12, window=(2, 1), block_m=8, block_n=4),
    "window_wider_than_sequence": Spec(Nq=13, Nk=29, window=(100, 200), block_m=8, block_n=8),
    "window_0_0": Spec(Nq=20, Nk=33, window=(0, 0), block_m=8, block_n=4),
    "window_0_0_nq_gt_nk": Spec(Nq=30, Nk=18, window=(0, 0), block_m=8, block_n=8),
    "window_0_none": Spec(Nq=24, Nk=24, window=(0, None), block_m=8, block_n=4),
    "window_none_0": Spec(Nq=19, Nk=37, window=(None, 0), block_m=8, block_n=8),
    "window_left_many_key_blocks": Spec(Nq=20, Nk=61, window=(9, None), block_m=16, block_n=4),
    "window_right_only": Spec(Nq=26, Nk=21, window=(None, 4), block_m=4, block_n=8),
    "window_causal_overrides_right": Spec(Nq=22, Nk=30, window=(6, 9), causal=True, block_m=8, block_n=4),
    # a window alone keeps the fast path's max of the raw scores, which a negative scale turns into the min
    "window_negative_scale": Spec(Hkv=1, Nq=18, Nk=61, window=(10, 4), scale=-0.5, block_m=8, block_n=4),
    # row maxes past 2^24 (log2 units): fp16 runs its keys again in the exact pass, window edges and bias included
    "exact_second_pass_window_alibi": Spec(Nq=20, Nk=33, window=(6, 3), alibi="h", scale=1e7, block_m=8,
                                           block_n=8),
    "exact_second_pass_left_window": Spec(Nq=20, Nk=45, window=(12, None), scale=-3e6, block_m=8, block_n=4),
    # --- softcap -----------------------------------------------------------------------------------------
    # |scale q.k| ~ 100, far past 88 c: (e^2x - 1) / (e^2x + 1) would be inf / inf
    "softcap_tanh_region": Spec(Nq=17, Nk=27, softcap=0.5, q_mult=100.0, block_m=8, block_n=8),
    "softcap_negative_scale": Spec(Nq=17, Nk=40, softcap=3.0, scale=-2.0, block_m=16, block_n=8),
    "softcap_causal": Spec(Hkv=1, Nq=25, Nk=25, softcap=20.0, q_mult=8.0, causal=True, block_m=8, block_n=8),
    # --- ALiBi -------------------------------------------------------------------------------------------
    "alibi_heads": Spec(Hq=4, Nq=21, Nk=35, alibi="h", block_m=8, block_n=8),
    "alibi_batch_heads_causal": Spec(B=2, Nq=29, Nk=19, alibi="bh", causal=True, block_m=8, block_n=4),
    "alibi_gqa_nq_lt_nk": Spec(Hq=4, Hkv=2, Nq=11, Nk=45, alibi="h", block_m=4, block_n=16),
    "alibi_negative_scale": Spec(Nq=15, Nk=33, alibi="bh", scale=-0.7, block_m=8, block_n=8),
    # --- combinations ------------------------------------------------------------------------------------
    "all_features": Spec(B=2, Hq=6, Hkv=2, Nq=23, Nk=31, D=16, Dv=24, window=(7, 2), softcap=4.0, alibi="bh",
                         block_m=8, block_n=4),
    "all_features_causal": Spec(Hq=8, Hkv=2, Nq=30, Nk=22, D=16, Dv=8, window=(5, None), softcap=1.5, alibi="h",
                                q_mult=4.0, causal=True, block_m=8, block_n=8),
    "all_features_bthd": Spec(B=2, Hq=4, Hkv=2, Nq=18, Nk=27, D=16, Dv=32, window=(4, 6), softcap=2.0, alibi="h",
                              layout="bthd", block_m=8, block_n=8),
    "mixed_layout_dv_softcap": Spec(Hkv=1, Nq=14, Nk=26, D=20, Dv=12, softcap=1.0, q_mult=5.0, layout="mixed",
                                    block_m=8, block_n=8),
    "mixed_layout_window_alibi": Spec(B=2, Hq=2, Hkv=1, Nq=21, Nk=17, D=16, Dv=24, window=(3, 3), alibi="bh",
                                      layout="mixed", block_m=16, block_n=4),
    # --- the kernel's paths ------------------------------------------------------------------------------
    # default blocks (64 x 64 on the interpreter), one partial block each way
    "default_blocks_all_features": Spec(Hq=4, Hkv=2, Nq=70, Nk=75, Dv=24, window=(40, 10), softcap=5.0,
                                        alibi="h"),
    # split-KV decode (Nq <= 16, many keys, few programs: split_plan splits; the interpreter plays 4 SMs)
    "split_kv_decode": Spec(Hq=2, Hkv=1, Nq=3, Nk=300, Dv=24, window=(100, 5), alibi="h"),
    "split_kv_decode_causal_softcap": Spec(Hq=2, Hkv=2, Nq=5, Nk=290, D=24, Dv=16, window=(60, None),
                                           causal=True, softcap=2.0),
}
# fp32 at a padded head dim of 128 runs the head dim in two halves (D_SPLIT) when Dv == D; Dv != D runs it whole
FP32_SPECS = {
    "split_head_dim_features": Spec(Hq=4, Hkv=2, Nq=20, Nk=37, D=128, window=(9, 3), softcap=3.0, alibi="h",
                                    block_m=16, block_n=16),
    "split_head_dim_dv_differs": Spec(Hkv=1, Nq=20, Nk=29, D=128, Dv=64, window=(None, 2), block_m=16, block_n=8),
}


def _blocks(spec, backend):
    """The spec's block pins (tl.dot needs >= 16 on the GPU: smaller pins become 16 there)."""
    pins = (spec.block_m, spec.block_n)
    if backend == "gpu":
        pins = tuple(None if b is None else max(b, 16) for b in pins)
    return pins


def _lay_out(t, how, device):
    """t (B, H, N, X) on device with the same values in another memory layout (views; gaps hold NaN)."""
    if how == "contiguous":
        return t.to(device)
    if how == "bthd":
        return t.transpose(1, 2).contiguous().to(device).transpose(1, 2)
    if how == "d_major":
        return t.transpose(2, 3).contiguous().to(device).transpose(2, 3)
    if how == "gapped":
        buf = torch.full(t.shape[:-1] + (t.shape[-1] + 3,), float("nan"), dtype=t.dtype)
        buf[..., :t.shape[-1]] = t
        return buf.to(device)[..., :t.shape[-1]]
    raise ValueError(how)


_MIXED = {"q": "bthd", "k": "gapped", "v": "d_major", "out": "bthd"}


def _slopes(spec, device):
    if spec.alibi is None:
        return None
    if spec.alibi == "h":
        return torch.tensor([2.0 ** (-8.0 * (h + 1) / spec.Hq) for h in range(spec.Hq)], device=device)
    g = torch.Generator().manual_seed(spec.seed + 1)
    return (0.05 + 0.5 * torch.rand(spec.B, spec.Hq, generator=g)).to(device)


def make_call(spec, dtype, device):
    """(q, k, v, out, kwargs, problem): the inputs rounded to dtype in the spec's layouts, out poisoned with NaN."""
    g = torch.Generator().manual_seed(spec.seed)
    q = torch.randn(spec.B, spec.Hq, spec.Nq, spec.D, generator=g) * spec.q_mult
    k = torch.randn(spec.B, spec.Hkv, spec.Nk, spec.D, generator=g)
    v = torch.randn(spec.B, spec.Hkv, spec.Nk, spec.dv, generator=g)
    out = torch.full((spec.B, spec.Hq, spec.Nq, spec.dv), float("nan"))
    hows = _MIXED if spec.layout == "mixed" else dict.fromkeys(_MIXED, spec.layout)
    q, k, v, out = (_lay_out(t.to(dtype), hows[name], device) for name, t in zip(("q", "k", "v", "out"),
                                                                                 (q, k, v, out)))
    slopes = _slopes(spec, device)
    kwargs = dict(causal=spec.causal, scale=spec.scale, window=spec.window, softcap=spec.softcap,
                  alibi_slopes=slopes)
    pb = Problem.make(spec.B, spec.Hq, spec.Hkv, spec.Nq, spec.Nk, spec.D, spec.dv, causal=spec.causal,
                      scale=spec.scale, window=spec.window, softcap=spec.softcap,
                      alibi_slopes=None if slopes is None else slopes.cpu().numpy())
    return q, k, v, out, kwargs, pb


def check_against_reference(attention, spec, dtype, device, backend, label):
    """Run attention on the spec and hold out and lse to the oracle's tolerance; returns the expectation."""
    q, k, v, out, kwargs, pb = make_call(spec, dtype, device)
    block_m, block_n = _blocks(spec, backend)
    got, lse = attention(q, k, v, out=out, return_lse=True, block_m=block_m, block_n=block_n, **kwargs)
    assert got is out, f"{label}: out= was not the tensor returned"
    e = tolerance.expectation(dtype, q, k, v, problem=pb, half_scores=False)
    why = tolerance.discriminates(e)
    assert why is None, f"{label}: the case cannot judge the kernel ({why}); change its shape or data"
    fail, worst = compare(got.double().cpu().numpy(), e.out, e.tol)
    assert fail is None, f"{label}: out {fail.line()} (worst err/tol {worst[0]:.3g})"
    fail, worst = compare(lse.double().cpu().numpy()[..., None], e.lse[..., None], e.tol_lse[..., None])
    assert fail is None, f"{label}: lse {fail.line()} (worst err/tol {worst[0]:.3g})"
    return e


def _dtype_params(names):
    return [pytest.param(d, marks=[pytest.mark.gpu] if d == "bf16" else []) for d in names]


@pytest.mark.parametrize("dtype", _dtype_params(("fp32", "fp16", "bf16")))
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_feature_against_reference(kernel, name, dtype, device, backend):
    check_against_reference(KERNELS[kernel], SPECS[name], DTYPES[dtype], device, backend, f"{kernel} {name} {dtype}")


@pytest.mark.parametrize("name", sorted(FP32_SPECS))
@pytest.mark.parametrize("kernel", sorted(FP32_KERNELS))
def test_fp32_head_dim_128(kernel, name, device, backend):
    check_against_reference(FP32_KERNELS[kernel], FP32_SPECS[name], torch.float32, device, backend,
                            f"{kernel} {name}")


def test_fp32_head_dim_128_paths():
    """D_SPLIT runs with Dv == D only; another Dv takes the whole head dims (the same sums, unsplit)."""
    assert fused.head_dim_split(128, torch.float32, 128) and fused.head_dim_split(111, torch.float32)
    assert not fused.head_dim_split(128, torch.float32, 64)
    assert fused.launch_block_d(128, torch.float32, 64) == 128 and fused.launch_block_d(128, torch.float32) == 64


@pytest.mark.parametrize("name", ["split_kv_decode", "split_kv_decode_causal_softcap"])
def test_split_kv_decode_is_the_path_taken(name, device):
    """The decode specs run split-KV (several key splits and their combine), as split_plan decides for them."""
    spec = SPECS[name]
    bm, bn, _, _ = fused.default_blocks(spec.Nq, spec.Nk, max(spec.D, spec.dv), torch.float16)
    splits, _ = fused.split_plan(spec.B, spec.Hq, spec.Nq, spec.Nk, bm, bn, device)
    assert splits > 1, (name, splits)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_split_kv_combine_keeps_each_splits_l(dtype, backend, device):
    """Split-KV at scores of 6.7e7 (9.7e7 in the kernel's log2 units, where fp32's ulp is 8), the row max tied by
    three keys of the first split and one of the last: the answer is exactly the mean of their four value rows.
    A combine through each split's log-sum-exp m + log2(l) (flash-decoding's partial state) loses log2(3) to
    rounding there and weighs the two splits alike: (mean(v0, v1, v2) + v511) / 2 (0.70 off here before the
    kernel kept m and l apart). Every score is exact (one nonzero column of q, powers of two), so the tie is too."""
    if dtype == "bf16" and backend != "gpu":
        pytest.skip("GPU only: the interpreter reads bfloat16 wrongly")
    B, H, Nq, Nk, D = 1, 1, 1, 512, 16
    dt = DTYPES[dtype]
    bm, bn, _, _ = fused.default_blocks(Nq, Nk, D, dt)
    assert fused.split_plan(B, H, Nq, Nk, bm, bn, device)[0] > 1    # the split path, as the kernel plans it
    big, tied = 2.0 ** 14, (0, 1, 2, Nk - 1)
    q = torch.zeros(B, H, Nq, D)
    q[..., 0] = big
    k = torch.zeros(B, H, Nk, D)
    k[..., 0] = -big                  # every other key scores -6.7e7: its weight underflows to exactly 0
    k[:, :, list(tied), 0] = big
    v = torch.randn(B, H, Nk, D, generator=torch.Generator().manual_seed(0))
    q, k, v = (t.to(dt).to(device) for t in (q, k, v))
    out = fused.attention(q, k, v).double().cpu()
    want = v.double().cpu()[:, :, list(tied)].mean(2, keepdim=True)
    unit = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}[dtype]
    err = float((out - want).abs().max())
    assert err <= 4 * unit * float(want.abs().max()) + 1e-30, (dtype, err, out[0, 0, 0, :4], want[0, 0, 0, :4])


def test_descriptor_path_with_gqa_and_dv(backend):
    """fp16 K and V in aligned layouts load through tensor descriptors (the interpreter emulates them), each with
    its own head dim; V with 20 columns (40-byte rows) takes the pointer path."""
    if backend == "gpu" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need compute capability 9.0 (Hopper) or later")
    device = "cuda" if backend == "gpu" else "cpu"
    k = torch.zeros(2, 2, 37, 16, dtype=torch.float16, device=device)
    assert fused.tma_eligible(k) and fused.tma_eligible(torch.zeros(2, 2, 37, 24, dtype=torch.float16, device=device))
    assert not fused.tma_eligible(torch.zeros(2, 2, 37, 20, dtype=torch.float16, device=device))


# --- block skipping: key blocks outside every row's window of a program are never visited ------------------

SKIP_SPECS = {
    "window_left": Spec(Hq=1, Hkv=1, Nq=32, Nk=64, window=(4, 3), block_m=8, block_n=8),
    "window_right": Spec(Hq=1, Hkv=1, Nq=32, Nk=32, window=(2, 1), block_m=8, block_n=8),
    "window_causal": Spec(Hq=1, Hkv=1, Nq=24, Nk=40, window=(5, None), causal=True, block_m=8, block_n=4),
    "window_decode_split": Spec(Hq=2, Hkv=1, Nq=3, Nk=300, window=(40, 2)),
}


@pytest.mark.parametrize("where", ["left", "right"])
@pytest.mark.parametrize("name", sorted(SKIP_SPECS))
def test_fused_never_visits_key_blocks_outside_the_window(name, where, device, backend):
    """A NaN in K and V at one key poisons every row of a program that visits its key block (0 * NaN is NaN even
    where the mask zeroes the weight), so the rows of the programs for which that block lies outside every row's
    window must come out finite and right: the block was skipped. The NaN key is in the block just left of the
    last program's window, or just right of the first program's."""
    spec = SKIP_SPECS[name]
    block_m, block_n = _blocks(spec, backend)
    if block_m is None:
        block_m, block_n, _, _ = fused.default_blocks(spec.Nq, spec.Nk, spec.D, torch.float32)
    q, k, v, out, kwargs, pb = make_call(spec, torch.float32, device)
    seen = torch.as_tensor(pb.visible())                                    # (Nq, Nk)
    programs = [list(range(s, min(s + block_m, spec.Nq))) for s in range(0, spec.Nq, block_m)]
    seen_blocks = [set((torch.nonzero(seen[rows].any(0)).flatten() // block_n).tolist()) for rows in programs]
    if where == "left":
        key = min(seen_blocks[-1]) * block_n - 1
    else:
        key = (max(seen_blocks[0]) + 1) * block_n
    if not 0 <= key < spec.Nk:
        pytest.skip(f"the window of that program reaches the {where} end of the keys")
    judged = [i for rows, blocks in zip(programs, seen_blocks) if key // block_n not in blocks for i in rows]
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, key], v_bad[:, :, key] = float("nan"), float("nan")
    got = fused.attention(q, k_bad, v_bad, out=out, block_m=block_m, block_n=block_n, **kwargs)
    e = tolerance.expectation(torch.float32, q, k, v, problem=pb, half_scores=False)
    fail, _ = compare(got[:, :, judged].double().cpu().numpy(), e.out[:, :, judged], e.tol[:, :, judged])
    assert fail is None, f"{name}: key {key} (NaN) reached rows {judged[0]}..{judged[-1]}: {fail.line()}"


# --- bad input ---------------------------------------------------------------------------------------------

def _qkv(device, B=2, Hq=4, Hkv=2, Nq=5, Nk=7, D=8, Dv=None):
    return (torch.randn(B, Hq, Nq, D, device=device), torch.randn(B, Hkv, Nk, D, device=device),
            torch.randn(B, Hkv, Nk, D if Dv is None else Dv, device=device))


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("make, kwargs, error, words", [
    (lambda d: _qkv(d, Hq=6, Hkv=4), {}, ValueError, r"Hq = 6 .* Hkv = 4; Hq must be a multiple of Hkv"),
    (lambda d: _qkv(d, Hq=2, Hkv=4), {}, ValueError, "must be a multiple of Hkv"),
    (lambda d: (lambda q, k, v: (q, k, v[:, :1]))(*_qkv(d)), {}, ValueError,
     r"k and v must have the same shape \(B, Hkv, Nk\)"),
    (lambda d: (lambda q, k, v: (q, k, v[:, :, :3]))(*_qkv(d)), {}, ValueError, "same shape"),
    (lambda d: (lambda q, k, v: (q, k[..., :4], v))(*_qkv(d)), {}, ValueError,
     "head dim differs: q has D = 8, k has D = 4"),
    (lambda d: _qkv(d, Dv=257), {}, ValueError, "Dv = 257 is outside"),
    (lambda d: _qkv(d, Dv=12), {"out": "D"}, ValueError, r"out must match .* \(2, 4, 5, 12\)"),
    (lambda d: _qkv(d), {"window": 3}, TypeError, "window must be None or a pair"),
    (lambda d: _qkv(d), {"window": (1, 2, 3)}, TypeError, "window must be None or a pair"),
    (lambda d: _qkv(d), {"window": (-1, 2)}, ValueError, "left side must be >= 0"),
    (lambda d: _qkv(d), {"window": (0, -2)}, ValueError, "right side must be >= 0"),
    (lambda d: _qkv(d), {"window": (1.5, 2)}, TypeError, "left side must be None or an int"),
    (lambda d: _qkv(d), {"window": (True, 2)}, TypeError, "left side must be None or an int"),
    (lambda d: _qkv(d), {"softcap": 0.0}, ValueError, "softcap must be a finite number > 0"),
    (lambda d: _qkv(d), {"softcap": -1.0}, ValueError, "softcap must be a finite number > 0"),
    (lambda d: _qkv(d), {"softcap": math.inf}, ValueError, "softcap must be a finite number > 0"),
    (lambda d: _qkv(d), {"softcap": math.nan}, ValueError, "softcap must be a finite number > 0"),
    (lambda d: _qkv(d), {"softcap": "30"}, TypeError, "softcap must be None or a real number"),
    (lambda d: _qkv(d), {"alibi_slopes": [0.5] * 4}, TypeError, "alibi_slopes must be a torch.Tensor"),
    (lambda d: _qkv(d), {"alibi_slopes": ("shape", (2,))}, ValueError,
     r"alibi_slopes must have shape \(4,\) or \(2, 4\)"),
    (lambda d: _qkv(d), {"alibi_slopes": ("shape", (4, 2))}, ValueError,
     r"alibi_slopes must have shape \(4,\) or \(2, 4\)"),
    (lambda d: _qkv(d), {"alibi_slopes": ("shape", (1, 4))}, ValueError, r"alibi_slopes must have shape"),
    (lambda d: _qkv(d), {"alibi_slopes": ("dtype", torch.float64)}, TypeError, "alibi_slopes must be float32"),
    (lambda d: _qkv(d), {"alibi_slopes": ("dtype", torch.float16)}, TypeError, "alibi_slopes must be float32"),
    (lambda d: _qkv(d), {"alibi_slopes": ("device", "meta")}, ValueError, "alibi_slopes must be on q's device"),
], ids=["hq_not_multiple", "hkv_more_than_hq", "v_other_heads", "v_other_nk", "k_other_d", "dv_over_256",
        "out_with_d_not_dv", "window_not_pair", "window_triple", "window_left_negative", "window_right_negative",
        "window_float_side", "window_bool_side", "softcap_zero", "softcap_negative", "softcap_inf", "softcap_nan",
        "softcap_string", "slopes_list", "slopes_short", "slopes_transposed", "slopes_one_batch", "slopes_fp64",
        "slopes_fp16", "slopes_other_device"])
def test_bad_input_is_named(kernel, make, kwargs, error, words, device):
    q, k, v = make(device)
    kwargs = dict(kwargs)
    if kwargs.get("out") == "D":
        kwargs["out"] = torch.empty(q.shape, device=device)
    slopes = kwargs.get("alibi_slopes")
    if isinstance(slopes, tuple):
        what, arg = slopes
        kwargs["alibi_slopes"] = {"shape": lambda: torch.ones(arg, device=device),
                                  "dtype": lambda: torch.ones(q.shape[1], dtype=arg, device=device),
                                  "device": lambda: torch.ones(q.shape[1], device=arg)}[what]()
    with pytest.raises(error, match=words):
        KERNELS[kernel](q, k, v, **kwargs)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_legal_feature_inputs_are_accepted(kernel, device):
    """The edges of what is legal: MQA, window sides of None and 0, a (None, None) window (no window), numpy
    integers as sides, slopes as a (B, Hq) view with strides, Hq = 0 heads (an empty output)."""
    import numpy as np

    q, k, v = _qkv(device, Hkv=1, Dv=3)
    slopes = torch.rand(4, 2, device=device).t()     # (2, 4), not contiguous
    for window in [(None, None), (0, 0), (np.int64(2), None), [1, 1]]:
        out = KERNELS[kernel](q, k, v, window=window, softcap=1e-3, alibi_slopes=slopes)
        assert out.shape == (2, 4, 5, 3) and torch.isfinite(out).all()
    empty = KERNELS[kernel](q[:, :0], k[:, :0], v[:, :0], window=(1, 1))
    assert empty.shape == (2, 0, 5, 3)


# --- GPU: offsets past 2^31 elements ----------------------------------------------------------------------

@pytest.mark.gpu
def test_offsets_past_2_31_with_gqa_and_dv():
    """B*Hq*Nq*D past 2^31 elements: the batch and head offsets of Q, K, V, the output and the slopes in int64.
    Only the last batch is judged (the reference of the whole call would not fit)."""
    B, Hq, Hkv, Nq, Nk, D, Dv = 1025, 8, 2, 1024, 64, 256, 64          # q: 2.15e9 elements
    assert B * Hq * Nq * D > 2 ** 31
    torch.manual_seed(0)
    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.float16)
    k = torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.float16)
    v = torch.randn(B, Hkv, Nk, Dv, device="cuda", dtype=torch.float16)
    slopes = torch.rand(B, Hq, device="cuda")
    out = fused.attention(q, k, v, window=(20, 3), softcap=5.0, alibi_slopes=slopes)
    pb = Problem.make(1, Hq, Hkv, Nq, Nk, D, Dv, window=(20, 3), softcap=5.0,
                      alibi_slopes=slopes[-1:].cpu().numpy())
    e = tolerance.expectation(torch.float16, q[-1:], k[-1:], v[-1:], problem=pb, half_scores=False)
    fail, _ = compare(out[-1:].double().cpu().numpy(), e.out, e.tol)
    assert fail is None, fail.line()
