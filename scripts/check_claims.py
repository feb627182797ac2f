#!/usr/bin/env python3
"""Re-run the claims the documentation makes, and check that they still hold.

A claim is a command the prose says something about: its exit status and, usually, what it prints. It is
marked in the markdown by an HTML comment (invisible when rendered), followed by the transcript it claims:

    <!-- claim: exit=1 backend=cpu ci cmd: flashcheck verify examples/buggy_attention.py:attention
         --only hand_one_query_two_keys -q -->
    ```text
    $ flashcheck verify examples/buggy_attention.py:attention --only hand_one_query_two_keys -q
    FAIL hand_one_query_two_keys[fp32] [examples/buggy_attention.py:attention]
    ...
    ```

The comment holds attributes, then `cmd:` and the command (it may wrap over several lines; whitespace is
collapsed). Attributes, separated by spaces (a value with spaces in quotes):

    exit=N          the exit status the prose claims (required)
    backend=B       cpu: run on Triton's interpreter (FLASHCHECK_BACKEND=cpu, on any machine);
                    gpu: needs a GPU (FLASHCHECK_BACKEND=gpu), skipped with the reason where there is none;
                    any (the default): the machine's own choice
    ci              cheap enough for CI: tests/test_claims.py runs the claims marked so
    tail=N, head=N  the transcript holds only the last (first) N lines of the output; "..." stands for the rest
    grep=REGEX      the transcript holds only the lines that match (after which head/tail apply)
    contains=TEXT   the output must contain TEXT (repeatable): for claims without a transcript
    stderr=no       the output is stdout alone (e.g. to leave library warnings out of a transcript)
    timeout=S       seconds before the command counts as failed (default 900)

The transcript is the first fenced block after the comment when its info string is `text` (blank lines in
between are allowed); without one, only the exit status (and any contains=) is checked. Its first line is
`$ ` and the command as written, then the output: stdout and stderr together, in order, with the progress
heartbeat lines of `flashcheck verify` left out. A marker starts its line; one inside a fenced block or
after other text on its line (inline code) is an example, not a claim.

Running: from the repository root, without a shell. A leading `flashcheck` (or .venv/bin/flashcheck) runs as
`python -m flashcheck` with this interpreter, so the checkout under test is the one judged (--installed: the
`flashcheck` script on PATH instead); a leading `python`/`python3` is this interpreter; leading NAME=value
words are environment variables.

Comparing: volatile parts are masked on both sides before comparing: timings (`in 12.3 s`, `4 ms`) and the
torch/triton versions of the backend line (`torch 2.13.0+cpu, triton 3.9.0`; the transcript keeps the
versions that produced it; --strict compares them too), a passing case's err/tol in verify's table (its rounding,
which differs from one CPU's BLAS to another's; --strict compares it too), and the compile cache's line (where it
is, how full).
Trailing spaces and blank lines do not count.

    python scripts/check_claims.py                 # check every claim of FILES (README.md, examples/, docs/)
    python scripts/check_claims.py --ci            # only the claims marked ci
    python scripts/check_claims.py --update        # rewrite the transcripts that differ with the actual output
    python scripts/check_claims.py -k sdpa --list  # the claims whose file:line or command contains "sdpa"

Each claim is reported as ok, EXIT (the status differs from exit=), DIFFERS (the transcript differs: a diff
follows), MISSING (a contains= text is not in the output), or skip (backend=gpu without a GPU), and with
--update, updated. Exit status: 0 every claim that ran held; 1 a claim failed; 2 a malformed marker or a bad
option. --update never changes exit=: a status that differs is a failure for a person to look at.
"""
import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("README.md", "examples/README.md", "docs/found-bugs.md")
DEFAULT_TIMEOUT = 900.0
BACKENDS = ("cpu", "gpu", "any")

