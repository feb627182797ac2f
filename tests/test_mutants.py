"""The bug corpus against the suite (cases/corpus/mutants.py): every mutant must be killed by each of its named
killer cases; the corpus must still apply to the kernel (drift); the kernels' "guards:" comments must
name real mutants and cases; the isolation that the GPU relies on must contain crashes and hangs.

Each mutant is judged on its named killers only (the whole catalogue is `flashcheck mutants`' job).
"""
import re
import time

import pytest

from flashcheck.cases import catalogue
from flashcheck.cases.corpus import mutants, sweep
from flashcheck.cases.corpus.mutants import Mutant, MutantDrift
from flashcheck.cases.backend import backend

# mutants compute NaN and inf on purpose: the interpreter's NumPy warnings about it are noise here
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

# a kill through one of these says the mutant's own text is broken, not that the suite caught a bug
_TEXT_ERRORS = re.compile(r"\b(NameError|SyntaxError|IndentationError|ImportError|UnboundLocalError)\b")


def _param(m):
    marks = [pytest.mark.mutants]
    if m.gpu_only:
        # conftest skips gpu-marked tests on the CPU; the skipif, evaluated first, carries the mutant's reason
        marks += [pytest.mark.gpu, pytest.mark.skipif(backend() != "gpu", reason=f"GPU only: {m.gpu_only}")]
    return pytest.param(m, id=m.name, marks=marks)


@pytest.mark.parametrize("mutant", [_param(m) for m in mutants.MUTANTS])
def test_mutant_is_killed(mutant):
    results = mutants.kill(mutant)
    broken = [(c.name, v.failures[0].line()) for c, v in results
              if v.failed and _TEXT_ERRORS.search(v.failures[0].message)]
    assert not broken, (f"mutant {mutant.name}: its transformed source does not run, so its kills prove nothing: "
                        f"{broken}\n{mutants.diff(mutant)}")
    survived = [c.name for c, v in results if not v.failed]
    kills = ", ".join(f"{c.name} ({v.kind})" for c, v in results if v.failed) or "none"
    assert not survived, (
        f"SURVIVOR: mutant {mutant.name} (kernel/{mutant.module}.py) was not killed by its named killer(s) "
        f"{', '.join(survived)}: each passed the whole oracle.\n"
        f"  breaks: {mutant.breaks}\n  origin: {mutant.origin}\n"
        f"  expected killers: {', '.join(mutant.killers)}; actual kills: {kills}\n{mutants.diff(mutant)}")


def test_corpus_applies_to_the_current_kernel():
    """Drift: every find-text occurs exactly once in the kernel source it transforms."""
    drifted = []
    for m in mutants.MUTANTS:
        try:
            mutants.source(m)
        except MutantDrift as exc:
            drifted.append(str(exc))
    assert not drifted, "the kernel changed under the bug corpus; update cases/corpus/mutants.py:\n" + "\n".join(drifted)


def test_the_proofs_of_the_tests_still_apply():
    """scripts/prove_tests.py deletes checks and expects their tests to go red: each deletion's text must still occur
    exactly once in its file, or the proof silently stops proving (two had drifted with the protocol-v3 refactor)."""
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("prove_tests", root / "scripts" / "prove_tests.py")
    prove = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prove)
    counts = [(name, path, (root / path).read_text().count(find)) for name, path, find, _, _ in prove.DELETIONS]
    drifted = [f"{name}: {path} holds its text {n} times" for name, path, n in counts if n != 1]
    assert not drifted, "scripts/prove_tests.py no longer applies:\n" + "\n".join(drifted)


@pytest.mark.parametrize("find, count", [("this text is in no kernel", 0), ("tl.arange(0, BLOCK_N)", 2)])
def test_drift_names_the_mutant_and_the_count(find, count):
    m = Mutant("drift_probe", "fused", find, "x", "-", "test", ())
    with pytest.raises(MutantDrift, match=rf"mutant drift_probe: its find-text occurs {count} times"):
        mutants.source(m)
    later = Mutant("drift_probe", "fused", "LOG2E = ", "LOG2E_ = ", "-", "test", (), edits=((find, "x"),))
    with pytest.raises(MutantDrift, match=rf"mutant drift_probe: edit 2 of 2 occurs {count} times"):
        mutants.source(later)


