"""The backward layer (cases/oracle/backward.py): the float64 gradients are autograd's of the forward definition for
every feature; a kernel whose output carries autograd has its gradients judged on every case, a correct one passes
and each backward bug of tests/backward_kernels.py fails with kind "gradient" naming the gradient; a forward-only
kernel is not judged unless it declares --backward yes, and then fails; the project's own judging (the corpus, the
catalogue tests) leaves the layer off."""
import math

import pytest
import torch

import flashcheck
from flashcheck.cases.verify.judging import Settings
from flashcheck.reference import torch_ref
from flashcheck.reference.problem import Problem
from tests import backward_kernels as bk

SOME = "hand_one_query_two_keys,causal_nq_gt_nk,gqa_groups_of_three,empty_queries,partial_last_key_block,layout_mixed"


@pytest.mark.parametrize("features", [{}, {"causal": True}, {"window": (3, 1)}, {"softcap": 2.0},
                                      {"alibi_slopes": [0.5, 0.25, 0.125, 0.1]}], ids=str)
@pytest.mark.parametrize("Hkv, Nq, Nk", [(2, 7, 11), (4, 9, 5), (1, 3, 3)])
def test_reference_gradients_are_autograds_of_the_forward_definition(features, Hkv, Nq, Nk):
    torch.manual_seed(0)
    pb = Problem.make(2, 4, Hkv, Nq, Nk, 8, 6, **features)
    q = torch.randn(2, 4, Nq, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, Hkv, Nk, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, Hkv, Nk, 6, dtype=torch.float64, requires_grad=True)
    out = torch_ref.softmax_parts(q, k, v, problem=pb).out
    dout = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), dout)
    got = torch_ref.backward(q.detach(), k.detach(), v.detach(), dout, pb)
    for w, g in zip(want, got):
        assert torch.isfinite(g).all() and (w - g).abs().max() < 1e-12


def test_a_softcap_deep_in_tanhs_flat_region_has_its_tiny_gradient_judged_relatively():
    """Scores 30 caps deep: tanh' is 4e^-60, which 1 - tanh^2 in float64 made 0, and with it the bound's floor, so a
    correct kernel's dq of 1e-26 (its derivative accurate there, D_i from the rounded output) failed as "gradient".
    The definition takes sech^2, accurate to its last bit there; and the floor allows a float32 derivative's own
    absolute error, since 1 - tanh^2 in float32 (another correct kernel's) is 0 there."""
    pb = Problem.make(1, 1, 1, 1, 1, 1, causal=False, scale=1.0, softcap=1.0)
    one = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    grads, mags = torch_ref.backward(one, -30 * one, one, one, pb, magnitudes=True)
    assert mags[0].item() == pytest.approx(2 * 4 * math.exp(-60) * 30, rel=1e-6), mags   # (|dP| + |D_i|) tanh' |k|
    cases = ["Case('x', Nq=3, Nk=5, D=8, dtype='bf16', data='very_negative', softcap=5.0)",
             "Case('y', Nq=1, Nk=2, D=1, dtype='bf16', data='very_negative', softcap=5.0)"]
    for kernel in (bk.softcap_by_sigmoid, bk.softcap_by_tanh):
        report = flashcheck.verify(kernel, cases=cases, backward="yes")
        assert report.exit_code == 0, str(report)


def _verify(kernel, **options):
    return flashcheck.verify(kernel, only=options.pop("only", SOME), dtypes=options.pop("dtypes", "fp32,fp16"),
                             **options)


def test_a_correct_backward_passes_and_is_judged():
    report = _verify(bk.correct)
    assert report.exit_code == 0, str(report)
    assert "backward" in report.run.caps.features
    assert "backward yes (probed: its output carries autograd)" in str(report)