MARKER = re.compile(r"<!--\s*claim:(.*?)-->", re.S)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
# `flashcheck verify`'s heartbeat on a log (stderr): "[12/181] case name (10 s, 0 failed so far)"
PROGRESS = re.compile(r"^\[\d+/\d+\] .* \(\d+ s, \d+ failed so far\)$")
TIMING = re.compile(r"(?<![\w.])\d+(?:\.\d+)? ?(s|ms)\b")
VERSIONS = re.compile(r"\btorch \S+, triton [^\s:,;)]+")
CACHE = re.compile(r"compile cache [^;]*")   # where the compile cache is, and how full: this machine's own
# a passing case's err/tol is its rounding, which the CPU's BLAS kernels change (the interpreter's dots are NumPy's):
# 0.1 recorded on one 2-core machine was 0.073 on another; the verdict beside it is compared
PASS_ERR = re.compile(r"^(\S+\s+PASS\s+)\d[\d.e+-]*\s+")


class MarkerError(Exception):
    """A claim marker that cannot be read (a usage error: exit status 2)."""


@dataclass
class Claim:
    path: Path                 # the markdown file
    line: int                  # 1-based line of the marker
    cmd: str                   # the command as written (whitespace collapsed)
    exit: int
    backend: str = "any"
    ci: bool = False
    head: int = None
    tail: int = None
    grep: str = None
    contains: list = field(default_factory=list)
    timeout: float = DEFAULT_TIMEOUT
    stderr: bool = True        # stderr=no: the output is stdout alone
    block: tuple = None        # (first, last) 0-based line indexes of the transcript's body, or None
    recorded: list = None      # the transcript's lines (without the fences)
    rank: int = 0              # how many claims before it in its file have the same command and attributes

    @property
    def where(self):
        try:
            rel = self.path.resolve().relative_to(ROOT)
        except ValueError:
            rel = self.path
        return f"{rel}:{self.line}"

    @property
    def name(self):
        """A short id, for test names and -k."""
        return f"{self.where} {self.cmd}"


@dataclass
class Outcome:
    claim: Claim
    status: str                # ok, EXIT, DIFFERS, MISSING, skip, updated, ERROR
    problems: list = field(default_factory=list)   # [(what, text)]: exit, missing, transcript
    seconds: float = 0.0
    code: int = None
    output: list = None        # the output's lines, as the transcript would show them (before head/tail/grep)
    stderr: list = None        # stderr's lines, when stderr=no kept them out of the output

    @property
    def failed(self):
        return self.status in ("EXIT", "DIFFERS", "MISSING", "ERROR")

    @property
    def detail(self):
        return "\n".join(text for _, text in self.problems)


# ---- reading the markdown ----------------------------------------------------------------------------------

def _attributes(text, where):
    words = shlex.split(text)
    attrs = {"contains": []}
    for w in words:
        key, sep, value = w.partition("=")
        if not sep:
            if key == "ci":
                attrs["ci"] = True
                continue
            raise MarkerError(f"{where}: claim attribute {w!r} is not NAME=VALUE (or ci)")
        if key == "contains":
            attrs["contains"].append(value)
        elif key in ("exit", "head", "tail"):
            try:
                attrs[key] = int(value)
            except ValueError:
                raise MarkerError(f"{where}: {key}={value!r} is not a whole number") from None
        elif key == "timeout":
            try:
                attrs[key] = float(value)
            except ValueError:
                raise MarkerError(f"{where}: timeout={value!r} is not a number of seconds") from None
        elif key == "backend":
            if value not in BACKENDS:
                raise MarkerError(f"{where}: backend={value!r}: expected one of {', '.join(BACKENDS)}")
            attrs[key] = value
        elif key == "stderr":
            if value not in ("yes", "no"):
                raise MarkerError(f"{where}: stderr={value!r}: expected yes or no")
            attrs[key] = value == "yes"
        elif key == "grep":
            try:
                re.compile(value)
            except re.error as exc:
                raise MarkerError(f"{where}: grep={value!r}: {exc}") from None
            attrs[key] = value
        else:
            raise MarkerError(f"{where}: unknown claim attribute {key!r} (known: exit, backend, ci, head, tail, "
                              "grep, contains, stderr, timeout)")
    if "exit" not in attrs:
        raise MarkerError(f"{where}: a claim needs exit=N")
    if attrs.get("head") is not None and attrs.get("tail") is not None:
        raise MarkerError(f"{where}: head= and tail= together: choose one")
    return attrs


