"""How verify learns protocol v3's optional features of a kernel (cases/features.py, docs/design.md) and what it
does with them: a shape feature (GQA) found by its probe or declared, a keyword feature from the signature; a
case of a feature the kernel lacks is skipped with the reason, never passed; a kernel that has a feature is
judged on it, so a wrong head map fails even where the probe's shape hides it; the conventions real kernels
disagree on (the head map, the lse of an empty row) are declarations that change the reference, not the
verdict's strictness."""
import pytest

import flashcheck
from flashcheck.cases.errors import UsageError
from tests import feature_kernels as fk

GQA = "gqa_groups_of_three,gqa_groups_of_four_causal,mqa_decode"


def _verify(kernel, only, **options):
    return flashcheck.verify(kernel, only=only, dtypes="fp32", properties=False, **options)


def _by_status(report):
    out = {}
    for r in report.results:
        out.setdefault(r.status, []).append(r)
    return out


def test_a_kernel_that_refuses_grouped_heads_has_their_cases_skipped_not_passed():
    report = _verify(fk.heads_must_match, GQA + ",causal_square")
    got = _by_status(report)
    assert [r.case.name for r in got["pass"]] == ["causal_square[fp32]"], str(report)
    assert len(got["skip"]) == 3 and "fail" not in got, str(report)
    for r in got["skip"]:
        assert "lacks grouped-query heads" in r.reason and "probed, exception" in r.reason, r.reason
    assert "gqa" not in report.run.caps.features
    assert "GQA no (probed, exception" in str(report)
    # declared, the feature is judged: the kernel's refusal is then a failure, not a skip
    declared = _by_status(_verify(fk.heads_must_match, GQA, gqa="yes"))
    assert len(declared.get("fail", [])) == 3 and "skip" not in declared


def test_a_kernel_lacking_some_features_is_judged_on_the_others_together():
    """every_feature_at_once is about its features composed: a kernel that lacks some of them (Dv != D, found by
    the probe or declared --dv no) is judged on the others while two remain, the case named for what it left out,
    so a bug where two of them meet fails it; with fewer than two left it is skipped with the reason."""
    name = "every_feature_at_once[fp32, without Dv != D]"
    right = _by_status(_verify(fk.same_head_dims, "every_feature_at_once"))
    assert [r.case.name for r in right["pass"]] == [name] and "skip" not in right, right
    wrong = _verify(fk.softcap_dropped_beside_alibi, "every_feature_at_once")
    assert [r.case.name for r in wrong.failures] == [name], str(wrong)
    declared = _by_status(_verify(fk.softcap_dropped_beside_alibi, "every_feature_at_once", dv="no"))
    assert [r.case.name for r in declared["fail"]] == [name], declared
    lone = _by_status(_verify(fk.heads_must_match, "every_feature_at_once,causal_square"))
    assert "fewer than two of its features would remain" in lone["skip"][0].reason, lone
    # projected onto declared head dims, it keeps every feature it can: Dv != D where two head dims allow it, not
    # where one does
    from flashcheck.kernel import fused
    for dims, want in (("64,128", "every_feature_at_once[fp32, D=128, Dv=64]"),
                       ("64", "every_feature_at_once[fp32, without Dv != D, D=64]")):
        got = _by_status(_verify(fused.attention, "every_feature_at_once", head_dims=dims))
        assert [r.case.name for r in got["pass"]] == [want], got


def test_the_protocols_head_map_passes_and_the_interleaved_one_needs_its_declaration():
    assert _verify(fk.grouped, GQA).exit_code == 0
    wrong = _verify(fk.interleaved, GQA)
    assert wrong.exit_code == 1
    # groups of 3 and 4 tell the maps apart; MQA (one kv head) cannot, and passes under both
    assert sorted(r.case.name for r in wrong.failures) == ["gqa_groups_of_four_causal[fp32]",
                                                           "gqa_groups_of_three[fp32]"], str(wrong)
    assert all(str(r.verdict.kind) == "mismatch" for r in wrong.failures)
    assert _verify(fk.interleaved, GQA, head_map="interleaved").exit_code == 0
    assert _verify(fk.grouped, "gqa_groups_of_three", head_map="interleaved").exit_code == 1


def test_a_head_map_right_only_for_the_probes_shape_fails_the_feature_cases():
    """The probe's 4 query heads on 2 kv heads cannot tell h // Hkv from h // (H // Hkv): the kernel is found to
    have GQA, and the catalogue's groups of 3 and 4 and MQA fail it."""
    report = _verify(fk.group_counted_as_kv_heads, GQA)
    assert "gqa" in report.run.caps.features
    assert len(report.failures) == 3, str(report)


