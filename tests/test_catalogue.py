"""Every catalogue case, in every dtype it is about, judged as verify judges (the oracle's layers, then the
properties), for the fused kernel and the unfused baseline."""
import pytest

from flashcheck.cases import catalogue
from flashcheck.cases.declarations import Declarations
from flashcheck.cases.generate import strategies as S
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
    # the properties on every case cost minutes in Triton's interpreter: on the CPU they run under the thorough
    # profile (tests/test_properties.py and the corpus's kills run them under every profile)
    properties = backend == "gpu" or S.current_profile() == "thorough"
    verdict = judge_case(attention, case, Settings(target=f"kernel.{kernel}:attention",
                                                   decl=Declarations.of(attention), properties=properties))
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
