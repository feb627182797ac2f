"""Record how long the suite's long tests took, for conftest.py's dealing of them under pytest-xdist.

    python scripts/suite_durations.py RUN.xml [--backend gpu|cpu] [--min SECONDS]

RUN.xml is the JUnit XML of one whole run (`pytest -n auto --junitxml RUN.xml`, a cold one on a GPU runner:
the compile times are part of what the dealing balances). Writes tests/durations/<backend>.json: {node id: seconds}
for every test that took at least --min seconds (default 1; the rest count as short). Only the order the tests
run in depends on it, never a verdict: a stale file makes the run's end less even, nothing else.
"""
import argparse
import json
import pathlib
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]


def node_id(testcase):
    """pytest's node id of a JUnit testcase (classname "tests.test_x", or "tests.test_x.TestClass", and name)."""
    parts = testcase.get("classname").split(".")
    n = next(i for i in range(len(parts), 0, -1) if (ROOT / "/".join(parts[:i])).with_suffix(".py").is_file())
    return "::".join(["/".join(parts[:n]) + ".py", *parts[n:], testcase.get("name")])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit")
    ap.add_argument("--backend", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--min", type=float, default=1.0)
    args = ap.parse_args(argv)
    seconds = {}
    for tc in ET.parse(args.junit).iter("testcase"):
        if any(child.tag == "skipped" for child in tc):
            continue
        t = float(tc.get("time") or 0)
        if t >= args.min:
            seconds[node_id(tc)] = round(t, 1)
    out = ROOT / "tests" / "durations" / f"{args.backend}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(dict(sorted(seconds.items())), indent=0) + "\n")
    print(f"{out.relative_to(ROOT)}: {len(seconds)} tests of {args.min} s or more, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main()
