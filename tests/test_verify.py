"""`flashcheck verify` end to end, through its command line (`python -m flashcheck verify` in a subprocess where the
process is the point, its main() in this process elsewhere: verify() below): exit codes, the two examples, one
named failure per way a kernel can misbehave, the JSON and JUnit reports, and cases skipped by declaration listed
as skipped with their reason."""
import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from flashcheck.cases.case import parse_case
from tests.misbehaving_kernels import MISBEHAVIOURS

ROOT = Path(__file__).resolve().parents[1]
BUGGY = "examples/buggy_attention.py:attention"
SDPA = "examples/sdpa_attention.py:attention"
CHAOS = "tests/misbehaving_kernels.py:attention"
BUGGY_SELECTION = ("--only", "hand_one_query_two_keys,cross_nq_gt_nk,causal_square", "--examples", "10")
HANG_TIMEOUT = 4   # seconds: the hanging kernel sleeps an hour; every well-behaved case here takes ~10 ms


def verify(*args, process=False):
    """`flashcheck verify ARGS` from the repository root, on the backend conftest chose, as a CompletedProcess.
    process=True: `python -m flashcheck verify ARGS` in a subprocess, as a user types it (the buggy fixture and the
    fused selection below: the exit status, the table and the summary line as a shell sees them). Otherwise in this
    process: the command line's own main(ARGS), its stdout and stderr captured and its exit status returned, while
    the kernel still runs in verify's worker processes. A subprocess cost each call a fresh interpreter importing
    torch and Triton and servers of its own (H200 suite: 77 of them, 2.5 s of CPU each, and their 71 servers, 3.1 s
    each); here the servers are those this pytest worker parked (cases/runner/worker.py)."""
    if process:
        return subprocess.run([sys.executable, "-m", "flashcheck", "verify", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
    return main_in_process("verify", *args)


def main_in_process(*argv):
    """`flashcheck ARGV` run by cases/cli.py's main() in this process, from the repository root: a CompletedProcess
    with its exit status (argparse's SystemExit included) and what it wrote to stdout and stderr. --backend sets
    FLASHCHECK_BACKEND as it would in a process of its own: restored afterwards."""
    import contextlib
    import io

    from flashcheck.cases import cli

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    backend = os.environ.get("FLASHCHECK_BACKEND")
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(argv))
            except SystemExit as exc:     # argparse's usage errors and --help
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        os.chdir(here)
        if backend is None:
            os.environ.pop("FLASHCHECK_BACKEND", None)
        else:
            os.environ["FLASHCHECK_BACKEND"] = backend
    return subprocess.CompletedProcess(["flashcheck", *argv], code, out.getvalue(), err.getvalue())


def once(request, name, produce):
    """produce() (JSON data) once per session. Under pytest-xdist every worker would run a module fixture
    of its own; here the first worker runs it under a file lock in the session's shared temp directory and
    the others read its result."""
    worker = getattr(request.config, "workerinput", None)
    if worker is None:
        return produce()
    shared = request.getfixturevalue("tmp_path_factory").getbasetemp().parent
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / f"{name}.json"
        if not done.exists():
            done.write_text(json.dumps(produce()))
        return json.loads(done.read_text())


def verify_with_reports(tmp_path, *args):
    """verify ARGS --json --junit: (returncode, stdout, stderr, the JSON report, the JUnit XML text)."""
    proc = verify(*args, "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"))
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "report": json.loads((tmp_path / "r.json").read_text()), "junit": (tmp_path / "r.xml").read_text()}


def explain(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def row(stdout, name):
    """The table row of a case, split into its columns (its last column joined from its continuation lines), without
    the "peak extra" column (GPU runs only)."""
    lines = stdout.splitlines()
    head = next((re.split(r"\s{2,}", ln.strip()) for ln in lines if ln.startswith("case ")), [])
    for n, line in enumerate(lines):
        if line.startswith(name + " "):
            cols = re.split(r"\s{2,}", line.strip())
            for more in lines[n + 1:]:
                if not more.startswith(" ") or not more.strip():
                    break
                cols[-1] += " " + more.strip()
            if "peak extra" in head and len(cols) == len(head):
                del cols[head.index("peak extra")]
            return cols
    raise AssertionError(f"no table row for {name}:\n{stdout}")


def test_fused_kernel_passes_a_selection(backend):
    """No target: the project's fused kernel; each entry in every dtype (bf16 of a Triton kernel: GPU only)."""
    cases = "hand_one_query_two_keys,partial_last_key_block,causal_nq_gt_nk,layout_mixed"
    proc = verify("--only", cases, "-q", process=True)
    assert proc.returncode == 0, explain(proc)
    counts = "12 passed, 0 failed, 0 skipped" if backend == "gpu" else "8 passed, 0 failed, 4 skipped \\(4 GPU only\\)"
    assert re.fullmatch(rf"verify flashcheck\.kernel\.fused:attention on .*: {counts}, 0 reduced; 4 of 4 catalogue "
                        r"entries judged in [\d.]+ s(; compile cache .*)?", proc.stdout.strip()), \
        "--quiet: only the summary line\n" + explain(proc)
    # on the GPU the summary says where the workers' compile cache is (the interpreter compiles nothing)
    assert ("; compile cache " in proc.stdout) == (backend == "gpu"), explain(proc)


@pytest.fixture(scope="module")
def buggy(request):
    def produce():
        with tempfile.TemporaryDirectory() as where:
            report = Path(where) / "r.json"
            proc = verify(BUGGY, *BUGGY_SELECTION, "--json", str(report), process=True)
            return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                    "report": json.loads(report.read_text()) if report.exists() else None}
    return SimpleNamespace(**once(request, "buggy", produce))


