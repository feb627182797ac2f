"""Measured power of the properties alone: run cases/generate/properties.py (no named catalogue case) against every
mutant of the bug corpus (cases/corpus/mutants.py) and report which mutants they kill, the fraction, and the time.

    python -m flashcheck.cases.corpus.power [--examples N] [--mutant NAME ...] [--property NAME ...] [--shrink]
                                            [--seed S] [--drawn-only]
                          [--jobs N] [--json PATH]

For each mutant: hypothesis generates up to N cases (derandomized: a run repeats exactly, and every mutant
starts from the same cases; hypothesis steers later ones by what earlier ones did), checks every applicable
property on each (the mutant as the kernel; the other project kernel for the agreement property) and stops
at the first failure. A mutant of kernel/fused.py is compared with the real
unfused kernel and vice versa. --shrink also shrinks the killing case to a minimal catalogue entry.
--property restricts the search to some properties (e.g. the metamorphic relations alone, without the
reference, to measure what they catch with no oracle of record). Each search starts, as verify's generated
cases do, with the representative cases (strategies.representative); --drawn-only leaves them out, to measure
the drawn cases alone.

Each mutant runs in a child of the runner of cases/runner/worker.py (the one verify uses): a mutant that
corrupts memory (an interpreter store out of bounds) or faults the GPU takes down its child only, which counts
as a kill ("crash" or "device fault"), as a hang past --timeout does ("timeout").
"""
import argparse
import json
import os
import queue
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass

from flashcheck.cases import features
from flashcheck.cases.backend import backend, describe, select_backend
from flashcheck.cases.corpus import mutants
from flashcheck.cases.generate import properties
from flashcheck.cases.generate.properties import NAMES
from flashcheck.cases.runner.target import TargetError
from flashcheck.cases.runner.worker import Died, Hung, Raised, Worker

DEFAULT_EXAMPLES = 40
DEFAULT_TIMEOUT = 900.0


@dataclass
class Outcome:
    mutant: str
    module: str
    status: str             # "killed", "missed", "skipped" (GPU only here), "error" (does not apply / load)
    prop: str = ""          # the property that killed it
    kind: str = ""          # the failure kind (an oracle Kind's text)
    detail: str = ""        # the failure's first line, the skip reason, or the error
    entry: str = ""         # the killing case as a catalogue entry (Case.source())
    examples: int = 0       # generated cases tried (shrinking included)
    seconds: float = 0.0


def hunt(attention, mutant, examples, shrink, seed, props, representative=True):
    """Search the properties for a failure of the mutant (its loaded `attention`). Returns an Outcome as a
    dict. Runs in the runner's child (or in this process with isolate=False)."""
    from flashcheck.kernel import fused, unfused   # lazy: Triton, after main() has chosen the backend

    other = fused.attention if mutant.module == "unfused" else unfused.attention
    # the project's kernels have every optional feature: drawn as verify's generated cases draw them for a kernel
    # that has them (each in about half the cases)
    result = properties.search(attention, examples, other=other, target=mutants.target(mutant),
                               names=props, shrink=shrink, seed=seed, kernels=("fused", "unfused"),
                               representative=representative, features=frozenset(features.BY_NAME))
    f = result.failure
    if f is None:
        return asdict(Outcome(mutant.name, mutant.module, "missed", examples=result.examples,
                              seconds=result.seconds))
    return asdict(Outcome(mutant.name, mutant.module, "killed", f.prop, str(f.failure.kind),
                          f.failure.line()[:300], f.entry().source(), result.examples, result.seconds))


def _hunt_isolated(worker, mutant, examples, shrink, seed, props, timeout, representative=True):
    """hunt() in the runner's child; a child that dies or hangs kills the mutant (crash / timeout)."""
    t0 = time.perf_counter()
    try:
        worker.open(mutants.spec(mutant))
        return Outcome(**worker.call("flashcheck.cases.corpus.power:hunt", mutant, examples, shrink, seed, props,
                                     representative, timeout=timeout))
    except TargetError as exc:   # drift (the kernel changed under it) or a mutant that does not import
        return Outcome(mutant.name, mutant.module, "error", detail=str(exc)[:500])
    except Died as exc:
        return Outcome(mutant.name, mutant.module, "killed", kind=str(exc.kind), detail=str(exc)[:300],
                       seconds=time.perf_counter() - t0)
    except Hung:
        return Outcome(mutant.name, mutant.module, "killed", kind="timeout", detail=f"no verdict within "
                       f"{timeout:.0f} s", seconds=time.perf_counter() - t0)
    except Raised as exc:
        return Outcome(mutant.name, mutant.module, "error", detail=f"the search itself failed: {exc}"[:500])


