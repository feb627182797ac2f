"""`flashcheck verify [MODULE:FUNCTION]`: the catalogue, the oracle and the properties applied to any attention
kernel that follows the protocol (docs/design.md):

    attention(q, k, v, *, causal=False, scale=None) -> out      (optionally out=, return_lse=)

The kernel is imported from MODULE (importable) or from a .py file, and judged case by case in a worker
process (cases/runner/worker.py), so that a hang or a crash is one named failure and the next case still runs.
What the kernel's signature accepts is discovered (out=, return_lse=, causal=, scale=); its documented limits
are declared, by the flags below or by the kernel itself (flashcheck.declare), and the cases outside them are
listed as skipped with the reason.

Exit status: 0 every judged case passed; 1 a case failed; 2 a usage or import error, or nothing judged.
Nothing here imports torch, Triton or the kernel before run(): the backend is chosen after argument parsing, and
`--help` or a usage error that argparse finds answers at once (importing torch takes seconds on some machines).
"""
import argparse
import sys
import traceback

from flashcheck.cases.declarations import FIELDS
from flashcheck.cases.errors import UsageError
from flashcheck.cases.verify.defaults import DEFAULT_EXAMPLES, DEFAULT_TARGET, MAX_AUTO_JOBS


def add_arguments(parser):
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("examples:\n"
                     "  flashcheck verify                                   the project's fused kernel\n"
                     "  flashcheck verify examples/sdpa_attention.py:attention\n"
                     "  flashcheck verify my_pkg.attn:forward --dtypes fp16,bf16 --head-dims 64,128 --seq-multiple 128\n"
                     "  flashcheck verify my_pkg.attn:forward --case \"Case('x', Nq=1, Nk=2, D=16)\"")
    parser.add_argument("target", nargs="?", default=DEFAULT_TARGET, metavar="MODULE:FUNCTION",
                        help=f"the kernel: an importable module or a path to a .py file, and the function "
                             f"(default {DEFAULT_TARGET})")
    sel = parser.add_argument_group("which cases")
    sel.add_argument("--only", action="append", default=[], metavar="NAME[,NAME]",
                     help="run only these catalogue cases (an entry, or one instance: name[fp16]); repeatable")
    sel.add_argument("-k", dest="keyword", action="append", default=[], metavar="SUBSTRING",
                     help="run only the catalogue cases whose name contains SUBSTRING (repeatable or "
                          "comma-separated: any of them)")
    sel.add_argument("--exclude", action="append", default=[], metavar="NAME[,NAME]",
                     help="leave these catalogue cases out (entries or instances; repeatable)")
    sel.add_argument("--case", dest="cases", action="append", default=[], metavar="\"Case(...)\"",
                     help="run this case, in the catalogue's syntax (as a failure's repro line prints it); "
                          "repeatable; without --only/-k the catalogue is not run")
    sel.add_argument("--examples", type=int, metavar="N",
                     help="also judge N generated cases within the declarations (each distinct kind of failure "
                          f"shrunk to a minimal case); default {DEFAULT_EXAMPLES} with the whole catalogue, 0 with "
                          "--only/-k/--case")
    sel.add_argument("--seed", type=int, metavar="S",
                     help="draw the generated cases from this seed (default: the same cases every run)")
    dec = parser.add_argument_group(
        "what the kernel declares (cases outside it are skipped, never passed; the kernel may carry these "
        "itself: flashcheck.declare)")
    for f in FIELDS:
        if f.metavar is None:
            dec.add_argument(f.flag, dest=f.name, action="store_false" if f.default else "store_true",
                             default=None, help=f.help)
        else:
            dec.add_argument(f.flag, dest=f.name, metavar=f.metavar, default=None, help=f.help)
    chk = parser.add_argument_group("more checks")
    chk.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="call each case N times on the same inputs: outputs (and lse) must be bitwise identical, "
                          "else the case fails as nondeterministic (a race shows like this)")
    chk.add_argument("--sanitize", action="store_true",
                     help="run the kernel under compute-sanitizer memcheck (GPU): an out-of-bounds access fails its "
                          "case as memcheck, with the first error, even when its value never reaches the output")
    chk.add_argument("--no-properties", dest="properties", action="store_false",
                     help="skip the properties (rows independent, keys permutable, linear in V, ...) after the "
                          "reference comparison")
    chk.add_argument("--max-memory", metavar="GIB", type=float,
                     help="skip cases that need more than GIB of device memory (shared runners)")
    out = parser.add_argument_group("running and reporting")
    out.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="limit of each kernel call whose inputs already ran in its worker, and of the oracle's work "
                          "between calls; past it the case fails as 'timeout' (default 120 on CPU, 60 on GPU)")
    out.add_argument("--compile-timeout", type=float, metavar="SECONDS",
                     help="limit of a kernel call whose inputs (shapes, strides, dtypes, arguments) are new to its "
                          "worker, where a Triton kernel compiles, an autotuned one tunes, torch.compile traces "
                          "(default 900); a timeout says which limit ran out")
    out.add_argument("--no-isolate", action="store_true",
                     help="judge in this process (for debugging: no timeout, a crash ends the run)")
    out.add_argument("--no-cache", dest="cache", action="store_false",
                     help="compile into a fresh temporary directory (a cold run) instead of flashcheck's own cache "
                          "($FLASHCHECK_CACHE_DIR, default ~/.cache/flashcheck), which workers and later runs share")
    out.add_argument("--jobs", "-j", type=_jobs, default=None, metavar="N",
                     help="judge N cases at once, each in its own worker process (default 'auto': one per core, at "
                          f"most {MAX_AUTO_JOBS}, as each worker holds its own CUDA context; 1 for --no-isolate and "
                          "--sanitize). Results and their order are the same for any N; a case needing much of the "
                          "memory runs alone")
    out.add_argument("--shard", metavar="I/N", help="judge only the I-th of N disjoint parts of the run (by each case's "
                     "stable id, the same on every machine); `flashcheck merge` combines the shards' --json records")
    out.add_argument("--max-failures", type=int, metavar="N", help="stop after N failed cases")
    out.add_argument("--json", metavar="PATH", help="write the results as JSON, kept current as cases finish ('-': "
                                                    "stdout, the report then goes to stderr)")
    out.add_argument("--junit", metavar="PATH", help="write JUnit XML (one testcase per case), kept current")
    out.add_argument("--html", metavar="PATH", help="write one self-contained HTML report, with a map of where the "
                                                    "error lives for each failing case (needs matplotlib: "
                                                    "pip install 'flashcheck[plot]')")
    out.add_argument("-q", "--quiet", action="store_true",
                     help="print only the failures and the summary line, no table and no progress")