def test_buggy_example_is_rejected_naming_case_and_element(buggy):
    assert buggy.returncode == 1, explain(buggy)
    out = buggy.stdout
    for dtype in ("fp32", "fp16"):      # 7.5 is exact in both
        verdict, _, kind, element = row(out, f"hand_one_query_two_keys[{dtype}]")[1:]
        assert (verdict, kind, element) == ("FAIL", "mismatch", "b=0 h=0 row=0 col=0: got 5, expected 7.5"), \
            explain(buggy)
    assert "FAIL hand_one_query_two_keys[fp32] [examples/buggy_attention.py:attention]" in out
    assert "mismatch at (b=0, h=0, row=0, col=0): got 5, expected 7.5" in out
    # Nq > Nk: the loop bound from Nq reads key rows past Nk, which hold the NaN guard bands
    assert row(out, "cross_nq_gt_nk[fp32]")[3] == "out-of-bounds read", explain(buggy)
    # self-attention hides the bug: not a planted constant
    assert row(out, "causal_square[fp32]")[1] == "PASS", explain(buggy)


def test_buggy_example_hypothesis_shrinks_each_kind_to_a_cross_attention_case(buggy):
    """Generated cases keep going past the first failure: each distinct kind is shrunk on its own. The bug
    needs Nq != Nk: a mismatch when keys past Nq are ignored (Nq < Nk), an out-of-bounds read past Nk."""
    minimal = [ln for ln in buggy.stdout.splitlines() if ln.startswith("hypothesis_minimal")]
    assert minimal and all(" FAIL " in ln for ln in minimal), explain(buggy)
    sources = re.findall(r"repro: .* --case \"(Case\('hypothesis_minimal[^\"]*\))\"", buggy.stdout)
    cases = {row(buggy.stdout, parse_case(s).name)[3]: parse_case(s) for s in sources}
    assert set(cases) == {"mismatch", "out-of-bounds read"}, explain(buggy)
    assert cases["mismatch"].Nq < cases["mismatch"].Nk and cases["out-of-bounds read"].Nq > cases["out-of-bounds read"].Nk
    # shrunk: the seed's own report, one query against two keys
    assert (cases["mismatch"].Nq, cases["mismatch"].Nk, cases["mismatch"].D) == (1, 2, 1), explain(buggy)


def test_a_shrink_stops_at_its_time_budget_with_the_simplest_failure_it_has():
    """A slow kernel with a flaky failure spent 15 to 28 minutes shrinking (each candidate took seconds and most
    passed): a shrink now stops at its seconds as at its steps, keeps what it reached, and says it stopped."""
    from flashcheck.cases.declarations import Declarations
    from flashcheck.cases.verify import generated

    start = parse_case("Case('big', B=2, H=3, Nq=40, Nk=70, D=32, dtype='fp16', causal=True)")
    now, judged = [0.0], []

    def verdict_of(case):                    # every candidate takes 10 s; only fewer batches still fail
        now[0] += 10.0
        judged.append(case)
        return SimpleNamespace(failed=case.B == 1, kind="NaN")
    small, cut = generated.shrink(start, "NaN", verdict_of, Declarations(), ("fp32",), steps=80, seconds=35.0,
                                  clock=lambda: now[0])
    assert cut and len(judged) == 4 and small.B == 1, (small, judged)
    now[0], judged[:] = 0.0, []
    small, cut = generated.shrink(start, "NaN", verdict_of, Declarations(), ("fp32",), steps=80, seconds=1e9,
                                  clock=lambda: now[0])
    assert not cut and small.B == 1 and len(judged) > 4        # unhurried, it tries every other simpler step


