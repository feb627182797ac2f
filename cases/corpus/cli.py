"""flashcheck mutants: run the bug corpus and print the kill matrix.

    flashcheck mutants                  every catalogue case against every mutant: the kill matrix
    flashcheck mutants --killers-only   each mutant against its named killers only (fast)
    flashcheck mutants --markdown       the corpus as a markdown table (docs/mutants.md)
    flashcheck mutants --sweep          mechanical mutants of kernel/fused.py (cases/corpus/sweep.py): the score

Exit status 0 only when every mutant this backend can judge is killed (2: a mutant no longer applies).
Judging runs in-process on the CPU and in worker subprocesses on the GPU (--isolate / --no-isolate
override; --jobs N > 1 always uses N workers), so that a device fault kills one mutant, not the run.
This module imports neither Triton nor kernel.* at import time: the backend is chosen after parsing.
"""
import argparse
import sys
import time
import warnings

from flashcheck.cases import catalogue
from flashcheck.cases.backend import backend, describe
from flashcheck.cases.case import parse_case
from flashcheck.cases.corpus import mutants, sweep
from flashcheck.cases.oracle.kinds import Kind
from flashcheck.cases.report import publish


def add_arguments(parser):
    parser.add_argument("--json", metavar="PATH", help="write the full results as JSON ('-': stdout)")
    parser.add_argument("--killers-only", action="store_true",
                        help="judge each mutant on its named killers only, not the whole catalogue")
    parser.add_argument("--mutant", action="append", metavar="NAME", help="only this mutant (repeatable)")
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                        help="judge in worker subprocesses (default: on the GPU only)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="worker subprocesses judging in parallel (N > 1 implies --isolate)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds a worker may spend on one case before it is stopped (isolated runs)")
    parser.add_argument("--markdown", action="store_true", help="print the corpus as a markdown table and exit")
    parser.add_argument("--sweep", action="store_true",
                        help="generate mechanical mutants of kernel/fused.py, run the catalogue on each, report "
                             "the mutation score and classify the survivors")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="--sweep: only the first N mutants")
    parser.add_argument("--extra-case", action="append", default=[], metavar="'Case(...)'",
                        help="judge with this proposed case besides the catalogue (repeatable; see "
                             "cases/case.py Case.source() for the syntax)")


def run(args):

    # mutants compute NaN and inf on purpose: NumPy's warnings from inside the interpreter are noise here
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.")

    if args.markdown:
        print(mutants.markdown())
        return 0
    if args.jobs < 1:
        print("flashcheck mutants: --jobs must be >= 1", file=sys.stderr)
        return 2

    try:
        args.extra_cases = [parse_case(text) for text in args.extra_case]
    except (ValueError, SyntaxError, TypeError) as exc:
        print(f"flashcheck mutants: --extra-case: {exc}", file=sys.stderr)
        return 2
    if args.sweep:

        return sweep.run(args)
    return _matrix(args)


def progress(text):
    print(text, file=sys.stderr, flush=True)


def _matrix(args):
    be = backend()
    try:
        chosen = [mutants.get(n) for n in args.mutant] if args.mutant else list(mutants.MUTANTS)
    except KeyError as exc:
        print(f"flashcheck mutants: {exc.args[0]}", file=sys.stderr)
        return 2
    drift = []
    for m in chosen:
        try:
            mutants.source(m)
        except mutants.MutantDrift as exc:
            drift.append(str(exc))
    if drift:
        print("flashcheck mutants: the corpus no longer applies to the kernel:\n" + "\n".join(drift), file=sys.stderr)
        return 2

    # each entry once, in the dtype the corpus judges it in (catalogue.primary)
    judgeable = catalogue.judgeable(be) + args.extra_cases
    judged = [m for m in chosen if not (m.gpu_only and be != "gpu")]
    skipped = [m for m in chosen if m not in judged]
    if args.killers_only:
        # a killer names an entry (its primary instance) or one instance, name[fp16]
        tasks = [(m, catalogue.judgeable(be, [catalogue.get(k) for k in m.killers])) for m in judged]
    else:
        tasks = [(m, judgeable) for m in judged]
    isolate = args.isolate if args.isolate is not None else be == "gpu"
    isolate = isolate or args.jobs > 1
    what = "named killers" if args.killers_only else f"{len(judgeable)} cases"
    progress(f"flashcheck mutants: {len(judged)} mutants x {what}"
             f" on {describe()}{' (isolated, %d job(s))' % args.jobs if isolate else ''}")

    t0 = time.perf_counter()
    done = [0]

    def on_done(i, mutant, results):
        done[0] += 1
        kills = sum(1 for _, v in results if v.failed)
        state = f"killed by {kills}/{len(results)}" if mutants.killed(results) else "SURVIVED"
        progress(f"[{done[0]:>3}/{len(tasks)}] {mutant.name:<30} {state:<18} "
                 f"{time.perf_counter() - t0:7.1f} s elapsed")

    if isolate:
        outcomes = mutants.judge_isolated(tasks, jobs=args.jobs, timeout=args.timeout, on_done=on_done)
    else:
        outcomes = []
        for i, (m, cases) in enumerate(tasks):
            outcomes.append(mutants.kill(m, cases, isolate=False))
            on_done(i, m, outcomes[-1])
    seconds = time.perf_counter() - t0

    report = _report(be, describe(), judgeable, tasks, outcomes, skipped, seconds, args.killers_only)
    publish(_render(report), report, args.json)
    return 0 if not report["survivors"] else 1


