"""Every kind of failure, property failures among them, renders in every report verify writes: the text report,
the JSON record, JUnit XML and the HTML page. A failure whose fields a renderer cannot format (the convex-hull
property once carried the whole tolerance array where every other failure carries one float) must show here, not
in the first user's run that trips it."""
import json
import xml.etree.ElementTree as ET
from html import escape
from html.parser import HTMLParser

import pytest

from flashcheck.cases import oracle, report
from flashcheck.cases.case import Case
from flashcheck.cases.generate import properties
from flashcheck.cases.oracle import Kind
from flashcheck.cases.report import files, html
from flashcheck.kernel import fused

CASE = Case("probe", B=2, H=2, Nq=9, Nk=13, D=8, seed=3, causal=True)


def _outside_the_hull(q, k, v, **kw):
    """Right everywhere but one element, pushed past the largest value its row sees."""
    out = fused.attention(q, k, v, **kw)
    out[1, 1, 8, 0] = v[1, 1, :, 0].max() + 0.5
    return out


def _leaks_into_row_zero(q, k, v, **kw):
    out = fused.attention(q, k, v, **kw)
    out[:, :, 0] += 1e-2 * (v[:, :, 1:].abs() > 5).any(dim=(2, 3))[..., None]
    return out


def _property_failures():
    """Real property failures, from the property functions themselves on kernels that break them."""
    found = [properties.convex_hull(_outside_the_hull, CASE),
             properties.causal_hidden_keys(_leaks_into_row_zero, CASE, (0, 7))]
    assert all(f is not None for f in found), found
    out = []
    for f in found:
        failure = f.failure
        failure.message = f"property {f.prop}: {failure.message}" + (f" ({f.detail})" if f.detail else "")
        out.append((f"property_{f.prop}", failure))
    return out


def _failures():
    """One failure of every Kind, with the fields the oracle gives that kind, and the real property failures."""
    element = dict(where=(1, 0, 4, 3), got=0.25, expected=0.5, tol=1e-3)
    made = []
    for kind in Kind:
        if kind in (Kind.MISMATCH, Kind.HAND_VALUE, Kind.INVARIANT, Kind.NONDETERMINISTIC):
            f = oracle.Failure(kind, "1 element(s) out of tolerance", **element)
        elif kind in (Kind.NAN, Kind.OOB_READ, Kind.LSE):
            f = oracle.Failure(kind, "non-finite", where=(0, 1, 2, 0), got=float("nan"), expected=1.5)
        elif kind == Kind.UNWRITTEN:
            f = oracle.Failure(kind, "3 output element(s) never written", where=(0, 0, 8, 0))
        elif kind in (Kind.EXCEPTION, Kind.COMPILE_ERROR):
            f = oracle.Failure(kind, "RuntimeError: boom", location="kernel.py:12")
        else:
            f = oracle.Failure(kind, f"what a {kind} says")
        made.append((str(kind).replace(" ", "_"), f))
    return made + _property_failures()


@pytest.fixture(scope="module")
def run():
    r = report.Run("tests:every_kind", "CPU (test)", oracle.Capabilities(out=True, lse=True))
    for name, failure in _failures():
        case = CASE.replace(name=f"{name}[fp32]", dtype="fp32")
        v = oracle.Verdict(case, r.target, [failure], ratio=2.5 if failure.tol else 0.0, tol=failure.tol or 0.0)
        r.results.append(report.Result.of(case, v, "catalogue"))
    r.results.append(report.Result(CASE.replace(name="skipped[fp32]"), "skip", reason="GPU only: a reason",
                                   skip_group="GPU only"))
    return r


def test_every_failure_kind_renders_as_text(run):
    text = report.text(run)
    for result in run.results:
        if result.status == "fail":
            assert f"FAIL {result.case.name}" in text
            assert result.verdict.failures[0].line() in text
    assert "property convex_hull" in text and "property causal_hidden_keys" in text
    assert f"{len(run.results) - 1} failed" in text


def test_every_failure_kind_renders_as_json(run, tmp_path):
    path = tmp_path / "r.json"
    files.write_json(run, str(path))
    data = json.loads(path.read_text())      # strict JSON: no NaN, no arrays where a number belongs
    fails = [c for c in data["cases"] if c["status"] == "fail"]
    assert len(fails) == len(run.results) - 1
    for c in fails:
        f = c["failures"][0]
        assert isinstance(f["line"], str) and f["kind"] == c["kind"]
        assert f["tol"] is None or isinstance(f["tol"], (int, float, str))
    hull = next(c for c in fails if c["name"].startswith("property_convex_hull"))
    assert isinstance(hull["failures"][0]["tol"], float) and hull["failures"][0]["where"] == [1, 1, 8, 0]


