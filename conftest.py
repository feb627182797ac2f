"""Backend choice before Triton is imported (in each process that runs tests, not in pytest-xdist's controller),
per-worker GPU pinning, and GPU fault containment.

FLASHCHECK_BACKEND=cpu|gpu forces a backend; otherwise CUDA when a GPU is visible, else Triton's
interpreter on the CPU (TRITON_INTERPRET=1). Under pytest-xdist, worker n uses GPU n mod count (set through
CUDA_VISIBLE_DEVICES before CUDA starts). FLASHCHECK_WORKER_LOG=PATH appends one line per worker naming its
device. A sticky CUDA error (illegal address) poisons a process for good: after any test that leaves one,
the worker exits, and pytest-xdist replaces it with a fresh one, so the tests that follow still run.
"""
import functools
import os

from flashcheck.cases.runner.cache import default_dir, keep_bytecode  # (nothing heavy: torch waits for the backend)

# under pytest-xdist each worker, and what it starts (verify's worker processes), gets its share of the host's
# cores: N workers each running one OpenMP thread per core oversubscribe the machine (2 cores, the fp16 and bf16
# tolerance tests under -n 2: 110 s, and 70 s with one thread each). Set before torch is imported.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // _WORKERS))


# Where torch was installed without bytecode and the environment forbids writing it (PYTHONDONTWRITEBYTECODE: the
# H200 machine's image), every process the suite starts compiled torch's sources again, and the tests start hundreds
# (each verify and its workers): the suite keeps the bytecode in flashcheck's cache directory instead (the summed
# test time on the H200 went from 4020 s to 3128 s with it, beside two smaller changes).
keep_bytecode()

import pytest  # noqa: E402

# The backend, chosen in pytest_configure below by every process that runs tests (None until then). Not in the
# pytest-xdist controller, which hands the tests to its workers and runs none: there torch's import (for the
# choice) and CUDA's start came before the workers were started, and each worker did both again. On a fresh H200
# machine the workers started 7 s after the command, and ran their first test 12 s after it.
BACKEND = None


def _set_up():
    """Choose the backend (before Triton is imported: the test modules import it), and on the GPU the shared
    compile cache and the wait mode."""
    global BACKEND
    from flashcheck.cases.backend import keep_freed_memory, select_backend, sleep_while_waiting

    BACKEND = select_backend()
    keep_freed_memory()       # the oracle's arrays, judged in this process by many tests, reuse freed memory
    # On the GPU one compile cache serves the whole session: this process's own kernels, the mutants' workers and
    # the workers of every verify the tests start (which use flashcheck's directory, cases/runner/cache.py). Left
    # to Triton's default here, each kernel specialisation the tests share with a verify run compiled twice. Set
    # before Triton is imported; a TRITON_CACHE_DIR of the user's own stands.
    if BACKEND == "gpu":
        for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
            os.environ.setdefault(var, os.path.join(default_dir(), sub))
        # this process's waits for the GPU sleep instead of spinning beside the other workers (cases/backend.py)
        sleep_while_waiting()


def hands_tests_to_workers(config):
    """Whether this process is a pytest-xdist controller, which hands every test to its workers and runs none (xdist's
    distribution mode: a --dist other than no and workers to send to; not under --collect-only, -n 0 or -p no:xdist,
    nor in a worker)."""
    return (not hasattr(config, "workerinput") and not config.getoption("collectonly", False)
            and config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None)))


def pytest_configure(config):
    if not hands_tests_to_workers(config):
        _set_up()


# tests/fault_demo faults the GPU on purpose; tests/test_gpu_runner.py runs it in a pytest of its own
collect_ignore = [] if os.environ.get("FLASHCHECK_FAULT_DEMO") else ["tests/fault_demo"]


def pytest_report_header(config):
    if BACKEND is None:     # the controller: each worker chooses, and says what it chose at the end (below)
        chosen = os.environ.get("FLASHCHECK_BACKEND") or "the GPU where CUDA is visible, else the CPU"
        return f"flashcheck backend: chosen by each worker ({chosen}); named at the end"
    from flashcheck.cases.backend import describe

    return f"flashcheck backend: {describe()}"


_WORKER_BACKENDS = {}     # the controller's: what each worker's backend() describes, with the workers' ids


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)     # a pytest-xdist worker's, sent to the controller
    if output is not None and BACKEND is not None:
        from flashcheck.cases.backend import describe

        output["flashcheck_backend"] = describe()


@pytest.hookimpl(optionalhook=True)      # pytest-xdist's hook: absent without it
def pytest_testnodedown(node, error):
    line = getattr(node, "workeroutput", {}).get("flashcheck_backend")
    if line:
        _WORKER_BACKENDS.setdefault(line, []).append(node.gateway.id)


def pytest_terminal_summary(terminalreporter):
    for line, workers in _WORKER_BACKENDS.items():
        terminalreporter.write_line(f"flashcheck backend ({len(workers)} worker(s)): {line}")


@pytest.fixture(scope="session")
def backend():
    return BACKEND


@pytest.fixture(scope="session")
def device():
    return "cuda" if BACKEND == "gpu" else "cpu"


