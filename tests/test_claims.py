"""The documentation's claims (scripts/check_claims.py): the marker syntax and the checker itself, the claims
marked `ci` re-run on this backend, and the relative links of the markdown pointing at files that exist.

The slow claims (whole-catalogue runs, GPU-only ones) are left to `python scripts/check_claims.py`."""
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_claims", ROOT / "scripts" / "check_claims.py")
cc = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("check_claims", cc)
_spec.loader.exec_module(cc)

CLAIMS = cc.collect(cc.FILES)
CI_CLAIMS = [c for c in CLAIMS if c.ci]


def _md(tmp_path, text, name="doc.md"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- the marker syntax -----------------------------------------------------------------------------------

def test_marker_with_transcript(tmp_path):
    path = _md(tmp_path, "intro\n\n<!-- claim: exit=1 backend=cpu ci tail=3 cmd: flashcheck verify x.py:f\n"
                         "     --only a,b -q -->\n\n```text\n$ flashcheck verify x.py:f --only a,b -q\nout\n```\n")
    [c] = cc.parse(path)
    assert (c.exit, c.backend, c.ci, c.tail, c.line) == (1, "cpu", True, 3, 3)
    assert c.cmd == "flashcheck verify x.py:f --only a,b -q"
    assert c.recorded == ["$ flashcheck verify x.py:f --only a,b -q", "out"]


def test_marker_defaults_and_contains(tmp_path):
    path = _md(tmp_path, "<!-- claim: exit=0 contains='got 5, expected 7.5' contains=ok cmd: python -V -->\n"
                         "```bash\npython -V\n```\n")
    [c] = cc.parse(path)
    assert (c.backend, c.ci, c.block, c.recorded) == ("any", False, None, None)   # a bash block is no transcript
    assert c.contains == ["got 5, expected 7.5", "ok"]


def test_examples_of_the_syntax_are_not_claims(tmp_path):
    path = _md(tmp_path, "```\n<!-- claim: exit=0 cmd: python -V -->\n```\n\n"
                         "Write `<!-- claim: exit=0 cmd: python -V -->` before the block.\n")
    assert cc.parse(path) == []


@pytest.mark.parametrize("marker, message", [
    ("<!-- claim: backend=cpu cmd: python -V -->", "needs exit=N"),
    ("<!-- claim: exit=0 colour=red cmd: python -V -->", "unknown claim attribute 'colour'"),
    ("<!-- claim: exit=0 backend=tpu cmd: python -V -->", "backend='tpu'"),
    ("<!-- claim: exit=zero cmd: python -V -->", "not a whole number"),
    ("<!-- claim: exit=0 head=2 tail=2 cmd: python -V -->", "head= and tail= together"),
    ("<!-- claim: exit=0 stderr=off cmd: python -V -->", "stderr='off'"),
    ("<!-- claim: exit=0 -->", "needs `cmd:`"),
    ("<!-- claim: exit=0 cmd: python -V", "without its closing -->"),
])
def test_malformed_markers(tmp_path, marker, message):
    with pytest.raises(cc.MarkerError, match=re.escape(message)):
        cc.parse(_md(tmp_path, marker + "\n"))


def test_command_words():
    argv, env = cc.argv_env("FOO=1 flashcheck verify 'a b.py:f' --case \"Case('x', Nq=1)\"")
    assert argv == [sys.executable, "-m", "flashcheck", "verify", "a b.py:f", "--case", "Case('x', Nq=1)"]
    assert env == {"FOO": "1"}
    assert cc.argv_env("python3 -c pass")[0] == [sys.executable, "-c", "pass"]


# ---- comparing ---------------------------------------------------------------------------------------------

def test_volatile_parts_are_masked():
    a = ["verify k on CPU (Triton interpreter), torch 2.13.0+cpu, triton 3.9.0: 1 passed, 5 skipped in 3.8 s",
         "[3/9] case (10 s, 0 failed so far)"]
    b = ["verify k on CPU (Triton interpreter), torch 2.14.1+cpu, triton 3.10.0: 1 passed, 5 skipped in 12 s",
         "[3/9] case (20 s, 0 failed so far)"]
    assert cc.normalise(a) == cc.normalise(b)
    assert cc.normalise(a, strict=True) != cc.normalise(b, strict=True)
    # numbers that are not timings still count
    assert cc.normalise(["2 passed in 1 s"]) != cc.normalise(["3 passed in 1 s"])
    assert cc.clean("x\n[3/9] case (10 s, 0 failed so far)\ny  \n\n") == ["x", "y"]


def test_a_passing_cases_rounding_is_masked_and_a_verdict_is_not():
    """A passing case's err/tol differs from one CPU's BLAS to another's (0.1 and 0.073 for the same case); the
    verdict, and a failing case's err/tol, still count."""
    here = ["causal_square[fp32]            PASS     0.1      -"]
    there = ["causal_square[fp32]            PASS     0.073    -"]
    assert cc.normalise(here) == cc.normalise(there)
    assert cc.normalise(here, strict=True) != cc.normalise(there, strict=True)
    assert cc.normalise(here) != cc.normalise(["causal_square[fp32]            FAIL     0.1      -"])
    assert cc.normalise(["x[fp16]  FAIL     1.9e+02  mismatch"]) != cc.normalise(["x[fp16]  FAIL     1.6e+02  mismatch"])


def test_excerpts():
    claim = cc.Claim(Path("x.md"), 1, "cmd", 0)
    lines = [f"line {i}" for i in range(6)]
    assert cc.excerpt(claim, lines) == lines
    claim.tail = 2
    assert cc.excerpt(claim, lines) == ["...", "line 4", "line 5"]
    claim.tail, claim.head = None, 2
    assert cc.excerpt(claim, lines) == ["line 0", "line 1", "..."]
    claim.head, claim.grep = None, r"[03]$"
    assert cc.excerpt(claim, lines) == ["line 0", "...", "line 3", "..."]


# ---- checking and updating a file -------------------------------------------------------------------------

def test_check_then_update_then_check(tmp_path):
    cmd = "python -c \"print('judged 3 cases in 1.5 s'); print('done')\""
    path = _md(tmp_path, f"# t\n\n<!-- claim: exit=0 cmd: {cmd} -->\n```text\n```\n\nafter\n"
                         f"<!-- claim: exit=3 cmd: python -c \"import sys; sys.exit(2)\" -->\n")
    first, second = cc.parse(path)
    o1, o2 = cc.check(first), cc.check(second)
    assert o1.status == "DIFFERS" and "transcript differs" in o1.detail
    assert o2.status == "EXIT" and "exit 2, claimed exit=3" in o2.detail
    cc.update([o1, o2])
    assert o1.status == "updated"
    text = path.read_text()
    assert f"```text\n$ {cmd}\njudged 3 cases in 1.5 s\ndone\n```\n\nafter\n" in text
    # another timing is no difference; another count is
    path.write_text(text.replace("\njudged 3 cases in 1.5 s", "\njudged 3 cases in 9.9 s"))
    assert cc.check(cc.parse(path)[0]).status == "ok"
    path.write_text(text.replace("\njudged 3 cases", "\njudged 4 cases"))
    assert cc.check(cc.parse(path)[0]).status == "DIFFERS"


def test_stderr_no_keeps_stdout_alone(tmp_path):
    cmd = "python -c \"import sys; print('out'); print('warning', file=sys.stderr)\""
    both, alone = cc.parse(_md(tmp_path, f"<!-- claim: exit=0 cmd: {cmd} -->\n\n"
                                         f"<!-- claim: exit=0 stderr=no cmd: {cmd} -->\n"))
    assert cc.check(both).output == ["out", "warning"]
    assert cc.check(alone).output == ["out"]


def test_update_finds_its_claim_after_the_file_moved(tmp_path):
    path = _md(tmp_path, "<!-- claim: exit=0 cmd: python -c \"print(1)\" -->\n```text\n```\n")
    outcome = cc.check(cc.parse(path)[0])
    path.write_text("a new paragraph\n\nwritten while the claim ran\n\n" + path.read_text())
    cc.update([outcome])
    assert outcome.status == "updated"
    assert path.read_text().endswith("```text\n$ python -c \"print(1)\"\n1\n```\n")


def test_identical_claims_are_told_apart(tmp_path):
    block = "<!-- claim: exit=0 cmd: python -c \"print(2)\" -->\n```text\n{}```\n"
    path = _md(tmp_path, block.format("$ python -c \"print(2)\"\n2\n") + "\n" + block.format(""))
    first, second = cc.parse(path)
    assert (first.rank, second.rank) == (0, 1)
    outcome = cc.check(second)
    assert outcome.status == "DIFFERS"
    cc.update([outcome])
    assert [c.recorded for c in cc.parse(path)] == [['$ python -c "print(2)"', "2"]] * 2


def test_gpu_claims_skip_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(cc, "_GPU", (False, "no GPU here (test)"))
    [claim] = cc.parse(_md(tmp_path, "<!-- claim: exit=0 backend=gpu cmd: python -c pass -->\n"))
    outcome = cc.check(claim)
    assert outcome.status == "skip" and "no GPU here" in outcome.detail and not outcome.failed


# ---- the repository's own claims -------------------------------------------------------------------------

def test_every_transcript_starts_with_its_command():
    """A transcript whose command was edited without --update is stale; one left empty was never made
    (GPU claims excepted: they are made on a GPU machine)."""
    assert CLAIMS, "no claims found in " + ", ".join(cc.FILES)
    for c in CLAIMS:
        if c.recorded is None:
            continue
        if not c.recorded:
            assert c.backend == "gpu", f"{c.where}: empty transcript: run scripts/check_claims.py --update"
            continue
        assert c.recorded[0] == f"$ {c.cmd}", f"{c.where}: the transcript's first line is not `$ {c.cmd}`"


@pytest.mark.parametrize("claim", CI_CLAIMS, ids=[f"{c.where}" for c in CI_CLAIMS])
def test_ci_claim(claim, backend):
    """Each claim on the backend it was recorded on: a cpu claim's transcript comes from the interpreter of the
    CPU set-up (scripts/setup.sh), a gpu claim's from the GPU runner."""
    if claim.backend not in ("any", backend):
        pytest.skip(f"backend={claim.backend} claim; this session's backend is {backend}")
    outcome = cc.check(claim)
    assert outcome.status == "ok", cc.report_line(outcome)


# ---- links -------------------------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "examples").glob("*.md")), *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("doc", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_relative_links_resolve(doc):
    broken = []
    in_fence = False
    for n, line in enumerate(doc.read_text().split("\n"), 1):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        if in_fence:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if path and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}:{n}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)
