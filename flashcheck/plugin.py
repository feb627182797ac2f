"""flashcheck's pytest plugin: the catalogue as ordinary pytest items, for a kernel repository's own test run.

    pytest --flashcheck=my_pkg.attn:forward                     # every catalogue case, one item each
    pytest --flashcheck=my_pkg.attn:forward -n auto             # in parallel (pytest-xdist), one GPU per worker
    pytest --flashcheck=my_pkg.attn:forward --flashcheck-dtypes fp16,bf16 --flashcheck-only partial_last_key_block

Installed, the plugin is registered through the `pytest11` entry point and does nothing at all unless a target
is given: `--flashcheck=MODULE:FUNCTION` or the ini key `flashcheck_target`. (So every import of flashcheck.cases
and torch here is inside the hook that needs it: pytest loads this module in every session, and a session without
a target must not import torch.) Then:

  * the backend is chosen (cases/backend.py select_backend) before any conftest.py is imported, so before
    Triton is, and again in pytest_configure (it is idempotent); under pytest-xdist worker gwN uses GPU
    N mod count;
  * the selection is planned by the engine of `flashcheck verify` (engine.select, engine.plan with its
    skip_reason): the catalogue entries expanded into the declared dtypes, each checked against the
    declarations, the signature and the backend. Each planned case becomes one item,
    `flashcheck::partial_last_key_block[fp16]`, judged in the pytest process with
    cases/verify/judging.judge_case (the oracle's layers, then the properties);
  * outcomes: pass is a pass; fail is a failure whose text is the oracle's report (kind, first bad element,
    got / expected / tolerance, the bug the case guards against, the repro line); a case the engine skips
    (not declared, GPU only, too large) is a pytest skip with its reason; unsupported, inconclusive and
    out of memory are pytest skips whose reason starts with that status and carries the oracle's note;
  * `--flashcheck-examples N` adds one item, `flashcheck::generated_examples`, that runs the engine's generated
    search (cases/verify/generated.py run: N cases within the declarations, every distinct kind of failure
    shrunk to a minimal case) and fails with each minimal case's report;
  * every item carries the marker `flashcheck`: `pytest -m flashcheck` runs only these, `-m "not flashcheck"`
    only the repository's own tests.

Declarations are options generated from cases/declarations.py FIELDS: `--flashcheck-dtypes fp16,bf16`,
`--flashcheck-head-dims 64,128`, `--flashcheck-no-causal`, ... (the `flashcheck verify` flag behind
`--flashcheck-`), and ini keys named after the declaration: `flashcheck_dtypes = fp16,bf16`,
`flashcheck_causal = false`. Command-line options override the ini keys, which override the kernel's own
(flashcheck.declare). Those options are registered once the plugin is active (a target is given), so that a
pytest run without flashcheck never imports torch for them; `pytest --flashcheck=X --help` lists them.

The kernel runs in the pytest process: no per-case timeout (pytest-timeout gives one) and no crash
isolation; `flashcheck verify` has both. A case that leaves a sticky CUDA error (an illegal address) ends its
xdist worker after the item, so that pytest-xdist starts a fresh one; without xdist the session stops there.

Importing this module is cheap: nothing of torch or Triton is imported until the plugin is active.
"""
import inspect
import os
import sys
import time

import pytest

GROUP = "flashcheck"
GENERATED = "generated_examples"
_STATE = pytest.StashKey()
_ADDED = "_flashcheck_declaration_options"   # set on the parser once the declaration options exist


# ---- options ----

