"""The files of a verify run: a JSON record and JUnit XML (one testcase per case, so that CI systems list every
case), written again as each case finishes. A run that is killed or times out leaves valid files that say
they are partial ("partial": true in the JSON, a property partial=true in the XML); the last write of a
finished run says it is complete. Each write goes to a temporary file renamed over the old one, so a reader
never sees half a file.
"""
import json
import sys
import time
import xml.etree.ElementTree as ET

from flashcheck.cases.case import parse_case
from flashcheck.cases.oracle.verdict import Capabilities, Failure, Verdict
from flashcheck.cases.report import Result, Run, atomic_write, capabilities_line, html, summary


def _num(x):
    """JSON has no NaN or infinity: those become strings."""
    if x is None or (x == x and abs(x) != float("inf")):
        return x
    return str(x)


def to_dict(run, partial=False):
    def failure(f):
        return {"kind": str(f.kind), "message": f.message, "where": list(f.where) if f.where else None,
                "got": _num(f.got), "expected": _num(f.expected), "tol": _num(f.tol), "location": f.location,
                "axes": list(f.axes) if f.axes else None, "worst": list(f.worst) if f.worst else None,
                "line": f.line()}

    cases = []
    for r in run.results:
        entry = {"name": r.case.name, "status": r.status, "origin": r.origin, "case": r.case.source(),
                 "index": r.index}
        if r.status == "skip":
            entry.update(reason=r.reason, skip_group=r.skip_group)
        else:
            v = r.verdict
            entry.update(kind=str(v.kind), ratio=_num(v.ratio), max_err=_num(v.max_err), tol=_num(v.tol),
                         note=v.note, seconds=round(v.seconds, 4), reduced=list(v.reduced),
                         peak_bytes=v.peak_bytes, failures=[failure(f) for f in v.failures])
            if v.timing:      # where the run's time went: when judging began (from the run's start), for how long
                entry["timing"] = {"start": round(v.timing[0], 3), "seconds": round(v.timing[1], 3),
                                   "worker": v.timing[2]}
            if r.status == "fail":
                entry["repro"] = v.repro()
        cases.append(entry)
    c = run.caps
    judged, total = run.entries
    return {"target": run.target, "backend": run.describe, "partial": partial, "stopped": run.stopped,
            "shard": list(run.shard) if run.shard else None,
            "capabilities": {"out": c.out, "return_lse": c.lse, "blocks": c.blocks, "causal": c.causal,
                             "scale": c.scale, "features": sorted(c.features), "notes": dict(c.notes or {})},
            "declared": run.declared, "notes": run.notes,
            "summary": {"passed": run.count("pass"), "failed": run.count("fail"),
                        "inconclusive": run.count("inconclusive"), "unsupported": run.count("unsupported"),
                        "out_of_memory": run.count("out of memory"), "skipped": run.count("skip"),
                        "reduced": len(run.reduced), "catalogue_entries_judged": judged,
                        "catalogue_entries": total, "seconds": round(run.seconds, 3), "line": summary(run)},
            "cases": cases}


def _float(x):
    """A number of the JSON record back (NaN and infinities travel as strings)."""
    return float(x) if isinstance(x, str) else x


def from_dict(data):
    """The Run a JSON record (to_dict's document) describes: the inverse of to_dict, for flashcheck merge."""
    run = Run(data["target"], data["backend"], Capabilities(out=data["capabilities"]["out"],
                                                           lse=data["capabilities"]["return_lse"],
                                                           blocks=data["capabilities"]["blocks"],
                                                           causal=data["capabilities"]["causal"],
                                                           scale=data["capabilities"]["scale"],
                                                           features=frozenset(data["capabilities"].get("features", ())),
                                                           notes=data["capabilities"].get("notes") or {}),
              declared=list(data.get("declared", [])), notes=list(data.get("notes", [])),
              stopped=data.get("stopped", ""), shard=tuple(data["shard"]) if data.get("shard") else None)
    run.seconds = data["summary"]["seconds"]
    run.entries = (data["summary"]["catalogue_entries_judged"], data["summary"]["catalogue_entries"])
    for c in data["cases"]:
        case = parse_case(c["case"]).replace(name=c["name"])
        if c["status"] == "skip":
            run.results.append(Result(case, "skip", reason=c["reason"], skip_group=c["skip_group"], origin=c["origin"],
                                      index=c.get("index")))
            continue
        failures = [Failure(f["kind"], f["message"], tuple(f["where"]) if f["where"] else None, _float(f["got"]),
                            _float(f["expected"]), _float(f["tol"]), f["location"],
                            tuple(f["axes"]) if f.get("axes") else None,
                            tuple(f["worst"]) if f.get("worst") else None) for f in c["failures"]]
        verdict = Verdict(case, data["target"], failures, max_err=_float(c["max_err"]), tol=_float(c["tol"]),
                          ratio=_float(c["ratio"]), reduced=list(c["reduced"]), seconds=c["seconds"],
                          status=c["status"], note=c["note"], peak_bytes=c["peak_bytes"])
        run.results.append(Result(case, c["status"], verdict, origin=c["origin"], index=c.get("index")))
    return run


