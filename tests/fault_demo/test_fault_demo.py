"""Run only by tests/test_gpu_runner.py (FLASHCHECK_FAULT_DEMO=1): a fault that escapes into a pytest worker."""
import torch

from tests.faulty_kernels import attention


def test_a_faults_in_process():
    q = torch.ones(1, 1, 1, 16, device="cuda")
    attention(q, q, q)


def test_b_runs_after_the_fault():
    assert torch.ones(4, device="cuda").sum().item() == 4
