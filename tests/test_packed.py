"""The varlen and paged protocols (cases/protocols.py, cases/verify/packed.py): a correct kernel of each passes the
packed entries and the dense catalogue replayed through it; each bug of tests/packed_kernels.py fails, named by its
sequence; the leak check catches a leak the reference cannot see; a dense kernel is never handed a packed case; a
kernel whose arguments have other names declares its protocol."""
import pytest

import flashcheck
from flashcheck.cases import catalogue
from flashcheck.cases.errors import UsageError
from tests import packed_kernels as pk

def _no_keyword_features(case):
    """Whether a packed entry needs none of window=, softcap= or alibi_slopes= (the example kernels take none)."""
    return case.window is None and case.softcap is None and case.alibi is None


PACKED = ",".join(sorted(n for n in catalogue.PACKED_NAMES if _no_keyword_features(catalogue.get(n))))
DENSE = "hand_one_query_two_keys,causal_nq_gt_nk,partial_last_key_block,gqa_groups_of_three,dv_larger_odd_causal"


def _verify(kernel, only, dtypes="fp32", **options):
    return flashcheck.verify(kernel, only=only, dtypes=dtypes, **options)


def _statuses(report):
    return {r.case.name: r.status for r in report.results}


@pytest.mark.parametrize("kernel, protocol", [(pk.attention_varlen, "varlen"), (pk.attention_paged, "paged")])
def test_correct_kernels_pass_the_packed_entries_and_the_replayed_catalogue(kernel, protocol):
    report = _verify(kernel, PACKED + "," + DENSE, dtypes="fp32,fp16")
    assert report.exit_code == 0, str(report)
    assert report.run.caps.protocol == protocol
    got = _statuses(report)
    for name in DENSE.split(","):          # the dense entries, each batch a sequence
        assert got[f"{name}[fp32]"] == "pass", str(report)
    judged = {n.partition("[")[0] for n, s in got.items() if s == "pass"}
    if protocol == "varlen":
        assert judged >= set(PACKED.split(",")), str(report)
    else:   # a paged call has one Nq: the varlen entries of different query lengths are skipped, with the reason
        skipped = [r for r in report.results if r.status == "skip"]
        assert skipped and all("a paged call has one Nq" in r.reason for r in skipped), str(report)
        assert {n for n in PACKED.split(",") if n.startswith("paged_")} <= judged, str(report)


@pytest.mark.parametrize("kernel, case, kind", [
    (pk.reads_one_key_past_its_sequence, "varlen_block_edges", "mismatch"),
    (pk.max_seqlen_as_length, "varlen_max_seqlen_larger", "mismatch"),
    (pk.empty_sequence_writes_next, "varlen_empty_sequences", "mismatch"),
    (pk.causal_from_packed_totals, "varlen_cross_causal", "mismatch"),
    (pk.max_seqlen_of_first_sequence, "varlen_max_seqlen_omitted", "mismatch"),
    (pk.pages_assumed_contiguous, "paged_decode_page_16", "NaN"),
    (pk.block_table_row_stride_off_by_one, "paged_page_size_1", "NaN"),
    (pk.reads_whole_last_page, "paged_odd_page_size", "NaN"),
    (pk.heads_interleaved_on_small_pages, "paged_gqa_small_pages", "mismatch"),
    (pk.window_offset_from_the_longest_cache, "paged_window", "mismatch"),
], ids=lambda x: getattr(x, "__name__", None) if callable(x) else None)
def test_each_packed_bug_fails_its_case_naming_the_sequence(kernel, case, kind):
    report = _verify(kernel, case)
    assert report.exit_code == 1, str(report)
    failure = report.failures[0]
    assert str(failure.verdict.kind) == kind, str(report)
    first = failure.verdict.failures[0]
    assert first.message.startswith("sequence "), first.message
    assert first.where[0] == int(first.message.split()[1]), first.line()   # b is the sequence