def _key(claim):
    return (claim.cmd, claim.exit, claim.backend, claim.head, claim.tail, claim.grep)


def parse(path):
    """The claims of one markdown file, in order. Raises MarkerError."""
    path = Path(path)
    lines = path.read_text().split("\n")
    claims = []
    fence = None            # the fence string of the block we are in, or None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(2).startswith(fence) and not m.group(3).strip():
                fence = None
            i += 1
            continue
        if m:
            fence = m.group(2)
            i += 1
            continue
        stripped = line.lstrip()
        if not (stripped.startswith("<!--") and stripped[4:].lstrip().startswith("claim:")):
            i += 1
            continue
        # the marker may span lines: gather up to its closing -->
        j = i
        text = stripped
        while "-->" not in text and j + 1 < len(lines):
            j += 1
            text += "\n" + lines[j]
        where = f"{path}:{i + 1}"
        mm = MARKER.match(text)
        if not mm:
            raise MarkerError(f"{where}: a claim marker without its closing -->")
        body = " ".join(mm.group(1).split())
        attrs_text, sep, cmd = body.partition("cmd:")
        if not sep or not cmd.strip():
            raise MarkerError(f"{where}: a claim needs `cmd:` and a command after its attributes")
        attrs = _attributes(attrs_text, where)
        claim = Claim(path, i + 1, cmd.strip(), **attrs)
        # the transcript: the next non-blank line opens a ```text block
        k = j + 1
        while k < len(lines) and not lines[k].strip():
            k += 1
        if k < len(lines):
            fm = FENCE.match(lines[k])
            if fm and fm.group(3).strip() == "text":
                end = k + 1
                while end < len(lines):
                    em = FENCE.match(lines[end])
                    if em and em.group(2).startswith(fm.group(2)) and not em.group(3).strip():
                        break
                    end += 1
                if end == len(lines):
                    raise MarkerError(f"{path}:{k + 1}: the transcript block after the claim is never closed")
                claim.block = (k + 1, end - 1)
                claim.recorded = lines[k + 1:end]
        claim.rank = sum(_key(c) == _key(claim) for c in claims)
        claims.append(claim)
        i = j + 1
    return claims


def collect(files, missing_ok=True):
    """The claims of these markdown files (relative to the repository root); a default file that does not
    exist is left out, a file asked for by name must exist."""
    claims = []
    for f in files:
        p = Path(f)
        if not p.is_absolute():
            p = p if p.exists() else ROOT / p
        if p.exists():
            claims.extend(parse(p))
        elif not missing_ok:
            raise MarkerError(f"{f}: no such file")
    return claims


# ---- running a claim -----------------------------------------------------------------------------------------

def argv_env(cmd, installed=False):
    """(argv, extra environment) of a claim's command."""
    words = shlex.split(cmd)
    env = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not words:
        raise MarkerError(f"command {cmd!r}: nothing to run")
    head = words[0]
    base = os.path.basename(head)
    if base == "flashcheck" and not (installed and _which("flashcheck")):
        words = [sys.executable, "-m", "flashcheck"] + words[1:]
    elif base in ("python", "python3"):
        words = [sys.executable] + words[1:]
    return words, env


def _which(name):
    from shutil import which

    return which(name)


_GPU = None


def gpu_available():
    """(True, "") when a GPU backend is possible here, else (False, why)."""
    global _GPU
    if _GPU is None:
        if os.environ.get("FLASHCHECK_BACKEND", "").lower() == "cpu":
            _GPU = (False, "FLASHCHECK_BACKEND=cpu is set")
        else:
            try:
                import torch

                _GPU = (True, "") if torch.cuda.is_available() else \
                    (False, "no GPU here (torch.cuda.is_available() is False)")
            except ImportError:
                _GPU = (False, "torch is not importable here")
    return _GPU


