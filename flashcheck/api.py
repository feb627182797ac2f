"""flashcheck from Python: the engine of `flashcheck verify` as a function, and an assertion for a kernel's own
tests (docs/api.md).

    report = flashcheck.verify("my_pkg.attn:forward", dtypes="fp16,bf16", head_dims="64,128")
    print(report)                 # the text report, as `flashcheck verify` prints it
    assert report.passed, report.summary

    def test_attention_is_right():
        flashcheck.assert_attention(forward, ["partial_last_key_block", "causal_square[fp16]"])

Both run cases/verify/engine.py (request() then run()), the same engine as the command and the pytest plugin:
nothing is judged differently here. Errors in the request (an unknown option, a bad declaration, a target that
cannot be imported) raise flashcheck.UsageError (flashcheck.TargetError, a subclass, for the target), with the
message the command prints.

The backend (the GPU, or Triton's interpreter on the CPU) is chosen by flashcheck.cases.backend.select_backend()
before anything is run; it must be chosen before Triton is first imported, so in a test suite that imports
Triton kernels at the top of its modules, call flashcheck.select_backend() first (in conftest.py), or use the
pytest plugin, which does.
"""
import warnings

from flashcheck.cases import report
from flashcheck.cases.backend import BackendError, select_backend
from flashcheck.cases.case import Case
from flashcheck.cases.report import files
from flashcheck.cases.runner.target import TargetError as _RunnerTargetError
from flashcheck.cases.verify import engine
from flashcheck.cases.verify.engine import UsageError

__all__ = ["verify", "assert_attention", "Report", "UsageError", "TargetError", "NotJudgedWarning"]


class TargetError(UsageError, _RunnerTargetError):
    """The kernel cannot be used: a bad MODULE:FUNCTION, a file or module that does not import, not callable,
    a signature that cannot take (q, k, v). A UsageError, so one `except flashcheck.UsageError` catches every
    request that cannot run."""


class NotJudgedWarning(UserWarning):
    """assert_attention passed, but some selected cases were not judged here (GPU only, too large,
    inconclusive, out of memory): the warning lists them with the reason."""


class Report:
    """The outcome of flashcheck.verify(): a thin view of the engine's Run (flashcheck.cases.report.Run).

    results    every case's Result (.case, .status, .verdict, .reason), in the order judged
    passed     True when the run's exit status is 0: a case passed and none failed
    exit_code  what `flashcheck verify` exits with: 0 passed, 1 a case failed, 2 nothing judged
    summary    the summary line
    failures   the results whose status is "fail"
    run        the engine's Run itself
    str(report) is the text report the command prints (table, failures in full, notes, summary).
    """

    def __init__(self, run):
        self.run = run

    @property
    def target(self):
        return self.run.target

    @property
    def results(self):
        return self.run.results

    @property
    def exit_code(self):
        return self.run.exit_code()

    @property
    def passed(self):
        return self.exit_code == 0

    @property
    def failures(self):
        return [r for r in self.run.results if r.status == "fail"]

    @property
    def summary(self):
        return report.summary(self.run)

    def count(self, status):
        """How many cases ended with this status ("pass", "fail", "inconclusive", "unsupported",
        "out of memory", "skip")."""
        return self.run.count(status)

    def to_dict(self):
        """The JSON record (the document write_json writes)."""
        return files.to_dict(self.run)

    def write_json(self, path):
        files.write_json(self.run, str(path))

    def write_junit(self, path):
        files.write_junit(self.run, str(path))

    def text(self, quiet=False):
        """The text report of `flashcheck verify` (quiet: only the failures and the closing lines, as -q)."""
        return report.text(self.run, quiet)

    def __str__(self):
        return self.text()

    def __repr__(self):
        return f"<flashcheck.Report exit_code={self.exit_code}: {self.summary}>"


def _select_backend():
    try:
        return select_backend()
    except BackendError as exc:
        raise UsageError(str(exc)) from None


def _run(target, options):
    """engine.request(target, **options), then engine.run, with errors raised as flashcheck's own types."""
    if not (isinstance(target, str) or callable(target)):
        raise UsageError(f"the kernel must be a callable or a 'MODULE:FUNCTION' string, got {type(target).__name__}")
    _select_backend()

    options.setdefault("progress", False)
    req = engine.request(target, **options)
    try:
        return Report(engine.run(req))
    except _RunnerTargetError as exc:
        if isinstance(exc, UsageError):
            raise
        raise TargetError(str(exc)) from None


def verify(fn, **options):
    """Verify an attention kernel; returns a Report. The same engine as `flashcheck verify`.

    fn: the kernel, a callable or "MODULE:FUNCTION" / "path/to/file.py:FUNCTION". A callable that has an
    importable module:qualname is judged like its name, in a worker process (isolate=True, the default) with a
    timeout per case; a lambda, a closure or a function of __main__ is judged in this process.

    options: the declarations (dtypes, head_dims, causal, causal_align, causal_same_length, causal_only, same_length,
    nk_ge_nq, seq_multiple, min_seq, max_seq, max_seq_q, strides, fp32_scores, fused, gqa, dv, head_map, empty_lse, paged_q,
    window_count, lse_layout, lse_base, nan_stays_in_row: as flashcheck.declare takes them; they override the
    kernel's own) and the options of a run: only, keyword, exclude, cases, examples, seed, repeat, sanitize,
    properties, timeout, isolate, jobs (cases judged at once, each in its own worker process; needs an importable
    kernel), max_failures, max_memory (bytes), json, junit, html, progress (default False here).
    As on the command line, examples defaults to 25 with the whole catalogue and to 0 with only/keyword/cases.

    Raises UsageError (TargetError for the kernel) when the request cannot run; a run interrupted by Ctrl-C
    returns the partial report (its summary says "stopped early: interrupted").
    """
    return _run(fn, dict(options))