def test_jobs_judge_the_same_cases_with_the_same_verdicts(buggy, tmp_path):
    """--jobs 2 (two workers at once) reports what one worker does: the same cases, catalogue and generated
    (drawn before they are judged), with the same verdicts and kinds, in the same order, and the same shrunk
    minimal cases."""
    proc = verify(BUGGY, "--only", "hand_one_query_two_keys,cross_nq_gt_nk,causal_square", "--examples", "10",
                  "--jobs", "2", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 1, explain(proc)
    cases = json.loads((tmp_path / "r.json").read_text())["cases"]
    lines = buggy.stdout.splitlines()
    table = next(i for i, ln in enumerate(lines) if ln.startswith("-----")) + 1
    names = [ln.split()[0] for ln in lines[table:lines.index("", table)] if not ln.startswith(" ")]   # no continuations
    assert [c["name"] for c in cases] == names, explain(proc)
    for c in cases:
        cols = row(buggy.stdout, c["name"])
        assert cols[1] == c["status"].upper(), (c, cols)
        if c["status"] == "fail":
            assert cols[3] == c["kind"], (c, cols)
    # where the run's time went: each judged case's start (from the run's start), seconds and worker
    timed = [c["timing"] for c in cases if c["status"] != "skip"]
    assert timed and all(t["start"] >= 0 and t["seconds"] >= 0 and t["worker"] in (0, 1) for t in timed), timed
    assert {t["worker"] for t in timed} == {0, 1}, "one of the two workers judged nothing"


def test_the_default_jobs_keep_to_the_cores_other_runs_leave_free(tmp_path, monkeypatch, capsys):
    """Runs side by side on one machine: the default --jobs takes the cores whose slots no other flashcheck run holds
    (15 runs on 16 cores once made 240 workers, each with torch and a CUDA context), never fewer than one worker;
    an explicit --jobs stands; a slot held by another process counts; released slots are free again."""
    from flashcheck.cases.runner import slots
    from flashcheck.cases.verify import engine

    monkeypatch.setattr(slots, "directory", lambda: str(tmp_path))
    monkeypatch.setattr(engine, "_cores", lambda: 4)
    monkeypatch.delenv("FLASHCHECK_JOBS", raising=False)
    auto, explicit = engine.request(SDPA), engine.request(SDPA, jobs=4)

    jobs, held = engine.take_slots(auto, 4)
    assert (jobs, len(held)) == (4, 4)
    assert engine.take_slots(auto, 4)[0] == 1                      # every slot held: one worker, none taken
    held.release()
    other = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom flashcheck.cases.runner import slots\n"
                              f"slots.directory = lambda: {str(tmp_path)!r}\nh = slots.claim(3, 4)\n"
                              "print(len(h), flush=True)\ntime.sleep(60)"],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "3"              # another process holds three
        jobs, held = engine.take_slots(auto, 4)
        assert (jobs, len(held)) == (1, 1)
        assert "1 worker(s), not 4" in capsys.readouterr().err
        held.release()
        jobs, held = engine.take_slots(explicit, 4)
        assert (jobs, len(held)) == (4, 1)                          # --jobs 4 stands
        held.release()
    finally:
        other.kill()
        other.wait()
    jobs, held = engine.take_slots(auto, 4)                          # its slots went with it
    assert (jobs, len(held)) == (4, 4)
    held.release()


def test_heavy_cases_are_told_by_their_share_of_the_free_memory():
    """engine._heavy: a case within a 2N-th of the free memory (N jobs) is light, one past it "one" (beside light
    cases, never beside another such), one past half of it "alone"."""
    from flashcheck.cases.case import Case
    from flashcheck.cases.inputs import footprint
    from flashcheck.cases.verify.engine import _heavy

    small, big = Case("small", Nq=64, Nk=64, D=64), Case("big", B=4, H=16, Nq=4096, Nk=4096, D=128)
    need = footprint(big)[0]
    heavy = _heavy({"device_free": 3 * need, "host_free": None}, jobs=4)     # 2N-th: 3/8 of big's need
    assert heavy(small) is None and heavy(big) == "one"
    assert _heavy({"device_free": 1.5 * need, "host_free": None}, jobs=4)(big) == "alone"


def test_jobs_keep_order_and_run_heavy_cases_alone():
    """engine.in_order, the scheduler of --jobs, on three stand-in runners: results come back in the items'
    order whatever order they finish in, at most one item per runner at a time, an "alone" item only when no
    other item runs, a "one" item beside light ones but never beside another "one", and nothing more comes back
    once stopped() says so."""
    import threading
    import time

    from flashcheck.cases.verify.engine import in_order

    lock, running, log = threading.Lock(), set(), []
    one_started = threading.Event()

    def work(runner, item):
        with lock:
            assert runner not in {r for r, _ in running}, "a runner serves two items at once"
            running.add((runner, item))
            log.append(("start", item, frozenset(i for _, i in running)))
        if item == 7:
            one_started.set()
        if item == 6:      # the light item before the first "one" item waits for it (however loaded the machine):
            one_started.wait(5)     # a scheduler that keeps "one" items from light ones times this out
        time.sleep(0.02 * (item % 3))        # later items often finish first
        with lock:
            running.discard((runner, item))
        return item * 10

    items = list(range(12))
    heavy = {5: "alone", 7: "one", 8: "one", 9: True}
    got = list(in_order(items, ["r0", "r1", "r2"], work, heavy=heavy.get))
    assert got == [(i, i * 10) for i in items]
    for _, item, together in log:
        if heavy.get(item) in ("alone", True):
            assert together == {item}, f"heavy item {item} ran alongside {set(together) - {item}}"
        if heavy.get(item) == "one":
            assert not {7, 8} - {item} & together, f"two 'one' items ran together: {set(together)}"
    assert max(len(t) for _, _, t in log) > 1, "the stand-in runners never overlapped: nothing was parallel"
    assert any({6, 7} <= t for _, _, t in log), "a 'one' item never ran beside a light one"
    seen = []
    for item, _ in in_order(items, ["r0", "r1"], work, stopped=lambda: len(seen) >= 3):
        seen.append(item)
    assert seen == [0, 1, 2]