def test_declared_without_grouped_heads_skips_them_with_the_declaration():
    got = _by_status(_verify(fk.grouped, GQA + ",causal_square", gqa="no"))
    assert len(got["skip"]) == 3 and len(got["pass"]) == 1
    assert all("(--gqa no)" in r.reason for r in got["skip"])


def test_a_keyword_feature_comes_from_the_signature():
    got = _by_status(_verify(fk.grouped, "window_diagonal_only,window_hand_4x4,causal_square"))
    assert len(got["skip"]) == 2 and len(got["pass"]) == 1
    assert all("the signature has no window=" in r.reason for r in got["skip"])
    # a kernel that takes window= is judged on it: one that ignores it fails both
    ignored = _verify(fk.window_ignored, "window_diagonal_only,window_hand_4x4")
    assert len(ignored.failures) == 2, str(ignored)


def test_a_kwargs_kernel_declares_the_keywords_it_takes():
    """A **kwargs signature shows no keyword: its window and softcap cases are skipped, and the capabilities line
    says how to declare them; declared (--keywords), they are judged, out= and return_lse too."""
    only = "window_diagonal_only,softcap_tanh_region,causal_square"
    hidden = _verify(fk.fused_through_kwargs, only)
    skipped = [r for r in hidden.results if r.status == "skip"]
    assert hidden.exit_code == 0 and len(skipped) == 2, str(hidden)
    assert all("--keywords" in r.reason for r in skipped), [r.reason for r in skipped]
    assert "--keywords declares those it takes" in str(hidden), str(hidden)
    shown = _verify(fk.fused_through_kwargs, only, keywords="window,softcap,out,return_lse")
    assert shown.exit_code == 0 and {r.status for r in shown.results} == {"pass"}, str(shown)
    line = str(shown)
    assert "out= yes, return_lse= yes" in line and "window= yes" in line and "softcap= yes" in line, line
    # a keyword the signature cannot take (no such parameter, no **kwargs) is a usage error, not failed cases
    with pytest.raises(UsageError, match=r"has no window= and no \*\*kwargs"):
        _verify(fk.grouped, only, keywords="window")


@pytest.mark.parametrize("kernel, declared, passes", [
    (fk.grouped, None, True), (fk.empty_lse_plus_inf, None, False),
    (fk.empty_lse_plus_inf, "+inf", True), (fk.grouped, "+inf", False), (fk.empty_lse_plus_inf_out, None, False),
    (fk.empty_lse_plus_inf_out, "+inf", True)])
def test_the_lse_of_an_empty_row_is_a_declared_convention(kernel, declared, passes):
    options = {} if declared is None else {"empty_lse": declared}
    report = _verify(kernel, "causal_nq_gt_nk", **options)
    assert report.passed == passes, str(report)
    if not passes:
        assert str(report.failures[0].verdict.kind) == "lse", str(report)
        assert "the row sees no key" in str(report), str(report)


def test_probes_use_a_head_dim_and_length_the_kernel_declares():
    """A kernel of head dims 64 and 128 only, declared so, was probed at D = 16: it raised, so it lost its GQA cases
    and its backward ("probed, raised"). The probes now take a declared head dim and length."""
    report = flashcheck.verify(fk.grouped_head_dims_64_128, head_dims="64,128", only="gqa_groups_of_three",
                               dtypes="fp32")
    text = str(report)
    assert report.exit_code == 0 and report.passed == 1, text
    assert "GQA yes (probed)" in text and "backward yes (probed: its output carries autograd)" in text, text


def test_a_repro_line_carries_the_declarations_the_case_was_judged_under():
    """Pasted back without them, a case judged under a declared convention would be judged under the protocol's."""
    report = _verify(fk.grouped, "causal_nq_gt_nk", empty_lse="+inf", head_map="interleaved")
    [failed, *_] = report.failures
    repro = failed.verdict.repro()
    assert "--empty-lse +inf" in repro and "--head-map interleaved" in repro, repro
    assert repro.startswith("flashcheck verify ") and " --case " in repro, repro


