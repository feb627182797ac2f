"""Hypothesis property tests (cases/generate/properties.py) of the fused kernel, and of the unfused baseline where the
issue asks for it, over the case space of cases/generate/strategies.py under the loaded profile (dev, ci, thorough).

A failure's message is the property's report: the first bad element, got, expected, tolerance, and the
shrunk case as a catalogue entry, one `Case(...)` line to paste into cases/catalogue.py.
"""
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from flashcheck.cases.generate import properties as P
from flashcheck.cases.generate import strategies as S
from flashcheck.cases.backend import backend
from flashcheck.cases.case import parse_case
from flashcheck.kernel import fused, unfused

pytestmark = pytest.mark.properties
FUSED = "flashcheck.kernel.fused:attention"
UNFUSED = "flashcheck.kernel.unfused:attention"


def holds(failure):
    if failure is not None:
        raise AssertionError(failure.report())


@given(case=S.cases(data=S.FINITE_DATA + ("nan_input",)))
def test_fused_matches_reference(case):
    holds(P.reference(fused.attention, case, target=FUSED))


# the unfused softmax holds a whole row of scores in one tile: Nk <= unfused.MAX_ROW
@given(case=S.cases(kernels=("unfused",), max_len=unfused.MAX_ROW, data=S.FINITE_DATA + ("nan_input",)))
def test_unfused_matches_reference(case):
    holds(P.reference(unfused.attention, case, target=UNFUSED))


@given(case=S.cases(kernels=("fused", "unfused"), max_len=unfused.MAX_ROW))
def test_fused_and_unfused_agree(case):
    holds(P.agreement(fused.attention, unfused.attention, case, target=FUSED))


@given(case=S.cases(causal=False), data=st.data())
def test_key_permutation_leaves_output_unchanged(case, data):
    perm = data.draw(S.key_permutations(case.Nk), label="perm")
    holds(P.permutation(fused.attention, case, perm, target=FUSED))


@given(case=S.cases(), a=S.v_factors())
def test_scaling_v_scales_output(case, a):
    holds(P.v_scaling(fused.attention, case, a, target=FUSED))


@given(case=S.cases(), shift=S.v_shifts())
def test_shifting_v_shifts_output(case, shift):
    holds(P.v_shift(fused.attention, case, shift, target=FUSED))


@given(case=S.cases(), c=S.q_factors())
def test_trading_q_scale_for_softmax_scale_leaves_output_unchanged(case, c):
    holds(P.scale_equivariance(fused.attention, case, c, target=FUSED))


@given(case=S.cases(min_nq=1), data=st.data())
def test_query_row_changes_only_its_output_row(case, data):
    holds(P.row_locality(fused.attention, case, data.draw(S.query_changes(case), label="change"), target=FUSED))


@given(case=S.cases())
def test_duplicating_keys_leaves_output_unchanged(case):
    holds(P.duplication(fused.attention, case, target=FUSED))


@given(case=S.cases())
def test_output_in_convex_hull_of_values(case):
    holds(P.convex_hull(fused.attention, case, target=FUSED))


@given(case=S.cases(causal=True, min_nq=2), data=st.data())
def test_causal_rows_ignore_hidden_keys(case, data):
    hidden = data.draw(S.hidden_key_rows(case), label="hidden")
    holds(P.causal_hidden_keys(fused.attention, case, hidden, target=FUSED))


def _drops_last_key(q, k, v, **kwargs):
    """A broken kernel: attends over every key but the last (when there are two or more)."""
    keep = max(k.shape[2] - 1, 1)
    return fused.attention(q, k[:, :, :keep], v[:, :, :keep], **kwargs)