def _two_runners_in_step(**affinity):
    """in_order over items 0..15 of two kinds (i % 2) on two runners that go in step, one item each per round (else
    a runner that got ahead, its own kind's items done, rightly takes the other's next one rather than idle: a race
    on a loaded machine, not a wrong pick). Checks the results' order; returns the (runner, kind) pairs served."""
    import threading

    from flashcheck.cases.verify.engine import in_order

    lock, served = threading.Lock(), set()
    rounds = threading.Barrier(2, timeout=10)

    def work(runner, item):
        with lock:
            served.add((runner, item % 2))
        rounds.wait()
        return item

    items = list(range(16))
    assert list(in_order(items, ["r0", "r1"], work, **affinity)) == [(i, i) for i in items]
    return served


def test_jobs_send_a_specialisation_back_to_the_runner_that_met_it():
    """in_order's key: a runner takes, among the next items, one whose key it has already judged (its compile and
    autotune caches are warm), so two interleaved specialisations on two runners stay one per runner (each key
    once cold, not once per runner), and the results keep the items' order."""
    served = _two_runners_in_step(key=lambda i: i % 2)
    assert len(served) == 2 and {k for _, k in served} == {0, 1}, served


def test_jobs_send_a_family_of_compiles_to_one_runner_and_new_ones_elsewhere():
    """in_order's family (engine.compiled_alike: the lengths only as Triton specialises them): items whose keys all
    differ but that share compiled kernels go back to the runner that met their family, and a free runner takes a
    family no runner has met, so no two runners compile one specialisation at once (each is compiled by every
    runner that meets it before the shared cache has it). Red when the family is ignored: the runners then take
    the items in turn, and both meet both families."""
    from flashcheck.cases.case import Case
    from flashcheck.cases.verify.engine import compiled_alike

    served = _two_runners_in_step(key=lambda i: i, family=lambda i: i % 2)
    assert len(served) == 2 and {k for _, k in served} == {0, 1}, served
    # lengths 37 and 45 compile alike (neither 1 nor a multiple of 16); 48, a causal mask, a dtype do not
    base = Case("a", Nq=37, Nk=45)
    assert compiled_alike(base) == compiled_alike(base.replace(Nq=45, Nk=37, B=3))
    for other in (base.replace(Nk=48), base.replace(causal=True), base.replace(dtype="fp16"), base.replace(D=32)):
        assert compiled_alike(other) != compiled_alike(base)


def test_repro_line_reruns_the_failure_also_in_process(buggy):
    """The repro line, pasted back (here with --no-isolate, the debugging mode), gives the same failure."""
    line = next(ln for ln in buggy.stdout.splitlines() if "repro:" in ln and "hand_one_query_two_keys[fp32]" in ln)
    argv = shlex.split(line.split("repro: ", 1)[1])
    assert argv[:3] == ["flashcheck", "verify", BUGGY]
    proc = verify(*argv[2:], "--no-isolate", "-q")
    assert proc.returncode == 1, explain(proc)
    assert "mismatch at (b=0, h=0, row=0, col=0): got 5, expected 7.5" in proc.stdout
    assert ": 0 passed, 1 failed" in proc.stdout


SDPA_SHARDS = 3     # the default verify of the SDPA example, in three parts that run in parallel (under -n auto)


