"""verify on kernels with the limits real ones document (tests/limited_kernels.py): declared limits are
skipped, limits raised as NotImplementedError are "unsupported", out of memory is its own outcome, a
nondeterministic kernel fails only under --repeat, a top-left causal kernel is judged against a top-left
reference when it declares so; and the run's own machinery: --exclude, --max-failures, --json -, files
written as cases finish, usage errors in the user's terms."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.test_verify import ROOT, explain, row, verify

LIMITED = "tests/limited_kernels.py"
SOME = "partial_last_key_block,cross_nq_gt_nk,causal_nq_lt_nk,layout_bthd"


def _json(tmp_path, *args):
    path = tmp_path / "r.json"
    proc = verify(*args, "--json", str(path))
    return proc, json.loads(path.read_text())


def _by_name(report):
    return {c["name"]: c for c in report["cases"]}


def _count(report, status):
    return sum(c["status"] == status for c in report["cases"])


def _undeclared_and_declared(tmp_path, kernel, declaration, selection, unsupported_before):
    """The JSON reports of a limited kernel judged without and with the declaration of its limit: both exit 0; without
    it, at least unsupported_before cases are "unsupported" (the kernel declines them); with it, none."""
    undeclared, plain = _json(tmp_path, f"{LIMITED}:{kernel}", *selection)
    assert undeclared.returncode == 0, explain(undeclared)
    declared, judged = _json(tmp_path, f"{LIMITED}:{kernel}", *declaration, *selection)
    assert declared.returncode == 0, explain(declared)
    assert _count(plain, "unsupported") >= unsupported_before and _count(judged, "unsupported") == 0, \
        (plain["summary"], judged["summary"])
    return plain, judged


def test_same_length_kernel_declared_and_undeclared(tmp_path):
    """--same-length skips Nq != Nk up front; without it, the kernel's NotImplementedError is "unsupported":
    neither passed nor failed, and the run still exits 0."""
    declared, rep = _json(tmp_path, f"{LIMITED}:same_length_only", "--same-length", "--only", SOME + ",causal_square",
                          "--examples", "12")
    assert declared.returncode == 0, explain(declared)
    cases = _by_name(rep)
    assert cases["cross_nq_gt_nk[fp32]"]["status"] == "skip"
    assert "Nq = 48 != Nk = 20 (--same-length)" in cases["cross_nq_gt_nk[fp32]"]["reason"]
    generated = [c for c in rep["cases"] if c["origin"] == "hypothesis"]
    # none refused (unsupported) or failed: every generated case kept Nq == Nk (inconclusive: judged, too loose)
    assert generated and all(c["status"] in ("pass", "inconclusive") for c in generated), \
        "generated cases keep Nq == Nk"
    plain, rep = _json(tmp_path, f"{LIMITED}:same_length_only", "--only", SOME + ",causal_square")
    assert plain.returncode == 0, explain(plain)
    cases = _by_name(rep)
    assert cases["cross_nq_gt_nk[fp32]"]["status"] == "unsupported"
    assert "needs Nq == Nk" in cases["cross_nq_gt_nk[fp32]"]["note"]
    assert "unsupported" in rep["summary"]["line"] and rep["summary"]["unsupported"] >= 3
    assert row(plain.stdout, "cross_nq_gt_nk[fp32]")[1] == "UNSUPPORTED"


def test_fp16_only_kernel_passes_when_declared():
    proc = verify(f"{LIMITED}:fp16_only", "--dtypes", "fp16", "--examples", "50", "-q")
    assert proc.returncode == 0, explain(proc)
    assert "50 distinct example(s) judged, 50 without a failure" in proc.stdout
    undeclared = verify(f"{LIMITED}:fp16_only", "--only", "partial_last_key_block", "-q")
    assert undeclared.returncode == 1 and "TypeError: fp16 only" in undeclared.stdout, explain(undeclared)


def test_last_bit_race_needs_repeat():
    base = verify(f"{LIMITED}:last_bit_differs", "--only", SOME, "-q")
    assert base.returncode == 0, explain(base)
    repeated = verify(f"{LIMITED}:last_bit_differs", "--only", SOME, "--repeat", "3", "-q")
    assert repeated.returncode == 1, explain(repeated)
    assert "nondeterministic at (b=0, h=0, row=0, col=0)" in repeated.stdout
    assert "differs from call 1 in 1 output element(s)" in repeated.stdout


def test_top_left_causal_is_judged_against_a_top_left_reference():
    cases = "causal_nq_lt_nk,causal_nq_gt_nk,causal_square"
    wrong = verify(f"{LIMITED}:sdpa_is_causal", "--only", cases, "-q")
    assert wrong.returncode == 1 and "causal_nq_lt_nk[fp32]" in wrong.stdout, explain(wrong)
    right = verify(f"{LIMITED}:sdpa_is_causal", "--only", cases, "--causal-align", "top-left")
    assert right.returncode == 0, explain(right)
    assert row(right.stdout, "causal_nq_gt_nk[fp32]")[1] == "PASS"     # judged, not skipped


def test_a_hand_value_worked_out_bottom_right_is_not_held_against_a_declared_top_left_kernel():
    """window_hand_bottom_right's exact 3 and 6 are the protocol's alignment; a kernel declared top-left gives 1 and
    1.5 there, rightly, and is judged against the top-left reference alone (it failed on the hand value)."""
    cases = "window_hand_bottom_right,window_hand_4x4,window_with_causal"
    right = verify(f"{LIMITED}:top_left_window", "--only", cases, "--causal-align", "top-left", "--dtypes", "fp32")
    assert right.returncode == 0, explain(right)
    assert row(right.stdout, "window_hand_bottom_right[fp32]")[1] == "PASS"
    wrong = verify(f"{LIMITED}:top_left_window", "--only", cases, "--dtypes", "fp32", "-q")
    assert wrong.returncode == 1 and "window_hand_bottom_right[fp32]" in wrong.stdout, explain(wrong)


def test_signature_without_causal_is_an_undeclared_feature(tmp_path):
    proc, rep = _json(tmp_path, f"{LIMITED}:no_causal_keyword", "--only", "causal_square,partial_last_key_block")
    assert proc.returncode == 0, explain(proc)
    cases = _by_name(rep)
    assert cases["causal_square[fp32]"]["status"] == "skip"
    assert "the signature has no causal=" in cases["causal_square[fp32]"]["reason"]
    assert cases["partial_last_key_block[fp32]"]["status"] == "pass"
    assert "causal= no" in proc.stdout


def test_signature_without_scale_is_not_called_with_one(tmp_path):
    """A kernel without scale= skips the cases that set a scale, and the property that rescales Q and passes
    scale / 2 is not checked on it either (it raised TypeError: a false alarm on a correct kernel)."""
    proc, rep = _json(tmp_path, f"{LIMITED}:no_scale_keyword", "--only", "causal_square,negative_scale",
                      "--dtypes", "fp32")
    assert proc.returncode == 0, explain(proc)
    cases = _by_name(rep)
    assert cases["causal_square[fp32]"]["status"] == "pass", cases
    assert cases["negative_scale[fp32]"]["status"] == "skip", cases
    assert "the signature has no scale=" in cases["negative_scale[fp32]"]["reason"]


def test_exception_names_file_and_line():
    proc = verify(f"{LIMITED}:raises_inside", "--only", "one_query", "-q")
    assert proc.returncode == 1
    assert "ValueError: unexpected stride (raised at" in proc.stdout and "limited_kernels.py:" in proc.stdout, \
        explain(proc)


def test_out_of_memory_is_its_own_outcome(tmp_path):
    proc, rep = _json(tmp_path, f"{LIMITED}:out_of_memory_when_long", "--only",
                      "many_key_chunks,one_query,partial_last_key_block")
    assert proc.returncode == 0, explain(proc)     # out of memory does not fail the run by itself
    cases = _by_name(rep)
    oom = cases["many_key_chunks[fp32]"]
    assert oom["status"] == "out of memory" and "asked for 32.50 GiB" in oom["note"], oom
    assert cases["one_query[fp32]"]["status"] == "pass"
    assert rep["summary"]["out_of_memory"] == 3
    assert "warning: the kernel ran out of memory on 3 ordinary" in proc.stdout


def test_max_memory_skips_cases_too_large_for_it(tmp_path):
    proc, rep = _json(tmp_path, "--only", "fp16_many_key_blocks,one_query", "--max-memory", "0.001")
    assert proc.returncode == 0, explain(proc)
    cases = _by_name(rep)
    big = cases["fp16_many_key_blocks[fp16]"]
    assert big["status"] == "skip" and big["reason"].startswith("too large: needs about"), big
    assert "--max-memory is 0.0 GiB" in big["reason"] and cases["one_query[fp32]"]["status"] == "pass"


def test_exclude_and_max_failures():
    proc = verify("examples/buggy_attention.py:attention", "--only", SOME, "--exclude", "cross_nq_gt_nk",
                  "--max-failures", "1", "-q")
    assert proc.returncode == 1, explain(proc)
    assert "cross_nq_gt_nk" not in proc.stdout
    assert "stopped early: --max-failures 1 reached" in proc.stdout
    assert ": 0 passed, 1 failed" in proc.stdout


def test_json_dash_is_stdout():
    proc = verify("--only", "one_query", "--json", "-")
    assert proc.returncode == 0, explain(proc)
    report = json.loads(proc.stdout)
    # one_query in each dtype the backend judges: fp32 and fp16 on the CPU, bf16 too on a GPU
    judged = [c for c in report["cases"] if c["status"] != "skip"]
    assert report["summary"]["passed"] == len(judged) >= 2 and not report["partial"]
    assert "verify flashcheck.kernel.fused:attention" in proc.stderr   # the human report went to stderr


def test_killed_run_leaves_valid_partial_files(tmp_path):
    """JSON and JUnit are written as cases finish: a run killed half-way leaves valid files saying so."""
    path, xml = tmp_path / "r.json", tmp_path / "r.xml"
    proc = subprocess.Popen([sys.executable, "-m", "flashcheck", "verify", "--json", str(path), "--junit", str(xml),
                             "--examples", "0"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            if path.exists() and len(json.loads(path.read_text())["cases"]) >= 3:
                break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    report = json.loads(path.read_text())
    assert report["partial"] is True and len(report["cases"]) >= 3
    import xml.etree.ElementTree as ET

    props = {p.get("name"): p.get("value") for p in ET.parse(xml).getroot().iter("property")}
    assert props["partial"] == "true"


@pytest.mark.parametrize("args, words", [
    (["--backend", "gpu"], "torch sees no CUDA device"),
    (["--head-dims", "300"], "head dims 300 are outside"),
    (["--no-causal", "--causal-align", "top-left"], "--causal-align goes with a causal mode"),
    (["--seq-multiple", "0"], "--seq-multiple"),
    (["--repeat", "0"], "--repeat must be >= 1"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--jobs", "2", "--no-isolate"], "not with --no-isolate"),
    (["--jobs", "many"], "expected a number or 'auto'"),
    (["--sanitize"], "needs the GPU backend"),
    (["not_a_protocol_kernel.py:f"], "does not exist"),
], ids=["gpu_without_gpu", "head_dims_300", "align_without_causal", "seq_multiple_0", "repeat_0", "jobs_0",
        "jobs_in_process", "jobs_word", "sanitize_cpu",
        "missing"])
def test_more_usage_errors_exit_2(args, words, backend):
    if backend == "gpu" and args[:2] in (["--backend", "gpu"], ["--sanitize"]):
        pytest.skip("a GPU is present")
    if args[:2] == ["--backend", "gpu"]:
        proc = subprocess.run([sys.executable, "-m", "flashcheck", *args, "verify"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env=dict(os.environ, FLASHCHECK_BACKEND=""))
    else:
        proc = verify(*args)
    assert proc.returncode == 2, explain(proc)
    assert words in proc.stderr, explain(proc)


def test_a_bad_declared_value_is_a_usage_error_before_the_kernel_is_imported(tmp_path):
    """A declaration's bad value (--seq-multiple 0, --dtypes fp8) answers at once: no worker starts, so the kernel's
    module is never imported (on the H200 a worker's start costs seconds; the usage error used to wait for it)."""
    marker = tmp_path / "imported"
    (tmp_path / "k.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                   "def attention(q, k, v, *, causal=False, scale=None):\n    return q\n")
    for args, words in ((["--seq-multiple", "0"], "seq_multiple must be >= 1"), (["--dtypes", "fp8"], "fp8")):
        proc = verify(f"{tmp_path / 'k.py'}:attention", *args)
        assert proc.returncode == 2 and words in proc.stderr, explain(proc)
    assert not marker.exists(), "a worker imported the kernel before the usage error"


def test_signature_that_cannot_take_q_k_v_is_a_usage_error(tmp_path):
    (tmp_path / "two_args.py").write_text("def attention(q, k):\n    return q\n")
    proc = verify(f"{tmp_path / 'two_args.py'}:attention")
    assert proc.returncode == 2 and "cannot be called as attention(q, k, v)" in proc.stderr, explain(proc)


def test_user_folders_do_not_shadow_flashcheck(tmp_path):
    """A kernel repository with its own cases/, reference/ and kernel.py: flashcheck's worker imports only its
    own package."""
    for name in ("cases", "reference"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the user package was imported')\n")
    (tmp_path / "kernel.py").write_text("from flashcheck.kernel.fused import attention\n")
    from flashcheck.cases.runner.target import python_command

    argv = python_command("from flashcheck.cases.cli import main; "
                          "sys.exit(main(['verify', 'kernel:attention', '--only', 'one_query', '-q']))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, explain(proc)


@pytest.mark.gpu
@pytest.mark.parametrize("target, fused", [("flashcheck.kernel.fused:attention", True),
                                           ("flashcheck.kernel.unfused:attention", False)], ids=["fused", "unfused"])
def test_fused_declaration_checks_memory_complexity(tmp_path, target, fused):
    """--fused: the project's fused kernel passes the memory-complexity check; the seed's unfused baseline,
    which materialises the Nq x Nk scores by design, fails it with a "memory complexity" finding."""
    proc, rep = _json(tmp_path, target, "--fused", "--only", "one_query")
    probe = [c for c in rep["cases"] if c["origin"] == "--fused"]
    assert len(probe) == 1, rep["cases"]
    probe = probe[0]
    assert probe["peak_bytes"] is not None and probe["peak_bytes"] >= 0, probe
    if fused:
        assert proc.returncode == 0 and probe["status"] == "pass", explain(proc)
    else:
        assert proc.returncode == 1 and probe["status"] == "fail", explain(proc)
        assert probe["kind"] == "memory complexity", probe
        assert "materialises the Nq x Nk scores" in probe["failures"][0]["line"], probe


def test_relations_respect_the_declarations():
    """A relation's transformed input is judged only where the kernel's declarations admit it: duplication
    turns Nk = 45 into 90, past this kernel's declared --max-seq 48, where it returns zeros by design."""
    proc = verify(f"{LIMITED}:garbage_beyond_max_seq", "--only", "partial_last_key_block", "-q")
    assert proc.returncode == 0, explain(proc)
    assert "passed, 0 failed" in proc.stdout, explain(proc)


def test_compile_time_is_not_the_answer(tmp_path):
    """A kernel slower than --timeout on its first call with each new shape (compiling, autotuning) passes: those
    calls have the compile limit. With a compile limit below its first-call time it fails as a timeout that names
    the compile limit, never the per-call one."""
    from tests.limited_kernels import FIRST_CALL_SECONDS

    target = f"{LIMITED}:slow_first_call"
    ok, rep = _json(tmp_path, target, "--only", "one_query,causal_nq_gt_nk", "--dtypes", "fp32", "--timeout", "1")
    assert ok.returncode == 0 and rep["summary"]["passed"] == 2, explain(ok)
    short = str(FIRST_CALL_SECONDS / 2)
    cut, rep = _json(tmp_path, target, "--only", "one_query", "--dtypes", "fp32", "--timeout", "1",
                     "--compile-timeout", short)
    assert cut.returncode == 1, explain(cut)
    [case] = rep["cases"]
    assert case["kind"] == "timeout" and f"compile limit of {short} s" in case["failures"][0]["message"], case


def test_the_oracles_own_work_is_not_the_kernels_time():
    """Between the kernel's calls the oracle builds inputs and computes the float64 reference (and the worker's first
    touch of a GPU makes its CUDA context): that work is not cut at the kernel's --timeout (on an H200, verify
    --timeout 1 failed a correct kernel so before the floor)."""
    from flashcheck.cases.runner.worker import WORK_FLOOR, Worker

    worker = Worker(timeout=1)
    try:
        worker.open(f"{LIMITED}:slow_first_call")
        assert WORK_FLOOR > 3 and worker.call("tests.limited_kernels:oracle_work", 3) == "done"
    finally:
        worker.close()


def test_a_server_parked_by_one_test_serves_the_next(monkeypatch):
    """A run's server, parked when it closes, serves the next run of this process in the same environment, though
    pytest named another test in PYTEST_CURRENT_TEST meanwhile (with that variable in the adoption key, no test
    adopted what an earlier one parked: 73 servers of 3.1 s of CPU each in the H200 suite's workers); an environment
    that really differs gets a server of its own."""
    from flashcheck.cases.runner.worker import Worker

    def server(env=None):
        worker = Worker(timeout=60, env=env)
        try:
            worker.open(f"{LIMITED}:slow_first_call")
            return worker.proc.pid
        finally:
            worker.close()
    first = server()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/elsewhere.py::test_next (call)")
    assert server() == first
    assert server({"FLASHCHECK_PROBE_ENV": "1"}) != first


def test_a_value_head_dim_is_projected_with_the_head_dims(tmp_path):
    """--head-dims applies to v's head dim too: an entry about Dv < D or Dv > D is moved to a declared pair that keeps
    its side of D (named so), and skipped only when its point cannot survive (an odd Dv among powers of two). A
    kernel that sizes its output by D answers the probe in the wrong shape: that is the bug, judged, not a kernel
    without Dv (which raises, as Triton's tutorial asserts)."""
    args = ("--only", "dv_smaller,dv_half_descriptor,dv_larger_odd_causal", "--head-dims", "64,128", "--dtypes", "fp16",
            "--examples", "0")
    ok, rep = _json(tmp_path, "examples/plain_attention.py:matmul_softmax", *args)
    assert ok.returncode == 0, explain(ok)
    cases = _by_name(rep)
    assert cases["dv_smaller[fp16, D=128, Dv=64]"]["status"] == "pass", cases
    assert cases["dv_half_descriptor[fp16, D=64, Dv=128]"]["status"] == "pass", cases
    odd = cases["dv_larger_odd_causal[fp16]"]
    assert odd["status"] == "skip" and "a value head dim that is not a power of two" in odd["reason"], odd
    bad, rep = _json(tmp_path, f"{LIMITED}:output_sized_by_d", *args)
    assert bad.returncode == 1, explain(bad)
    case = _by_name(rep)["dv_smaller[fp16, D=128, Dv=64]"]
    assert case["kind"] == "bad return" and "(1, 2, 20, 64)" in case["failures"][0]["message"], case


def test_the_path_without_out_is_judged_too(tmp_path):
    """A kernel that takes out= is judged on the call without it as well: one that allocates float32 there fails as a
    bad return naming what it should have returned; with out= alone it would have passed."""
    proc, rep = _json(tmp_path, f"{LIMITED}:float32_without_out", "--only", "one_query", "--dtypes", "fp16")
    assert proc.returncode == 1, explain(proc)
    [case] = rep["cases"]
    message = case["failures"][0]["message"]
    assert case["kind"] == "bad return" and "without out=" in message and "torch.float16" in message, case


def test_an_fp16_accumulator_fails_the_large_accumulator_case(tmp_path):
    """A kernel whose running P.V sum is fp16 is right on ordinary rows (short ones, and 150 keys in ten blocks) and
    overflows in the large-accumulator case (thousands of alike keys, values far from 0)."""
    target = f"{LIMITED}:fp16_accumulator"
    ok, _ = _json(tmp_path, target, "--only", "one_query,many_key_chunks", "--dtypes", "fp16")
    assert ok.returncode == 0, explain(ok)
    bad, rep = _json(tmp_path, target, "--only", "large_accumulator[fp16]")
    assert bad.returncode == 1, explain(bad)
    [case] = rep["cases"]
    assert case["status"] == "fail" and case["kind"] in ("NaN", "mismatch"), case


def test_memory_that_runs_out_outside_the_kernel_call_is_not_a_failure(monkeypatch):
    """An out-of-memory anywhere in judging (the inputs, the reference, a gradient), not only in the kernel call,
    ends the case as "out of memory": nothing of the kernel was judged. It used to fail the case as an exception
    that escaped the oracle (H200, flash-attn-triton: offsets_over_2_31[bf16], whose worker still held the memory
    of the case before it). Any other exception that escapes still fails."""
    import torch

    from flashcheck.cases import catalogue
    from flashcheck.cases.verify import judging
    from flashcheck.kernel import fused

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.06 GiB.")

    def broken(*args, **kwargs):
        raise KeyError("a bug of ours")

    case = catalogue.get("one_key")
    settings = judging.Settings(target="fused")
    monkeypatch.setattr(judging, "_judge", out_of_memory)
    verdict = judging.judge_case(fused.attention, case, settings)
    assert (verdict.status, verdict.failures) == ("out of memory", []), verdict.report()
    assert "Tried to allocate 4.06 GiB" in verdict.note and not verdict.failed
    monkeypatch.setattr(judging, "_judge", broken)
    verdict = judging.judge_case(fused.attention, case, settings)
    assert verdict.failed and "escaped the oracle: KeyError" in verdict.failures[0].message


def test_a_cuda_error_reported_after_the_kernel_calls_is_a_device_fault_of_that_case(monkeypatch):
    """A kernel's illegal address surfaces at a later CUDA call (kernels run asynchronously): here, handing a large
    case's memory back to the device. It fails that case as a device fault, and nothing escapes judge_case (an H200,
    sageattention 1.0.6, offsets_over_2_31[bf16]: it escaped as an exception of the oracle's own). An exception that
    escaped a worker's judging and names a CUDA error is a device fault too."""
    import torch

    from flashcheck.cases import catalogue
    from flashcheck.cases.oracle import Kind
    from flashcheck.cases.runner.worker import Raised
    from flashcheck.cases.verify import engine, judging
    from flashcheck.kernel import fused

    text = "CUDA error: an illegal memory access was encountered"

    def illegal_address():
        raise getattr(torch, "AcceleratorError", RuntimeError)(text)

    case = catalogue.get("one_key")
    settings = judging.Settings(target="fused")
    passed = judging.judge_case(fused.attention, case, settings)
    assert not passed.failed, passed.report()
    monkeypatch.setattr(judging, "_judge", lambda *args, **kwargs: passed)
    monkeypatch.setattr(judging, "_device_bytes", lambda case: 2 * judging.RELEASE)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", illegal_address)
    verdict = judging.judge_case(fused.attention, case, settings)
    assert verdict.failed and verdict.kind == Kind.DEVICE_FAULT, verdict.report()
    assert "handing its memory back raised" in verdict.failures[0].message

    class Runner:
        timeout = None

        def call(self, *args, **kwargs):
            raise Raised(f'  File "judging.py", line 75, in judge_case\ntorch.AcceleratorError: {text}')
    assert engine.judge(Runner(), case, settings).kind == Kind.DEVICE_FAULT


def test_a_causal_only_kernel_is_declared_and_the_catalogue_judged_causal(tmp_path):
    """A decoder's prefill kernel masks causally on every call (tests/limited_kernels.py; vLLM's unified attention
    asserts causal). Undeclared, every non-causal entry is only "unsupported", and a default scale taken from the
    padded head dim, wrong at odd head dims only, goes unseen: only non-causal entries have those. Declared with
    --causal-only, the entries are judged causal (named so; a hand value kept where the mask hides no key a row saw)
    and the bug fails on them."""
    selection = ("-k", "head_dim_3,head_dim_59,hand_one_query_two_keys,causal_square", "--dtypes", "fp32",
                 "--examples", "3")
    plain, judged = _undeclared_and_declared(tmp_path, "causal_only", ("--causal-only",), selection, 3)
    names = _by_name(judged)
    assert {"head_dim_3[fp32, causal]", "hand_one_query_two_keys[fp32, causal]", "causal_square[fp32]"} <= set(names)
    assert all(names[n]["status"] == "pass" for n in names if n.startswith(("head_dim", "hand"))), names
    missed, _ = _json(tmp_path, f"{LIMITED}:causal_only_scale_from_padded_d", *selection)
    assert missed.returncode == 0, explain(missed)
    caught, report = _json(tmp_path, f"{LIMITED}:causal_only_scale_from_padded_d", "--causal-only", *selection)
    assert caught.returncode == 1, explain(caught)
    failed = {n for n, c in _by_name(report).items() if c["status"] == "fail"}
    assert "head_dim_3[fp32, causal]" in failed and "causal_square[fp32]" not in failed, failed
    usage = verify(f"{LIMITED}:causal_only", "--causal-only", "--no-causal")
    assert usage.returncode == 2 and "--causal-only and --no-causal" in usage.stderr, explain(usage)


def test_a_kernel_that_needs_as_many_keys_as_queries_has_the_entries_projected_onto_that(tmp_path):
    """A prefill kernel whose queries are the last tokens of their KV cache takes Nk >= Nq only. Undeclared, the
    entries with more queries than keys are "unsupported"; declared (--nk-ge-nq), those whose point survives are
    judged with the keys raised or the queries lowered (named so), and the others skipped with the point they need."""
    selection = ("-k", "partial_last_query_block,one_key,cross_nq_gt_nk,causal_nq_gt_nk,hand_one_query_two_keys",
                 "--dtypes", "fp32", "--examples", "4")
    plain, projected = _undeclared_and_declared(tmp_path, "keys_cover_queries", ("--nk-ge-nq",), selection, 3)
    names = _by_name(projected)
    assert any(n.startswith("partial_last_query_block[fp32, Nk=") and c["status"] == "pass" for n, c in names.items())
    assert names["one_key[fp32, Nq=1]"]["status"] == "pass", sorted(names)
    for entry, point in (("cross_nq_gt_nk[fp32]", "Nq > Nk"), ("causal_nq_gt_nk[fp32]", "causal rows that see no key")):
        assert names[entry]["status"] == "skip" and point in names[entry]["reason"], names[entry]


def test_made_causal_keeps_a_hand_value_only_where_the_mask_hides_nothing():
    from flashcheck.cases.catalogue import CATALOGUE
    from flashcheck.cases.projection import made_causal

    entry = {e.name: e for e in CATALOGUE}
    one = made_causal(entry["hand_one_query_two_keys"].instances(("fp32",))[0])     # one query sees both keys
    assert one.causal and one.expected == ((7.5,),) and one.name == "hand_one_query_two_keys[fp32, causal]"
    mean = made_causal(entry["equal_scores"].instances(("fp32",))[0])                # rows see prefixes: not the mean
    assert mean.causal and mean.expected is None and not mean.exact


def test_a_decode_kernels_query_limit_is_declared_and_the_catalogue_projected_onto_it(tmp_path):
    """A decode kernel takes a few queries against any number of keys (tests/limited_kernels.py: at most 8). Undeclared,
    every entry with more queries is only "unsupported"; declared with --max-seq-q 8, the entries are projected onto
    8 queries or fewer where their point survives (a square causal or windowed case keeps its diagonal offset), and
    judged. A chunk skip off by one at the window's left edge, which an independent decode kernel had and verify
    missed for want of both, then fails on window_left_edge_on_a_block_end."""
    selection = ("-k", "window,causal_square,empty", "--dtypes", "fp32", "--examples", "0")
    plain, projected = _undeclared_and_declared(tmp_path, "decode_only", ("--max-seq-q", "8"), selection, 4)
    assert _count(projected, "pass") > _count(plain, "pass"), (plain["summary"], projected["summary"])
    names = _by_name(projected)
    assert "window_left_edge_on_a_block_end[fp32]" in names and "empty_queries_causal[fp32]" in names
    assert any(n.startswith("window_wider_than_the_sequence[fp32, Nq=8") for n in names), sorted(names)
    buggy, report = _json(tmp_path, f"{LIMITED}:decode_window_chunk_skipped", "--max-seq-q", "8", *selection)
    assert buggy.returncode == 1, explain(buggy)
    failed = {n for n, c in _by_name(report).items() if c["status"] == "fail"}
    assert "window_left_edge_on_a_block_end[fp32]" in failed, failed
    usage = verify(f"{LIMITED}:decode_only", "--max-seq-q", "8", "--seq-multiple", "16")
    assert usage.returncode == 2 and "--seq-multiple 16 > --max-seq-q 8" in usage.stderr, explain(usage)