# The corpus only grows: every mutant ever added is named here. A mutant removed must say why in its commit and
# leave this list; a mutant added joins it (the test fails until it does, so the list stays the whole corpus).
CORPUS = frozenset("""
kv_other_neg_inf kv_mask_plus score_mask_wrong_axis score_mask_from_kv_mask no_score_mask kv_mask_off_by_one
unmasked_tail_block inner_lo_not_applied one_length_nq loop_bound_nq kv_mask_nq score_mask_nq
head_dim_block_no_floor head_dim_block_fixed_16 fp32_tf32_dot tf32x3_single_pass split_keys_overlap
split_last_keys_dropped split_partial_no_l_guard split_combine_no_inf_guard rescale_paper_inverse
l_not_rescaled acc_not_rescaled acc_in_input_dtype l_in_input_dtype m_never_updated m_new_drops_old_max
fast_path_max_ignores_sign exact_pass_never exact_pass_fused big_rows_final_max_only big_rows_threshold_2_31
exp_instead_of_exp2 log2e_missing scale_twice scale_never causal_no_masked_row_guard masked_max_kept_as_zero empty_row_zero_division
causal_top_left causal_hi_block_n causal_shift_sign store_no_row_mask store_row_mask_off_by_one
lse_log2_domain int32_offsets batch_head_swapped k_batch_stride_from_q v_strides_from_k out_strides_from_q
kv_advance_wrong_stride q_head_dim_stride_assumed_1 query_block_from_wrong_axis
causal_heaviest_first_off_by_one unfused_kv_mask_plus unfused_softmax_flat_mask unfused_no_normalise
unfused_softmax_no_max unfused_scores_nq_by_nq tma_no_alignment_check tma_desc_rows_nq
tma_desc_padded_head_dim tma_coords_batch_head_swapped d_split_second_half_same_columns
d_split_second_half_not_rescaled d_split_column_mask_unshifted q_in_loop_columns_unclamped
unfused_scores_unwritten unfused_causal_top_left
gqa_interleaved_map gqa_group_inverted gqa_v_reads_query_head gqa_group_from_batch dv_load_mask_head_dim
dv_block_from_d dv_descriptor_shape_from_d dv_split_partial_row_stride window_left_off_by_one
window_right_off_by_one window_left_top_left window_lead_block_unmasked window_lo_skips_partial_block
softcap_textbook_tanh softcap_ratio_times_tanh softcap_after_mask softcap_natural_units alibi_sign
varlen_rows_from_max_seqlen varlen_keys_from_max_seqlen varlen_key_start_from_q varlen_lse_rows_padded
paged_keys_from_max_seqlen paged_pages_assumed_contiguous paged_slot_from_block paged_table_row_stride_from_b
alibi_top_left alibi_no_abs alibi_batch_slopes_ignored alibi_natural_units unfused_gqa_v_reads_query_head
unfused_window_left_off_by_one unfused_softcap_textbook_tanh unfused_alibi_top_left
""".split())


def test_corpus_records():
    names = [m.name for m in mutants.MUTANTS]
    assert len(set(names)) == len(names), "mutant names must be unique"
    removed, added = CORPUS - set(names), set(names) - CORPUS
    assert not removed, f"mutants removed from the corpus: {sorted(removed)}"
    assert not added, f"new mutants: add their names to CORPUS in this test: {sorted(added)}"
    for m in mutants.MUTANTS:
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", m.name), m.name
        assert m.module in mutants.MODULES, m.name
        assert m.breaks and m.origin and m.killers, f"mutant {m.name} must say what it breaks, where from, and its killers"


def test_every_killer_is_a_catalogue_case():
    missing = []
    for m in mutants.MUTANTS:
        for k in m.killers:
            try:
                catalogue.get(k)
            except KeyError:
                missing.append((m.name, k))
    assert not missing, f"killers that are not in cases/catalogue.py: {missing}"


def test_cpu_judgeable_mutants_have_cpu_judgeable_killers():
    """A mutant the interpreter can show must be killed there too: none of its killers may be GPU-only."""
    bad = [(m.name, k) for m in mutants.MUTANTS if not m.gpu_only for k in m.killers
           if catalogue.get(k).gpu_only or catalogue.get(k).dtype == "bf16"]
    assert not bad, f"GPU-only killers of mutants the CPU judges: {bad}"


_NOT_NAMES = {"mutant", "mutants", "case", "cases", "and", "gpu", "the", "of", "one", "length", "passed", "for",
              "both", "each", "new", "max", "keeps", "old", "state", "stays", "fp32", "a", "query", "block", "sees",
              "is", "bounded", "by", "its", "rows", "last", "key", "pointer", "advances", "own", "tensor", "row",
              "stride", "every", "strides", "passes", "grid", "axis", "rounds", "up", "tile", "it", "written",
              "buffer", "scores", "subtracted", "before", "exp", "bottom", "right"}