def pytest_addoption(parser):
    group = parser.getgroup(GROUP, "flashcheck: verify an attention kernel, one pytest item per catalogue case")
    group.addoption("--flashcheck", dest="flashcheck_target", metavar="MODULE:FUNCTION", default=None,
                    help="judge this attention kernel on flashcheck's catalogue, one item per case "
                         "(flashcheck::NAME); 'path/to/file.py:FUNCTION' works too. With it, the declaration "
                         "options --flashcheck-dtypes, --flashcheck-head-dims, --flashcheck-no-causal, ... "
                         "exist (pytest --flashcheck=X --help lists them)")
    group.addoption("--flashcheck-only", dest="flashcheck_only", action="append", default=[], metavar="NAME[,NAME]",
                    help="only these catalogue cases (an entry, or one instance: name[fp16]); repeatable")
    group.addoption("--flashcheck-exclude", dest="flashcheck_exclude", action="append", default=[],
                    metavar="NAME[,NAME]", help="leave these catalogue cases out (entries or instances); repeatable")
    group.addoption("--flashcheck-case", dest="flashcheck_case", action="append", default=[], metavar="\"Case(...)\"",
                    help="also judge this case, in the catalogue's syntax (a repro line's --case); repeatable; "
                         "without --flashcheck-only the catalogue is then left out")
    group.addoption("--flashcheck-examples", dest="flashcheck_examples", type=int, default=None, metavar="N",
                    help="add one item, flashcheck::generated_examples, judging N generated cases within the "
                         "declarations (each distinct kind of failure shrunk to a minimal case); default 0")
    group.addoption("--flashcheck-shard", dest="flashcheck_shard", default=None, metavar="I/N",
                    help="collect only the I-th of N parts of the cases, as flashcheck verify --shard shares them out "
                         "(a CI job matrix: each job one I)")
    group.addoption("--flashcheck-seed", dest="flashcheck_seed", type=int, default=None, metavar="S",
                    help="draw the generated cases from this seed (default: the same cases every run)")
    group.addoption("--flashcheck-repeat", dest="flashcheck_repeat", type=int, default=None, metavar="N",
                    help="call each case N times on the same inputs: the outputs must agree bitwise")
    group.addoption("--flashcheck-no-properties", dest="flashcheck_properties", action="store_false", default=None,
                    help="judge the oracle's layers only, not the properties after them")
    parser.addini("flashcheck_target", "the attention kernel to judge (MODULE:FUNCTION), as --flashcheck", default="")
    parser.addini("flashcheck_only", "catalogue cases to judge (comma-separated), as --flashcheck-only", default="")
    parser.addini("flashcheck_exclude", "catalogue cases to leave out (comma-separated)", default="")
    parser.addini("flashcheck_examples", "generated cases to judge, as --flashcheck-examples", default="")
    if "torch" in sys.modules:      # declarations cost nothing more now: register them at once
        _add_declaration_options(parser)


def _add_declaration_options(parser):
    """--flashcheck-<flag> and the ini key flashcheck_<name> for every declaration (cases/declarations.py
    FIELDS); imports the declarations (and so torch) on first use."""
    if getattr(parser, _ADDED, False):
        return
    setattr(parser, _ADDED, True)
    from flashcheck.cases.declarations import FIELDS  # lazy: see the module docstring

    group = parser.getgroup(GROUP)
    for f in FIELDS:
        flag = "--flashcheck-" + f.flag[2:]
        if f.metavar is None:
            group.addoption(flag, dest=f"flashcheck_decl_{f.name}", action="store_false" if f.default else "store_true",
                            default=None, help=f.help)
            ini_help = f"{f.help} (true or false; the declaration {f.name})"
        else:
            group.addoption(flag, dest=f"flashcheck_decl_{f.name}", metavar=f.metavar, default=None, help=f.help)
            ini_help = f.help
        parser.addini(f"flashcheck_{f.name}", ini_help, default="")


