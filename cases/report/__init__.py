"""What `flashcheck verify` prints: the table, the failure details, the summary line and a progress line.
The files (JSON, JUnit XML, written as cases finish) are report/files.py; the HTML report is report/html.py.

A case's status: "pass", "fail", "inconclusive" (the tolerance could not tell a wrong answer), "unsupported"
(the kernel declined the input), "out of memory", or "skip" (not judged: not declared, GPU only, too big,
...). Only "pass" is a pass; every other status is counted apart and shown with its reason.
"""
import json
import os
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field

from flashcheck.cases import features

# the failures found by the comparison with the reference, whose worst err/tol the table shows (the others
# stop before it, or come from a later layer after the reference comparison passed)
_REFERENCE_KINDS = {"mismatch", "NaN", "out-of-bounds read"}
ORDER = ("pass", "fail", "inconclusive", "unsupported", "out of memory", "skip")
LEGEND = {
    "pass": "every layer held, and the tolerance could tell a wrong answer from the right one",
    "fail": "a failure of a named kind: the first bad element, got, expected, the tolerance, a repro line",
    "inconclusive": "nothing failed, but the tolerance was so wide that zeros or the plain mean of V would have "
                    "passed: not counted as passed",
    "unsupported": "the kernel raised NotImplementedError (or flashcheck.Unsupported) for this input: declare the "
                   "limit to skip such cases up front",
    "out of memory": "the kernel (or the case's own inputs) ran out of memory; the figures say how much was asked "
                     "for and held. Counted apart: it does not fail the run by itself",
    "skip": "not judged, with the reason: outside the declarations, GPU only, or larger than the memory at hand",
}


@dataclass
class Result:
    case: object                 # flashcheck.cases.case.Case
    status: str                  # one of ORDER
    verdict: object = None       # flashcheck.cases.oracle.Verdict of a case that ran
    reason: str = ""             # why a case was skipped
    skip_group: str = ""         # "not declared", "GPU only", "too large", ...: the summary counts skips by group
    origin: str = "catalogue"    # "catalogue", "--case" or "hypothesis"
    index: int = None            # its place in the report of the whole (unsharded) run, for flashcheck merge

    @classmethod
    def of(cls, case, verdict, origin, index=None):
        return cls(case, verdict.status, verdict, origin=origin, index=index)


@dataclass
class Run:
    target: str
    describe: str                # backend, device, torch and triton versions
    caps: object                 # flashcheck.cases.oracle.Capabilities
    declared: list = field(default_factory=list)   # the declarations, as flags
    results: list = field(default_factory=list)
    seconds: float = 0.0
    notes: list = field(default_factory=list)      # e.g. what the hypothesis examples found
    stopped: str = ""            # why the run ended early (--max-failures, interrupted), or ""
    entries: tuple = (0, 0)      # (catalogue entries with a case judged, catalogue entries selected)
    shard: tuple = None          # (I, N): this run is the I-th of N shards (verify --shard)
    cache: str = ""              # where the workers' compile cache was, and what this run added to it

    def count(self, status):
        return sum(r.status == status for r in self.results)

    @property
    def reduced(self):
        return [r for r in self.results if r.verdict is not None and r.verdict.reduced]

    def exit_code(self):
        """0 every judged case passed, 1 a case failed, 2 nothing was judged (no pass, no failure)."""
        if self.count("fail"):
            return 1
        return 0 if self.count("pass") else 2


def _err(verdict):
    if not verdict.tol or not (verdict.passed or verdict.kind in _REFERENCE_KINDS):
        return "-"
    return f"{verdict.ratio:.2g}"


def _element(failure):
    """"(b, h, row, col) got .. expected .." of a failure, or its message when it has no element."""
    if failure.where is None:
        return failure.message
    s = failure.element(sep=" ")
    if failure.got is not None:
        s += f": got {failure.got:.6g}" + ("" if failure.expected is None else f", expected {failure.expected:.6g}")
    return s


def _row(result):
    v = result.verdict
    status = result.status.upper()
    if result.status == "skip":
        return [result.case.name, status, "-", "-", result.reason]
    if result.status == "pass":
        return [result.case.name, status, _err(v), "-", v.note]
    if result.status == "fail":
        return [result.case.name, status, _err(v), str(v.kind), _element(v.failures[0])]
    return [result.case.name, status, "-", "-", v.note]


def _peak(result):
    v = result.verdict
    return "-" if v is None or v.peak_bytes is None else f"{v.peak_bytes / 2 ** 20:.1f} MiB"