def measure(names=None, *, examples=DEFAULT_EXAMPLES, props=None, shrink=False, seed=None, isolate=True,
            timeout=DEFAULT_TIMEOUT, jobs=1, progress=None, representative=True):
    """Outcomes of the properties (all, or those named in props) against the corpus (or the named
    mutants), in corpus order. jobs > 1 hunts that many mutants at once (isolated only); progress(outcome)
    is called as each one ends, in the order they end. representative=False: the drawn cases alone, without
    the representative cases verify judges first (properties.search)."""
    chosen = [mutants.get(n) for n in names] if names else list(mutants.MUTANTS)
    outcomes = [None] * len(chosen)
    lock = threading.Lock()

    def done(i, outcome):
        with lock:
            outcomes[i] = outcome
            if progress:
                progress(outcome)

    pending = queue.Queue()
    for i, m in enumerate(chosen):
        if m.gpu_only and backend() != "gpu":
            done(i, Outcome(m.name, m.module, "skipped", detail=f"GPU only: {m.gpu_only}"))
        elif not isolate:
            try:
                attention = mutants.kernel(m)
            except Exception as exc:  # noqa: BLE001  (drift, or a mutant that does not import)
                done(i, Outcome(m.name, m.module, "error", detail=f"{type(exc).__name__}: {exc}"[:500]))
                continue
            done(i, Outcome(**hunt(attention, m, examples, shrink, seed, props, representative)))
        else:
            pending.put((i, m))

    def slot():
        worker = Worker(timeout, compile_timeout=timeout)   # the project's own kernels compile within it
        try:
            while True:
                try:
                    i, m = pending.get_nowait()
                except queue.Empty:
                    return
                done(i, _hunt_isolated(worker, m, examples, shrink, seed, props, timeout, representative))
        finally:
            worker.close()

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(max(1, min(jobs, pending.qsize())))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return outcomes


def line(o):
    if o.status == "killed":
        head = f"killed by {o.prop or o.kind}" + (f" ({o.kind})" if o.prop else "")
        return (f"{o.mutant:32s} {head:40s} after {o.examples:3d} case(s) {o.seconds:7.1f} s"
                + (f"\n    {o.entry}" if o.entry else ""))
    if o.status == "missed":
        return f"{o.mutant:32s} {'MISSED':40s} after {o.examples:3d} case(s) {o.seconds:7.1f} s"
    return f"{o.mutant:32s} {o.status.upper()}: {o.detail}"


def summary(outcomes, seconds):
    judged = [o for o in outcomes if o.status in ("killed", "missed")]
    killed = [o for o in judged if o.status == "killed"]
    missed = [o.mutant for o in judged if o.status == "missed"]
    skipped = [o.mutant for o in outcomes if o.status == "skipped"]
    errors = [o.mutant for o in outcomes if o.status == "error"]
    frac = len(killed) / len(judged) if judged else 0.0
    lines = [f"properties alone killed {len(killed)}/{len(judged)} mutants ({100 * frac:.0f}%) in {seconds:.0f} s"]
    if missed:
        lines.append("missed: " + ", ".join(missed))
    if skipped:
        lines.append("skipped (GPU only on this backend): " + ", ".join(skipped))
    if errors:
        lines.append("errors (not judged): " + ", ".join(errors))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashcheck.cases.corpus.power",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, metavar="N",
                        help=f"generated cases per mutant at most (default {DEFAULT_EXAMPLES})")
    parser.add_argument("--mutant", action="append", metavar="NAME", help="only this mutant (repeatable)")
    parser.add_argument("--property", action="append", metavar="NAME",
                        help="only this property (repeatable; default all of cases/generate/properties.py)")
    parser.add_argument("--shrink", action="store_true", help="shrink each killing case to a minimal one")
    parser.add_argument("--seed", type=int, help="a random seed instead of the derandomized sequence")
    parser.add_argument("--no-isolate", action="store_true", help="run every mutant in this process")
    parser.add_argument("--drawn-only", action="store_true",
                        help="the drawn cases alone, without the representative cases verify judges first")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="hunt N mutants at once, each in its own forked child (default 1)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds per mutant before it counts as a hang (default {DEFAULT_TIMEOUT:.0f})")
    parser.add_argument("--backend", choices=["cpu", "gpu"], help="force a backend")
    parser.add_argument("--json", metavar="PATH", help="also write the outcomes as JSON")
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error("--examples must be >= 1")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.jobs > 1 and args.no_isolate:
        parser.error("--jobs needs the forked children; drop --no-isolate")
    if args.backend:
        os.environ["FLASHCHECK_BACKEND"] = args.backend

    select_backend()

    # mutants compute NaN and inf on purpose: NumPy's warnings from inside the interpreter are noise here
    warnings.filterwarnings("ignore", category=RuntimeWarning)

    unknown = [n for n in args.mutant or () if n not in mutants.BY_NAME]
    if unknown:
        parser.error(f"no mutant named {', '.join(unknown)}")
    unknown = [n for n in args.property or () if n not in NAMES]
    if unknown:
        parser.error(f"no property named {', '.join(unknown)}; properties: {', '.join(NAMES)}")
    which = ", ".join(args.property) if args.property else "all properties"
    where = describe()
    print(f"flashcheck properties vs the bug corpus: {where}; {which}; up to {args.examples} cases per "
          f"mutant" + (f", {args.jobs} at a time" if args.jobs > 1 else ""), flush=True)
    t0 = time.perf_counter()
    outcomes = measure(args.mutant, examples=args.examples, props=args.property, shrink=args.shrink,
                       seed=args.seed, isolate=not args.no_isolate, timeout=args.timeout, jobs=args.jobs,
                       progress=lambda o: print(line(o), flush=True), representative=not args.drawn_only)
    seconds = time.perf_counter() - t0
    print()
    print(summary(outcomes, seconds))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seconds": seconds, "examples": args.examples, "properties": args.property or list(NAMES),
                       "outcomes": [asdict(o) for o in outcomes]},
                      fh, indent=1)
    return 1 if any(o.status == "error" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
