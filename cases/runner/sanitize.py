"""`flashcheck sanitize`: the catalogue under compute-sanitizer's memcheck (GPU only).

The oracle's guard bands turn a stray read into a NaN in the output, but only when the stray value reaches
the output: a read that is masked out later (a K/V load mask combined with + instead of &, whose extra rows
get -inf scores and weight 0) changes nothing visible. memcheck sees the access itself. Here the inputs are
plain tensors of their exact size and PyTorch's caching allocator is off (PYTORCH_NO_CUDA_MEMORY_CACHING=1),
so every tensor is its own allocation and an access past its end is reported.

    flashcheck sanitize                               # the fused kernel, every catalogue case that fits
    flashcheck sanitize --mutant kv_mask_plus --mutant store_no_row_mask
    flashcheck sanitize --target flashcheck.kernel.unfused:attention

Each target runs in its own `compute-sanitizer --tool memcheck` process; the report gives memcheck's error
count per target. Exit 0 when every real kernel is clean and every named mutant is flagged.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from flashcheck.cases import catalogue, inputs
from flashcheck.cases.backend import backend
from flashcheck.cases.errors import UsageError
from flashcheck.cases.runner.target import MUTANT_PREFIX, load_target
from flashcheck.cases.runner.worker import Worker


def add_arguments(parser):
    parser.add_argument("--target", action="append", default=[],
                        help="MODULE:FUNCTION to check (default flashcheck.kernel.fused:attention); repeatable")
    parser.add_argument("--mutant", action="append", default=[],
                        help="a bug-corpus mutant that memcheck must flag; repeatable")
    parser.add_argument("--sanitizer", default="compute-sanitizer", help="path of compute-sanitizer")
    parser.add_argument("--max-elements", type=int, default=1 << 24,
                        help="skip cases with more elements per tensor (memcheck is slow)")
    parser.add_argument("--inner", help=argparse.SUPPRESS)


def _cases(max_elements):
    return [c for c in catalogue.instances() if c.B * c.H * max(c.Nq, c.Nk) * c.D <= max_elements]


def _inner(spec, max_elements):
    """Runs inside compute-sanitizer: every case once on plain, exact-size tensors."""
    attention = load_target(spec)
    for case in _cases(max_elements):
        q, k, v = (t.cuda().contiguous() for t in inputs.values(case))
        kwargs = {"causal": case.causal}
        if case.scale is not None:
            kwargs["scale"] = case.scale
        try:
            attention(q, k, v, **kwargs)
            torch.cuda.synchronize()
        except Exception as exc:  # a fault ends this process's usefulness; memcheck has recorded it
            print(f"case {case.name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
            return 1
    return 0


def _errors(output):
    found = re.findall(r"ERROR SUMMARY: (\d+) error", output)
    return int(found[-1]) if found else None


def run(args):
    if args.inner:
        return _inner(args.inner, args.max_elements)

    if backend() != "gpu":
        print("flashcheck sanitize: compute-sanitizer needs the GPU backend", file=sys.stderr)
        return 2
    tool = find_tool(args.sanitizer) or (args.sanitizer if os.path.exists(args.sanitizer) else None)
    if tool is None:
        print(f"flashcheck sanitize: {args.sanitizer} not found (it ships with the CUDA toolkit)", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    specs = [(t, False) for t in (args.target or ["flashcheck.kernel.fused:attention"])]
    specs += [(f"{MUTANT_PREFIX}{m}", True) for m in args.mutant]
    ok = True
    for spec, must_flag in specs:
        t0 = time.perf_counter()
        cmd = [tool, "--tool", "memcheck", "--print-limit", "5", sys.executable, "-m", "flashcheck",
               "--backend", "gpu", "sanitize", "--inner", spec, "--max-elements", str(args.max_elements)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        output = proc.stdout + proc.stderr
        errors = _errors(output)
        good = (errors is not None and errors > 0) if must_flag else (errors == 0 and proc.returncode == 0)
        ok &= good
        verdict = "flagged" if must_flag and good else "clean" if good else "UNEXPECTED"
        print(f"{spec}: memcheck errors {errors}, exit {proc.returncode}, {time.perf_counter() - t0:.1f} s -> {verdict}")
        if not good or must_flag:
            first = [ln for ln in output.splitlines() if "Invalid" in ln or "ERROR" in ln or "case " in ln][:4]
            for line in first:
                print("    " + line.strip())
    return 0 if ok else 1


# ---- verify --sanitize: the runner's worker under memcheck ----

def find_tool(name="compute-sanitizer"):
    """The path of compute-sanitizer, or None (it ships with the CUDA toolkit)."""
    found = shutil.which(name)
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "bin", name)):
            return os.path.join(home, "bin", name)
    return None


def worker(timeout, compile_timeout=None, env=None):
    """A runner Worker whose processes run under compute-sanitizer memcheck (verify --sanitize)."""
    tool = find_tool()
    if tool is None:
        raise UsageError("--sanitize needs compute-sanitizer (it ships with the CUDA toolkit); none on PATH, in "
                         "$CUDA_HOME/bin or /usr/local/cuda/bin")
    return SanitizedWorker(timeout, tool, compile_timeout, env)


_ERROR_START = re.compile(r"^========= (Invalid|Program hit|Out-of-range|Misaligned|Cuda API error|Error)")


def first_error(text):
    """The first memcheck error of a log, as one line: its headline and the next three lines (where, who)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _ERROR_START.match(line):
            block = [ln.replace("=========", "").strip() for ln in lines[i:i + 4]]
            return "; ".join(b for b in block if b)
    return ""


class SanitizedWorker(Worker):
    """The worker's server (and the children it forks) under `compute-sanitizer --tool memcheck`, with PyTorch's
    caching allocator off so that every tensor is an allocation of its own. memcheck() returns the first error
    logged since the last call: the case just judged."""

    def __init__(self, timeout, tool, compile_timeout=None, env=None):
        self.logdir = tempfile.mkdtemp(prefix="flashcheck-memcheck-")
        self.offsets = {}
        # memcheck slows a kernel down by one or two orders of magnitude
        super().__init__(timeout * 10, compile_timeout=compile_timeout and compile_timeout * 10,
                         env={**(env or {}), "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, wrap=[
            tool, "--tool", "memcheck", "--target-processes", "all", "--print-limit", "5",
            "--log-file", os.path.join(self.logdir, "memcheck.%p.log")])

    def memcheck(self):
        found = ""
        for path in sorted(glob.glob(os.path.join(self.logdir, "memcheck.*.log"))):
            with open(path, errors="replace") as f:
                f.seek(self.offsets.get(path, 0))
                text = f.read()
                self.offsets[path] = f.tell()
            found = found or first_error(text)
        return found