@pytest.mark.parametrize("kernel, gradient, case", [
    (bk.dq_unscaled, "dq", "partial_last_key_block"),
    (bk.no_rowsum_term, "dq", "hand_one_query_two_keys"),
    (bk.rowsum_of_dp, "dq", "hand_one_query_two_keys"),
    (bk.gqa_first_head_only, "dk", "gqa_groups_of_three"),
    (bk.dv_from_transposed_heads, "dv", "layout_mixed"),
    (bk.backward_top_left_causal, "dq", "causal_nq_lt_nk"),
], ids=lambda x: getattr(x, "__name__", None) if callable(x) else None)
def test_each_backward_bug_fails_naming_its_gradient(kernel, gradient, case):
    report = _verify(kernel, only=case, dtypes="fp32")
    assert report.exit_code == 1, str(report)
    [failed] = report.failures
    first = failed.verdict.failures[0]
    assert str(first.kind) == "gradient" and first.message.startswith(f"backward: {gradient}:"), first.line()
    assert first.where is not None and first.got is not None and first.expected is not None
    # dK and dV have K's shape: their element is named as a kv head's key, dQ's as a query head's row
    named = "(b=0, kv_head=" if gradient in ("dk", "dv") else "(b=0, h="
    assert f"gradient at {named}" in first.line() and ("key=" in first.line()) == (gradient != "dq"), first.line()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_gradients_are_held_to_the_roundings_of_a_correct_kernel(dtype):
    """A kernel that rounds where FlashAttention-2 does passes in fp16 and bf16; a dK not summed over its GQA group
    and a dQ without its scale fail there too (the bound's floor, with the dtype's eps in its score and length
    terms, came to 3 times the largest gradient in bf16, and both passed). Its backward rebuilds P from the saved
    float32 lse with scores in its own order: on huge_scores (1e9) that gave infinite dq, and the case's backward
    is now not judged (scores float32 cannot resolve), said in the report."""
    assert _verify(bk.fa2_rounding, dtypes=dtype).exit_code == 0
    for kernel, case in ((bk.gqa_first_head_only, "gqa_groups_of_three"), (bk.dq_unscaled, "partial_last_key_block")):
        report = _verify(kernel, only=case, dtypes=dtype)
        assert report.exit_code == 1, str(report)
        assert str(report.failures[0].verdict.failures[0].kind) == "gradient", str(report)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_backward_of_scores_rounded_after_q_was_scaled_passes(dtype):
    """Q scaled in its dtype, then the scores in that dtype (plain PyTorch: matmul(q * scale, k^T)): dV landed 4.7
    times the scores-after-the-product baseline's largest error from its definition on large_scores_whole_blocks in
    bf16, past F = 4, until that recipe became a baseline too (found by a kernel written from the protocol alone)."""
    report = _verify(bk.prescaled_half_scores, dtypes=dtype,
                     only="large_scores_whole_blocks,large_scores,partial_last_key_block,causal_nq_gt_nk")
    assert report.exit_code == 0 and "backward" in report.run.caps.features, str(report)


def test_a_forward_only_kernel_is_not_judged_unless_it_declares_a_backward():
    report = _verify(bk.forward_only)
    assert report.exit_code == 0 and "backward" not in report.run.caps.features, str(report)
    assert "backward no (probed: its output carries no autograd graph)" in str(report)
    declared = _verify(bk.forward_only, only="partial_last_key_block", dtypes="fp32", backward="yes")
    assert declared.exit_code == 1, str(declared)
    assert "carries no autograd graph" in declared.failures[0].verdict.failures[0].message
    assert _verify(bk.correct, backward="no").run.caps.notes["backward"] == "--backward no"


def test_a_case_whose_output_has_no_graph_is_not_judged_unless_a_backward_is_declared():
    """A forward-only kernel whose small shapes fall back on PyTorch: the probe finds autograd, the cases past the
    fallback have none; auto judges their forward and says the backward was not judged, --backward yes fails them."""
    report = _verify(bk.falls_back_for_small_shapes, only="partial_last_key_block", dtypes="fp32")
    assert report.exit_code == 0, str(report)
    [result] = report.results
    assert any("backward not judged: this case's output carries no autograd graph" in r
               for r in result.verdict.reduced), str(report)
    declared = _verify(bk.falls_back_for_small_shapes, only="partial_last_key_block", dtypes="fp32", backward="yes")
    assert declared.exit_code == 1 and "--backward yes" in declared.failures[0].verdict.failures[0].message