def _jobs(text):
    """--jobs N, or 'auto' (engine.auto_jobs decides)."""
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def request(args):
    from flashcheck.cases.verify.engine import Request   # lazy: torch, once the arguments and backend are settled

    declarations = {f.name: getattr(args, f.name) for f in FIELDS if getattr(args, f.name) is not None}
    return Request(target=args.target, declarations=declarations, only=tuple(args.only),
                   keyword=tuple(args.keyword), exclude=tuple(args.exclude), cases=tuple(args.cases),
                   examples=args.examples, seed=args.seed, repeat=args.repeat, sanitize=args.sanitize,
                   properties=args.properties, timeout=args.timeout, compile_timeout=args.compile_timeout,
                   cache=args.cache, shard=args.shard,
                   isolate=not args.no_isolate,
                   jobs=args.jobs, max_failures=args.max_failures,
                   max_memory=None if args.max_memory is None else int(args.max_memory * 2 ** 30),
                   json=args.json, junit=args.junit, html=args.html, progress=not args.quiet)


INTERNAL_ERROR = 3


def run(args):
    # lazy: these import torch, which --help and argparse's usage errors never need (module docstring)
    from flashcheck.cases import report
    from flashcheck.cases.runner.target import TargetError
    from flashcheck.cases.verify import engine

    req = request(args)
    try:
        the_run = engine.run(req)
    except (UsageError, TargetError) as exc:
        return _usage(exc)
    except Exception as exc:  # noqa: BLE001  (flashcheck's own bug: never exit 1, which reads as a failed kernel)
        traceback.print_exc()
        print(f"flashcheck verify: internal error (a bug of flashcheck, no verdict on the kernel): "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return INTERNAL_ERROR
    print(report.text(the_run, quiet=args.quiet), file=sys.stderr if args.json == "-" else sys.stdout)
    code = the_run.exit_code()
    if the_run.stopped == "interrupted":
        print("flashcheck verify: interrupted", file=sys.stderr)
        return 130
    if code == 2:
        print("flashcheck verify: nothing was verified: no case passed or failed", file=sys.stderr)
    return code


def _usage(exc):
    print(f"flashcheck verify: error: {exc}", file=sys.stderr)
    return 2