@pytest.mark.parametrize("part", range(1, SDPA_SHARDS + 1))
def test_sdpa_example_is_accepted(tmp_path, backend, part):
    from flashcheck.cases.verify import shard

    proc = verify(SDPA, "--shard", f"{part}/{SDPA_SHARDS}", "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, explain(proc)
    report = json.loads((tmp_path / "r.json").read_text())
    by_name = {c["name"]: c for c in report["cases"]}

    def mine(name):     # each named case is checked in the one part that judges it
        return shard.owns((part, SDPA_SHARDS), name)
    # the wrapper implements bottom-right causal itself: causal cases run, and pass
    if mine("causal_nq_gt_nk[fp16]"):
        assert by_name["causal_nq_gt_nk[fp16]"]["status"] == "pass"
    assert report["summary"]["failed"] == 0 and report["summary"]["passed"] > 100 / SDPA_SHARDS
    # no out=: the report says which check was reduced, for every case that ran
    judged = [c for c in report["cases"] if c["status"] != "skip"]
    assert report["summary"]["reduced"] == len(judged)
    assert "reduced check: no out=" in proc.stdout
    # not a Triton kernel: its bf16 cases run on the CPU too
    if mine("batch_heads_d64[bf16]"):
        assert by_name["batch_heads_d64[bf16]"]["status"] == "pass"


def test_declared_support_is_skipped_with_its_reason(tmp_path):
    args = ["--no-causal", "--dtypes", "fp32", "--head-dims", "1-64,128", "--max-seq", "40", "--strides", "contiguous"]
    proc = verify(SDPA, *args, "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"))
    assert proc.returncode == 0, explain(proc)
    report = json.loads((tmp_path / "r.json").read_text())
    cases = {c["name"]: c for c in report["cases"]}
    expected = {"causal_square[fp32]": "causal (--no-causal)",
                "fp16_many_key_blocks[fp16]": "dtype fp16 (--dtypes fp32)",
                "head_dim_256[fp32]": "head dim 256 (--head-dims 1-64,128)",
                "many_key_chunks[fp32]": "Nk = 150 > --max-seq 40",
                "layout_bthd[fp32]": "layout bthd (--strides contiguous)"}
    for name, reason in expected.items():
        assert cases[name]["status"] == "skip", cases[name]
        assert reason in cases[name]["reason"], cases[name]
    # skipped only where the entry's point cannot survive the declarations, and saying so
    assert "its point (" in cases["layout_bthd[fp32]"]["reason"]
    assert cases["head_dim_128[fp32]"]["status"] == "pass"
    # projected where it can: an odd head dim near 111 within 1-64 (63), keys cut to --max-seq, the names saying so
    assert cases["head_dim_111[fp32, D=63]"]["status"] == "pass"
    assert cases["partial_last_key_block[fp32, Nk=40]"]["status"] == "pass"
    # no fp16 expansion: only an entry about half precision alone is listed (once, skipped)
    assert all(c["status"] == "skip" and "dtype fp16 (--dtypes fp32)" in c["reason"]
               for n, c in cases.items() if n.endswith("[fp16]"))
    summary = report["summary"]
    assert summary["passed"] + summary["failed"] + summary["skipped"] == len(cases)
    assert summary["passed"] == sum(c["status"] == "pass" for c in cases.values())
    assert summary["skipped"] == sum(c["status"] == "skip" for c in cases.values()) > len(expected)
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert int(suite.get("tests")) == len(cases) and int(suite.get("failures")) == 0
    assert int(suite.get("skipped")) == summary["skipped"]
    skipped = {tc.get("name"): tc.find("skipped").get("message") for tc in suite.iter("testcase")
               if tc.find("skipped") is not None}
    assert skipped == {n: c["reason"] for n, c in cases.items() if c["status"] == "skip"}
    # the table shows the same reason
    assert row(proc.stdout, "causal_square[fp32]")[1:] == ["SKIP", "-", "-", cases["causal_square[fp32]"]["reason"]]


def test_nothing_to_verify_is_not_a_pass():
    proc = verify(SDPA, "--only", "causal_square", "--no-causal")
    assert proc.returncode == 2, explain(proc)
    assert "nothing to verify" in proc.stderr and "causal_square[fp32]: not declared: causal" in proc.stderr


@pytest.mark.parametrize("args, words", [
    (["attention_without_colon"], "is not MODULE:FUNCTION"),
    (["examples/no_such_file.py:attention"], "does not exist"),
    (["no_such_module_xyz:attention"], "cannot import no_such_module_xyz: ModuleNotFoundError"),
    (["flashcheck.kernel.fused:no_such_function"], "has no attribute 'no_such_function'"),
    ([f"{CHAOS.split(':')[0]}:MISBEHAVIOURS"], "is a dict, not callable"),
    (["--only", "no_such_case"], "no catalogue case named no_such_case"),
    (["--case", "Case('x', dtype='fp8')"], "--case"),
    (["--head-dims", "0-4"], "--head-dims"),
    (["--min-seq", "100", "--max-seq", "120", "--seq-multiple", "64"],
     "no length from --min-seq 100 to --max-seq 120 is a multiple of --seq-multiple 64"),
], ids=["no_colon", "file_missing", "module_missing", "no_attribute", "not_callable", "unknown_case", "bad_case",
        "bad_head_dims", "no_length_fits"])
def test_usage_errors_exit_2(args, words):
    proc = verify(*args)
    assert proc.returncode == 2, explain(proc)
    assert "flashcheck verify: error: " in proc.stderr and words in proc.stderr, explain(proc)
    assert proc.stdout == ""


