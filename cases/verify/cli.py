"""`flashcheck verify [MODULE:FUNCTION]`: the catalogue, the oracle and the properties applied to any
attention kernel that follows the protocol of DESIGN.md:

    attention(q, k, v, *, causal=False, scale=None) -> out      (optionally out=, return_lse=)

The kernel is imported from MODULE (importable) or from a .py file, and judged case by case in a worker
process (cases/isolate.py), so that a hang or a crash is one named failure and the next case still runs.
What the kernel's signature accepts is discovered (out=, return_lse=); what it does not support is
declared by flags, and the cases outside that support are listed as skipped with the reason.

Exit status: 0 every case that ran passed; 1 a case failed; 2 usage or import error, or nothing to run.
Nothing here imports Triton or the kernel before run(): the backend is chosen after argument parsing.
"""
import argparse
import importlib.util
import os
import sys
import time

DEFAULT_TARGET = "flashcheck.kernel.fused:attention"
DEFAULT_TIMEOUT = {"cpu": 120.0, "gpu": 60.0}   # seconds per case; the interpreter is much slower
DEFAULT_EXAMPLES = 25   # hypothesis cases judged after the whole catalogue (derandomized: the same every run)
_DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16",
                "bf16": "bf16", "bfloat16": "bf16"}


class UsageError(Exception):
    pass


def add_arguments(parser):
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("examples:\n"
                     "  flashcheck verify                                   the project's fused kernel\n"
                     "  flashcheck verify examples/sdpa_attention.py:attention\n"
                     "  flashcheck verify my_pkg.attn:forward --no-causal --dtypes fp16,bf16 --head-dims 64,128\n"
                     "  flashcheck verify my_pkg.attn:forward --case \"Case('x', Nq=1, Nk=2, D=16)\"")
    parser.add_argument("target", nargs="?", default=DEFAULT_TARGET, metavar="MODULE:FUNCTION",
                        help=f"the kernel: an importable module or a path to a .py file, and the function "
                             f"(default {DEFAULT_TARGET})")
    sel = parser.add_argument_group("which cases")
    sel.add_argument("--only", action="append", default=[], metavar="NAME[,NAME]",
                     help="run only these catalogue cases (repeatable)")
    sel.add_argument("-k", dest="keyword", action="append", default=[], metavar="SUBSTRING",
                     help="run only the catalogue cases whose name contains SUBSTRING (repeatable or "
                          "comma-separated: any of them)")
    sel.add_argument("--case", dest="cases", action="append", default=[], metavar="\"Case(...)\"",
                     help="run this case, in the catalogue's syntax (as a failure's repro line prints it); "
                          "repeatable; without --only/-k the catalogue is not run")
    sel.add_argument("--examples", type=int, metavar="N",
                     help="also judge N hypothesis-generated cases within the declared support (the first "
                          f"failure is shrunk to a minimal case); default {DEFAULT_EXAMPLES} with the whole "
                          "catalogue, 0 with --only/-k/--case, 0 to judge the catalogue alone")
    sel.add_argument("--seed", type=int, metavar="S",
                     help="draw the hypothesis examples from this seed (default: the same examples every run)")
    dec = parser.add_argument_group("what the kernel supports (cases outside it are skipped, never passed)")
    dec.add_argument("--no-causal", action="store_true", help="the kernel has no causal mode")
    dec.add_argument("--dtypes", metavar="LIST", help="supported dtypes, e.g. fp16,bf16 (default: all)")
    dec.add_argument("--head-dims", metavar="LIST",
                     help="supported head dims: values and ranges, e.g. 64,128 or 1-128 or 16-64,128")
    dec.add_argument("--max-seq", type=int, metavar="N", help="longest supported Nq and Nk")
    dec.add_argument("--contiguous-only", action="store_true",
                     help="the kernel needs contiguous (B, H, N, D) inputs")
    out = parser.add_argument_group("running and reporting")
    out.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="per-case limit, after which the case fails as 'timeout' (default 120 on CPU, 60 on GPU)")
    out.add_argument("--no-isolate", action="store_true",
                     help="judge in this process (for debugging: no timeout, a crash ends the run)")
    out.add_argument("--json", metavar="PATH", help="write the results as JSON")
    out.add_argument("--junit", metavar="PATH", help="write the results as JUnit XML (one testcase per case)")
    out.add_argument("-q", "--quiet", action="store_true",
                     help="print only the failures and the summary line, no table and no progress")