def _select(cases):
    """(catalogue names, Case objects or source texts) from assert_attention's `cases`."""
    items = [cases] if isinstance(cases, (str, Case)) else list(cases)
    if not items:
        raise UsageError("assert_attention: cases is empty: give case names, Case objects or their text, or leave "
                         "it out for the whole catalogue")
    names, objects = [], []
    for item in items:
        if isinstance(item, Case):
            objects.append(item)
        elif isinstance(item, str) and item.strip().startswith("Case("):
            objects.append(item)
        elif isinstance(item, str):
            names.append(item)
        else:
            raise UsageError(f"assert_attention: a case is a catalogue name, a Case or its text, got "
                             f"{type(item).__name__}")
    return names, objects


def assert_attention(fn, cases=None, *, strict=False, **options):
    """Assert that an attention kernel is right on catalogue cases, for a kernel's own test suite.

    fn: as for verify(). cases: one case or a list: catalogue names ("partial_last_key_block", every declared
    dtype of it, or "partial_last_key_block[fp16]", one), Case objects, or their text ("Case('x', Nq=3, ...)");
    None (the default): the whole catalogue. options: as for verify(); here isolate=False (the kernel runs in
    this process) and examples=0 unless given.

    The rule, case by case:
      pass                       silent
      skipped by declaration     silent (outside what the kernel declares: flashcheck.declare or the options)
      fail                       AssertionError
      unsupported                AssertionError: the kernel declined (Unsupported / NotImplementedError) an
                                 input inside its declarations; declare the limit to make it a skip
      GPU only, too large,       not judged here: one NotJudgedWarning lists them (never silent, never a
      inconclusive, out of mem.  pass); strict=True makes them AssertionErrors too
    The AssertionError's message has, for every case that did not pass, the oracle's text: the kind, the first
    bad element, got / expected / tolerance, the bug the case guards against and the repro line; then the
    summary line. Returns the Report (None when every selected case was skipped by declaration).
    """
    options = dict(options)
    if cases is not None:
        names, objects = _select(cases)
        only = options.pop("only", ())
        only = (only,) if isinstance(only, str) else tuple(only)
        options["only"] = only + tuple(names)
        options["cases"] = tuple(objects)
    options.setdefault("isolate", False)
    options.setdefault("examples", 0)
    try:
        report = _run(fn, options)
    except UsageError as exc:
        if not hasattr(exc, "skipped"):    # engine.NothingToVerify: every selected case is skipped
            raise
        skipped = [f"  {name}: {reason}" for name, reason in exc.skipped]
        # the engine refuses a run in which every selected case is skipped; case by case, the rule holds
        other = [line for line in skipped if not line.split(": ", 1)[-1].startswith("not declared: ")]
        if other and strict:
            raise AssertionError(f"Attention kernel {_target_name(fn)}: no selected case could be judged here:\n"
                                 + "\n".join(other)) from None
        if other:
            warnings.warn(NotJudgedWarning(f"{len(other)} selected case(s) were not judged for "
                                           f"{_target_name(fn)} (not counted as passed):\n" + "\n".join(other)),
                          stacklevel=2)
        return None
    if report.run.stopped == "interrupted":
        raise KeyboardInterrupt
    not_judged = [r for r in report.results
                  if r.status in ("inconclusive", "out of memory")
                  or (r.status == "skip" and r.skip_group != "not declared")]
    failed = [r for r in report.results if r.status in ("fail", "unsupported")]
    if strict:
        failed += not_judged
        not_judged = []
    if failed:
        kinds = sorted({str(r.verdict.kind) for r in failed if r.status == "fail"})
        head = (f"Attention kernel {report.target} is not right: {len(failed)} of {len(report.results)} selected "
                f"case(s) did not pass" + (f" ({', '.join(kinds)})" if kinds else "") + ":")
        blocks = []
        for r in failed:
            if r.status == "fail":
                blocks.append(r.verdict.report())
            elif r.status == "unsupported":
                blocks.append(f"{r.verdict.report()}\n  the kernel declined an input inside its declarations: "
                              f"declare the limit (flashcheck.declare) to skip such cases\n"
                              f"  repro: {r.verdict.repro()}")
            else:
                blocks.append("NOT JUDGED " + _not_judged_line(r))
        raise AssertionError("\n\n".join([head, *blocks, report.summary]))
    if not_judged:
        lines = "\n".join("  " + _not_judged_line(r) for r in not_judged)
        warnings.warn(NotJudgedWarning(f"{len(not_judged)} selected case(s) were not judged for {report.target} "
                                       f"(not counted as passed):\n{lines}"), stacklevel=2)
    return report


def _not_judged_line(result):
    if result.status == "skip":
        return f"{result.case.name}: {result.reason}"
    return f"{result.case.name}: {result.status}: {result.verdict.note}"


def _target_name(fn):
    return engine._name(fn)