def clean(text):
    """The output as a transcript shows it: lines, right-stripped, heartbeat lines out, no trailing blanks."""
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    lines = [ln for ln in lines if not PROGRESS.match(ln)]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def excerpt(claim, lines):
    """The lines the transcript keeps (grep, then head or tail), "..." where lines were left out."""
    if claim.grep:
        pat = re.compile(claim.grep)
        kept, dropped = [], False
        for ln in lines:
            if pat.search(ln):
                if dropped:
                    kept.append("...")
                kept.append(ln)
                dropped = False
            else:
                dropped = True
        if dropped:
            kept.append("...")
        lines = kept
    if claim.tail is not None and len(lines) > claim.tail:
        lines = ["..."] + lines[len(lines) - claim.tail:]
    if claim.head is not None and len(lines) > claim.head:
        lines = lines[:claim.head] + ["..."]
    return lines


def transcript(claim, output_lines):
    return [f"$ {claim.cmd}"] + excerpt(claim, output_lines)


def normalise(lines, strict=False):
    out = []
    for ln in lines:
        ln = TIMING.sub(lambda m: "<T> " + m.group(1), ln.rstrip())
        ln = CACHE.sub("compile cache <C>", ln)
        if not strict:
            ln = VERSIONS.sub("torch <V>, triton <V>", ln)
            ln = PASS_ERR.sub(lambda m: m.group(1) + "<E> ", ln)
        out.append(ln)
    while out and not out[-1]:
        out.pop()
    return out


def execute(claim, installed=False):
    """(exit status, output lines, seconds, stderr lines) of a claim's command (stderr lines only when
    stderr=no keeps them out of the output), or raises subprocess.TimeoutExpired."""
    argv, extra = argv_env(claim.cmd, installed)
    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1", "COLUMNS": "100"})
    if claim.backend in ("cpu", "gpu"):
        env["FLASHCHECK_BACKEND"] = claim.backend
    env.update(extra)
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if claim.stderr else subprocess.PIPE, text=True,
                          timeout=claim.timeout)
    err = [] if claim.stderr else clean(done.stderr)
    return done.returncode, clean(done.stdout), time.perf_counter() - t0, err


def check(claim, installed=False, strict=False):
    """Run one claim and judge it (no file is changed)."""
    if claim.backend == "gpu":
        ok, why = gpu_available()
        if not ok:
            return Outcome(claim, "skip", [("skip", f"backend=gpu: {why}")])
    try:
        code, lines, seconds, err = execute(claim, installed)
    except subprocess.TimeoutExpired:
        return Outcome(claim, "ERROR", [("error", f"no exit within {claim.timeout:g} s")], seconds=claim.timeout)
    except (OSError, MarkerError) as exc:
        return Outcome(claim, "ERROR", [("error", f"could not run: {exc}")])
    out = Outcome(claim, "ok", seconds=seconds, code=code, output=lines, stderr=err)
    problems = out.problems
    if code != claim.exit:
        out.status = "EXIT"
        problems.append(("exit", f"exit {code}, claimed exit={claim.exit}"))
    text = "\n".join(lines)
    missing = [c for c in claim.contains if c not in text]
    if missing:
        out.status = "MISSING" if out.status == "ok" else out.status
        problems.append(("missing", "output lacks " + ", ".join(repr(c) for c in missing)))
    if claim.recorded is not None:
        want = normalise(claim.recorded, strict)
        got = normalise(transcript(claim, lines), strict)
        if want != got:
            out.status = "DIFFERS" if out.status == "ok" else out.status
            diff = difflib.unified_diff(claim.recorded, transcript(claim, lines), "recorded", "actual",
                                        lineterm="", n=2)
            problems.append(("transcript", "transcript differs:\n" + "\n".join("    " + d for d in diff)))
    return out