class Support:
    """What the kernel declares it supports (flags); everything else is skipped with the reason."""

    def __init__(self, args):
        self.causal = not args.no_causal
        self.dtypes = _parse_dtypes(args.dtypes) if args.dtypes else None
        self.head_dims = _parse_ranges(args.head_dims) if args.head_dims else None
        if args.max_seq is not None and args.max_seq < 1:
            raise UsageError(f"--max-seq must be >= 1, got {args.max_seq}")
        self.max_seq = args.max_seq
        self.contiguous_only = args.contiguous_only
        self.flags = ((["--no-causal"] if args.no_causal else [])
                      + ([f"--dtypes {args.dtypes}"] if args.dtypes else [])
                      + ([f"--head-dims {args.head_dims}"] if args.head_dims else [])
                      + ([f"--max-seq {args.max_seq}"] if args.max_seq is not None else [])
                      + (["--contiguous-only"] if args.contiguous_only else []))

    def head_dim_ok(self, d):
        return self.head_dims is None or any(lo <= d <= hi for lo, hi in self.head_dims)

    def reasons(self, case):
        """Why the declarations exclude this case (empty when they do not)."""
        why = []
        if case.causal and not self.causal:
            why.append("causal (--no-causal)")
        if self.dtypes is not None and case.dtype not in self.dtypes:
            why.append(f"dtype {case.dtype} (--dtypes {','.join(self.dtypes)})")
        if not self.head_dim_ok(case.D):
            why.append(f"head dim {case.D} (--head-dims {_ranges_text(self.head_dims)})")
        if self.max_seq is not None and max(case.Nq, case.Nk) > self.max_seq:
            why.append(f"length {max(case.Nq, case.Nk)} > --max-seq {self.max_seq}")
        if self.contiguous_only and case.layout != "contiguous":
            why.append(f"layout {case.layout} (--contiguous-only)")
        return why


def _parse_dtypes(text):
    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in _DTYPE_NAMES]
    if bad or not names:
        raise UsageError(f"--dtypes {text!r}: expected a list of fp32, fp16, bf16")
    return list(dict.fromkeys(_DTYPE_NAMES[x] for x in names))


def _parse_ranges(text):
    ranges = []
    for part in (x.strip() for x in text.split(",")):
        lo, sep, hi = part.partition("-")
        try:
            lo, hi = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise UsageError(f"--head-dims {text!r}: {part!r} is not a number or a range like 1-128") from None
        if lo < 1 or hi < lo:
            raise UsageError(f"--head-dims {text!r}: {part!r} is not a range of head dims >= 1")
        ranges.append((lo, hi))
    return ranges


def _ranges_text(ranges):
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def skip_reason(case, support, backend):
    """(reason, group) when this case cannot be judged here, else ("", "")."""
    declared = support.reasons(case)
    if declared:
        return "not declared: " + "; ".join(declared), "not declared"
    if case.gpu_only and backend != "gpu":
        return f"GPU only: {case.gpu_only}", "GPU only"
    return "", ""


def select_cases(args):
    """[(case, origin)] from --only, -k and --case (the whole catalogue when none is given)."""
    from flashcheck.cases import catalogue
    from flashcheck.cases.case import parse_case

    picked = []
    names = [n.strip() for text in args.only for n in text.split(",") if n.strip()]
    keywords = [k.strip() for text in args.keyword for k in text.split(",") if k.strip()]
    unknown = [n for n in names if n not in catalogue.BY_NAME]
    if unknown:
        raise UsageError(f"--only: no catalogue case named {', '.join(unknown)} (see `flashcheck cases`)")
    if names or keywords or not args.cases:
        for c in catalogue.CATALOGUE:
            if (not names and not keywords) or c.name in names or any(k in c.name for k in keywords):
                picked.append((c, "catalogue"))
        if not picked:
            raise UsageError(f"-k {','.join(keywords)}: no catalogue case name contains any of it")
    for text in args.cases:
        try:
            picked.append((parse_case(text), "--case"))
        except (ValueError, SyntaxError, TypeError) as exc:
            raise UsageError(f"--case {text!r}: {exc}") from None
    return picked