def test_help_and_a_usage_error_answer_before_torch_is_imported():
    """`flashcheck verify --help`, `flashcheck --help` and a usage error found while parsing import neither torch nor
    Triton: importing torch took 4 to 6 s on the H200 image (it has no bytecode for torch), spent before argparse
    could say a word."""
    probe = ("import sys\nfrom flashcheck.cases.cli import main\n"
             "for argv in ({argvs}):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "print('heavy:', sorted(m for m in ('torch', 'triton', 'hypothesis', 'numpy') if m in sys.modules))")
    argvs = "['verify', '--help'], ['--help'], ['cases', '--help'], ['verify', '--jobs', 'many']"
    proc = subprocess.run([sys.executable, "-c", probe.format(argvs=argvs)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "heavy: []" in proc.stdout, explain(proc)
    assert "expected a number or 'auto', got 'many'" in proc.stderr, explain(proc)


def test_help_names_every_declaration():
    """--help renders (a help text with a bare % once made argparse raise instead of printing it), and every
    declaration has its flag there."""
    from flashcheck.cases.cli import SUBCOMMANDS
    from flashcheck.cases.declarations import FIELDS
    for where in [[]] + [[name] for name in SUBCOMMANDS]:
        proc = subprocess.run([sys.executable, "-m", "flashcheck", *where, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and "usage:" in proc.stdout, explain(proc)
        if where == ["verify"]:
            missing = [f.flag for f in FIELDS if f.flag not in proc.stdout]
            assert not missing, missing


def test_a_declared_value_that_starts_with_a_dash_parses():
    """--empty-lse=-inf (the default written out) is accepted; a bad value is a usage error naming the choices."""
    proc = verify(SDPA, "--only", "hand_one_query_two_keys", "--dtypes", "fp32", "--empty-lse=-inf", "-q")
    assert proc.returncode == 0, explain(proc)
    proc = verify(SDPA, "--empty-lse", "zero")
    assert proc.returncode == 2 and "--empty-lse" in proc.stderr and "+inf" in proc.stderr, explain(proc)


def _processes_marked(mark):
    """PIDs of this user's processes whose environment holds `mark` (verify's workers inherit it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc to find the workers")
def test_a_verify_killed_by_its_runner_leaves_no_worker_behind(tmp_path):
    """A CI runner's timeout sends verify SIGTERM: the worker servers (a session of their own, out of reach of that
    signal) and the child in the middle of a call must go too; they ran on at full CPU."""
    mark = f"FLASHCHECK_TEST_MARK={os.getpid()}_{tmp_path.name}"
    env = dict(os.environ, **dict([mark.split("=")]))
    proc = subprocess.Popen([sys.executable, "-m", "flashcheck", "verify", CHAOS, "--case",
                             "Case('hangs', Nq=5, Nk=6, D=9)", "--compile-timeout", "600"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # verify, its servers and their children, all started and settled (the judging child in the kernel's
        # hour-long call): the same processes for 3 s
        deadline, seen, since = time.monotonic() + 120, [], time.monotonic()
        while time.monotonic() < deadline and not (len(seen) >= 3 and time.monotonic() - since > 3.0):
            now = sorted(_processes_marked(mark))
            if now != seen:
                seen, since = now, time.monotonic()
            time.sleep(0.2)
        assert len(seen) >= 3, f"verify's worker never started its child: {seen}"
        proc.terminate()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _processes_marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_marked(mark), f"left behind: {_processes_marked(mark)}"
    finally:
        proc.kill()
        for pid in _processes_marked(mark):
            os.kill(pid, 9)


# ---- robustness: one run over every misbehaviour, each a case of its own head dim ----

def _chaos_order():
    """(case name, head dim): each misbehaviour once, and a well-behaved case (D = 16) right after the hang
    and after the crash, which verify must judge in a fresh worker."""
    order = [(MISBEHAVIOURS[d][0], d) for d in sorted(MISBEHAVIOURS)]
    order.insert(order.index(("hangs", 9)) + 1, ("after_hang", 16))
    order.insert(order.index(("segfaults", 10)) + 1, ("after_crash", 16))
    return order


@pytest.fixture(scope="module")
def chaos(request, tmp_path_factory):
    cases = [arg for name, d in _chaos_order() for arg in ("--case", f"Case({name!r}, Nq=5, Nk=6, D={d})")]
    out = once(request, "chaos", lambda: verify_with_reports(tmp_path_factory.mktemp("chaos"), CHAOS, *cases,
                                                              "--timeout", str(HANG_TIMEOUT), "--compile-timeout",
                                                              str(HANG_TIMEOUT)))
    proc = SimpleNamespace(returncode=out["returncode"], stdout=out["stdout"], stderr=out["stderr"])
    return proc, out["report"], ET.fromstring(out["junit"])


@pytest.mark.parametrize("head_dim", sorted(MISBEHAVIOURS), ids=[MISBEHAVIOURS[d][0] for d in sorted(MISBEHAVIOURS)])
def test_misbehaviour_is_named(chaos, head_dim, backend):
    proc, report, _ = chaos
    name, kind = MISBEHAVIOURS[head_dim]
    case = next(c for c in report["cases"] if c["name"] == name)
    assert case["status"] == "fail" and case["kind"] == kind, f"{case}\n{explain(proc)}"
    assert row(proc.stdout, name)[1] == "FAIL" and row(proc.stdout, name)[3] == kind, explain(proc)
    assert f"FAIL {name} [{CHAOS}]" in proc.stdout


def test_verify_carries_on_after_every_misbehaviour(chaos):
    proc, report, junit = chaos
    assert proc.returncode == 1, explain(proc)
    expected = [(name, "pass" if d == 16 else "fail") for name, d in _chaos_order()]
    assert [(c["name"], c["status"]) for c in report["cases"]] == expected, explain(proc)
    summary = report["summary"]
    assert (summary["passed"], summary["failed"], summary["skipped"]) == (2, len(MISBEHAVIOURS), 0)
    hang = next(c for c in report["cases"] if c["name"] == "hangs")
    # the hang is the kernel's first call on those inputs: the compile limit ran out, and the message says so
    assert f"did not return within the compile limit of {HANG_TIMEOUT} s" in hang["failures"][0]["message"]
    crash = next(c for c in report["cases"] if c["name"] == "segfaults")
    assert "signal 11 (SIGSEGV)" in crash["failures"][0]["message"]
    suite = junit.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (
        str(len(expected)), str(len(MISBEHAVIOURS)), "0")
    failures = {tc.get("name"): tc.find("failure") for tc in suite.iter("testcase")}
    assert failures["hangs"].get("type") == "timeout" and "repro: " in failures["hangs"].text
    assert failures["after_hang"] is None and failures["after_crash"] is None


def test_two_shards_merged_give_the_verdicts_of_one_run(buggy, tmp_path):
    """--shard 1/2 and 2/2 judge disjoint parts; `flashcheck merge` puts them back as the run without shards gave it:
    the same cases, verdicts and kinds in the same order (generated and shrunk cases included), one exit status."""
    # the run without shards is the buggy fixture's (a Triton kernel: on a GPU each shrink step compiles anew)
    assert buggy.report is not None, explain(buggy)
    (tmp_path / "all.json").write_text(json.dumps(buggy.report))
    for i in (1, 2):
        part = verify(BUGGY, *BUGGY_SELECTION, "--shard", f"{i}/2", "--json", str(tmp_path / f"s{i}.json"))
        assert part.returncode in (0, 1), explain(part)
        assert f"(shard {i}/2)" in part.stdout
    merged = subprocess.run([sys.executable, "-m", "flashcheck", "merge", str(tmp_path / "s1.json"),
                             str(tmp_path / "s2.json"), "--json", str(tmp_path / "m.json"), "--junit",
                             str(tmp_path / "m.xml")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert merged.returncode == buggy.returncode == 1, explain(merged)

    def verdicts(path):
        return [(c["name"], c["status"], c.get("kind")) for c in json.loads(path.read_text())["cases"]]
    assert verdicts(tmp_path / "m.json") == verdicts(tmp_path / "all.json")
    assert ET.parse(tmp_path / "m.xml").getroot().find("testsuite").get("failures") == \
        str(sum(s == "fail" for _, s, _ in verdicts(tmp_path / "all.json")))
    missing = subprocess.run([sys.executable, "-m", "flashcheck", "merge", str(tmp_path / "s1.json")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "missing 2" in missing.stderr, missing.stderr


def test_a_usage_error_with_a_full_compile_cache_exits_2(tmp_path):
    """The compile cache's line is added when the run ends; a run that never began (a module that does not import)
    must still end as the usage error it is (the line once tried to reach a run that did not exist: exit 1)."""
    (tmp_path / "triton" / "a_compiled_kernel").mkdir(parents=True)
    # a user's own TRITON_CACHE_DIR wins over flashcheck's cache; torch.compile in this pytest worker (the bench's
    # flex_attention) sets one in os.environ, so it is left out here
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    env["FLASHCHECK_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "flashcheck", "verify", "no_such_module_xyz:attention"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "cannot import no_such_module_xyz" in proc.stderr, explain(proc)
    ok = subprocess.run([sys.executable, "-m", "flashcheck", "verify", SDPA, "--only", "one_key", "-q"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, env=env)
    assert ok.returncode == 0 and f"compile cache {tmp_path / 'triton'} (0 new, 1 before)" in ok.stdout, explain(ok)


def test_bytecode_is_kept_in_the_cache_where_python_would_keep_none(tmp_path, monkeypatch):
    """torch installed without bytecode under PYTHONDONTWRITEBYTECODE (the H200 image: 3.4 s to import torch and
    Triton, 1.6 s with the bytecode kept): the processes flashcheck starts keep theirs under its cache directory;
    elsewhere nothing changes (a prefix would make Python ignore bytecode that sits beside its sources)."""
    from flashcheck.cases.runner import cache

    monkeypatch.setenv("FLASHCHECK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setattr(cache, "_torch_without_bytecode", lambda: True)
    assert cache.bytecode_env() == {}                 # Python writes its own bytecode
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(cache, "_torch_without_bytecode", lambda: False)
    assert cache.bytecode_env() == {}                 # torch has its bytecode: left alone
    monkeypatch.setattr(cache, "_torch_without_bytecode", lambda: True)
    env = cache.bytecode_env()
    assert env == {"PYTHONPYCACHEPREFIX": str(tmp_path / "pycache"), "PYTHONDONTWRITEBYTECODE": ""}
    opened = cache.Cache.open()                       # what verify() from a user's process gives its workers
    try:
        assert {k: opened.env.get(k) for k in env} == env
    finally:
        opened.close()
    # such an environment really makes a child write its bytecode there, and only there
    child = dict(os.environ, **env)
    proc = subprocess.run([sys.executable, "-c", "import flashcheck.cases.runner.cache"], cwd=ROOT, env=child,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "pycache").rglob("cache.cpython-*.pyc")), "no bytecode written under the prefix"


def test_the_probes_run_at_once_but_never_two_on_one_runner():
    """engine.support with several runners asks its probes (GQA, Dv, the backward) at once, one runner each, and a
    runner with two of them asks them one after the other: a worker's pipe serves one call at a time (two threads
    reading one pipe tore a frame: 'Python int too large to convert to C ssize_t')."""
    import threading
    import time

    from flashcheck.cases.declarations import Declarations
    from flashcheck.cases.oracle import Capabilities
    from flashcheck.cases.verify.engine import support

    busy, overlapped, lock = set(), [], threading.Lock()

    class Runner:
        def __init__(self, name):
            self.name = name

        def call(self, fn, *args):
            with lock:
                assert self.name not in busy, f"two calls at once on {self.name}"
                busy.add(self.name)
                overlapped.append(len(busy))
            time.sleep(0.2 if self.name == "r0" else 0.01)     # r1 is free again long before r0
            with lock:
                busy.discard(self.name)
            return fn.endswith("probe_backward") or args[0] == "gqa", "probed"

    info = {"caps": Capabilities(out=False, lse=False, blocks=False, causal=True, scale=True), "triton": False}
    caps = support([Runner("r0"), Runner("r1")], info, Declarations.make(), "cpu", {"gqa", "dv"})
    assert set(caps.features) >= {"gqa", "backward"} and "dv" not in caps.features, caps.features
    assert caps.notes == {"gqa": "probed", "dv": "probed", "backward": "probed"}, caps.notes
    assert max(overlapped) == 2, "the probes never ran at once"


def test_an_internal_error_exits_3_not_1(monkeypatch, capsys):
    """An exception of flashcheck's own (here the engine raising) is an internal error, exit status 3 with its
    traceback: exit 1 would read as a verdict on the kernel."""
    from flashcheck.cases import cli
    from flashcheck.cases.verify import engine

    def broken(req, on_result=None):
        raise OverflowError("Python int too large to convert to C ssize_t")
    monkeypatch.setattr(engine, "run", broken)
    assert cli.main(["verify", "-q"]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "OverflowError" in err and "Traceback" in err, err


def test_generated_cases_of_a_kernel_that_is_not_triton_draw_its_declared_bf16_on_any_backend():
    """bf16 on the CPU is wrong only through Triton's interpreter: a plain PyTorch kernel declared bf16 only gets its
    generated cases in bf16 (verify exited 3, an internal error, when the CPU's dtypes left none to draw)."""
    import flashcheck
    from examples import plain_attention

    report = flashcheck.verify(plain_attention.matmul_softmax, dtypes="bf16", only="one_query", examples=4)
    assert report.exit_code == 0, str(report)
    assert "4 distinct example(s) judged, 4 without a failure" in str(report), str(report)


def test_a_case_too_slow_for_the_interpreter_judges_a_pytorch_kernel_on_the_cpu(backend):
    """long_cross_decode (4099 keys) is GPU-only for a Triton kernel, which the interpreter would run for minutes,
    and judged on any backend for a kernel of plain PyTorch: on the CPU it was the only entry whose rows pass 4096
    keys, where a key-chunked kernel's merge bug first shows."""
    import flashcheck
    from tests import limited_kernels

    chunked = flashcheck.verify(limited_kernels.chunked_keys_partial_chunk_dropped, dtypes="fp32",
                                only="long_cross_decode,split_kv_decode", causal=False)
    assert chunked.exit_code == 1, str(chunked)
    assert [r.case.name for r in chunked.failures] == ["long_cross_decode[fp32]"], str(chunked)
    if backend != "gpu":
        fused = flashcheck.verify("flashcheck.kernel.fused:attention", only="long_cross_decode,one_key", dtypes="fp32")
        assert fused.exit_code == 0 and "GPU only: size: the interpreter would take minutes" in str(fused), str(fused)
