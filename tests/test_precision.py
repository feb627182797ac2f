"""fp32 precision on the GPU: dots with input_precision="ieee" pass the fp32 tolerance, tf32 dots fail it.

The tf32 variant is the bug corpus's mutant fp32_tf32_dot (the real kernel carries no precision switch).
On the CPU the interpreter computes every dot exactly, so only the GPU can judge this.
"""
import numpy as np
import pytest
import torch

from flashcheck.cases import catalogue, inputs, oracle

pytestmark = pytest.mark.gpu


def _relative_error(attention, case):
    q, k, v = inputs.values(case)
    expect = oracle.expectation(case, (q, k, v), "cuda")
    out = attention(q.cuda(), k.cuda(), v.cuda()).double().cpu().numpy()
    return float(np.abs(out - expect.out).max() / np.abs(expect.out).max()), expect.tol / np.abs(expect.out).max()


def test_ieee_passes_and_tf32_fails_the_fp32_tolerance(record_property):
    from flashcheck.cases.corpus import mutants
    from flashcheck.kernel import fused

    case = catalogue.get("fp32_precision")
    tf32 = mutants.load(mutants.get("fp32_tf32_dot"))
    ieee_err, rel_tol = _relative_error(fused.attention, case)
    tf32_err, _ = _relative_error(tf32.attention, case)
    print(f"\nfp32 relative error on {torch.cuda.get_device_name()}: ieee {ieee_err:.3g}, tf32 {tf32_err:.3g}, "
          f"tolerance {rel_tol:.3g} (relative to max|out|)")
    for name, value in (("ieee_relative_error", ieee_err), ("tf32_relative_error", tf32_err),
                        ("relative_tolerance", rel_tol)):
        record_property(name, f"{value:.3g}")   # lands in --junitxml, so GPU runs keep the figures
    assert ieee_err < rel_tol < tf32_err
    assert oracle.judge(fused.attention, case).passed
    assert oracle.judge(tf32.attention, case).kind == "mismatch"
