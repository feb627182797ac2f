"""The oracle must name each kind of failure: deliberately broken callables wrapped around the real kernel."""
import re

import numpy as np
import pytest
import torch

from flashcheck.cases import oracle
from flashcheck.cases.case import Case, parse_case
from flashcheck.kernel import fused

CASE = Case("oracle_probe", why="probe", B=2, H=2, Nq=21, Nk=27, D=16, layout="gapped", seed=3)


def judge(kernel, case=CASE):
    return oracle.judge(kernel, case, target="tests:broken")


def test_real_kernel_passes():
    verdict = judge(fused.attention)
    assert verdict.passed, verdict.report()
    assert 0 < verdict.tol < 1e-4   # fp32: 10x under tf32's ~1e-3 (test_tf32_sized_error_fails_fp32 shows it fails)


def test_mismatch_names_first_bad_element():
    def off_by_a_bit(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        out[1, 0, 5, 7] += 1e-3
        return out
    verdict = judge(off_by_a_bit)
    assert verdict.kind == "mismatch"
    f = verdict.failures[0]
    assert f.where == (1, 0, 5, 7) and f.got == pytest.approx(f.expected + 1e-3, abs=1e-5)
    text = verdict.report()
    assert "b=1, h=0, row=5, col=7" in text and "tol" in text and "oracle_probe" in text
    repro = text.split("repro: ")[1]
    assert parse_case(repro.split("--case ")[1].strip('"')) == CASE.replace(why="")


def test_a_mismatch_also_names_its_largest_element():
    """The first bad element starts a search; the largest error against its tolerance is often where the bug is
    (the last key block, the last head): both are named, in the case's own coordinates."""
    def off_twice(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        out[0, 1, 3, 2] += 1e-3
        out[1, 1, 20, 9] += 1.0
        return out
    f = judge(off_twice).failures[0]
    assert f.where == (0, 1, 3, 2) and f.worst == (1, 1, 20, 9), (f.where, f.worst)
    assert "the largest at (b=1, h=1, row=20, col=9)" in f.line(), f.line()

    def off_once(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        out[1, 0, 5, 7] += 1e-3
        return out
    f = judge(off_once).failures[0]
    assert f.worst == f.where and "the largest" not in f.line(), f.line()


def test_tf32_sized_error_fails_fp32():
    """A relative error of 2^-11 on the scores (tf32's rounding) must fail the fp32 tolerance."""
    def tf32_like(q, k, v, **kw):
        return fused.attention(q * (1 + 2.0 ** -11 * torch.randn_like(q).sign()), k, v, **kw)
    assert judge(tf32_like).kind == "mismatch"


def test_unwritten_rows():
    def skips_last_row(q, k, v, *, out, **kw):
        full = fused.attention(q, k, v, **kw)
        out[:, :, :-1].copy_(full[:, :, :-1])
        return out
    verdict = judge(skips_last_row)
    assert verdict.kind == "unwritten" and verdict.failures[0].where[2] == CASE.Nq - 1


def test_out_of_bounds_write():
    def writes_past_end(q, k, v, *, out, **kw):
        fused.attention(q, k, v, out=out, **kw)
        spill = out.as_strided((1,), (1,), out.storage_offset() + out.stride(2) * out.shape[2])
        spill.fill_(0.0)
        return out
    assert judge(writes_past_end).kind == "out-of-bounds write"


def test_input_written():
    def scribbles_on_v(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        v.mul_(1.0)
        v[0, 0, 0, 0] = 0.5
        return out
    assert judge(scribbles_on_v).kind == "input written"


def test_out_of_bounds_read_told_from_nan():
    def reads_a_row_too_many(q, k, v, **kw):
        # the last key row's successor in memory: a guard or gap element (NaN in the oracle's buffers)
        big = k.as_strided((k.shape[0], k.shape[1], k.shape[2] + 1, k.shape[3]), k.stride(), k.storage_offset())
        bigv = v.as_strided(big.shape, v.stride(), v.storage_offset())
        return fused.attention(q, big[:, :, 1:], bigv[:, :, 1:], **kw)
    verdict = judge(reads_a_row_too_many)
    assert verdict.kind == "out-of-bounds read", verdict.report()

    def computes_nan(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        out[0, 1, 2, 3] = float("nan")
        return out
    assert judge(computes_nan).kind == "NaN"


def test_exception_and_bad_return():
    def raises(q, k, v, **kw):
        raise RuntimeError("boom")
    verdict = judge(raises)
    assert verdict.kind == "exception" and "boom" in verdict.report()
    assert judge(lambda q, k, v, **kw: None).kind == "bad return"
    assert judge(lambda q, k, v, **kw: fused.attention(q, k, v).double()).kind == "bad return"
    assert judge(lambda q, k, v, **kw: fused.attention(q, k, v)[:, :, :-1]).kind == "bad return"


def test_hand_value_is_exact():
    """7.5 must come out bit-exact: one ulp off passes the reference's tolerance (fp32, a few ulps of 7.5) and is
    caught by the hand value alone."""
    case = Case("seven_and_a_half", Nq=1, Nk=2, D=1, data="explicit", q=((1.0,),), k=((1.0,), (1.0,)),
                v=((5.0,), (10.0,)), expected=((7.5,),), exact=True)
    assert judge(fused.attention, case).passed

    def one_ulp_off(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        return torch.nextafter(out, torch.full_like(out, 8.0))
    verdict = judge(one_ulp_off, case)
    assert verdict.kind == "hand value", verdict.report()
    assert verdict.failures[0].got == np.nextafter(np.float32(7.5), np.float32(8.0))


def test_lse_checked():
    def lse_in_log2(q, k, v, *, causal=False, scale=None, out=None, return_lse=False):
        out, lse = fused.attention(q, k, v, causal=causal, scale=scale, out=out, return_lse=True)
        return out, lse / 0.6931471805599453
    verdict = judge(lse_in_log2)
    assert verdict.kind == "lse"
    # an lse is one value per row: the failure names the row, not a column
    line = verdict.failures[0].line()
    assert re.search(r"^lse at \(b=\d+, h=\d+, row=\d+\): got", line) and "col=" not in line, line


def test_properties_catch_what_one_reference_run_cannot():
    """A kernel that remembers its first answer for each shape passes the reference comparison (its first
    call is right) and is caught by the properties verify runs next (V scaled, keys permuted: same shape)."""
    from flashcheck.cases.verify.judging import Settings, judge_case

    memory = {}

    def remembers(q, k, v, **kw):
        key = (tuple(q.shape), tuple(k.shape), q.dtype)
        if key not in memory:
            memory[key] = fused.attention(q, k, v, **kw).clone()
        out = kw.get("out")
        return out.copy_(memory[key]) if out is not None else memory[key].clone()
    assert judge(remembers).passed
    memory.clear()
    verdict = judge_case(remembers, CASE, Settings(target="tests:remembers"))
    assert verdict.kind == "invariant" and "property" in verdict.report(), verdict.report()


def test_invariant_causal_future_keys():
    """A causal kernel that lets row 0 read the keys past its diagonal, but only where they are large, passes the
    reference on the case's own inputs (randn keys stay small) and is caught by the causal_hidden_keys relation,
    which gives exactly those keys values several times larger."""
    from flashcheck.cases.generate import properties

    case = Case("causal_probe", Nq=20, Nk=20, D=16, causal=True, seed=5)

    def peeks_at_large_future_keys(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        leak = (v[:, :, 1:].abs() > 5).any(dim=(2, 3), keepdim=True)
        out[:, :, :1] += 1e-2 * leak
        return out
    assert judge(peeks_at_large_future_keys, case).passed
    found = properties.causal_hidden_keys(peeks_at_large_future_keys, case, (0, 7))
    assert found is not None and found.prop == "causal_hidden_keys" and found.failure.kind == "invariant", found
    assert found.failure.where[2] == 0


def test_tolerance_is_derived_per_dtype():
    """fp16's tolerance comes from fp16's roundings: far above fp32's, far below the output itself."""
    case16 = CASE.replace(dtype="fp16")
    e16 = oracle.expectation(case16, oracle.inp.values(case16), "cpu")
    e32 = oracle.expectation(CASE, oracle.inp.values(CASE), "cpu")
    assert e16.tol.shape == e16.out.shape and np.isfinite(e16.out).all()
    assert 1e-4 < e16.tol.max() < 2e-2 and e32.tol.max() < 1e-4
    assert e16.tol.max() < 0.1 * np.abs(e16.out).max()


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_a_relation_on_v_alone_reuses_the_score_side_bit_for_bit(dtype):
    """The properties that change only V (scaled, shifted) take their base run's score side (Expectation.scores: the
    scores, their softmax, how far each weight may move), most of the tolerance's work: what they get must be,
    bit for bit, what the whole computation gives for the new values, with every optional feature."""
    case = Case("reuse", B=2, H=4, Hkv=2, Nq=19, Nk=33, D=16, Dv=24, causal=True, window=(9, None), softcap=6.0,
                dtype=dtype, seed=5)
    q, k, v = oracle.inp.values(case)
    base = oracle.expectation(case, (q, k, v), "cpu")
    assert base.scores is not None
    for v2 in ((v.double() * -2).to(v.dtype), (v.double() + 3.0).to(v.dtype)):
        whole = oracle.expectation(case, (q, k, v2), "cpu")
        reused = oracle.expectation(case, (q, k, v2), "cpu", like=base, lean=True)
        for name in ("out", "lse", "tol", "tol_lse", "hull_lo", "hull_hi"):
            assert np.array_equal(getattr(whole, name), getattr(reused, name), equal_nan=True), name
        assert not np.array_equal(whole.tol, base.tol)    # new values, a new tolerance


def test_reference_equals_every_hand_value_of_the_catalogue():
    """The catalogue's hand values (7.5, the mean of V under equal scores or scale 0, one key's row) are answers known
    without the reference: the float64 reference must give them, to its own rounding, in every dtype."""
    from flashcheck.cases import catalogue
    from flashcheck.cases.oracle.layers import _hand_value

    checked = 0
    for case in catalogue.instances():
        if case.expected is None or case.gpu_only:
            continue
        qkv = oracle.inp.values(case)
        e = oracle.expectation(case, qkv, "cpu")
        hand = _hand_value(case, qkv)
        np.testing.assert_allclose(e.out, hand, rtol=1e-12, atol=1e-12, err_msg=case.name)
        checked += 1
    assert checked >= 9, checked


def test_case_source_round_trips():
    from flashcheck.cases import catalogue

    for case in catalogue.CATALOGUE:
        assert parse_case(case.source()) == case


def test_sampled_heads_map_failures_back():
    """Huge cases judge a spread sample of (b, h) pairs, the last included, and report real coordinates."""
    case = Case("sampled", B=2, H=3, Nq=9, Nk=11, D=8, seed=4, sample_heads=3)
    from flashcheck.cases.oracle.layers import _heads

    assert _heads(case)[0].tolist() == [0, 0, 1] and _heads(case)[1].tolist() == [0, 2, 2]
    assert judge(fused.attention, case).passed

    def wrong_last_head(q, k, v, **kw):
        out = fused.attention(q, k, v, **kw)
        out[1, 2, 4, 6] += 1.0
        return out
    verdict = judge(wrong_last_head, case)
    assert verdict.kind == "mismatch" and verdict.failures[0].where == (1, 2, 4, 6)

    def wrong_twice(q, k, v, **kw):
        out = wrong_last_head(q, k, v, **kw)
        out[0, 2, 8, 0] += 1e-3
        return out
    f = judge(wrong_twice, case).failures[0]
    assert (f.where, f.worst) == ((0, 2, 8, 0), (1, 2, 4, 6)), (f.where, f.worst)


def test_every_failure_kind_has_its_own_kill_matrix_code():
    codes = [k.code for k in oracle.Kind]
    assert len(set(codes)) == len(codes) and all(len(c) == 1 for c in codes)
    assert all(k.meaning for k in oracle.Kind)


def test_a_failure_without_an_expected_value_says_what_it_got_only():
    """A relation's base run that gives NaN from finite inputs has no expected value at hand: its line said "got nan,
    expected nan" (a placeholder), which read as if the reference were NaN too."""
    from flashcheck.cases.oracle.verdict import Failure
    from flashcheck.cases.report import _element

    fail = Failure("NaN", "1 non-finite output element(s) from finite inputs", where=(0, 0, 0, 0), got=float("nan"))
    assert "got nan" in fail.line() and "expected" not in fail.line(), fail.line()
    assert _element(fail) == "b=0 h=0 row=0 col=0: got nan", _element(fail)