def table(run, width=160):
    """The results as an aligned text table. The last column (the first bad element, or the reason) is never cut:
    where a line would pass `width`, it wraps onto continuation lines indented to that column, so that the whole
    reason reads the same on every backend. On the GPU a column gives each case's peak extra memory: what the
    kernel allocated beyond its inputs and output."""
    peaks = any(r.verdict is not None and r.verdict.peak_bytes is not None for r in run.results)
    head = ["case", "verdict", "err/tol", "failure"] + (["peak extra"] if peaks else []) + ["first bad element / reason"]
    rows = [head] + [_row(r)[:4] + ([_peak(r)] if peaks else []) + _row(r)[4:] for r in run.results]
    cols = len(head) - 1
    widths = [max(len(str(row[i])) for row in rows) for i in range(cols)]
    indent = sum(widths) + 2 * cols
    room = max(width - indent, 40)
    lines = []
    for n, row in enumerate(rows):
        first = "  ".join(str(c).ljust(w) for c, w in zip(row[:cols], widths)) + "  "
        last = textwrap.wrap(str(row[cols]), room, break_on_hyphens=False) or [""]
        lines.append((first + last[0]).rstrip())
        lines += [" " * indent + more for more in last[1:]]
    lines.insert(1, "-" * min(width, max(len(line) for line in lines)))
    return "\n".join(lines)


def details(run):
    """Every failure in full (Verdict.report(): the failures, the bug the case guards against, a repro)."""
    return "\n\n".join(r.verdict.report() for r in run.results if r.status == "fail")


def reduced_lines(run):
    """Which checks could not run in full, and for how many of the cases that ran."""
    ran = sum(r.verdict is not None for r in run.results)
    by_reason = {}
    for r in run.reduced:
        for why in r.verdict.reduced:
            by_reason[why] = by_reason.get(why, 0) + 1
    return [f"reduced check: {why} ({n} of {ran} cases)" for why, n in by_reason.items()]


