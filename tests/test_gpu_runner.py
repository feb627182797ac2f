"""The GPU runner: device faults stay contained, workers restart cleanly, memcheck sees out-of-bounds access."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, **env):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT, **env))


def test_device_fault_is_isolated_and_reported(tmp_path):
    """verify runs a kernel that faults the device: each case is reported as a device fault (the worker
    process is replaced after each fault), and this process's CUDA context is untouched."""
    report = tmp_path / "verify.json"
    proc = _run(["-m", "flashcheck", "verify", "tests/faulty_kernels.py:attention",
                 "--only", "hand_one_query_two_keys,partial_last_query_block", "--json", str(report)])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = json.loads(report.read_text())["cases"]
    # each entry in its three dtypes: every one a device fault, each in a fresh process
    assert [r["kind"] for r in results] == ["device fault"] * 6, results
    assert torch.ones(3, device="cuda").sum().item() == 3


def test_escaped_fault_restarts_the_worker():
    """A fault inside a pytest worker: that test fails, the worker exits, xdist starts a fresh one, and the
    next test passes."""
    proc = _run(["-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "tests/fault_demo"],
                FLASHCHECK_FAULT_DEMO="1")
    out = proc.stdout + proc.stderr
    failed = [ln for ln in out.splitlines() if ln.startswith("FAILED")]
    # the faulting test is reported twice: its own error, then the worker crash that follows it
    assert failed and all("test_a_faults_in_process" in ln for ln in failed), out[-3000:]
    assert " 1 passed" in out and "crashed while running" in out, out[-3000:]


@pytest.mark.sanitizer
def test_memcheck_clean_kernel_and_flagged_mutants():
    proc = _run(["-m", "flashcheck", "sanitize", "--mutant", "kv_mask_plus", "--mutant", "store_no_row_mask"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # each line: "SPEC: memcheck errors N, exit E, T s -> VERDICT"; the kernel clean, each mutant with errors
    lines = {m.group(1): (int(m.group(2)), m.group(3)) for m in
             re.finditer(r"^(\S+): memcheck errors (\d+), exit -?\d+, [\d.]+ s -> (\w+)", proc.stdout, re.M)}
    assert lines.get("flashcheck.kernel.fused:attention") == (0, "clean"), proc.stdout
    for mutant in ("kv_mask_plus", "store_no_row_mask"):
        errors, verdict = lines[f"mutant:{mutant}"]
        assert errors > 0 and verdict == "flagged", proc.stdout


def test_waits_for_the_gpu_sleep_instead_of_spinning():
    """A runner's child and this pytest process wait for the GPU asleep (cases/backend.py, sleep_while_waiting): a
    wait of about half a second costs them well under half its time of CPU, where CUDA's default spins for all of it
    (the suite's processes burnt the cores they shared so)."""
    from flashcheck.cases.runner.worker import Worker
    from tests.limited_kernels import waiting_cost

    cycles = 10 ** 9      # about 0.5 s at the H200's clock
    wall, cpu = waiting_cost(None, cycles)
    assert wall > 0.2 and cpu < wall / 2, (wall, cpu)
    worker = Worker(timeout=60)
    try:
        worker.open("tests/limited_kernels.py:slow_first_call")
        wall, cpu = worker.call("tests.limited_kernels:waiting_cost", cycles)
    finally:
        worker.close()
    assert wall > 0.2 and cpu < wall / 2, (wall, cpu)