def _guard_comments():
    """(file:line, names) of every 'guards:' note in the kernel sources, with the comment lines that continue it."""
    for module, path in mutants.MODULES.items():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "guards:" not in line or '"guards:"' in line:    # the docstring that explains the notes
                continue
            text = line.split("guards:", 1)[1]
            for more in lines[i + 1:]:
                if not more.strip().startswith("#") or "guards:" in more:
                    break
                text += " " + more.strip().lstrip("#")
            names = {n for n in re.findall(r"\b[a-z][a-z0-9_]*(?:\[[a-z0-9]+\])?", text) if n not in _NOT_NAMES}
            yield f"kernel/{module}.py:{i + 1}", names


def test_kernel_guard_comments_name_real_mutants_and_cases():
    """The kernels' 'guards: mutant X' notes and the corpus agree both ways: every name a note gives is a
    mutant or a catalogue case, and every mutant is named by a note of the kernel it transforms (a reader of
    the kernel sees which bug each line guards against)."""
    notes = list(_guard_comments())
    unknown = []
    for where, names in notes:
        for n in names:
            try:
                n in mutants.BY_NAME or catalogue.get(n)
            except KeyError:
                unknown.append((where, n))
    assert not unknown, f"'guards:' comments name neither a mutant nor a catalogue case: {unknown}"
    named = {(where.split(":")[0], n) for where, names in notes for n in names}
    silent = [m.name for m in mutants.MUTANTS if (f"kernel/{m.module}.py", m.name) not in named]
    assert not silent, f"mutants no 'guards:' comment of their kernel names: {silent}"


# --- isolation: what the GPU path runs on, exercised on any backend -----------------------------------------

def _injected(name, statement):
    """A probe mutant of the fused kernel whose host code runs `statement` first."""
    anchor = "    B, H, Nq, Nk, D, scale = check_attention_inputs("
    return Mutant(name, "fused", anchor, f"    {statement}\n{anchor}", "-", "test", ())


def test_isolated_verdicts_match_in_process():
    m = mutants.get("kv_mask_plus")
    here = mutants.kill(m, ["partial_last_key_block", "one_key"], isolate=False)
    there = mutants.kill(m, ["partial_last_key_block", "one_key"], isolate=True)
    assert [(c.name, v.kind, v.failures[0].where if v.failures else None) for c, v in here] == \
           [(c.name, v.kind, v.failures[0].where if v.failures else None) for c, v in there]