def test_every_failure_kind_renders_as_junit(run, tmp_path):
    path = tmp_path / "r.xml"
    files.write_junit(run, str(path))
    suite = ET.parse(path).getroot().find("testsuite")
    failed = {tc.get("name"): tc.find("failure") for tc in suite.iter("testcase") if tc.find("failure") is not None}
    assert len(failed) == len(run.results) - 1
    for result in run.results:
        if result.status == "fail":
            assert failed[result.case.name].get("type") == str(result.verdict.kind)
            assert failed[result.case.name].get("message") == result.verdict.failures[0].line()


def test_every_failure_kind_renders_as_html(run):
    pytest.importorskip("matplotlib")
    page = html.render(run)
    seen = []

    class Sections(HTMLParser):
        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "section" and "failure" in (a.get("class") or ""):
                seen.append(a["id"])
    Sections().feed(page)
    assert len(seen) == len(run.results) - 1
    for result in run.results:
        if result.status == "fail":
            assert escape(result.case.name) in page


def test_a_property_failure_carries_numbers_not_arrays():
    for _, failure in _property_failures():
        for field in ("got", "expected", "tol"):
            value = getattr(failure, field)
            assert value is None or isinstance(value, float), (field, type(value))
        assert failure.line()


@pytest.mark.parametrize("peak", [None, 3 << 20], ids=["cpu-table", "gpu-table"])
def test_the_table_never_cuts_a_reason(peak):
    """A reason longer than the table is wide wraps onto continuation lines and reads back whole, with or without
    the GPU's peak-memory column (the GPU suite once failed where the CPU passed: the wider table cut it)."""
    from tests.test_verify import row

    reason = "not declared: " + "; ".join(f"Nk = {n} > --max-seq 40" for n in range(45, 75))
    r = report.Run("tests:t", "CPU (test)", oracle.Capabilities())
    ran = oracle.Verdict(CASE.replace(name="ran"), r.target, ratio=0.1, tol=1e-6, peak_bytes=peak)
    r.results = [report.Result.of(ran.case, ran, "catalogue"),
                 report.Result(CASE.replace(name="long_reason[fp32]"), "skip", reason=reason,
                               skip_group="not declared")]
    text = report.table(r)
    assert all(len(line) <= 160 for line in text.splitlines())
    assert row(text, "long_reason[fp32]")[1:] == ["SKIP", "-", "-", reason]


def test_progress_on_a_log_says_how_much_is_left():
    """In a CI log (no terminal) a long run prints where it is and an estimate of the time left, from its pace."""
    import io

    stream = io.StringIO()
    p = report.Progress(4, stream=stream)
    p.HEARTBEAT = 0.0
    p.t0 -= 10.0                                  # ten seconds in
    for name in ("a", "b"):
        p.finish(report.Result(CASE.replace(name=name), "pass"))
    p.start(3, "case_c")
    line = stream.getvalue().strip().splitlines()[-1]
    assert line.startswith("[3/4] case_c (10 s, 0 failed so far, about 10 s left)"), line


def test_progress_counts_the_generated_cases_as_they_are_judged(monkeypatch):
    """verify records its generated cases after the last of them is judged (a failure is shrunk first); the
    progress line counted them only then, so its estimate stood still (vLLM's kernel on the CPU: "about 5 min
    left" from example 20 to example 25). Each now counts when its verdict arrives."""
    import flashcheck
    from examples.plain_attention import matmul_softmax

    seen = []

    class Watched(report.Progress):
        def start(self, n, name):
            seen.append((name, self.done))
            super().start(n, name)
    monkeypatch.setattr(report, "Progress", Watched)
    flashcheck.verify(matmul_softmax, only="hand_one_query_two_keys", dtypes="fp32", examples=4, isolate=False,
                      progress=True)
    generated = [done for name, done in seen if name.startswith("generated example")]
    assert len(generated) == 4 and generated[-1] >= generated[0] + 2, seen


def test_one_failure_text_met_by_many_cases_is_said_once():
    """Many failing cases with one exception's text are most often one bug met many times (tutorial 06 on an H200:
    22 of 34 failures were one autotuner error): the summary says so, with the first case; numeric kinds
    (mismatch) are never grouped, and texts that fewer than three cases share are not named."""
    r = report.Run("tests:t", "CPU (test)", oracle.Capabilities())
    raised = "AutotunerError: no valid autotuner configs after pruning"

    def failed(name, kind, message):
        v = oracle.Verdict(CASE.replace(name=name), r.target)
        v.fail(oracle.Failure(kind, message))
        return report.Result.of(v.case, v, "catalogue")

    r.results = ([failed(f"short_{n}", Kind.EXCEPTION, f"{raised} (raised at autotuner.py:{n})") for n in range(4)]
                 + [failed("d16", Kind.COMPILE_ERROR, "CompileTimeAssertionFailure")] * 2
                 + [failed(f"m{n}", Kind.MISMATCH, "1 element(s) out of tolerance") for n in range(3)])
    lines = report.kinds_line(r)
    assert lines[0] == "failures by kind: 4 exception, 3 mismatch, 2 compile error"
    assert lines[1:] == [f"4 failures share one exception, e.g. short_0: {raised}"]
    assert lines[1] in report.text(r, quiet=True).splitlines()
