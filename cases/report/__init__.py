"""What `flashcheck verify` prints and writes: the table, the failure details, the summary line, a JSON
record and JUnit XML (one testcase per case, so that CI systems list every case), and a progress line.

Statuses: "pass", "fail", "skip". A skipped case is never counted as passed; its reason is always shown.
"""
import json
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

# the failures found by the comparison with the reference, whose max error the table shows (the others stop
# before it, or come from a later layer after the reference comparison passed)
_REFERENCE_KINDS = {"mismatch", "NaN", "out-of-bounds read"}


@dataclass
class Result:
    case: object                 # flashcheck.cases.case.Case
    status: str                  # "pass", "fail" or "skip"
    verdict: object = None       # flashcheck.cases.oracle.Verdict of a case that ran
    reason: str = ""             # why a case was skipped
    skip_group: str = ""         # "GPU only" or "not declared": the summary counts skips by group
    origin: str = "catalogue"    # "catalogue", "--case" or "hypothesis"


@dataclass
class Run:
    target: str
    describe: str                # backend, device, torch and triton versions
    caps: object                 # flashcheck.cases.oracle.Capabilities
    declared: list = field(default_factory=list)   # the support declarations, as flags
    results: list = field(default_factory=list)
    seconds: float = 0.0
    notes: list = field(default_factory=list)      # e.g. what the hypothesis examples found

    def count(self, status):
        return sum(r.status == status for r in self.results)

    @property
    def reduced(self):
        return [r for r in self.results if r.verdict is not None and r.verdict.reduced]


def _err(verdict):
    if not verdict.tol or not (verdict.passed or verdict.kind in _REFERENCE_KINDS):
        return "-"
    return f"{verdict.max_err:.2g} / {verdict.tol:.2g}"


def _element(failure):
    """"(b, h, row, col) got .. expected .." of a failure, or its message when it has no element."""
    if failure.where is None:
        return failure.message
    b, h, i, d = failure.where
    s = f"b={b} h={h} row={i} col={d}"
    if failure.got is not None:
        s += f": got {failure.got:.6g}, expected {failure.expected:.6g}"
    return s


def _row(result):
    v = result.verdict
    if result.status == "skip":
        return [result.case.name, "SKIP", "-", "-", result.reason]
    if result.status == "pass":
        return [result.case.name, "PASS", _err(v), "-", ""]
    return [result.case.name, "FAIL", _err(v), v.kind, _element(v.failures[0])]


