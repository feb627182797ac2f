"""The flashcheck command line.

    flashcheck verify [MODULE:FUNCTION]   the catalogue, oracle and properties applied to a kernel
    flashcheck mutants [--sweep]          the bug corpus: every mutant must be killed (kill matrix)
    flashcheck bench                      TFLOP/s of the fused kernel against torch's SDPA backends (GPU)
    flashcheck cases                      list the catalogue

Each subcommand lives in its own module (cases/verify/cli.py, cases/corpus/cli.py, cases/bench.py,
cases/runner/sanitize.py) that defines
add_arguments(parser) and run(args) -> exit code. The backend is chosen before any of them imports Triton.
"""
import argparse
import importlib
import os
import sys

from flashcheck.cases.backend import BackendError, keep_freed_memory, select_backend
from flashcheck.cases.runner.cache import keep_bytecode

SUBCOMMANDS = {
    "verify": ("flashcheck.cases.verify.cli", "verify an attention kernel against the catalogue and the oracle"),
    "mutants": ("flashcheck.cases.corpus.cli", "run the bug corpus: every mutant must be killed"),
    "bench": ("flashcheck.cases.bench", "benchmark the fused kernel against torch's attention backends (GPU)"),
    "sanitize": ("flashcheck.cases.runner.sanitize", "run the catalogue under compute-sanitizer memcheck (GPU)"),
    "merge": ("flashcheck.cases.report.merge", "merge the JSON records of a sharded verify (--shard I/N) into one"),
    "cases": ("flashcheck.cases.cli", "list the catalogue's cases"),
}


def add_arguments(parser):
    parser.add_argument("--gpu-only", action="store_true", help="list only the cases that need the GPU")


def run(args):
    from flashcheck.cases import catalogue   # lazy: it imports torch, which must wait for the backend choice

    for c in catalogue.CATALOGUE + catalogue.PACKED:
        if args.gpu_only and not c.gpu_only:
            continue
        tag = (" [gpu]" if c.gpu_only else "") + (" [varlen, paged kernels]" if c.name in catalogue.PACKED_NAMES else "")
        print(f"{c.name}{tag}  ({', '.join(i.name for i in c.instances())})\n    {c.source()}\n    why: {c.why}")
    return 0


def main(argv=None):
    keep_bytecode()     # before anything imports torch: cases/runner/cache.py says why
    keep_freed_memory()  # the oracle's arrays reuse freed memory (cases/backend.py)
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="flashcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["cpu", "gpu"],
                        help="force a backend (default: GPU when CUDA is available, else Triton's interpreter)")
    sub = parser.add_subparsers(dest="command", required=True)
    # only the chosen subcommand's module is imported: one broken module cannot break the others
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)

    if args.backend:
        os.environ["FLASHCHECK_BACKEND"] = args.backend

    try:
        select_backend()
    except BackendError as exc:
        print(f"flashcheck: {exc}", file=sys.stderr)
        return 2
    return importlib.import_module(SUBCOMMANDS[args.command][0]).run(args)


if __name__ == "__main__":
    sys.exit(main())