def _wanted(config):
    """The target (a string) when the plugin is active, else ""."""
    namespace = getattr(config, "known_args_namespace", None)
    given = getattr(config.option, "flashcheck_target", None) or getattr(namespace, "flashcheck_target", None)
    return given or (config.getini("flashcheck_target") or "").strip()


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before any conftest.py is imported (and so before Triton is): with a target, choose the backend and
    register the declaration options; without one, register them only when the ini file names some."""
    if _wanted(early_config):
        _select_backend()
        _add_declaration_options(parser)
    elif any(str(key).startswith("flashcheck_") for key in (getattr(early_config, "inicfg", None) or {})):
        _add_declaration_options(parser)


def _select_backend():
    from flashcheck.cases.backend import BackendError, select_backend  # lazy: see the module docstring

    try:
        return select_backend()
    except BackendError as exc:
        raise pytest.UsageError(f"--flashcheck: {exc}") from None


# ---- configuration ----

def _split(values):
    """Names from repeated comma-separated option values (and ini text, where spaces separate too)."""
    out = []
    for value in values:
        out += [n for n in str(value).replace(" ", ",").replace("\n", ",").split(",") if n]
    return tuple(out)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _declarations(config):
    """The declarations given as options (first) or ini keys: {name: value}, as flashcheck.declare takes them."""
    from flashcheck.cases.declarations import FIELDS  # lazy: see the module docstring

    values = {}
    for f in FIELDS:
        value = getattr(config.option, f"flashcheck_decl_{f.name}", None)
        if value is None:
            try:
                text = (config.getini(f"flashcheck_{f.name}") or "").strip()
            except ValueError:    # not registered: the plugin was loaded after the initial conftests
                continue
            if not text:
                continue
            if f.metavar is None:
                if text.lower() not in _TRUE | _FALSE:
                    raise pytest.UsageError(f"ini key flashcheck_{f.name} = {text!r}: expected true or false")
                value = text.lower() in _TRUE
            else:
                value = text
        values[f.name] = value
    return values


def _int_ini(config, key):
    text = (config.getini(key) or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise pytest.UsageError(f"ini key {key} = {text!r}: not a whole number") from None


class _State:
    """One target's plan and judging, per pytest process (each xdist worker has its own)."""

    def __init__(self, config, target):
        self.target = target
        option = config.option
        only = _split(option.flashcheck_only) or _split([config.getini("flashcheck_only")])
        exclude = _split(option.flashcheck_exclude) or _split([config.getini("flashcheck_exclude")])
        examples = option.flashcheck_examples
        if examples is None:
            examples = _int_ini(config, "flashcheck_examples") or 0
        options = dict(only=only, exclude=exclude, cases=tuple(option.flashcheck_case), examples=examples,
                       seed=option.flashcheck_seed, isolate=False, progress=False, shard=option.flashcheck_shard)
        if option.flashcheck_repeat is not None:
            options["repeat"] = option.flashcheck_repeat
        if option.flashcheck_properties is not None:
            options["properties"] = option.flashcheck_properties
        from flashcheck.cases.declarations import DeclarationError, Declarations  # lazy: see the module docstring
        from flashcheck.cases.runner.target import TargetError, split_target  # lazy: see the module docstring
        from flashcheck.cases.verify import engine, shard  # lazy: see the module docstring

        declarations = _declarations(config)
        try:
            split_target(target)
            Declarations.make(**declarations)        # bad values are usage errors at once, not per item
            self.request = engine.request(target, **declarations, **options)
            self.shard = shard.parse(self.request.shard)
        except (engine.UsageError, TargetError, DeclarationError) as exc:
            raise pytest.UsageError(f"--flashcheck: {exc}") from None
        if examples < 0:
            raise pytest.UsageError(f"--flashcheck-examples must be >= 0, got {examples}")
        if self.request.repeat < 1:
            raise pytest.UsageError(f"--flashcheck-repeat must be >= 1, got {self.request.repeat}")
        self.runner = None

    def open(self):
        """Load the kernel in this process and plan the cases: [(case, origin, reason, group)].
        Raises the engine's UsageError or TargetError (a collection error)."""
        from flashcheck.cases.backend import backend  # lazy: see the module docstring
        from flashcheck.cases.runner.worker import InProcess  # lazy: see the module docstring
        from flashcheck.cases.verify import engine  # lazy: see the module docstring
        from flashcheck.cases.verify.judging import Settings, judges_backward  # lazy: see the module docstring

        req = self.request
        self.backend = backend()
        selected, instance_names, excluded = engine.select(req)
        self.runner = InProcess()
        self.info = self.runner.open(req.target)
        self.kernel = self.runner.target
        self.decl = engine._declarations(self.info, req.declarations)
        # the probed features and the protocol, as verify finds them
        self.info, selected = engine.prepare(req, self.runner, self.info, self.decl, self.backend, selected,
                                             req.examples or 0)
        self.decl = engine.with_probed(self.decl, self.info)
        self.declared = engine.declared_flags(self.decl)      # what the capabilities line shows as declared
        self.settings = Settings(target=req.target, decl=self.decl, properties=req.properties, repeat=req.repeat,
                                 backward=judges_backward(self.info))
        return engine.plan(selected, instance_names, excluded, self.decl, self.info, self.backend, req.max_memory)

    def judge(self, case):
        from flashcheck.cases.verify.judging import judge_case  # lazy: see the module docstring

        t0 = time.perf_counter()
        verdict = judge_case(self.kernel, case, self.settings)
        verdict.seconds = verdict.seconds or time.perf_counter() - t0
        return verdict

    def location(self):
        """(path, 0-based line) of the kernel's source, where reports point (the repository root if unknown)."""
        try:
            fn = inspect.unwrap(self.kernel)
            return inspect.getsourcefile(fn), inspect.getsourcelines(fn)[1] - 1
        except (TypeError, OSError, AttributeError):
            return str(self.root), 0