def table(run, width=160):
    """The results as an aligned text table; the last column is cut to fit `width`."""
    head = ["case", "verdict", "max err / tol", "failure", "first bad element / reason"]
    rows = [head] + [_row(r) for r in run.results]
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        text = ("  ".join(str(c).ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4]).rstrip()
        lines.append(text if len(text) <= width else text[:width - 3] + "...")
        if n == 0:
            lines.append("-" * min(width, max(len(x) for x in lines)))
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
            kinds[r.verdict.kind] = kinds.get(r.verdict.kind, 0) + 1
    if sum(kinds.values()) < 2:
        return []
    return ["failures by kind: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda x: -x[1]))]


def capabilities_line(run):
    c = run.caps
    yes = {True: "yes", False: "no"}
    line = (f"capabilities: out= {yes[c.out]}, return_lse= {yes[c.lse]}"
            + ("" if c.lse else " (log-sum-exp not checked)")
            + f", block_m/block_n {yes[c.blocks]}" + ("" if c.blocks else " (cases' block pins not passed)"))
    if run.declared:
        line += "; declared: " + " ".join(run.declared)
    return line


def summary(run):
    skips = {}
    for r in run.results:
        if r.status == "skip":
            skips[r.skip_group] = skips.get(r.skip_group, 0) + 1
    skipped = f"{run.count('skip')} skipped"
    if skips:
        skipped += " (" + ", ".join(f"{n} {group}" for group, n in skips.items()) + ")"
    return (f"verify {run.target} on {run.describe}: {run.count('pass')} passed, {run.count('fail')} failed, "
            f"{skipped}, {len(run.reduced)} reduced in {run.seconds:.1f} s")


def to_dict(run):
    def failure(f):
        return {"kind": f.kind, "message": f.message, "where": list(f.where) if f.where else None,
                "got": _num(f.got), "expected": _num(f.expected), "tol": _num(f.tol), "line": f.line()}

    cases = []
    for r in run.results:
        entry = {"name": r.case.name, "status": r.status, "origin": r.origin, "case": r.case.source()}
        if r.status == "skip":
            entry.update(reason=r.reason, skip_group=r.skip_group)
        else:
            v = r.verdict
            entry.update(kind=v.kind, max_err=_num(v.max_err), tol=_num(v.tol), seconds=round(v.seconds, 4),
                         reduced=list(v.reduced), failures=[failure(f) for f in v.failures])
            if r.status == "fail":
                entry["repro"] = v.repro()
        cases.append(entry)
    c = run.caps
    return {"target": run.target, "backend": run.describe,
            "capabilities": {"out": c.out, "return_lse": c.lse, "blocks": c.blocks},
            "declared": run.declared, "notes": run.notes,
            "summary": {"passed": run.count("pass"), "failed": run.count("fail"), "skipped": run.count("skip"),
                        "reduced": len(run.reduced), "seconds": round(run.seconds, 3)},
            "cases": cases}


def _num(x):
    """JSON has no NaN or infinity: those become strings."""
    if x is None or (x == x and abs(x) != float("inf")):
        return x
    return str(x)


def publish(text, data, json_path):
    """A human report and its JSON: the text on stdout, or on stderr when the JSON goes to stdout ('-')."""
    print(text, file=sys.stderr if json_path == "-" else sys.stdout)
    if json_path == "-":
        print(json.dumps(data, indent=1))
    elif json_path:
        with open(json_path, "w") as f:
            f.write(json.dumps(data, indent=1) + "\n")


def write_json(run, path):
    with open(path, "w") as f:
        json.dump(to_dict(run), f, indent=1)
        f.write("\n")


def junit(run):
    """JUnit XML: one testsuite, one testcase per case; <failure> with the kind and the first failure,
    the full report as its text; <skipped> with the reason."""
    suite = ET.Element("testsuite", name=f"flashcheck verify {run.target}", tests=str(len(run.results)),
                       failures=str(run.count("fail")), errors="0", skipped=str(run.count("skip")),
                       time=f"{run.seconds:.3f}", timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
    props = ET.SubElement(suite, "properties")
    for name, value in (("target", run.target), ("backend", run.describe), ("capabilities", capabilities_line(run))):
        ET.SubElement(props, "property", name=name, value=value)
    classname = "flashcheck.verify." + run.target.replace(".py:", ":").replace(":", ".").replace("/", ".")
    for r in run.results:
        seconds = r.verdict.seconds if r.verdict is not None else 0.0
        tc = ET.SubElement(suite, "testcase", classname=classname, name=r.case.name, time=f"{seconds:.3f}")
        if r.status == "skip":
            ET.SubElement(tc, "skipped", message=r.reason)
        elif r.status == "fail":
            f = r.verdict.failures[0]
            ET.SubElement(tc, "failure", message=f.line(), type=f.kind).text = r.verdict.report()
    root = ET.Element("testsuites", tests=suite.get("tests"), failures=suite.get("failures"), errors="0",
                      skipped=suite.get("skipped"), time=suite.get("time"))
    root.append(suite)
    return ET.ElementTree(root)


def write_junit(run, path):
    tree = junit(run)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


class Progress:
    """Progress on stderr. On a terminal: one self-overwriting bar. On a log (CI): a line "[n/total] case"
    at most every HEARTBEAT seconds, so that a short run adds nothing and a long one shows where it is.
    Off with --quiet."""
    HEARTBEAT = 10.0

    def __init__(self, total, enabled=True, stream=None):
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.failed = 0
        self.t0 = self.last = time.monotonic()

    def start(self, n, name):
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            width = 30
            done = width * (n - 1) // max(self.total, 1)
            fails = f" {self.failed} failed" if self.failed else ""
            self.stream.write(f"\r\x1b[K[{'#' * done}{'.' * (width - done)}] {n}/{self.total}{fails} {name}")
        elif now - self.last >= self.HEARTBEAT:
            self.stream.write(f"[{n}/{self.total}] {name} ({now - self.t0:.0f} s, {self.failed} failed so far)\n")
            self.last = now
        self.stream.flush()

    def finish(self, result):
        self.failed += result.status == "fail"

    def close(self):
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