def test_a_packed_kernel_given_out_must_write_it():
    """out= through the packed protocols: the adapter hands the dense oracle its own rows of out, so it checks
    the packed out itself; a kernel that returns its answer in a fresh tensor and leaves out untouched fails."""
    report = _verify(pk.ignores_out, "varlen_block_edges", properties=False)
    assert report.exit_code == 1, str(report)
    verdict = report.failures[0].verdict
    assert str(verdict.kind) == "bad return" and "out= was given" in verdict.failures[0].message, str(report)
    assert _verify(pk.attention_varlen, "varlen_block_edges", properties=False).exit_code == 0


def test_per_sequence_alibi_slopes_differ_between_sequences():
    """(B, H) slopes through the packed protocols: each sequence gets a row of its own, so a kernel that reads
    sequence 0's row for every sequence fails (when every row was the judged one's, it passed)."""
    only = "alibi_batch_heads_cross,alibi_heads_causal"
    good = _verify(pk.alibi_varlen, only, properties=False)
    assert good.exit_code == 0 and len(good.results) >= 2, str(good)
    bad = _verify(pk.alibi_slopes_of_sequence_0, only, properties=False)
    assert bad.exit_code == 1, str(bad)
    assert {r.case.name for r in bad.failures} == {"alibi_batch_heads_cross[fp32]"}, str(bad)
    assert str(bad.failures[0].verdict.kind) == "mismatch", str(bad)


def test_the_leak_check_sees_a_leak_the_reference_cannot():
    """1e-4 of the next sequence's mean value: within fp16's tolerance on ordinary values (the reference passes
    it), not when the other sequences' values are near 500."""
    report = _verify(pk.leaks_a_little, "varlen_block_edges", dtypes="fp16", properties=False)
    assert report.exit_code == 1, str(report)
    verdict = report.failures[0].verdict
    assert str(verdict.kind) == "leak" and "the other sequences' keys and values" in verdict.failures[0].message
    assert _verify(pk.attention_varlen, "varlen_block_edges", dtypes="fp16", properties=False).exit_code == 0


def test_a_dense_kernel_is_never_given_a_packed_case():
    with pytest.raises(UsageError, match="a packed-sequence case"):
        _verify("examples/sdpa_attention.py:attention", "varlen_empty_sequences")
    with pytest.raises(UsageError, match="are packed-sequence cases, and the kernel is dense"):
        flashcheck.verify("examples/sdpa_attention.py:attention", keyword="paged_", dtypes="fp32")
    # the whole catalogue of a dense kernel: the dense entries alone
    report = _verify("examples/sdpa_attention.py:attention", "causal_square")
    assert report.run.entries == (1, 1)


def test_a_kernel_whose_arguments_have_other_names_declares_its_protocol():
    with pytest.raises(UsageError, match="declares --protocol varlen or paged"):
        _verify(pk.named_offsets, "varlen_one_row")
    assert _verify(pk.named_offsets, "varlen_one_row", protocol="varlen").exit_code == 0


def test_generated_cases_are_drawn_as_packed_sequences_and_find_a_bug():
    """For a varlen kernel each drawn case becomes 2 to 6 sequences of drawn lengths (empty ones too); the catalogue
    left out, the draws alone find the causal offset taken from the packed totals, and shrink it."""
    ok = _verify(pk.attention_varlen, "hand_one_query_two_keys", examples=10)
    drawn = [r for r in ok.results if r.origin == "hypothesis"]
    assert ok.exit_code == 0 and len(drawn) == 10, str(ok)
    assert sum(r.case.seqlens is not None for r in drawn) >= 8, [r.case.name for r in drawn]
    bad = _verify(pk.causal_from_packed_totals, "hand_one_query_two_keys", examples=25)
    assert bad.exit_code == 1 and any(r.origin == "hypothesis" for r in bad.failures), str(bad)


def test_the_fused_kernels_varlen_entry_passes_the_packed_entries():
    """flashcheck.kernel.fused.attention_varlen, the dense kernel's programs reading their sequences' offsets:
    empty sequences at the start, middle and end, Nq != Nk both ways with causal, lengths at block edges, a
    max_seqlen larger than needed, and GQA with a window and a softcap, each through the same oracle. (The whole
    catalogue replays through it in `flashcheck verify flashcheck.kernel.fused:attention_varlen`.)"""
    from flashcheck.kernel import fused

    entries = "varlen_empty_sequences,varlen_cross_causal,varlen_block_edges,varlen_max_seqlen_larger," \
              "varlen_max_seqlen_omitted,varlen_gqa_window_softcap"
    report = _verify(fused.attention_varlen, entries, properties=False)
    assert report.exit_code == 0, str(report)
    assert {n.partition("[")[0] for n, s in _statuses(report).items() if s == "pass"} == set(entries.split(","))