def junit(run, partial=False):
    """JUnit XML: one testsuite, one testcase per case; <failure> with the kind and the first failure, the
    full report as its text; <skipped> with the reason for every status besides pass and fail."""
    others = len(run.results) - run.count("pass") - run.count("fail")
    suite = ET.Element("testsuite", name=f"flashcheck verify {run.target}", tests=str(len(run.results)),
                       failures=str(run.count("fail")), errors="0", skipped=str(others),
                       time=f"{run.seconds:.3f}", timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
    props = ET.SubElement(suite, "properties")
    for name, value in (("target", run.target), ("backend", run.describe), ("capabilities", capabilities_line(run)),
                        ("partial", "true" if partial else "false"), ("summary", summary(run))):
        ET.SubElement(props, "property", name=name, value=value)
    classname = "flashcheck.verify." + run.target.replace(".py:", ":").replace(":", ".").replace("/", ".")
    for r in run.results:
        seconds = r.verdict.seconds if r.verdict is not None else 0.0
        tc = ET.SubElement(suite, "testcase", classname=classname, name=r.case.name, time=f"{seconds:.3f}")
        if r.verdict is not None and (r.verdict.peak_bytes is not None or r.verdict.ratio):
            tprops = ET.SubElement(tc, "properties")
            if r.verdict.ratio:
                ET.SubElement(tprops, "property", name="err_over_tol", value=f"{r.verdict.ratio:.4g}")
            if r.verdict.peak_bytes is not None:
                ET.SubElement(tprops, "property", name="peak_extra_bytes", value=str(r.verdict.peak_bytes))
        if r.status == "skip":
            ET.SubElement(tc, "skipped", message=r.reason)
        elif r.status == "fail":
            f = r.verdict.failures[0]
            ET.SubElement(tc, "failure", message=f.line(), type=str(f.kind)).text = r.verdict.report()
        elif r.status != "pass":
            ET.SubElement(tc, "skipped", message=f"{r.status}: {r.verdict.note}")
    root = ET.Element("testsuites", tests=suite.get("tests"), failures=suite.get("failures"), errors="0",
                      skipped=suite.get("skipped"), time=suite.get("time"))
    root.append(suite)
    return ET.ElementTree(root)


def write_json(run, path, partial=False):
    data = (json.dumps(to_dict(run, partial), indent=1) + "\n").encode()
    if path == "-":
        sys.stdout.write(data.decode())
        sys.stdout.flush()
        return
    atomic_write(path, lambda f: f.write(data))


def write_junit(run, path, partial=False):
    tree = junit(run, partial)
    ET.indent(tree)
    atomic_write(path, lambda f: tree.write(f, encoding="utf-8", xml_declaration=True))


class Files:
    """The files a run writes, kept current: update() after each case (partial; at most once every EVERY seconds,
    as each write is the whole run so far), finish() at the end. JSON to stdout ('-') is written once, at the end
    (a stream cannot be rewritten)."""

    EVERY = 1.0

    def __init__(self, json_path=None, junit_path=None, html_path=None):
        self.json, self.junit, self.html = json_path, junit_path, html_path
        self.written = None       # when update() last wrote

    def update(self, run):
        now = time.monotonic()
        if self.written is not None and now - self.written < self.EVERY:
            return
        self.written = now
        self._write(run, partial=True)

    def finish(self, run, partial=False):
        self._write(run, partial=partial, final=True)

    def _write(self, run, partial, final=False):
        if self.json and (self.json != "-" or final):
            write_json(run, self.json, partial)
        if self.junit:
            write_junit(run, self.junit, partial)
        if self.html and final:
            html.write(run, self.html, partial)
