"""Every catalogue case, in every dtype it is about, judged as verify judges (the oracle's layers, then the
properties), for the fused kernel and the unfused baseline."""
import pytest

from flashcheck.cases import catalogue
from flashcheck.cases.declarations import Declarations
from flashcheck.cases.verify.engine import TRITON_BF16
from flashcheck.cases.verify.judging import Settings, judge_case
from flashcheck.kernel import fused, unfused

KERNELS = {"fused": fused.attention, "unfused": unfused.attention}


def _param(case):
    marks = [pytest.mark.gpu] if case.gpu_only or case.dtype == "bf16" else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("case", [_param(c) for c in catalogue.instances()])
def test_case(kernel, case, backend):
    if backend != "gpu" and (case.gpu_only or case.dtype == "bf16"):
        pytest.skip(case.gpu_only or TRITON_BF16)
    attention = KERNELS[kernel]
    verdict = judge_case(attention, case, Settings(target=f"kernel.{kernel}:attention",
                                                   decl=Declarations.of(attention)))
    if kernel == "unfused" and case.Nk > unfused.MAX_ROW:
        # the baseline's documented limit (one register tile per row of scores): declined, never judged
        assert verdict.status == "unsupported" and "row limit" in (verdict.note or ""), verdict.report()
        pytest.skip(f"Nk = {case.Nk}: past the unfused baseline's row of {unfused.MAX_ROW} keys (declined)")
    assert verdict.passed, verdict.report()


def test_hand_value_is_exactly_7_5(device):
    """The seed's cross-attention bug report: 1 query vs keys [1, 1] and values [5, 10] must give 7.5."""
    import torch

    q = torch.ones(1, 1, 1, 1, device=device)
    k = torch.ones(1, 1, 2, 1, device=device)
    v = torch.tensor([5.0, 10.0], device=device).view(1, 1, 2, 1)
    for attention in KERNELS.values():
        assert attention(q, k, v).item() == 7.5


@pytest.mark.gpu
def test_fused_kernel_many_batch_heads():
    """B*H = 65,537 (a decode batch of 1,024 sequences of 64 heads is 65,536): past CUDA's cap of 65,535 on grid
    axes 1 and 2, where the fused kernel used to put B*H, so the launch failed. The unfused baseline refuses it
    as unsupported. Not a catalogue case: most published Triton kernels use that grid, and it needs the GPU."""
    from flashcheck.cases.case import Case

    case = Case("many_batch_heads", B=65537, H=1, Nq=5, Nk=21, D=16, dtype="fp16", causal=True, seed=3)
    verdict = judge_case(fused.attention, case, Settings(target="kernel.fused:attention",
                                                         decl=Declarations.of(fused.attention), properties=False))
    assert verdict.passed, verdict.report()


def test_unfused_baseline_refuses_more_batch_heads_than_its_grid_holds(device):
    import torch

    q = torch.zeros(65536, 1, 1, 16, device=device)
    with pytest.raises(NotImplementedError, match="grid limit of 65535"):
        unfused.attention(q, q, q)


def test_descriptor_path_is_taken_exactly_where_the_layout_allows(backend):
    """K and V load through tensor descriptors in fp16/bf16 when D has unit stride and every other stride and the
    base are multiples of 16 bytes (the layouts of the half_descriptor_* cases); otherwise the pointer path (the
    gapped and D-major layouts, an odd base, fp32). On the CPU the interpreter emulates descriptors, so the
    descriptor mutants are judged there; the rule is what decides which path the corpus exercises."""
    import torch

    from flashcheck.cases import inputs
    if backend == "gpu" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need compute capability 9.0 (Hopper) or later")

    def kv(case_name):   # K as the case lays it out, in its guarded buffer
        return inputs.make_inputs(catalogue.get(case_name), "cuda" if backend == "gpu" else "cpu").k.t

    assert fused.tma_eligible(kv("half_descriptor_layout[fp16]"))          # D = 24: 48-byte rows
    assert fused.tma_eligible(kv("layout_bthd[fp16]"))                     # heads and rows swap strides
    assert not fused.tma_eligible(kv("half_unaligned_rows[fp16]"))         # 38-byte rows
    assert not fused.tma_eligible(kv("layout_d_major[fp16]"))              # unit stride along N
    assert not fused.tma_eligible(kv("layout_bthd[fp32]"))                 # fp32 keeps the pointer path
    k = kv("half_descriptor_layout[fp16]")
    buf = torch.zeros(k.numel() + 8, dtype=k.dtype, device=k.device)
    assert fused.tma_eligible(buf[8:].view(k.shape))                   # a base 16 bytes in
    assert not fused.tma_eligible(buf[1:1 + k.numel()].view(k.shape))   # a base 2 bytes off