def test_a_crash_is_a_crash_of_that_case_only():
    """A mutant that kills its process is reported as a crash of the case it was judging (the same kind
    verify gives a kernel that segfaults: cases/oracle/kinds.py classify_death); the next case and the next
    mutant are judged by fresh processes as usual."""
    crasher = _injected("probe_crash", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    first, second = mutants.judge_isolated([(crasher, [catalogue.get("one_key"), catalogue.get("one_query")]),
                                            (mutants.get("scale_never"), [catalogue.get("custom_scale")])])
    assert [(c.name, v.kind) for c, v in first] == [("one_key[fp32]", "crash"), ("one_query[fp32]", "crash")]
    assert "signal 11" in first[0][1].failures[0].message
    assert [(c.name, v.kind) for c, v in second] == [("custom_scale[fp32]", "mismatch")]


def test_a_server_serves_the_next_mutant_after_a_crash_with_a_clean_log():
    """judge_isolated keeps its worker's server for the next call in this process (each mutant still gets a child
    of its own); a crash in one mutant's child neither stops the next mutant nor lends it the crash's last words."""
    crasher = _injected("probe_crash_then", "import sys, os, signal; print('illegal memory access', file=sys.stderr); "
                                            "sys.stderr.flush(); os.kill(os.getpid(), signal.SIGSEGV)")
    [(_, crashed)] = mutants.kill(crasher, ["one_key"], isolate=True)
    assert crashed.kind == "device fault", crashed.report()      # its last words name a device fault
    kept = list(mutants._SPARE)
    assert len(kept) == 1 and kept[0].proc is not None
    crasher2 = _injected("probe_crash_quiet", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    [(_, again)] = mutants.kill(crasher2, ["one_key"], isolate=True)
    assert mutants._SPARE == kept     # the same server
    assert again.kind == "crash" and "illegal memory access" not in again.failures[0].message, again.report()
    [(_, judged)] = mutants.kill(mutants.get("scale_never"), ["custom_scale"], isolate=True)
    assert judged.kind == "mismatch" and mutants._SPARE == kept, judged.report()


def child_state(target):
    """Run in a runner's child (Worker.call): which process it is, and which module its target comes from."""
    import os
    return os.getpid(), target.__module__


def test_a_clean_mutants_child_judges_the_next_mutant_and_a_dead_ones_does_not():
    """The child that judged a mutant without dying judges the next one too, the next mutant's module in place of
    its own (a new child is a new CUDA context: 0.5 s of CPU; 2.4 s, 1.0 s of it CPU, with 16 made at once on an
    H200 host), with the next mutant's verdicts; after a crash the next mutant gets a fresh child; a mutant with
    strays never shares one."""
    mutants._close_spares()
    [(_, first)] = mutants.kill(mutants.get("scale_never"), ["custom_scale"], isolate=True)
    [worker] = mutants._SPARE
    pid, module = worker.call("tests.test_mutants:child_state")
    assert first.kind == "mismatch" and module == "flashcheck_mutant_scale_never", (first.report(), module)
    [(_, second)] = mutants.kill(mutants.get("log2e_missing"), ["one_query"], isolate=True)
    assert second.failed and mutants._SPARE == [worker], second.report()
    assert worker.call("tests.test_mutants:child_state") == (pid, "flashcheck_mutant_log2e_missing")
    crasher = _injected("probe_crash_then_next", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    [(_, crashed)] = mutants.kill(crasher, ["one_key"], isolate=True)
    assert crashed.kind == "crash", crashed.report()
    [(_, third)] = mutants.kill(mutants.get("scale_never"), ["custom_scale"], isolate=True)
    after, module = worker.call("tests.test_mutants:child_state")
    assert third.kind == "mismatch" and after != pid and module == "flashcheck_mutant_scale_never", third.report()
    stray = next(m for m in mutants.MUTANTS if m.strays and not m.gpu_only)
    mutants.kill(stray, stray.killers[:1], isolate=True)
    assert worker.call("tests.test_mutants:child_state") == (after, "flashcheck_mutant_scale_never")
    # a child that dies after its last answer (here a timer armed by the kernel's first call) is not reused
    doomed = _injected("probe_dies_after_answering", "import os, signal, threading; t = os.__dict__.setdefault("
                                                     "'_fc_timer', threading.Timer(2.0, os.kill, (os.getpid(), "
                                                     "signal.SIGKILL))); t.ident is None and t.start()")
    mutants.kill(doomed, ["one_key"], isolate=True)
    time.sleep(3.0)
    [(_, fourth)] = mutants.kill(mutants.get("scale_never"), ["custom_scale"], isolate=True)
    assert fourth.kind == "mismatch", fourth.report()
    assert worker.call("tests.test_mutants:child_state")[0] not in (pid, after)


def test_a_hang_is_a_timeout():
    sleeper = _injected("probe_hang", "import time; time.sleep(120)")
    [(case, verdict)] = mutants.kill(sleeper, ["one_key"], isolate=True, timeout=10)
    assert verdict.kind == "timeout", verdict.report()


# --- the sweep's generator and its table of equivalent mutants --------------------------------------------

def test_sweep_generates_each_operator_inside_jit_bodies_only():
    generated = sweep.generate()
    assert len({g.id for g in generated}) == len(generated), "sweep ids must be unique"
    text = mutants.MODULES["fused"].read_text()
    import ast

    bodies = [(a, b) for a, b, _ in sweep._jit_ranges(ast.parse(text))]
    outside = [g.id for g in generated if not any(a <= g.line <= b for a, b in bodies)]
    assert not outside, f"sweep mutants outside the @triton.jit bodies: {outside}"
    ops = " ".join(g.op for g in generated)
    for op in ("'<' -> '<='", "'&' -> '|'", "'+' -> '-'", "'[:, None]' -> '[None, :]'", "other=0.0 ->",
               "minimum -> maximum", "const", "drop statement"):
        assert op in ops, f"the sweep generates no {op} mutant"
    for g in generated:
        mutants.source(g.mutant)     # each applies exactly once


def test_sweep_equivalents_match_generated_mutants():
    """An equivalence entry whose line changed no longer matches: it must be re-reviewed, not kept silently."""
    ids = {g.id for g in sweep.generate()}
    stale = sorted(set(sweep.EQUIVALENT) - ids)
    assert not stale, f"cases/corpus/sweep.py EQUIVALENT entries matching no generated mutant: {stale}"


def test_docs_table_is_current():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "mutants.md").read_text()
    assert mutants.markdown() in doc, "docs/mutants.md is stale: regenerate it with `flashcheck mutants --markdown`"