def pytest_configure(config):
    target = _wanted(config)
    if not target:
        return
    _select_backend()        # again (idempotent): conftest.py files may have run since
    config.addinivalue_line("markers", "flashcheck: a case of flashcheck's catalogue judged by the flashcheck plugin")
    state = _State(config, target)
    state.root = config.rootpath
    config.stash[_STATE] = state


# ---- collection ----

class CaseFailed(Exception):
    """The oracle failed this case (carries the Verdict)."""

    def __init__(self, verdict):
        super().__init__(verdict.report())
        self.verdict = verdict


class GeneratedFailed(Exception):
    """The generated search found failures (carries their report)."""


def _skip(reason):
    """A skip located at the kernel (the item), as a skip mark's is, rather than inside this plugin."""
    try:
        raise pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:    # a pytest without that keyword
        pytest.skip(reason)


class CaseItem(pytest.Item):
    """One planned case of the catalogue (or of --flashcheck-case)."""

    def __init__(self, *, case, origin, state, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.origin = origin
        self.state = state
        self.verdict = None

    def runtest(self):
        self.verdict = verdict = self.state.judge(self.case)
        self.user_properties.append(("flashcheck_status", verdict.status))
        if verdict.failed:
            raise CaseFailed(verdict)
        if verdict.status != "pass":
            _skip(f"{verdict.status}: {verdict.note}" if verdict.note else verdict.status)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return excinfo.value.verdict.report()
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        path, line = self.state.location()
        return path, line, f"flashcheck::{self.name}"


class GeneratedItem(pytest.Item):
    """The engine's generated search (cases/verify/generated.py): one item for all of it."""

    def __init__(self, *, state, examples, **kwargs):
        super().__init__(**kwargs)
        self.state = state
        self.examples = examples

    def runtest(self):
        from flashcheck.cases import report  # lazy: see the module docstring
        from flashcheck.cases.verify import generated  # lazy: see the module docstring

        state = self.state
        req = state.request
        run = report.Run(req.target, state.info["describe"], state.info["caps"], declared=state.declared)
        progress = report.Progress(self.examples, enabled=False)
        try:
            generated.run(self.examples, req.seed, state.decl, state.info, state.backend, state.judge, run,
                          run.results.append, progress, 0, the_shard=state.shard)
        except ImportError as exc:
            raise GeneratedFailed(f"--flashcheck-examples needs hypothesis ({exc}): pip install "
                                  "'flashcheck[test]'") from None
        notes = "\n".join(run.notes)
        failures = [r for r in run.results if r.status == "fail"]
        if failures:
            raise GeneratedFailed("\n\n".join([notes] + [r.verdict.report() for r in failures]))
        if notes:
            self.add_report_section("call", "flashcheck", notes)
        if not run.count("pass"):
            _skip(f"no generated case passed or failed: {notes}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, GeneratedFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        path, line = self.state.location()
        return path, line, f"flashcheck::{self.name}"


class Collector(pytest.Collector):
    """flashcheck: the planned cases of the target, then the generated search."""

    def __init__(self, *, state, **kwargs):
        super().__init__(**kwargs)
        self.state = state

    def collect(self):
        state = self.state
        planned = state.open()
        from flashcheck.cases.verify import shard  # lazy: see the module docstring

        items = []
        for case, origin, reason, group in planned:
            if not shard.owns(state.shard, case.name):
                continue
            item = CaseItem.from_parent(self, name=case.name, case=case, origin=origin, state=state)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
            items.append(item)
        if state.request.examples:
            items.append(GeneratedItem.from_parent(self, name=GENERATED, state=state,
                                                   examples=state.request.examples))
        return items

    def repr_failure(self, excinfo, style=None):
        from flashcheck.cases.runner.target import TargetError  # lazy: see the module docstring
        from flashcheck.cases.verify.engine import UsageError  # lazy: see the module docstring

        if isinstance(excinfo.value, (UsageError, TargetError)):
            return f"flashcheck: {self.state.target}: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.state.root, None, f"flashcheck {self.state.target}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Add the cases (before -k, -m and --deselect filter the items, which run after this)."""
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    collector = Collector.from_parent(session, name=GROUP, nodeid=GROUP, state=state)
    collector.add_marker(pytest.mark.flashcheck)
    report = collector.ihook.pytest_make_collect_report(collector=collector)
    session.ihook.pytest_collectreport(report=report)
    if report.passed:
        items.extend(report.result)


def pytest_report_header(config):
    state = config.stash.get(_STATE, None)
    if state is None:
        return None
    from flashcheck.cases.backend import describe  # lazy: see the module docstring

    return f"flashcheck plugin: {state.target} on {describe()}"


# ---- a sticky CUDA error ends the process ----

def cuda_poisoned():
    """The text of a sticky CUDA error in this process (an illegal address poisons it for good), or None."""
    if "torch" not in sys.modules:
        return None
    import torch  # lazy: see the module docstring

    if not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
    except Exception as exc:  # noqa: BLE001  (a sticky error surfaces on the next CUDA call, as any type)
        return f"{type(exc).__name__}: {exc}"
    return None


def restart_if_cuda_poisoned(item):
    """After a test that left a sticky CUDA error: under pytest-xdist, end this worker (xdist starts a fresh one
    and the run goes on); in a plain pytest, stop the session (every later CUDA call would fail). Shared with
    the repository's conftest.py. Returns the error text, or None when CUDA is fine."""
    poisoned = cuda_poisoned()
    if not poisoned:
        return None
    first = poisoned.splitlines()[0]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        sys.stderr.write(f"\nflashcheck: {item.nodeid} left the CUDA context unusable ({first}); restarting this "
                         "worker\n")
        sys.stderr.flush()
        os._exit(3)
    item.session.shouldstop = (f"flashcheck: {item.nodeid} left the CUDA context unusable ({first}); the tests "
                               "after it cannot use the GPU in this process (pytest -n N restarts a worker instead)")
    return poisoned


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if isinstance(item, (CaseItem, GeneratedItem)) and os.environ.get("FLASHCHECK_BACKEND") == "gpu":
        restart_if_cuda_poisoned(item)
