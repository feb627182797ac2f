"""The suite's own order under pytest-xdist (conftest.py): the long tests are dealt to the front of every worker's
first part, so no worker is handed a queue of them while the others run short ones."""
import conftest


def _parts(out, workers):
    parts, start = [], 0
    for size in conftest.first_parts(len(out), workers):
        parts.append(out[start:start + size])
        start += size
    return parts


def test_long_tests_are_dealt_to_the_front_of_every_workers_part():
    n_long, n_short, workers = 7, 30, 3
    items = [f"short{i}" for i in range(n_short)] + [f"long{i}" for i in range(n_long)]
    cost = lambda it: 1 if it.startswith("long") else 0       # noqa: E731
    out = conftest.dealt(items, cost, workers)
    assert sorted(out) == sorted(items)
    parts = _parts(out, workers)
    assert [len(p) for p in parts] == [12, 12, 13]
    for i, part in enumerate(parts):
        longs = [it for it in part if it.startswith("long")]
        assert longs == [f"long{j}" for j in range(i, n_long, workers)]       # equal costs: round-robin, in order
        assert part[:len(longs)] == longs                                       # at the front of the part
    assert [it for it in out if it.startswith("short")] == [f"short{i}" for i in range(n_short)]
    assert conftest.dealt(items, cost, 1) == items[n_short:] + items[:n_short]  # one worker: long first, that is all


def test_long_tests_go_costliest_first_to_the_part_with_the_least_long_work():
    """A worker handed one very long test is not also handed its round-robin share of the other long ones (on an
    H200 two workers that each ran 125 s of precision shards then ran five more long tests each and ended the suite
    last)."""
    items = ["short0", "m1", "huge", "m2", "m3", "m4", "small", "short1", "short2", "short3", "short4", "short5"]
    costs = {"huge": 10, "m1": 3, "m2": 3, "m3": 3, "m4": 3, "small": 1}
    out = conftest.dealt(items, lambda it: costs.get(it, 0), 2)
    parts = _parts(out, 2)
    assert parts[0][:1] == ["huge"] and parts[1][:4] == ["m1", "m2", "m3", "m4"]
    assert "small" in parts[0][:2]          # part 0 (10 s) got it after part 1 reached 12 s
    assert [it for it in out if it.startswith("short")] == [f"short{i}" for i in range(6)]


def test_long_tests_named_to_share_one_worker_are_dealt_as_one_in_their_order():
    """one_worker(name): the fp32 precision shards of one kernel path go to one worker's part, one after the other
    (each after the first finds most of its compiles in the cache), not one to each worker at once."""
    items = [f"short{i}" for i in range(20)] + ["a1", "b1", "a2", "b2", "solo", "a3"]
    cost = lambda it: 0 if it.startswith("short") else 1        # noqa: E731
    together = lambda it: it[0] if it[0] in "ab" else None                              # noqa: E731
    out = conftest.dealt(items, cost, 3, together)
    assert sorted(out) == sorted(items)
    assert [p[:3] for p in _parts(out, 3)] == [["a1", "a2", "a3"], ["b1", "b2", "short5"], ["solo", "short12", "short13"]]



def test_derandomized_draws_depend_on_the_seed_alone(tmp_path, monkeypatch):
    """hypothesis draws, now and then, among the literals of the project modules that are imported; under
    strategies.seed_alone (verify's and the properties' searches, and this suite through conftest) a derandomized
    search gives the same cases whatever was imported before it (outside it, a module of 300 new literals changed
    1 of 40 cases; a CI worker's earlier tests once moved tests/test_tolerance.py's statistics that way)."""
    import importlib

    from hypothesis import HealthCheck, Phase, given, settings

    from flashcheck.cases.generate import strategies as S

    def draws():
        got = []

        @settings(max_examples=40, derandomize=True, database=None, phases=(Phase.generate,),
                  suppress_health_check=list(HealthCheck))
        @given(S.cases(backend="cpu"))
        def collect(case):
            got.append(case.key())
        with S.seed_alone():
            collect()
        return got

    before = draws()
    (tmp_path / "fc_many_literals.py").write_text(
        "VALUES = (" + ", ".join(str(7 * i + 3) for i in range(300)) + ")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("fc_many_literals")
    assert draws() == before


def test_the_xdist_controller_imports_no_torch_and_the_workers_name_their_backend(tmp_path):
    """pytest-xdist's controller runs no test: conftest chooses the backend (importing torch, starting CUDA) in
    the processes that run tests. Before, the controller did both before it started its workers (a fresh H200
    machine: workers started 7 s after the command). Its header says the workers choose; the workers' choice is
    named at the end. A plain run (no workers) chooses in its own process, and its header names the backend."""
    import os
    import subprocess
    import sys

    spy = tmp_path / "controller_spy.py"
    spy.write_text("import sys\n"
                   "def pytest_sessionfinish(session):\n"
                   "    if not hasattr(session.config, 'workerinput'):\n"
                   f"        open({str(tmp_path / 'seen')!r}, 'w').write(str('torch' in sys.modules))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    test = "tests/test_suite_order.py::test_long_tests_are_dealt_to_the_front_of_every_workers_part"

    def pytest(*args):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "controller_spy", "-p", "no:cacheprovider",
                               *args, test], cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout, (tmp_path / "seen").read_text()

    out, torch_in_controller = pytest("-n", "2")
    assert torch_in_controller == "False", out
    assert "flashcheck backend: chosen by each worker" in out
    assert "flashcheck backend (2 worker(s)): " in out, out
    out, torch_in_plain_run = pytest("-p", "no:xdist")
    assert torch_in_plain_run == "True"
    assert "flashcheck backend: " in out and "chosen by each worker" not in out, out
