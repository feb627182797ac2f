"""`flashcheck merge SHARD.json ...`: the JSON records of a sharded verify (`verify --shard I/N`, one per shard, from
a CI job matrix or a Slurm job array) put back together as one run: one text report, one JSON record, one JUnit
file and one exit status, as the unsharded run would have given them (cases/verify/shard.py says how cases are
shared out).

    flashcheck merge shard-*.json --json verify.json --junit verify.xml

Every shard 1..N must be there once, of one target and backend; a shard cut short (partial) makes the merged run
partial. Exit status: 0 a case passed and none failed, 1 a case failed, 2 a usage error or nothing judged.
"""
import json
import sys

from flashcheck.cases import report
from flashcheck.cases.report import files


def add_arguments(parser):
    parser.add_argument("records", nargs="+", metavar="SHARD.json", help="the JSON record of each shard (--json)")
    parser.add_argument("--json", metavar="PATH", help="write the merged JSON record ('-': stdout)")
    parser.add_argument("--junit", metavar="PATH", help="write the merged JUnit XML")
    parser.add_argument("-q", "--quiet", action="store_true", help="only the failures and the summary line")


class MergeError(Exception):
    """Records that do not make one run (a usage error)."""


def merge(documents):
    """(Run, partial) of the shards' JSON documents."""
    if not documents:
        raise MergeError("no records given")
    shards = [d.get("shard") for d in documents]
    if any(s is None for s in shards):
        raise MergeError("a record is not a shard's (verify --shard I/N wrote none of them)"
                         if all(s is None for s in shards) else "some records are not shards' (no --shard)")
    n = shards[0][1]
    if any(s[1] != n for s in shards):
        raise MergeError(f"the records are shards of different runs: {sorted(tuple(s) for s in shards)}")
    have = sorted(s[0] for s in shards)
    if have != list(range(1, n + 1)):
        missing = sorted(set(range(1, n + 1)) - set(have))
        twice = sorted({i for i in have if have.count(i) > 1})
        raise MergeError(f"shards of /{n}: " + "; ".join(part for part in (
            f"missing {', '.join(map(str, missing))}" if missing else "",
            f"given twice {', '.join(map(str, twice))}" if twice else "") if part))
    for key in ("target", "backend", "declared"):
        values = {json.dumps(d.get(key)) for d in documents}
        if len(values) > 1:
            raise MergeError(f"the shards disagree on {key}: {', '.join(sorted(values))}")
    runs = [files.from_dict(d) for d in documents]
    merged = report.Run(runs[0].target, runs[0].describe, runs[0].caps, declared=runs[0].declared)
    results = [r for run in runs for r in run.results]
    # each kind of generated failure keeps one minimal case: the one shrunk from its earliest failure, as one run has
    minimal = {}
    for r in results:
        if r.case.name.startswith("hypothesis_minimal") and r.status == "fail":
            kind = str(r.verdict.kind)
            if kind not in minimal or r.index < minimal[kind].index:
                minimal[kind] = r
    keep = {id(r) for r in minimal.values()}
    results = [r for r in results if not r.case.name.startswith("hypothesis_minimal") or id(r) in keep]
    merged.results = sorted(results, key=lambda r: (r.index is None, r.index if r.index is not None else 0))
    judged = {r.case.name.partition("[")[0] for r in merged.results if r.origin == "catalogue" and r.status != "skip"}
    merged.entries = (len(judged), runs[0].entries[1])
    merged.seconds = max(run.seconds for run in runs)
    for i, run in sorted(zip(have, runs), key=lambda x: x[1].shard[0]):
        merged.notes += [f"shard {run.shard[0]}/{n}: {note}" for note in run.notes]
    stops = [f"shard {run.shard[0]}/{n}: {run.stopped}" for run in runs if run.stopped]
    merged.stopped = "; ".join(stops)
    merged.notes.append(f"merged from {n} shards; wall time of the slowest shard")
    partial = any(d.get("partial") for d in documents)
    return merged, partial


def run(args):
    documents = []
    try:
        for path in args.records:
            with open(path) as f:
                documents.append(json.load(f))
        merged, partial = merge(documents)
    except (OSError, ValueError, KeyError, MergeError) as exc:
        print(f"flashcheck merge: error: {exc}", file=sys.stderr)
        return 2
    text = report.text(merged, quiet=args.quiet)
    report.publish(text, files.to_dict(merged, partial), args.json)
    if args.junit:
        files.write_junit(merged, args.junit, partial)
    return merged.exit_code()
