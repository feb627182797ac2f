"""The Python API (flashcheck/api.py, docs/api.md): flashcheck.verify() returns a Report over the same engine as
`flashcheck verify`; flashcheck.assert_attention() passes silently, warns, or raises AssertionError with the
oracle's text, by the rule its docstring states; `import flashcheck` stays cheap (no torch)."""
import json
import math
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import flashcheck
import flashcheck.api

ROOT = Path(__file__).resolve().parents[1]
HAND = "hand_one_query_two_keys[fp32]"


def _attention(q, k, v, causal=False, scale=None):
    """Plain attention in float64: right, and fast on the CPU."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        sees = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        s = s.masked_fill(~sees, float("-inf"))
    return (torch.softmax(s, dim=-1).nan_to_num(0.0) @ v.double()).to(q.dtype)


def make_kernel():
    """A closure: no importable module:qualname, so the engine judges it in this process."""
    def attention(q, k, v, *, causal=False, scale=None):
        return _attention(q, k, v, causal, scale)
    return attention


def make_one_length_kernel():
    """The bug of examples/buggy_attention.py in plain PyTorch: one length, read off q, for queries and keys."""
    def attention(q, k, v, *, causal=False, scale=None):
        n = q.shape[-2]
        return _attention(q, k[..., :n, :], v[..., :n, :], causal, scale)
    return attention


def test_import_is_cheap_and_exports_are_lazy():
    code = ("import sys, flashcheck, flashcheck.plugin\n"
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'imported torch'\n"
            "names = ['verify', 'assert_attention', 'Report', 'UsageError', 'TargetError', 'declare', 'Unsupported',"
            " 'Case', 'Declarations', 'NotJudgedWarning', 'select_backend']\n"
            "assert set(names) <= set(dir(flashcheck)), dir(flashcheck)\n"
            "assert 'torch' not in sys.modules\n"
            "print(flashcheck.__version__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == flashcheck.__version__


def test_exports_are_the_engine_own_objects():
    from flashcheck.cases import case, declarations
    from flashcheck.cases.oracle import kinds
    from flashcheck.cases.runner import target
    from flashcheck.cases.verify import engine

    assert flashcheck.declare is declarations.declare
    assert flashcheck.Declarations is declarations.Declarations
    assert flashcheck.Unsupported is kinds.Unsupported
    assert flashcheck.Case is case.Case
    assert flashcheck.UsageError is engine.UsageError
    assert issubclass(flashcheck.TargetError, flashcheck.UsageError)
    assert issubclass(flashcheck.TargetError, target.TargetError)
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        flashcheck.nonesuch  # noqa: B018


def test_verify_a_closure_returns_a_report(tmp_path):
    report = flashcheck.verify(make_kernel(), only=[HAND, "partial_last_key_block"], dtypes="fp32,fp16")
    assert isinstance(report, flashcheck.Report)
    assert report.passed and report.exit_code == 0 and report.failures == []
    names = [r.case.name for r in report.results]
    assert names == [HAND, "partial_last_key_block[fp32]", "partial_last_key_block[fp16]"]
    assert all(r.status == "pass" for r in report.results)
    assert report.summary.startswith("verify ") and "3 passed, 0 failed" in report.summary
    text = str(report)
    assert text.startswith("capabilities: ") and "declared: --dtypes fp32,fp16" in text
    assert "case" in text and "verdict" in text and text.rstrip().endswith(report.summary)
    report.write_json(tmp_path / "r.json")
    report.write_junit(tmp_path / "r.xml")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["summary"]["passed"] == 3 and data["partial"] is False
    assert [tc.get("name") for tc in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")] == names
    import os

    assert os.environ["FLASHCHECK_BACKEND"] in ("cpu", "gpu")    # the API chose the backend before running


def test_verify_reports_a_failure_with_the_oracle_text():
    report = flashcheck.verify(make_one_length_kernel(), only=HAND)
    assert not report.passed and report.exit_code == 1
    (failure,) = report.failures
    assert failure.case.name == HAND and str(failure.verdict.kind) == "mismatch"
    text = str(report)
    assert "got 5, expected 7.5" in text
    assert "repro: flashcheck verify " in text and "--case \"Case('hand_one_query_two_keys[fp32]'" in text


def test_verify_an_importable_callable_in_a_worker_and_in_process():
    from flashcheck.kernel import fused

    isolated = flashcheck.verify(fused.attention, only=HAND)           # a worker process (isolate=True)
    here = flashcheck.verify(fused.attention, only=HAND, isolate=False)
    for report in (isolated, here):
        assert report.passed, str(report)
        assert report.target == "flashcheck.kernel.fused:attention"


def test_verify_a_string_target():
    report = flashcheck.verify(f"{ROOT}/examples/buggy_attention.py:attention", only=HAND, isolate=False)
    assert report.exit_code == 1 and "got 5, expected 7.5" in str(report)


@pytest.mark.parametrize("call, error, text", [
    (lambda: flashcheck.verify(make_kernel(), bogus=1), flashcheck.UsageError, "unknown option(s) bogus"),
    (lambda: flashcheck.verify(make_kernel(), dtypes="fp64"), flashcheck.UsageError, "fp32, fp16, bf16"),
    (lambda: flashcheck.verify(make_kernel(), only="no_such_case"), flashcheck.UsageError, "no catalogue case"),
    (lambda: flashcheck.verify("no_such_module_xyz:attention", isolate=False), flashcheck.TargetError, "cannot import"),
    (lambda: flashcheck.verify("not a target"), flashcheck.TargetError, "MODULE:FUNCTION"),
    (lambda: flashcheck.verify(42), flashcheck.UsageError, "callable"),
    (lambda: flashcheck.verify(lambda q: q, only=HAND), flashcheck.TargetError, "cannot be called as"),
    (lambda: flashcheck.assert_attention(make_kernel(), []), flashcheck.UsageError, "cases is empty"),
])
def test_bad_requests_raise_usage_errors(call, error, text):
    with pytest.raises(error) as raised:
        call()
    assert text in str(raised.value)
    assert isinstance(raised.value, flashcheck.UsageError)


def test_assert_attention_passes_silently():
    cases = [HAND, flashcheck.Case("tiny_cross", Nq=3, Nk=7, D=4, seed=5), "Case('tiny_self', Nq=5, Nk=5, D=8)"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = flashcheck.assert_attention(make_kernel(), cases)
    assert [r.case.name for r in report.results] == [HAND, "tiny_cross", "tiny_self"]
    assert report.count("pass") == 3


def test_assert_attention_raises_with_the_oracle_text():
    with pytest.raises(AssertionError) as raised:
        flashcheck.assert_attention(make_one_length_kernel(), [HAND, "Case('tiny_self', Nq=5, Nk=5, D=8)"])
    message = str(raised.value)
    first = message.splitlines()[0]
    assert first.startswith("Attention kernel ") and "1 of 2 selected case(s) did not pass (mismatch)" in first
    assert f"FAIL {HAND}" in message and "tiny_self" not in message.split("verify ")[0]
    assert "mismatch at (b=0, h=0, row=0, col=0): got 5, expected 7.5" in message
    assert "tol" in message and "guards against: " in message
    assert "repro: flashcheck verify " in message
    assert message.rstrip().splitlines()[-1].startswith("verify ")     # the summary line closes it


def test_a_skip_by_declaration_is_silent():
    kernel = flashcheck.declare(causal=False)(make_kernel())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert flashcheck.assert_attention(kernel, "causal_square") is None      # every case skipped: silent
        report = flashcheck.assert_attention(kernel, ["causal_square[fp32]", HAND])
    assert [(r.case.name, r.status) for r in report.results] == [(HAND, "pass"), ("causal_square[fp32]", "skip")]
    assert report.results[1].skip_group == "not declared"


def test_unsupported_inside_the_declarations_fails():
    def kernel(q, k, v, *, causal=False, scale=None):
        if q.shape[-1] > 8:
            raise flashcheck.Unsupported("head dims above 8")
        return _attention(q, k, v, causal, scale)

    with pytest.raises(AssertionError) as raised:
        flashcheck.assert_attention(kernel, ["head_dim_16[fp32]", HAND])
    message = str(raised.value)
    assert "UNSUPPORTED head_dim_16[fp32]" in message and "head dims above 8" in message
    assert "declare the limit" in message and "repro: " in message
    # declared, the same case is a silent skip
    flashcheck.assert_attention(flashcheck.declare(head_dims="1-8")(kernel), ["head_dim_16[fp32]", HAND])


def test_cases_not_judged_here_warn_and_strict_fails(backend):
    if backend == "gpu":
        pytest.skip("a GPU-only case is judged on the GPU")
    gpu_case = flashcheck.Case("gpu_case", Nq=4, Nk=4, D=4, gpu_only="only the GPU can judge this")
    with pytest.warns(flashcheck.NotJudgedWarning, match="gpu_case: GPU only: only the GPU can judge this"):
        report = flashcheck.assert_attention(make_kernel(), [gpu_case, HAND])
    assert report.count("pass") == 1
    with pytest.raises(AssertionError, match="NOT JUDGED gpu_case"):
        flashcheck.assert_attention(make_kernel(), [gpu_case, HAND], strict=True)
    with pytest.warns(flashcheck.NotJudgedWarning, match="gpu_case"):
        assert flashcheck.assert_attention(make_kernel(), gpu_case) is None   # nothing else selected


def test_assert_attention_runs_the_whole_catalogue_by_default():
    """With no cases named, every catalogue entry is judged: a kernel wrong only at the catalogue's largest head dim
    (its last entry by head dim) is caught, and the message names that case."""
    def wrong_at_d256(q, k, v, *, causal=False, scale=None):
        out = _attention(q, k, v, causal, scale)
        return out + 0.1 if q.shape[-1] == 256 else out

    with pytest.raises(AssertionError, match=r"head_dim_256\[fp32\]") as raised:
        flashcheck.assert_attention(wrong_at_d256, dtypes="fp32")
    failed = [ln for ln in str(raised.value).splitlines() if ln.startswith("FAIL ")]
    assert failed and all("head_dim_256" in ln for ln in failed), str(raised.value)[-2000:]


def test_report_text_is_what_the_command_prints():
    target = f"{ROOT}/examples/sdpa_attention.py:attention"
    report = flashcheck.verify(target, only=HAND, isolate=False)
    proc = subprocess.run([sys.executable, "-m", "flashcheck", "verify", target, "--only", HAND, "--no-isolate"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == report.exit_code == 0, proc.stderr

    def without_times(text):
        return [line.split(" in ")[0] if line.startswith("verify ") else line for line in text.splitlines()]

    assert without_times(str(report)) == without_times(proc.stdout.rstrip("\n"))