def _report(be, where, cases, tasks, outcomes, skipped, seconds, killers_only):
    rows = []
    for (m, judged_cases), results in zip(tasks, outcomes):
        res = {c.name: {"kind": str(v.kind), "passed": not v.failed, "seconds": round(v.seconds, 3),
                        "failure": v.failures[0].line() if v.failures else None} for c, v in results}
        kills = [n for n, r in res.items() if not r["passed"]]
        rows.append({"name": m.name, "module": m.module, "breaks": m.breaks, "origin": m.origin,
                     "killers": list(m.killers), "gpu_only": m.gpu_only, "skipped": None,
                     "killed": bool(kills), "results": res,
                     "named_killers_missed": [k for k in m.killers
                                              if res.get(catalogue.get(k).name, {}).get("passed")]})
    for m in skipped:
        rows.append({"name": m.name, "module": m.module, "breaks": m.breaks, "origin": m.origin,
                     "killers": list(m.killers), "gpu_only": m.gpu_only,
                     "skipped": f"GPU only: {m.gpu_only}", "killed": None, "results": {},
                     "named_killers_missed": []})
    # with --killers-only a killer may be an instance outside `cases` (head_dim_2[fp16]): count every case judged
    judged = list(dict.fromkeys([c.name for c in cases] + [n for r in rows for n in r["results"]]))
    sole = {n: [] for n in judged}
    kills_by_case = {n: 0 for n in judged}
    for r in rows:
        killers = [n for n, x in r["results"].items() if not x["passed"]]
        for n in killers:
            kills_by_case[n] += 1
        if len(killers) == 1:
            sole[killers[0]].append(r["name"])
    return {"backend": be, "where": where, "seconds": round(seconds, 1), "killers_only": killers_only,
            "cases": judged, "mutants": rows,
            "survivors": [r["name"] for r in rows if r["killed"] is False],
            "skipped": [r["name"] for r in rows if r["skipped"]],
            "sole_killer_of": {n: v for n, v in sole.items() if v},
            "kills_by_case": kills_by_case}


def _code(kind):
    try:
        return Kind(kind).code
    except ValueError:     # an outcome that is not a failure
        return "?"


def _render(report):
    cases = report["cases"]
    rows = [r for r in report["mutants"] if not r["skipped"]]
    used = [c for c in cases if any(c in r["results"] for r in rows)]
    width = max([len(r["name"]) for r in report["mutants"]] + [10]) + 2
    out = [f"Kill matrix: {len(rows)} mutants x {len(used)} cases on {report['where']} "
           f"({report['seconds']:.0f} s{', named killers only' if report['killers_only'] else ''})",
           "cell: the failure kind of the kill (" + ", ".join(f"{k.code} {k}" for k in Kind)
           + "); '.' survived; ' ' not run", ""]
    for i, c in enumerate(used):
        out.append(f"  {i + 1:>3} {c}")
    out.append("")
    tens = "".join(str((i + 1) // 10 % 10) if (i + 1) % 10 == 0 else " " for i in range(len(used)))
    units = "".join(str((i + 1) % 10) for i in range(len(used)))
    out += [" " * width + tens, " " * width + units]
    for r in rows:
        cells = "".join(" " if c not in r["results"] else
                        "." if r["results"][c]["passed"] else _code(r["results"][c]["kind"]) for c in used)
        n = sum(1 for x in r["results"].values() if not x["passed"])
        out.append(f"{r['name']:<{width}}{cells}  {n} kill{'s' if n != 1 else ''}")
    out.append("")
    for r in report["mutants"]:
        if r["skipped"]:
            out.append(f"skipped {r['name']}: {r['skipped']}")
    missed = [(r["name"], r["named_killers_missed"]) for r in rows if r["named_killers_missed"]]
    for name, ks in missed:
        out.append(f"note: {name} survived named killer(s) {', '.join(ks)} "
                   "(cases/corpus/mutants.py names them as killers)")
    if not report["killers_only"]:
        out.append("")
        out.append("cases that alone kill a mutant (deleting one loses that bug):")
        sole = report["sole_killer_of"]
        for c in used:
            if c in sole:
                out.append(f"  {c}: {', '.join(sole[c])}")
        if not sole:
            out.append("  none: every killed mutant has at least two killers")
        idle = [c for c in used if report["kills_by_case"][c] == 0]
        if idle:
            out.append(f"cases that kill no mutant: {', '.join(idle)}")
    out.append("")
    judged = len(rows)
    if report["survivors"]:
        for r in rows:
            if r["name"] in report["survivors"]:
                out.append(f"SURVIVOR {r['name']} ({r['module']}): {r['breaks']}; expected killers: "
                           f"{', '.join(r['killers'])}")
        out.append(f"FAIL: {len(report['survivors'])} of {judged} judgeable mutants survived")
    else:
        out.append(f"OK: all {judged} judgeable mutants killed"
                   + (f" ({len(report['skipped'])} skipped: GPU only)" if report["skipped"] else ""))
    return "\n".join(out)