def test_a_nan_in_q_is_judged_only_where_the_kernel_declares_it_stays_in_its_row():
    """The protocol admits finite inputs: a kernel that scales q per tensor is right by it, though one NaN in q
    makes every row NaN. nan_input_stays_in_its_row failed it (a false alarm found by a kernel written from the
    protocol's text alone); now the case is judged only under --nan-stays-in-row, which the project's kernels
    declare, and skipped as not declared otherwise."""
    from flashcheck.kernel import fused

    plain = _verify(fk.q_scaled_per_tensor, "nan_input_stays_in_its_row,partial_last_key_block")
    assert plain.exit_code == 0 and sorted(r.status for r in plain.results) == ["pass", "skip"], str(plain)
    (skipped,) = [r for r in plain.results if r.status == "skip"]
    assert skipped.case.name.startswith("nan_input_stays_in_its_row") and "--nan-stays-in-row" in skipped.reason, \
        str(plain)
    declared = _verify(fk.q_scaled_per_tensor, "nan_input_stays_in_its_row", nan_stays_in_row=True)
    assert declared.exit_code == 1 and len(declared.failures) == 1, str(declared)
    own = _verify(fused.attention, "nan_input_stays_in_its_row")     # declared by the kernel itself
    assert own.exit_code == 0 and [r.status for r in own.results] == ["pass"], str(own)


WINDOWS = "window_hand_4x4,window_diagonal_only,window_crossing_key_blocks,window_right_zero_is_causal"


@pytest.mark.parametrize("kernel, declared, passes", [
    (fk.window_counted_in_keys, None, False), (fk.window_counted_in_keys, "size", True),
    (fk.window_counted_as_distance, None, True), (fk.window_counted_as_distance, "size", False)])
def test_how_a_window_is_counted_is_a_declared_convention(kernel, declared, passes):
    """window=(left, right) as the farthest key on each side (the protocol, FlashAttention's window_size) or as
    counts of keys with the diagonal's own (Mistral's and Hugging Face's sliding_window): the same attention, handed
    to the kernel in its own count; judged by the other count, either kernel fails."""
    options = {} if declared is None else {"window_count": declared}
    report = _verify(kernel, WINDOWS, **options)
    judged = [r for r in report.results if r.status != "skip"]
    assert len(judged) == 4, str(report)
    if passes:
        assert report.exit_code == 0 and {r.status for r in judged} == {"pass"}, str(report)
    else:
        assert report.exit_code == 1 and len(report.failures) >= 3, str(report)
    if declared:
        assert all("--window-count size" in r.verdict.repro() for r in report.failures), str(report)


def test_the_lse_layout_is_a_declared_convention_and_its_failure_says_so():
    only = "causal_nq_gt_nk,cross_nq_gt_nk"
    undeclared = _verify(fk.lse_tokens_first, only)
    assert undeclared.exit_code == 1 and undeclared.failures, str(undeclared)
    first = undeclared.failures[0].verdict
    assert str(first.kind) == "bad return" and "--lse-layout tokens-first" in str(undeclared), str(undeclared)
    declared = _verify(fk.lse_tokens_first, only, lse_layout="tokens-first")
    assert declared.exit_code == 0 and [r.status for r in declared.results] == ["pass", "pass"], str(declared)
    # the protocol's layout declared the other way fails
    assert _verify(fk.grouped, only, lse_layout="tokens-first").exit_code == 1


def test_the_lse_base_is_a_declared_convention_and_its_failure_says_so():
    only = "causal_nq_gt_nk,cross_nq_gt_nk"
    undeclared = _verify(fk.lse_in_log2, only)
    assert undeclared.exit_code == 1 and str(undeclared.failures[0].verdict.kind) == "lse", str(undeclared)
    assert "--lse-base 2" in str(undeclared), str(undeclared)
    assert _verify(fk.lse_in_log2, only, lse_base="2").exit_code == 0
    assert _verify(fk.grouped, only, lse_base="2").exit_code == 1


def test_given_out_a_kernel_may_answer_in_it_alone():
    """Returning None (or (None, lse)) after writing out= is an answer; out= left unwritten is still a failure."""
    only = "causal_nq_gt_nk,cross_nq_gt_nk,partial_last_key_block"
    report = _verify(fk.answers_in_out_alone, only)
    assert report.exit_code == 0 and {r.status for r in report.results} == {"pass"}, str(report)
    dropped = _verify(fk.returns_none_and_leaves_out, only)
    assert dropped.exit_code == 1 and str(dropped.failures[0].verdict.kind) == "unwritten", str(dropped)


def test_a_case_that_pins_one_tile_leaves_the_kernels_default_for_the_other():
    """block_override_decode_d128 pins block_m alone: a kernel whose block_n defaults to 16 was handed None."""
    from flashcheck.cases import catalogue

    pinned_one = {c.name.partition("[")[0] for e in catalogue.CATALOGUE for c in e.instances()
                  if bool(c.block_m) != bool(c.block_n)}
    assert pinned_one, "no catalogue case pins one tile alone"
    report = flashcheck.verify(fk.own_block_defaults, only=",".join(sorted(pinned_one)), dtypes="fp16",
                               properties=False)
    assert report.exit_code == 0 and {r.status for r in report.results} == {"pass"}, str(report)
