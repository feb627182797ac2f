"""Prove the tests can fail: delete a check in a scratch copy of the repository and run the test that names
it; it must go red. A test that stays green with its check gone guards nothing.

    python scripts/prove_tests.py            # every deletion below, one scratch copy each (CPU, a few minutes)
    python scripts/prove_tests.py -k repeat  # those whose name contains "repeat"

Each deletion is a find/replace of one file (the text must occur exactly once). A control changes nothing and
must stay green (the scratch copy itself works). Exit 1 if any test stays green, or the control goes red.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, file, find, replace, test)
DELETIONS = [
    ("poison check", "cases/oracle/layers.py", "    if bool(unwritten.any()):", "    if False:",
     "tests/test_oracle.py::test_unwritten_rows"),
    ("output guard", "cases/oracle/layers.py", "        if len(stray):", "        if False:",
     "tests/test_oracle.py::test_out_of_bounds_write"),
    ("input guard", "cases/oracle/layers.py", "        if len(changed):", "        if False:",
     "tests/test_oracle.py::test_input_written"),
    ("NaN diagnosis", "cases/oracle/layers.py", "            fail = _diagnose_nan(kernel, case, caps, qkv, device, fail, heads)",
     "            pass", "tests/test_oracle.py::test_out_of_bounds_read_told_from_nan"),
    ("hand value", "cases/oracle/layers.py", "        if hand is not None and heads is None and _exact_in(case, hand):",
     "        if False:", "tests/test_oracle.py::test_hand_value_is_exact"),
    ("lse check", "cases/oracle/layers.py", "        if lse is not None:\n            fail = _lse_check",
     "        if False:\n            fail = _lse_check", "tests/test_oracle.py::test_lse_checked"),
    ("properties in verify", "cases/verify/judging.py",
     "        if not verdict.failed and settings.properties and case.data != \"nan_input\":", "        if False:",
     "tests/test_oracle.py::test_properties_catch_what_one_reference_run_cannot"),
    ("inconclusive", "cases/oracle/tolerance.py", "    if not mask.any():\n        return None",
     "    if True:\n        return None", "tests/test_property_catches.py::test_trivial_answers_are_never_a_pass"),
    ("repeat", "cases/verify/judging.py", "        if not verdict.failed and settings.repeat > 1:",
     "        if False:", "tests/test_verify_real.py::test_last_bit_race_needs_repeat"),
    ("same-length declaration", "cases/declarations.py", "            if self.same_length and nq != nk:",
     "            if False:", "tests/test_verify_real.py::test_same_length_kernel_declared_and_undeclared"),
    ("unsupported outcome", "cases/oracle/layers.py", "        if declined is not None:\n            wrapped",
     "        if False:\n            wrapped", "tests/test_verify_real.py::test_same_length_kernel_declared_and_undeclared"),
    ("control: nothing deleted", "cases/oracle/layers.py", "LOOSE = 0.1", "LOOSE = 0.1",
     "tests/test_oracle.py::test_unwritten_rows"),
    ("out of memory outcome", "cases/oracle/layers.py", "        if is_out_of_memory(exc):\n            raise Outcome(\"out of memory\", _memory_note",
     "        if False:\n            raise Outcome(\"out of memory\", _memory_note",
     "tests/test_verify_real.py::test_out_of_memory_is_its_own_outcome"),
    ("dtype expansion", "cases/case.py", '        return [self.replace(name=f"{self.name}[{d}]", dtype=d) for d in self.dtypes',
     '        return [self.replace(name=f"{self.name}[{d}]", dtype=d) for d in self.dtypes[:1]',
     "tests/test_verify.py::test_fused_kernel_passes_a_selection"),
    ("drift check", "cases/corpus/mutants.py", "        if count != 1:", "        if count == 0:",
     "tests/test_mutants.py::test_drift_names_the_mutant_and_the_count"),
    ("an import cycle added", "cases/oracle/kinds.py", "import enum\n",
     "import enum\n\nimport flashcheck.cases.corpus.cli  # noqa: F401\n", "tests/test_layout.py"),
    ("a lazy import cycle added", "cases/oracle/kinds.py", "def classify_exception(",
     "def _cycle():\n    from flashcheck.cases.corpus import cli  # noqa: F401  (lazy: a test's probe)\n\n\n"
     "def classify_exception(", "tests/test_layout.py::test_no_import_cycles_and_kernel_reference_stand_alone"),
    ("a lazy import's reason", "cases/runner/worker.py", "    # lazy: Triton reads TRITON_INTERPRET when it is imported",
     "    # Triton reads TRITON_INTERPRET when it is imported", "tests/test_layout.py::test_every_lazy_import_says_why"),
    ("a property failure's numbers", "cases/generate/properties.py", "tol=float(e.tol_hull[w]))", "tol=e.tol_hull)",
     "tests/test_reports.py"),
    ("hull's own tolerance", "cases/generate/properties.py", "        below = rows & (out < e.hull_lo - e.tol_hull)\n"
     "        above = rows & (out > e.hull_hi + e.tol_hull)", "        below = rows & (out < e.hull_lo - e.tol)\n"
     "        above = rows & (out > e.hull_hi + e.tol)",
     "tests/test_property_catches.py::test_convex_hull_judges_tightly_where_the_reference_is_loose"),
    ("the table's whole reason", "cases/report/__init__.py",
     'last = textwrap.wrap(str(row[cols]), room, break_on_hyphens=False) or [""]', "last = [str(row[cols])[:room]]",
     "tests/test_reports.py::test_the_table_never_cuts_a_reason"),
    ("a mutant removed", "cases/corpus/mutants.py", '    Mutant("causal_shift_sign", "fused",',
     '    Mutant("causal_shift_sign_renamed", "fused",', "tests/test_mutants.py::test_corpus_records"),
    # a tolerance ten times wider: the half-precision near misses get through (fp32's and fp16's bounds keep more
    # than 10x of slack over what correct kernels do on most cases, so bf16's test is the one that notices)
    ("near misses caught", "cases/oracle/tolerance.py", "    tol = moved + after + rounding\n",
     "    tol = 10 * (moved + after + rounding)\n",
     "tests/test_tolerance.py::test_correct_formulations_pass_and_near_misses_fail[bf16]"),
    ("causal hidden keys reached", "cases/generate/properties.py", '    return _checked("causal_hidden_keys",',
     '    return None and _checked("causal_hidden_keys",', "tests/test_oracle.py::test_invariant_causal_future_keys"),
    ("the whole catalogue by default", "cases/verify/engine.py", "if (not names and not keywords) or c.name in bases",
     "if c.name in bases", "tests/test_api.py::test_assert_attention_runs_the_whole_catalogue_by_default"),
    ("compile limit for new inputs", "cases/runner/worker.py", '_write_frame(out, ("tick", "call", key not in seen))',
     "pass", "tests/test_verify_real.py::test_compile_time_is_not_the_answer"),
    ("the oracle's own limit", "cases/runner/worker.py", "work = max(timeout or self.timeout, WORK_FLOOR)",
     "work = timeout or self.timeout", "tests/test_verify_real.py::test_the_oracles_own_work_is_not_the_kernels_time"),
    ("Dv moved with the head dims", "cases/projection.py", "for dv in _nearest(case.Dv, ok, grow)]",
     "for dv in [case.Dv]]", "tests/test_verify_real.py::test_a_value_head_dim_is_projected_with_the_head_dims"),
    ("a wrong-shaped probe answer judged", "cases/verify/judging.py",
     '    if verdict.status == "fail" and str(verdict.kind) == "bad return":', "    if False:",
     "tests/test_verify_real.py::test_a_value_head_dim_is_projected_with_the_head_dims"),
    ("guards notes, both ways", "kernel/fused.py", "# guards: mutant lse_log2_domain\n", "#\n",
     "tests/test_mutants.py::test_kernel_guard_comments_name_real_mutants_and_cases"),
    ("no scale= for the properties", "cases/generate/properties.py",
     "        if case is not None and case.scale is not None and not oracle.Capabilities.of(kernel or self.kernel).scale:",
     "        if False:", "tests/test_verify_real.py::test_signature_without_scale_is_not_called_with_one"),
    ("varlen offsets checked", "kernel/_protocol.py", "        if bound is not None:\n            if isinstance(bound, bool)",
     "        if False:\n            if isinstance(bound, bool)", "tests/test_bad_input.py::test_varlen_offsets_rejected"),
    ("paged capacity checked", "kernel/_protocol.py", "        if not 0 <= n <= capacity:", "        if False:",
     "tests/test_bad_input.py::test_paged_table_and_lengths_rejected"),
    ("paged rows through the table", "kernel/fused.py", "        if PAGED:\n            k_ptrs, v_ptrs = _paged_rows(",
     "        if False:\n            k_ptrs, v_ptrs = _paged_rows(",
     "tests/test_packed.py::test_the_fused_kernels_paged_entry_passes_the_paged_entries"),
]
for _prop in ("permutation", "v_scaling", "v_shift", "scale_equivariance", "row_locality", "duplication",
              "convex_hull", "causal_hidden_keys"):
    DELETIONS.append((f"property {_prop}", "cases/generate/properties.py", f'    return _checked("{_prop}",',
                      f'    return None and _checked("{_prop}",',
                      "tests/test_property_catches.py::test_property_catches_the_kernel_that_breaks_it"))


def prove(name, path, find, replace, test, keep):
    work = tempfile.mkdtemp(prefix="flashcheck-prove-")
    try:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.split()
        for f in files:
            if os.path.isfile(os.path.join(ROOT, f)):
                os.makedirs(os.path.dirname(os.path.join(work, f)) or work, exist_ok=True)
                shutil.copy2(os.path.join(ROOT, f), os.path.join(work, f))
        target = os.path.join(work, path)
        text = open(target).read()
        if text.count(find) != 1:
            return "DRIFT", f"the check's text occurs {text.count(find)} times in {path}"
        open(target, "w").write(text.replace(find, replace))
        env = dict(os.environ, PYTHONPATH=work)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test], cwd=work,
                              env=env, capture_output=True, text=True, timeout=900)
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        return ("RED" if proc.returncode == 1 else "GREEN" if proc.returncode == 0 else f"rc={proc.returncode}"), \
            f"{last} ({time.perf_counter() - t0:.0f} s)"
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only deletions whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    args = parser.parse_args()
    bad = 0
    for name, path, find, replace, test in DELETIONS:
        if args.k not in name:
            continue
        if name.startswith("property "):
            test += f"[{name.split()[1]}]"
        status, detail = prove(name, path, find, replace, test, args.keep)
        bad += status != ("GREEN" if name.startswith("control") else "RED")
        print(f"{status:6} {name:26} -> {test}  {detail}", flush=True)
    print(f"{'every test went red' if not bad else f'{bad} deletion(s) left their test green'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