def update(outcomes):
    """Rewrite the transcripts of the claims that ran and whose transcript differs. Returns the outcomes,
    with status "updated" where a transcript was rewritten and nothing else failed.

    Each file is parsed again just before it is written (a claim can take minutes, and the file may have
    been edited meanwhile): a claim is found by its command and attributes (and its rank among identical
    ones), never by a line number read earlier; one no longer there is reported and left alone."""
    by_file = {}
    for o in outcomes:
        if o.output is not None and o.claim.block is not None and any(w == "transcript" for w, _ in o.problems):
            by_file.setdefault(o.claim.path, []).append(o)
    for path, items in by_file.items():
        now = {}
        for c in parse(path):
            now.setdefault(_key(c), []).append(c)
        lines = path.read_text().split("\n")
        targets = []
        for o in items:
            same = now.get(_key(o.claim), [])
            n = o.claim.rank
            if n >= len(same) or same[n].block is None:
                o.problems.append(("error", "not updated: the claim changed in the file while it ran"))
                o.status = "ERROR"
                continue
            targets.append((same[n].block, o))
        for (first, last), o in sorted(targets, key=lambda t: -t[0][0]):   # bottom up: indexes above stay valid
            lines[first:last + 1] = transcript(o.claim, o.output)
            o.problems = [(w, t) for w, t in o.problems if w != "transcript"]
            if o.status == "DIFFERS":
                o.status = "updated"
        path.write_text("\n".join(lines))
    return outcomes


# ---- the command line ------------------------------------------------------------------------------------

def report_line(o):
    c = o.claim
    head = f"{o.status:<8} {c.where}  {c.cmd}"
    if o.status == "skip":
        return f"{head}\n         {o.detail}"
    ran = f" (exit {o.code}, {o.seconds:.1f} s)" if o.code is not None else ""
    text = head + ran
    if o.detail:
        text += "\n         " + o.detail
    if o.status in ("EXIT", "MISSING", "ERROR") and (o.output or o.stderr):
        tail = (o.output or [])[-15:]
        text += "\n         output (last lines):\n" + "\n".join("    | " + ln for ln in tail)
        if o.stderr:
            text += "\n         stderr (last lines):\n" + "\n".join("    | " + ln for ln in o.stderr[-10:])
    return text


def select(claims, ci=False, keyword=(), backend=None):
    out = []
    for c in claims:
        if ci and not c.ci:
            continue
        if keyword and not any(k in c.name for k in keyword):
            continue
        if backend and c.backend != backend:
            continue
        out.append(c)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="The marker syntax is in this script's docstring and docs/design.md.")
    parser.add_argument("files", nargs="*", help=f"markdown files (default: {', '.join(FILES)})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="check every claim (the default)")
    mode.add_argument("--update", action="store_true",
                      help="rewrite each transcript that differs with the actual output (exit= is never changed)")
    mode.add_argument("--list", action="store_true", help="list the claims, run nothing")
    parser.add_argument("--ci", action="store_true", help="only the claims marked ci")
    parser.add_argument("--backend", choices=BACKENDS, help="only the claims of this backend= value")
    parser.add_argument("-k", dest="keyword", action="append", default=[],
                        help="only the claims whose file:line or command contains this text (repeatable)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="claims run at once (default 1)")
    parser.add_argument("--installed", action="store_true",
                        help="run `flashcheck` as the script on PATH, not as `python -m flashcheck` of this checkout")
    parser.add_argument("--strict", action="store_true", help="compare the torch and triton versions too")
    args = parser.parse_args(argv)
    try:
        claims = select(collect(args.files or FILES, missing_ok=not args.files), args.ci, args.keyword,
                        args.backend)
    except MarkerError as exc:
        print(f"check_claims: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for c in claims:
            flags = " ".join(x for x in (f"exit={c.exit}", f"backend={c.backend}", "ci" if c.ci else "",
                                         "transcript" if c.block else "no transcript") if x)
            print(f"{c.where}  [{flags}]  {c.cmd}")
        return 0
    if not claims:
        print("check_claims: no claims selected", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    files = sorted({c.where.rsplit(":", 1)[0] for c in claims})
    print(f"claims: {len(claims)} in {', '.join(files)}; python {sys.executable}", flush=True)

    outcomes = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for o in pool.map(lambda c: check(c, args.installed, args.strict), claims):
            if args.update:
                update([o])          # at once: the file is parsed again, so this is safe while others run
            print(report_line(o), flush=True)
            outcomes.append(o)
    counts = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    failed = sum(o.failed for o in outcomes)
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(f"claims: {parts} in {time.perf_counter() - t0:.1f} s" + (f": {failed} FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