def kinds_line(run):
    """How many failures of each kind, most frequent first (for runs with several)."""
    kinds = {}
    for r in run.results:
        if r.status == "fail":
            kinds[str(r.verdict.kind)] = kinds.get(str(r.verdict.kind), 0) + 1
    if sum(kinds.values()) < 2:
        return []
    return ["failures by kind: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda x: -x[1]))] \
        + shared_failure_lines(run)


# kinds whose message carries no figures of the case (an exception's text, a compile error's): one text in many
# cases is one bug met many times (tutorial 06 on an H200: 22 of its 34 failures were one autotuner error)
_TEXT_KINDS = ("exception", "compile error", "bad return", "timeout", "crash", "device fault")


def shared_failure_lines(run, least=3):
    """One line for each failure text that at least `least` failing cases share (kinds in _TEXT_KINDS; where it was
    raised left out), most frequent first, with the first case that met it: most often one bug, met many times."""
    groups = {}
    for r in run.results:
        if r.status == "fail" and r.verdict.failures and str(r.verdict.kind) in _TEXT_KINDS:
            text = r.verdict.failures[0].message.split(" (raised at ")[0].strip()
            groups.setdefault((str(r.verdict.kind), text), []).append(r.case.name)
    shared = sorted(((k, t, names) for (k, t), names in groups.items() if len(names) >= least),
                    key=lambda g: -len(g[2]))
    return [f"{len(names)} failures share one {kind}, e.g. {names[0]}: {text[:200]}" for kind, text, names in shared]


def outcome_lines(run):
    """One line for each status besides pass and fail that occurred: what it means, and the first reason."""
    lines = []
    for status in ("inconclusive", "unsupported", "out of memory"):
        hits = [r for r in run.results if r.status == status]
        if hits:
            lines.append(f"{status}: {len(hits)} case(s), e.g. {hits[0].case.name}: {hits[0].verdict.note}")
    ordinary_oom = [r for r in run.results if r.status == "out of memory" and not r.case.sample_heads
                    and r.case.B * r.case.H * max(r.case.Nq, r.case.Nk) * r.case.D < 1 << 28]
    if ordinary_oom:
        lines.append(f"warning: the kernel ran out of memory on {len(ordinary_oom)} ordinary (not huge) case(s), "
                     f"e.g. {ordinary_oom[0].case.name}: a kernel whose memory grows like Nq x Nk does that")
    return lines


def capabilities_line(run):
    c = run.caps
    yes = {True: "yes", False: "no"}
    protocol = getattr(c, "protocol", "dense")
    layout = ""
    if protocol == "paged" and getattr(c, "paged_q", "bhnd") == "bnhd":
        how = (c.notes or {}).get("paged_q")
        layout = "; q and out (B, Nq, H, D)" + (f", {how}" if how else "")
    line = ("capabilities: " + (f"protocol {protocol} (each sequence judged as a dense case; leak check{layout}), "
                                if protocol != "dense" else "")
            + f"out= {yes[c.out]}, return_lse= {yes[c.lse]}"
            + ("" if c.lse else " (log-sum-exp not checked)")
            + f", block_m/block_n {yes[c.blocks]}" + ("" if c.blocks else " (cases' block pins not passed)"))
    if not c.causal:
        line += ", causal= no (causal cases skipped)"
    if not c.scale:
        line += ", scale= no (cases with a scale skipped)"
    shown = []
    for f in features.FEATURES:
        has = "yes" if f.name in c.features else "no"
        note = (c.notes or {}).get(f.name)
        if f.keyword:
            shown.append(f"{f.keyword}= {has}")
        elif note is None and has == "no":      # a shape feature no selected case needed: neither probed nor said
            shown.append(f"{f.label} not probed")
        else:
            shown.append(f"{f.label} {has}" + (f" ({note})" if note else ""))
    line += "; features: " + ", ".join(shown)
    if getattr(c, "var_kw", False) and not any(d.startswith("--keywords") for d in run.declared or ()):
        line += " (a **kwargs signature shows no keyword: --keywords declares those it takes)"
    note = (c.notes or {}).get("backward")
    if note is not None:
        line += f"; backward {'yes' if 'backward' in c.features else 'no'} ({note})"
    if run.declared:
        line += "; declared: " + " ".join(run.declared)
    return line


def summary(run):
    skips = {}
    for r in run.results:
        if r.status == "skip":
            skips[r.skip_group] = skips.get(r.skip_group, 0) + 1
    parts = [f"{run.count('pass')} passed", f"{run.count('fail')} failed"]
    parts += [f"{run.count(s)} {s}" for s in ("inconclusive", "unsupported", "out of memory") if run.count(s)]
    skipped = f"{run.count('skip')} skipped"
    if skips:
        skipped += " (" + ", ".join(f"{n} {group}" for group, n in skips.items()) + ")"
    parts.append(skipped)
    judged, total = run.entries
    applies = f"; {judged} of {total} catalogue entries judged" if total else ""
    stopped = f"; stopped early: {run.stopped}" if run.stopped else ""
    which = f" (shard {run.shard[0]}/{run.shard[1]})" if run.shard else ""
    cache = f"; {run.cache}" if run.cache else ""
    return (f"verify {run.target}{which} on {run.describe}: {', '.join(parts)}, {len(run.reduced)} reduced"
            f"{applies} in {run.seconds:.1f} s{cache}{stopped}")


def text(run, quiet=False):
    """The text report of `flashcheck verify`: capabilities, the table, every failure in full, the closing lines
    and the summary (quiet: only the failures and the closing lines, as -q prints)."""
    parts = [] if quiet else [capabilities_line(run), "", table(run), ""]
    failures = details(run)
    if failures:
        parts += [failures, ""]
    parts += reduced_lines(run) + outcome_lines(run) + run.notes + kinds_line(run)
    parts.append(summary(run))
    return "\n".join(parts)


def publish(text, data, json_path):
    """A human report and its JSON: the text on stdout, or on stderr when the JSON goes to stdout ('-')."""
    print(text, file=sys.stderr if json_path == "-" else sys.stdout)
    if json_path == "-":
        print(json.dumps(data, indent=1))
    elif json_path:
        with open(json_path, "w") as f:
            f.write(json.dumps(data, indent=1) + "\n")


def atomic_write(path, write):
    """Write a file through write(f) atomically (a reader never sees half a file), with the permissions a plain
    open() would give it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".flashcheck-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        umask = os.umask(0)        # mkstemp makes the file 0600: give it the permissions a plain open() would
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Progress:
    """Progress on stderr, with an estimate of the time left (from the pace of the cases finished so far). On a
    terminal: one self-overwriting bar. On a log (CI): a line "[n/total] case (elapsed, failures, time left)" at
    most every HEARTBEAT seconds, so that a short run adds nothing and a long one shows where it is. Off with
    --quiet."""
    HEARTBEAT = 10.0

    def __init__(self, total, enabled=True, stream=None):
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.failed = 0
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.lock = threading.Lock()      # verify --jobs: cases start in several threads

    def start(self, n, name):
        if not self.enabled:
            return
        with self.lock:
            self._start(n, name)

    def left(self, now=None):
        """'about N s left' (or min), from the pace so far; '' before the first case finished."""
        if not self.done or self.done >= self.total:
            return ""
        seconds = (now or time.monotonic()) - self.t0
        rest = seconds / self.done * (self.total - self.done)
        return f"about {rest:.0f} s left" if rest < 120 else f"about {rest / 60:.0f} min left"

    def _start(self, n, name):
        now = time.monotonic()
        left = self.left(now)
        if self.tty:
            width = 30
            done = width * (n - 1) // max(self.total, 1)
            fails = f" {self.failed} failed" if self.failed else ""
            eta = f" ({left})" if left else ""
            self.stream.write(f"\r\x1b[K[{'#' * done}{'.' * (width - done)}] {n}/{self.total}{fails}{eta} {name}")
        elif now - self.last >= self.HEARTBEAT:
            eta = f", {left}" if left else ""
            self.stream.write(f"[{n}/{self.total}] {name} ({now - self.t0:.0f} s, {self.failed} failed so far{eta})\n")
            self.last = now
        self.stream.flush()

    def finish(self, result):
        if result.status != "skip":
            self.judged(result.status == "fail")

    def judged(self, failed):
        """One case judged (verify's generated cases count when their verdict arrives: they are recorded after
        the last of them, and the estimate stood still while they ran)."""
        self.failed += bool(failed)
        self.done += 1

    def close(self):
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