def test_the_fused_kernels_paged_entry_passes_the_paged_entries():
    """flashcheck.kernel.fused.attention_paged, each key block looking its rows up in the block table: page sizes
    1, 7, 16 and 128 (blocks crossing pages), a sequence at the table's capacity, an empty one, a shuffled pool whose
    unused pages and slots are NaN."""
    from flashcheck.kernel import fused

    entries = ",".join(sorted(n for n in catalogue.PACKED_NAMES if n.startswith("paged_")))
    report = _verify(fused.attention_paged, entries, properties=False)
    assert report.exit_code == 0, str(report)
    assert {n.partition("[")[0] for n, s in _statuses(report).items() if s == "pass"} == set(entries.split(","))


def test_a_paged_kernel_in_flashattentions_layout_is_found_by_its_probe_or_declared():
    """q and out as (B, Nq, H, D), FlashAttention's kvcache layout, which the protocol's text leaves open for a paged
    kernel: a kernel written so failed nearly every case on the lse's shape (a false alarm, found by a kernel written
    from the text alone). One small case judged both ways finds the layout; --paged-q declares it; the repro line
    carries it."""
    only = "paged_page_size_1,paged_odd_page_size,gqa_groups_of_three,causal_nq_gt_nk"
    found = _verify(pk.paged_q_bnhd, only)
    text = str(found)
    assert found.exit_code == 0 and [r.status for r in found.results] == ["pass"] * 4, text
    assert "q and out (B, Nq, H, D), probed" in text and "--paged-q" not in text.split("declared:")[-1], text
    assert _verify(pk.paged_q_bnhd, only, paged_q="bnhd").exit_code == 0
    wrong = _verify(pk.paged_q_bnhd, only, paged_q="bhnd")          # declared, so not probed: judged as declared
    assert wrong.exit_code == 1 and wrong.failures, str(wrong)
    assert _verify(pk.attention_paged, only).exit_code == 0          # the protocol's layout, probed as it
    bad = _verify(pk.paged_q_bnhd_drops_last_key, "paged_odd_page_size")
    assert bad.exit_code == 1 and "--paged-q bnhd" in bad.failures[0].verdict.repro(), str(bad)


def test_a_varlen_lse_laid_out_tokens_first_is_declared():
    """(total_q, H) instead of the protocol's (H, total_q): a bad return that names the declaration, and with it
    declared the kernel passes."""
    only = "varlen_empty_sequences_causal,varlen_cross_causal"
    undeclared = _verify(pk.lse_tokens_first, only)
    assert undeclared.exit_code == 1 and "--lse-layout tokens-first" in str(undeclared), str(undeclared)
    declared = _verify(pk.lse_tokens_first, only, lse_layout="tokens-first")
    assert declared.exit_code == 0 and {r.status for r in declared.results} == {"pass"}, str(declared)


def test_the_packed_alibi_entries_take_each_sequences_own_slopes():
    """No packed entry had ALiBi: a varlen kernel that read sequence 0's slopes for every sequence passed all of
    them (an independent check's kernel). The packed ALiBi entries (with softcap, whose order before the bias they
    also hold) fail it naming the sequence; the project's fused varlen kernel passes them."""
    only = "varlen_alibi_batch_heads_softcap,paged_alibi_batch_heads_softcap"
    from flashcheck.kernel import fused

    good = _verify(fused.attention_varlen, only)
    assert good.exit_code == 0 and {r.status for r in good.results} == {"pass"}, str(good)
    bad = _verify(pk.fused_slopes_of_sequence_0, only)
    assert {r.case.name for r in bad.failures} == {"varlen_alibi_batch_heads_softcap[fp32]",
                                                   "paged_alibi_batch_heads_softcap[fp32]"}, str(bad)
    assert all(f.verdict.failures[0].message.startswith("sequence ") for f in bad.failures), str(bad)