def test_the_project_judges_its_corpus_without_the_backward_layer():
    """The corpus and the catalogue tests judge with Settings' defaults: the kill matrix does not depend on it."""
    assert Settings().backward is False


def test_correct_backwards_pass_where_rounding_moves_gradients_most():
    """Large and very negative scores (a score's rounding is large in the softmax's terms) and a long row of values
    far from 0 (cancelling sums): torch's SDPA and a plain einsum, differentiated by autograd on the CPU, moved
    gradients 1e-3 and 1.7e-5 where a same-precision baseline moved 1e-7 (false alarms before the floor's score
    term and its lengths)."""
    sdpa = flashcheck.verify("examples/sdpa_attention.py:attention", dtypes="fp32,fp16",
                             only="large_scores,very_negative_scores,large_scores_whole_blocks")
    assert sdpa.exit_code == 0 and "backward" in sdpa.run.caps.features, str(sdpa)
    einsum = flashcheck.verify("examples/plain_attention.py:einsum", dtypes="fp32", only="large_accumulator")
    assert einsum.exit_code == 0, str(einsum)


def test_a_backward_that_declines_an_input_is_not_judged_there_and_says_so():
    report = _verify(bk.backward_fp16_only, only="partial_last_key_block")
    assert report.exit_code == 0, str(report)
    fp32 = next(r for r in report.results if r.case.name == "partial_last_key_block[fp32]")
    assert fp32.status == "pass" and any("backward not judged: the kernel's backward declined the input "
                                         "(backward for half precision only" in r for r in fp32.verdict.reduced)


@pytest.mark.parametrize("correct, buggy, gradient", [("attention_varlen", bk.varlen_dk_scaled, "dk"),
                                                      ("attention_paged", bk.paged_dv_scaled, "dv")],
                         ids=["varlen", "paged"])
def test_a_packed_kernels_backward_is_judged_sequence_by_sequence(correct, buggy, gradient):
    """Through the packed adapter, which places a sequence's q, k and v among the others without breaking the graph:
    the plain kernels of examples/varlen_attention.py pass, and each with one gradient 1.5 times too large fails,
    named by its sequence."""
    only = "varlen_block_edges,paged_odd_page_size,hand_one_query_two_keys,causal_nq_gt_nk"
    good = _verify(f"examples/varlen_attention.py:{correct}", only=only)
    assert good.exit_code == 0 and "backward" in good.run.caps.features, str(good)
    bad = _verify(buggy, only=only, dtypes="fp32")
    assert bad.exit_code == 1, str(bad)
    first = bad.failures[0].verdict.failures[0]
    assert str(first.kind) == "gradient" and first.message.startswith("sequence ") \
        and f"backward: {gradient}:" in first.message, first.line()


def test_a_sequence_without_queries_among_others_keeps_a_correct_backward_passing():
    """A sequence of no queries judged among others: its empty q was copied into the packed buffer as an empty slice
    of a leaf that requires grad, and the next sequence's copy then raised ("a leaf Variable that requires grad is
    being used in an in-place operation"), failing a correct kernel's backward (found by a generated bf16 case); an
    empty q, k or v, which no path reaches, has its gradient taken as empty, not missing."""
    from flashcheck.cases.case import parse_case

    case = parse_case("Case('no_queries_then_queries', H=2, D=8, dtype='fp32', seqlens=((0, 5), (0, 3), (4, 6)), "
                      "seed=5)")
    report = flashcheck.verify("examples/varlen_attention.py:attention_varlen", cases=[case], properties=False)
    assert report.exit_code == 0 and "backward" in report.run.caps.features, str(report)


def test_the_backward_of_a_sequence_without_keys_is_judged():
    """Its output is 0 whatever its queries, so their gradient must be exactly 0: a backward that skips such a
    sequence (its dq rows never written) passed, since the sequence's forward alone was checked."""
    only = "varlen_empty_sequences,varlen_one_row"
    bad = _verify(bk.varlen_dq_of_keyless_unwritten, only=only, dtypes="fp32")
    assert bad.exit_code == 1, str(bad)
    first = bad.failures[0].verdict.failures[0]
    assert str(first.kind) == "gradient" and "a sequence without keys" in first.message, first.line()
    assert _verify("examples/varlen_attention.py:attention_varlen", only=only, dtypes="fp32").exit_code == 0