def test_failure_prints_shrunk_case_as_catalogue_entry():
    """Part 4 of the issue: a property fails on a broken kernel, hypothesis shrinks the case, and the failure
    text holds a `Case(...)` line that parses, is minimal, and reproduces the failure."""
    @settings(max_examples=40, derandomize=True, database=None, deadline=None,
              phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False)
    @given(case=S.cases())
    def broken_matches_reference(case):
        holds(P.reference(_drops_last_key, case, target="tests:drops_last_key"))

    with pytest.raises(AssertionError) as info:
        broken_matches_reference()
    text = str(info.value)
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("Case(")]
    assert lines, f"no Case(...) line in the failure text:\n{text}"
    entry = parse_case(lines[0])
    # minimal: the bug needs one query and two keys, and nothing else
    assert (entry.B, entry.H, entry.Nq, entry.Nk) == (1, 1, 1, 2), text
    assert entry.block_m is None and entry.block_n is None and entry.layout == "contiguous", text
    assert P.reference(_drops_last_key, entry) is not None, "the printed case must reproduce the failure"
    assert P.reference(fused.attention, entry) is None, "the real kernel must pass the printed case"


_QUICK = settings(max_examples=1000, database=None, derandomize=True, phases=(Phase.generate,),
                  suppress_health_check=list(HealthCheck))
_REGIONS = {
    "causal, Nq > Nk (rows that see no key)": lambda c: c.causal and c.Nq > c.Nk,
    "causal, Nq < Nk": lambda c: c.causal and 0 < c.Nq < c.Nk,
    "Nq = 1": lambda c: c.Nq == 1,
    "Nk = 1": lambda c: c.Nk == 1,
    "partial last key block, several key blocks": lambda c: c.block_n and c.Nk > c.block_n and c.Nk % c.block_n,
    "partial last query block": lambda c: c.block_m and c.Nq > c.block_m and c.Nq % c.block_m,
    "BLOCK_M != BLOCK_N": lambda c: c.block_m and c.block_n and c.block_m != c.block_n,
    "many key blocks": lambda c: c.Nk >= 8 * (c.block_n or 64),
    "hundreds of key blocks, fp16": lambda c: c.dtype == "fp16" and c.Nk >= 128 * (c.block_n or 64),
    "D = 1": lambda c: c.D == 1,
    "D > 16, not a power of two": lambda c: c.D > 16 and c.D & (c.D - 1),
    "D = 256": lambda c: c.D == 256,
    "B != H, both > 1": lambda c: c.B > 1 and c.H > 1 and c.B != c.H,
    "fp16": lambda c: c.dtype == "fp16",
    "large scores": lambda c: c.data == "large",
    "very negative scores": lambda c: c.data == "very_negative",
    "negative scale": lambda c: c.scale is not None and c.scale < 0,
    "large scale": lambda c: c.scale is not None and c.scale >= 3,
    **{f"layout {layout}": (lambda c, layout=layout: c.layout == layout) for layout in S.LAYOUT_ORDER},
}


@pytest.mark.parametrize("region", sorted(_REGIONS))
def test_strategy_reaches(region):
    """The case strategy reaches each region where a known bug class lives (no kernel runs here)."""
    find(S.cases(), _REGIONS[region], settings=_QUICK)


@_QUICK
@given(case=S.cases(kernels=("fused", "unfused")))
def test_strategy_stays_in_the_legal_space(case):
    lim = S.limits()
    assert case.dtype in lim.dtypes
    assert case.block_m in (None,) + lim.blocks and case.block_n in (None,) + lim.blocks
    many = case.Nk > lim.max_len   # a many-blocks draw: few queries, a count of key blocks (+-1)
    assert 1 <= case.D <= 256 and 0 <= case.Nq <= lim.max_len and 1 <= case.Nk, case
    if many:
        bn = case.block_n or lim.default_block
        assert case.Nq <= S.MANY_QUERIES and case.Nk in {n * bn + d for n in lim.many_blocks for d in (-1, 0, 1)}
    # large data: any magnitude up to what the dtype's inputs hold (finite inputs are checked when built)
    assert case.magnitude is None or (case.data == "large" and case.magnitude <= S.magnitude_cap(case.dtype, case.D))
    if backend() == "gpu":
        assert "bf16" in lim.dtypes and min(lim.blocks) >= 16   # tl.dot's minimum
    else:
        assert "bf16" not in lim.dtypes                           # wrong in Triton's interpreter
        # within the interpreter's cost cap, unless the shape alone exceeds it (then nothing is multiplied)
        within = S.cost_ms(case, ("fused", "unfused"), lim) <= (lim.many_ms if many else lim.max_ms)
        assert within or (case.B, case.H, case.block_m, case.block_n) == (1, 1, None, None)