# The tests that each take long (a verify run, a mutant's worker, a bench), with the seconds each took in a whole run
# of the suite on this backend (tests/durations/<backend>.json, written from a run's JUnit XML by
# scripts/suite_durations.py; a test not listed counts as short). Under pytest-xdist's work stealing (below) each
# worker is first handed a contiguous part of the collection and runs it from the front, while idle workers steal
# from the back of the longest queue. So the long tests are dealt to the fronts of the workers' parts, the costliest
# first, each to the part with the least long work so far, and the many short tests fill the parts' backs, where
# stealing evens the end out. (Put in one block at the front, the long tests all went to one worker's part: on an
# H200 one worker ran five of the eight fp32 precision shards one after another and the run ended 40 s after the
# others were done. Dealt round-robin by module, the two workers that each ran a group of four precision shards
# (125 s) were also dealt five more long tests each, and the run ended 8 to 15 s after most workers.)
@functools.lru_cache(maxsize=None)
def _durations():
    """The recorded seconds of the long tests on this backend (read once the backend is chosen)."""
    import json

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "durations")
    try:
        with open(os.path.join(here, f"{BACKEND}.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def _cost(item):
    """The seconds a long test took in the recorded run, 0 for a short one."""
    return _durations().get(item.nodeid, 0)


def first_parts(total, workers):
    """The sizes of the contiguous parts pytest-xdist's work stealing first hands its workers (xdist's
    WorkStealingScheduling.check_schedule: each idle worker in turn gets the pending items // the workers left)."""
    sizes = []
    for i in range(workers):
        sizes.append((total - sum(sizes)) // (workers - i))
    return sizes


def one_worker(item):
    """The name of an item's `one_worker` mark (tests that run one after the other in one worker), or None."""
    mark = item.get_closest_marker("one_worker")
    return mark.args[0] if mark else None


def dealt(items, cost, workers, together=lambda item: None):
    """items reordered so that each of the workers' first parts starts with its share of the long items (cost above
    0), and is filled up with the short ones in collection order. The long items are dealt the costliest first, each
    to the part with the least long cost so far (the first such part on a tie), and run in that order. Long items
    that together(item) names alike are dealt as one unit of their summed cost, in their order, to one part: the fp32
    precision shards of one kernel path share most of their compiles, which concurrent shards each did anew (H200:
    their summed time 261 s when one worker happened to run them in a row, 483 s when each started on its own
    worker). With one worker: the long items first, costliest first, then the short ones."""
    units, by_name, short = [], {}, []
    for it in items:
        if not cost(it):
            short.append(it)
            continue
        name = together(it)
        if name is None:
            units.append([it])
        elif name in by_name:
            by_name[name].append(it)
        else:
            by_name[name] = [it]
            units.append(by_name[name])
    costed = sorted(((sum(cost(it) for it in unit), unit) for unit in units), key=lambda cu: -cu[0])   # stable
    if workers < 2:
        return [it for _, unit in costed for it in unit] + short
    parts, load = [[] for _ in range(workers)], [0.0] * workers
    for seconds, unit in costed:
        i = min(range(workers), key=lambda j: load[j])
        parts[i] += unit
        load[i] += seconds
    out = []
    for part, size in zip(parts, first_parts(len(items), workers)):
        take = max(0, size - len(part))
        out += part + short[:take]
        short = short[take:]
    return out + short


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`pytest -n N` hands tests out by work stealing unless --dist says otherwise: xdist's default (load) deals the
    first quarter of the items to the workers up front and never moves them, so with the long tests first one
    worker kept a queue of them while the others were idle (H200, -n auto: 15 tests not started at 330 s)."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", None) == "no":
        config.option.dist = "worksteal"


def pytest_collection_modifyitems(config, items):
    # in a worker the option reads as given on the command line ("no" when absent: pytest_cmdline_main above ran in
    # the controller only, which then steals work)
    stealing = config.getoption("dist", "no") in ("no", "worksteal")
    items[:] = dealt(items, _cost, _WORKERS if stealing else 1, one_worker)
    opt_in = pytest.mark.skip(reason="opt-in: select it with -m sanitizer (runs compute-sanitizer, slow)")
    sweep = pytest.mark.skip(reason="opt-in: select it with -m exhaustive (a whole-catalogue sweep of a second kernel "
                                    "path; scripts/gpu_suite.sh runs it)")
    gpu_only = pytest.mark.skip(reason="GPU only: needs the compiled backend (running on Triton's CPU interpreter)")
    for item in items:
        if "sanitizer" in item.keywords and "sanitizer" not in (config.option.markexpr or ""):
            item.add_marker(opt_in)
        elif "exhaustive" in item.keywords and "exhaustive" not in (config.option.markexpr or ""):
            item.add_marker(sweep)
        elif "gpu" in item.keywords and BACKEND != "gpu":
            item.add_marker(gpu_only)



def pytest_sessionstart(session):
    path = os.environ.get("FLASHCHECK_WORKER_LOG")
    if path and BACKEND is not None:
        from flashcheck.cases.backend import describe

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a") as log:
            log.write(f"worker {worker} pid {os.getpid()}: {describe()}\n")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """A sticky CUDA error (illegal address) poisons this process for good: under pytest-xdist the worker exits
    and xdist starts a fresh one; in a plain pytest the session stops with its summary (flashcheck.plugin)."""
    if BACKEND == "gpu":
        from flashcheck.plugin import restart_if_cuda_poisoned

        restart_if_cuda_poisoned(item)


# hypothesis profiles (cases/generate/profiles.py, no torch): dev, ci, thorough; pytest's --hypothesis-profile
# overrides this. Loaded in the controller too, whose header names the profile.
from flashcheck.cases.generate.profiles import load_default_profile, seed_alone  # noqa: E402

load_default_profile()
# the suite's own @given tests draw from their seeds alone too, whatever the tests before them imported (held for
# the session: a context manager left unreferenced is collected, and its exit runs at once)
_SEED_ALONE = seed_alone()
_SEED_ALONE.__enter__()