def _resolve_examples(args):
    """--examples as given; by default DEFAULT_EXAMPLES after the whole catalogue (cases no one wrote down
    catch the bugs no one thought of), none after a selection of cases or without hypothesis."""
    if args.examples is not None:
        return args.examples
    if args.only or args.keyword or args.cases:
        return 0
    if importlib.util.find_spec("hypothesis") is None:
        print(f"flashcheck verify: hypothesis is not installed: the {DEFAULT_EXAMPLES} generated cases are "
              "skipped, the catalogue alone is judged (pip install hypothesis)", file=sys.stderr)
        return 0
    return DEFAULT_EXAMPLES


def _check_examples(n):
    if n < 0:
        raise UsageError(f"--examples must be >= 0, got {n}")
    if n and importlib.util.find_spec("flashcheck.cases.generate.strategies") is None:
        raise UsageError("--examples needs the hypothesis strategies of cases/strategies.py, which this "
                         "installation does not have")


def run(args):
    from flashcheck.cases import report
    from flashcheck.cases.backend import backend as active_backend
    from flashcheck.cases.runner.isolate import InProcess, TargetError, Worker, split_target

    t0 = time.perf_counter()
    backend = active_backend()
    try:
        split_target(args.target)
        support = Support(args)
        selected = select_cases(args)
        args.examples = _resolve_examples(args)
        _check_examples(args.examples)
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError(f"--timeout must be > 0, got {args.timeout}")
        for flag, path in (("--json", args.json), ("--junit", args.junit)):
            # checked now: a run can take minutes, and its results must not be lost at the end
            if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
                raise UsageError(f"{flag} {path}: its directory does not exist")
    except (UsageError, TargetError) as exc:
        return _usage(exc)
    plan = []   # in catalogue order: a Result for a skipped case, (case, origin) for one to judge
    for case, origin in selected:
        reason, group = skip_reason(case, support, backend)
        plan.append(report.Result(case, "skip", reason=reason, skip_group=group, origin=origin) if reason
                    else (case, origin))
    todo = sum(not isinstance(p, report.Result) for p in plan)
    if not todo and not args.examples:
        # a run that judges nothing must not look like a pass
        reasons = "".join(f"\n  {r.case.name}: {r.reason}" for r in plan)
        print(f"flashcheck verify: nothing to verify: every selected case is skipped on {backend}:{reasons}",
              file=sys.stderr)
        return 2
    timeout = args.timeout or DEFAULT_TIMEOUT[backend]
    runner = InProcess(args.target) if args.no_isolate else Worker(args.target, timeout)
    try:
        try:
            info = runner.start()
        except TargetError as exc:
            return _usage(exc)
        run_ = report.Run(args.target, info["describe"], info["caps"], declared=support.flags)
        progress = report.Progress(todo + args.examples, enabled=not args.quiet)
        n = 0
        for item in plan:
            if isinstance(item, report.Result):
                run_.results.append(item)
                continue
            case, origin = item
            n += 1
            progress.start(n, case.name)
            verdict = runner.judge(case)
            result = report.Result(case, "pass" if verdict.passed else "fail", verdict, origin=origin)
            progress.finish(result)
            run_.results.append(result)
        if args.examples:
            _run_examples(args.examples, args.seed, support, backend, runner, run_, progress, n)
        progress.close()
    except KeyboardInterrupt:
        print("flashcheck verify: interrupted", file=sys.stderr)
        return 130
    finally:
        runner.close()
    run_.seconds = time.perf_counter() - t0
    return _finish(run_, args)