def test_power_names_the_killing_property(tmp_path):
    """cases/corpus/power.py on two mutants: one the reference-free relations cannot see (a softmax temperature
    error: the log2(e) factor missing from an exp2-based loop, uniform across key blocks and splits), one they
    can (the scale argument applied twice). (exp for exp2 inside the loop is not uniform: the split-KV combine
    weighs the splits in base 2, so duplicating keys moves the split borders and changes the output; on an H200
    the duplication relation killed it at Nq = 1, Nk = 2048.) The first search goes through
    the command line with --jobs 2 (both mutants at once in forked children; a fresh process, since a
    process that has used CUDA cannot fork children that use it); the outcomes come back in corpus order."""
    import json
    import subprocess
    import sys

    from flashcheck.cases.corpus import power

    relations = ("permutation", "v_scaling", "v_shift", "scale_equivariance", "row_locality", "duplication",
                 "convex_hull", "causal_hidden_keys")
    report = tmp_path / "power.json"
    argv = [sys.executable, "-m", "flashcheck.cases.corpus.power", "--mutant", "scale_twice", "--mutant", "log2e_missing",
            "--examples", "8", "--jobs", "2", "--json", str(report)]
    for name in relations:
        argv += ["--property", name]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    outcomes = [power.Outcome(**o) for o in json.loads(report.read_text())["outcomes"]]
    assert [o.mutant for o in outcomes] == ["scale_twice", "log2e_missing"]
    assert "2 at a time" in run.stdout and "killed 1/2 mutants" in run.stdout, run.stdout
    by_name = {o.mutant: o for o in outcomes}
    twice, exp = by_name["scale_twice"], by_name["log2e_missing"]
    # which relation kills it first depends on the draws (scale_equivariance on the CPU, permutation on an H200)
    assert twice.status == "killed" and twice.prop in relations, twice
    assert parse_case(twice.entry).name == f"found_{twice.prop}"
    assert exp.status == "missed" and exp.examples >= 8, exp
    (killed,) = power.measure(["log2e_missing"], examples=8, props=("reference",), isolate=False)
    assert killed.status == "killed" and killed.prop == "reference", killed


@pytest.mark.parametrize("declared", [{}, {"same_length": True}, {"seq_multiple": 64, "head_dims": "64,128"},
                                      {"dtypes": "fp16", "causal": False}, {"max_seq": 48},
                                      {"causal_same_length": True}, {"strides": "contiguous", "min_seq": 32}])
def test_representative_cases_keep_the_declarations(declared):
    """The cases judged before any drawn one (verify's generated cases, the properties' search) stay within
    the declarations, build finite inputs, and, where the declarations leave room, include the three bug-class
    shapes: a causal decode, many key blocks in half precision past the decode threshold, and the largest
    scores the dtype holds under a negative scale."""
    from flashcheck.cases.declarations import Declarations
    from flashcheck.cases.inputs import values
    from flashcheck.cases.oracle.verdict import Capabilities

    decl = Declarations.make(**declared)
    dtypes = tuple(d for d in S.limits().dtypes if decl.dtypes is None or d in decl.dtypes)
    reps = S.representative(decl, dtypes, backend(), Capabilities(out=True, lse=True, blocks=True))
    assert reps
    for case in reps:
        assert not decl.reasons(case), (case, decl.reasons(case))
        if case.data == "large":
            assert all(bool(t.isfinite().all()) for t in values(case))   # raises if not
    if not declared:
        assert any(c.causal and c.Nq <= 16 < 256 <= c.Nk for c in reps)                        # decode
        assert any(c.dtype != "fp32" and c.Nq > 16 and c.Nk > 1024 for c in reps)              # many blocks
        assert any(c.data == "large" and c.scale < 0 and c.magnitude == S.magnitude_cap(c.dtype, c.D)
                   for c in reps)                                                              # largest scores