def test_a_layout_case_is_judged_again_with_its_output_gradient_strided():
    """A case of a strided layout is judged a second time with dO laid out as its output (NaN-guarded): a backward
    that reads dO as if it were contiguous passed every case while dO always was; now it fails the layout case. A
    backward that raises on a strided dO (Triton's tutorial asserts a contiguous one; cuDNN's SDPA raised on rows
    with gaps on an H200) is not failed for it: the report says that part was not judged."""
    only = "layout_bthd,partial_last_key_block"
    bad = _verify(bk.do_assumed_contiguous, only=only, dtypes="fp32")
    assert bad.exit_code == 1 and [r.case.name for r in bad.failures] == ["layout_bthd[fp32]"], str(bad)
    first = bad.failures[0].verdict.failures[0]
    assert str(first.kind) == "gradient" and first.message.startswith("with dO strided"), first.line()
    strict = _verify(bk.do_must_be_contiguous, only=only, dtypes="fp32")
    assert strict.exit_code == 0, str(strict)
    assert "backward with a strided dO (the case's output layout) not judged: AssertionError: dO must be contiguous" \
        in str(strict), str(strict)


def test_a_backward_that_mixes_sequences_fails():
    """A varlen backward that sums one sequence's output gradient into the previous sequence's dk and dv (its
    forward exact, every dq right) fails: the packed adapter gives the other sequences' output rows a gradient of
    their own, which a correct backward keeps out of the judged sequence's gradients (with zeros there, as a plain
    slice gives, the leak was unseen)."""
    only = "varlen_block_edges,varlen_empty_sequences"
    bad = _verify(bk.varlen_dkv_from_the_next_sequence, only=only, dtypes="fp32")
    assert bad.exit_code == 1, str(bad)
    first = bad.failures[0].verdict.failures[0]
    assert str(first.kind) == "gradient" and first.message.startswith("sequence ") \
        and ("backward: dk:" in first.message or "backward: dv:" in first.message), first.line()


SUMS = "backward_sums_over_key_blocks,backward_sums_over_query_blocks"


def test_gradients_summed_across_blocks_in_the_input_dtype_fail():
    """dQ summed over key blocks of 128 in bf16, and dK, dV summed over query blocks in fp16 and bf16, fail the
    entries whose gradients are sums of one sign over 512 blocks (data gradient_sums); kernels that sum in fp32 pass
    them in every dtype: the FlashAttention-2 roundings, plain autograd of scores rounded to the dtype, fp32 inside.
    Before the entries, a bf16 dQ summed in bf16 over 1024 blocks of 16 keys passed the whole catalogue (an
    independent check's kernel)."""
    for kernel in (bk.correct, bk.fa2_rounding, bk.prescaled_half_scores):
        report = _verify(kernel, only=SUMS, dtypes="fp32,fp16,bf16")
        assert report.exit_code == 0 and len(report.results) == 6, str(report)
    failed = {f.verdict.case.name: f.verdict.failures[0] for f in _verify(bk.dq_summed_in_dtype, only=SUMS,
                                                                          dtypes="fp16,bf16").failures}
    assert set(failed) == {"backward_sums_over_key_blocks[bf16]"}, failed
    assert failed["backward_sums_over_key_blocks[bf16]"].message.startswith("backward: dq:")
    failed = {f.verdict.case.name: f.verdict.failures[0] for f in _verify(bk.dkv_summed_in_dtype, only=SUMS,
                                                                          dtypes="fp16,bf16").failures}
    assert set(failed) == {"backward_sums_over_query_blocks[fp16]", "backward_sums_over_query_blocks[bf16]"}, failed
    assert all(f.message.startswith(("backward: dk:", "backward: dv:")) for f in failed.values()), failed