def _finish(run_, args):
    from flashcheck.cases import report

    if not args.quiet:
        print(report.capabilities_line(run_))
        print()
        print(report.table(run_))
        print()
    failures = report.details(run_)
    if failures:
        print(failures)
        print()
    for line in report.reduced_lines(run_) + run_.notes + report.kinds_line(run_):
        print(line)
    print(report.summary(run_))
    if args.json:
        report.write_json(run_, args.json)
    if args.junit:
        report.write_junit(run_, args.junit)
    if run_.count("fail"):
        return 1
    if not run_.count("pass"):
        print("flashcheck verify: nothing was verified: no case passed or failed", file=sys.stderr)
        return 2
    return 0


def _usage(exc):
    print(f"flashcheck verify: error: {exc}", file=sys.stderr)
    return 2


class _Falsified(Exception):
    """Raised inside the hypothesis property: this example's verdict failed."""


def _run_examples(count, seed, support, backend, runner, run_, progress, n):
    """Judge `count` hypothesis-generated cases within the declared support; the first failure is shrunk
    to a minimal case, which is reported (with its repro) instead of every shrinking step."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as seeded
    from hypothesis.errors import Flaky

    from flashcheck.cases import report
    from flashcheck.cases.generate import strategies

    dtypes = tuple(d for d in strategies.limits(backend).dtypes if support.dtypes is None or d in support.dtypes)
    if not dtypes:
        run_.notes.append(f"hypothesis: no examples: the declared dtypes ({', '.join(support.dtypes)}) cannot "
                          f"be judged on this backend ({backend})")
        return
    strategy = strategies.cases(
        causal=None if support.causal else False, dtypes=dtypes,
        layouts=("contiguous",) if support.contiguous_only else None, max_len=support.max_seq,
        head_dim_ok=support.head_dim_ok if support.head_dims else None, backend=backend,
        pin_blocks=run_.caps.blocks)   # block pins only reach a kernel that accepts them
    failing, passed = [], []

    def prop(case):
        progress.start(n + len(passed) + 1, f"shrinking a failing example (step {len(failing)})" if failing
                       else f"hypothesis example {len(passed) + 1}")
        verdict = runner.judge(case)
        if not verdict.passed:
            failing.append(verdict)
            raise _Falsified()
        if not failing:   # after the first failure, passing runs are shrinking steps, not examples
            passed.append(verdict)

    # quiet: hypothesis would print its own report into ours; no explain phase: it re-runs examples
    test = settings(max_examples=count, deadline=None, database=None, derandomize=seed is None,
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False,
                    phases=(Phase.explicit, Phase.generate, Phase.shrink),
                    verbosity=Verbosity.quiet)(given(strategy)(prop))
    if seed is not None:
        test = seeded(seed)(test)
    try:
        test()
    except (_Falsified, Flaky):
        pass
    for i, verdict in enumerate(passed, 1):
        verdict.case = verdict.case.replace(name=_example_name(f"hypothesis_{i}", verdict.case))
        run_.results.append(report.Result(verdict.case, "pass", verdict, origin="hypothesis"))
    if failing:
        # hypothesis replays the minimal failing example last
        minimal = failing[-1]
        minimal.case = minimal.case.replace(name=_example_name("hypothesis_minimal", minimal.case))
        run_.results.append(report.Result(minimal.case, "fail", minimal, origin="hypothesis"))
        run_.notes.append(f"hypothesis: {len(passed)} example(s) passed, then one failed; shrunk to "
                          f"{minimal.case.name} ({len(failing)} failing runs in all)")
    else:
        run_.notes.append(f"hypothesis: {len(passed)} example(s), all passed" + (
            "" if seed is None else f" (--seed {seed})"))


def _example_name(prefix, case):
    """A generated case's name that says its shape, so that the table reads without the JSON."""
    return (f"{prefix}_{case.B}x{case.H}x{case.Nq}x{case.Nk}x{case.D}_{case.dtype}"
            + ("_causal" if case.causal else "") + ("" if case.layout == "contiguous" else f"_{case.layout}"))