def test_a_pinned_tile_too_deep_for_shared_memory_runs_with_fewer_stages(monkeypatch, device):
    """The compiled kernel raises OutOfResources when a tile's pipeline needs more shared memory than the GPU has
    (on an H200: a pinned 64 x 128 tile at D = 128 with the 4-stage decode default). The launch then retries with
    fewer stages and remembers the depth that fitted; a depth the caller gave is never changed. Here a stand-in
    launcher plays the GPU's limit (at most 2 stages), so the rule runs on either backend."""
    import torch
    from triton.runtime.errors import OutOfResources

    tried = []

    class Launcher:
        def __getitem__(self, grid):
            def launch(*args, num_stages, **kwargs):
                tried.append(num_stages)
                if num_stages > 2:
                    raise OutOfResources(196608 * num_stages, 232448, "shared memory")
            return launch

    monkeypatch.setattr(fused, "_attn_fwd", Launcher())
    monkeypatch.setattr(fused, "_STAGES_THAT_FIT", {})
    monkeypatch.setattr(fused, "default_blocks", lambda *a, **kw: (64, 64, 4, 4))   # a 4-stage default
    q = torch.zeros(1, 1, 40, 64, device=device)
    fused.attention(q, q, q, block_m=64, num_warps=4)
    assert tried == [4, 3, 2], tried
    tried.clear()
    fused.attention(q, q, q, block_m=64, num_warps=4)              # remembered: one launch, at 2 stages
    assert tried == [2], tried
    tried.clear()
    with pytest.raises(OutOfResources):
        fused.attention(q, q, q, block_m=64, num_warps=4, num_stages=3)   # the caller's depth is kept
    assert tried == [3], tried


def test_catalogue_covers_the_issue_checklist():
    """The cases the foundation issue requires are all present (a deleted case fails here)."""
    by = {c.name: c for c in catalogue.instances()}
    dims = {c.D for c in catalogue.CATALOGUE}
    assert {1, 2, 3, 16, 17, 59, 64, 111, 128, 256} <= dims
    assert any(c.Nq > c.Nk for c in by.values()) and any(c.Nq < c.Nk for c in by.values())
    assert any(c.block_m and c.block_n and c.block_m > c.block_n for c in by.values())
    assert any(c.block_m and c.block_n and c.block_m < c.block_n for c in by.values())
    assert any(c.block_n and c.Nk / c.block_n >= 8 for c in by.values())
    assert {"fp32", "fp16", "bf16"} <= {c.dtype for c in by.values()}
    assert {"bthd", "gapped", "mixed"} <= {c.layout for c in by.values()}
    causal = [c for c in by.values() if c.causal]
    assert {c.Nq == c.Nk for c in causal} == {True, False}
    assert any(c.Nq > c.Nk for c in causal) and any(c.Nq < c.Nk for c in causal)
    assert any(c.B > 1 and c.H > 1 and c.B != c.H for c in by.values())
    assert {"large", "very_negative", "equal_scores"} <= {c.data for c in by.values()}
    for c in catalogue.CATALOGUE:
        assert c.why, f"case {c.name} must say which bug it guards against"


@pytest.mark.parametrize("dtypes", [("fp16",), ("fp16", "bf16")], ids=["fp16", "fp16,bf16"])
def test_half_precision_kernels_get_nine_tenths_of_the_catalogue(dtypes):
    """Most real kernels are half precision only: at least 90 % of the catalogue's entries must have an
    instance in their dtypes (the dtype is the point only of the fp32 precision cases)."""
    from flashcheck.cases.catalogue import CATALOGUE

    applicable = [e.name for e in CATALOGUE if e.instances(dtypes)]
    assert len(applicable) >= 0.9 * len(CATALOGUE), sorted({e.name for e in CATALOGUE} - set(applicable))
