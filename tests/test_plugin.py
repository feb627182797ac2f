"""The pytest plugin (flashcheck/plugin.py) in a scratch kernel repository: a package with attention functions in
tmp_path, no conftest.py, pytest run there as a subprocess with `--flashcheck=pkg.attn:FUNCTION`. Item names,
counts, skip reasons, a buggy kernel's failure text with its repro line, ini keys, the generated search, a
collection error, pytest-xdist, and the plugin's being inert (no torch) without a target.

Plugins are loaded explicitly (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 with -p flashcheck.plugin, -p xdist), so that
the run sees only these; one test loads the plugin through its pytest11 entry point instead."""
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

KERNELS = '''
import math

import torch

import flashcheck


def forward(q, k, v, *, causal=False, scale=None):
    """Plain attention in float64 (bottom-right causal): right, and fast on the CPU."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        sees = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        s = s.masked_fill(~sees, float("-inf"))
    return (torch.softmax(s, dim=-1).nan_to_num(0.0) @ v.double()).to(q.dtype)


def limited(q, k, v, *, causal=False, scale=None):
    if q.shape[-1] > 32:
        raise flashcheck.Unsupported("head dims above 32")
    return forward(q, k, v, causal=causal, scale=scale)


@flashcheck.declare(causal=False)
def no_causal(q, k, v, *, causal=False, scale=None):
    return forward(q, k, v, scale=scale)


def wrong_default_scale(q, k, v, *, causal=False, scale=None):
    """A bug: the default scale 1/D instead of 1/sqrt(D) (right only for D = 1)."""
    return forward(q, k, v, causal=causal, scale=1.0 / q.shape[-1] if scale is None else scale)
'''


@pytest.fixture
def repo(tmp_path):
    """A kernel repository: pkg/attn.py, a copy of examples/buggy_attention.py, and nothing else."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "attn.py").write_text(KERNELS)
    shutil.copy(ROOT / "examples" / "buggy_attention.py", tmp_path / "buggy_attention.py")
    return tmp_path


def pytest_in(repo, *args, autoload=False):
    """`python -m pytest ARGS` in the scratch repository (the backend inherited: FLASHCHECK_BACKEND)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    # this checkout importable from the scratch repository even where flashcheck is not installed (a GPU
    # runner with PYTHONPATH=.: a relative path would point into the scratch repository)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    plugins = []
    if not autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        plugins = ["-p", "flashcheck.plugin"] + (["-p", "xdist"] if "-n" in args else [])
    proc = subprocess.run([sys.executable, "-m", "pytest", *plugins, "-p", "no:cacheprovider", *args], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)
    proc.output = proc.stdout + proc.stderr
    return proc


def outcomes(output):
    """{item name: PASSED/FAILED/SKIPPED} from -v output (with or without xdist's [gwN] prefix)."""
    found = {}
    for m in re.finditer(r"(?:(flashcheck::\S+) (PASSED|FAILED|SKIPPED)|(PASSED|FAILED|SKIPPED) (flashcheck::\S+))",
                         output):
        name, word = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        found[name] = word
    return found


def explain(proc):
    return f"exit {proc.returncode}\n{proc.output[-6000:]}"


def test_one_item_per_case_named_after_it_with_declaration_skips(repo):
    proc = pytest_in(repo, "--flashcheck=pkg.attn:forward", "-v", "-rs",
                     "--flashcheck-only", "hand_one_query_two_keys,partial_last_key_block",
                     "--flashcheck-only", "causal_square", "--flashcheck-no-causal", "--flashcheck-dtypes", "fp32,fp16")
    assert proc.returncode == 0, explain(proc)
    names = ["hand_one_query_two_keys", "partial_last_key_block", "causal_square"]
    expected = {f"flashcheck::{n}[{d}]": "SKIPPED" if n == "causal_square" else "PASSED"
                for n in names for d in ("fp32", "fp16")}
    assert outcomes(proc.output) == expected, explain(proc)
    assert "4 passed, 2 skipped" in proc.output
    assert "not declared: causal (--no-causal)" in proc.output
    assert "flashcheck plugin: pkg.attn:forward on " in proc.output     # the report header


def test_a_buggy_kernel_fails_with_the_oracle_text_and_repro_line(repo):
    proc = pytest_in(repo, "--flashcheck=buggy_attention.py:attention", "-q",
                     "--flashcheck-only", "hand_one_query_two_keys[fp32]")
    assert proc.returncode == 1, explain(proc)
    assert "1 failed" in proc.output
    assert "FAIL hand_one_query_two_keys[fp32] [buggy_attention.py:attention]" in proc.output
    assert "mismatch at (b=0, h=0, row=0, col=0): got 5, expected 7.5" in proc.output
    assert ("repro: flashcheck verify buggy_attention.py:attention --case \"Case('hand_one_query_two_keys[fp32]'"
            in proc.output)
    assert "Traceback" not in proc.output and "plugin.py" not in proc.output     # the oracle's text, no stack


def test_ini_keys_and_unsupported_and_own_declarations(repo):
    (repo / "pytest.ini").write_text(textwrap.dedent("""\
        [pytest]
        flashcheck_target = pkg.attn:limited
        flashcheck_only = head_dim_64, hand_one_query_two_keys
        flashcheck_dtypes = fp32
        """))
    proc = pytest_in(repo, "-v", "-rs")
    assert proc.returncode == 0, explain(proc)
    assert outcomes(proc.output) == {"flashcheck::hand_one_query_two_keys[fp32]": "PASSED",
                                     "flashcheck::head_dim_64[fp32]": "SKIPPED"}, explain(proc)
    assert "unsupported: head dims above 32" in proc.output
    # the command line overrides the ini file; the kernel's own declarations (flashcheck.declare) count
    proc = pytest_in(repo, "-v", "-rs", "--flashcheck=pkg.attn:no_causal", "--flashcheck-only", "causal_square[fp32]")
    assert proc.returncode == 0, explain(proc)
    assert outcomes(proc.output) == {"flashcheck::causal_square[fp32]": "SKIPPED"}, explain(proc)
    assert "not declared: causal (--no-causal)" in proc.output


def test_generated_cases_are_one_item_failing_with_each_minimal_case(repo):
    proc = pytest_in(repo, "--flashcheck=pkg.attn:wrong_default_scale", "-q", "--flashcheck-only", "head_dim_1[fp32]",
                     "--flashcheck-examples", "4", "--flashcheck-dtypes", "fp32")
    assert proc.returncode == 1, explain(proc)
    assert "1 failed, 1 passed" in proc.output, explain(proc)    # head_dim_1: D = 1 hides the bug
    assert "FAILED flashcheck::generated_examples" in proc.output
    assert "distinct failure kind(s), each shrunk to a minimal case: mismatch (hypothesis_minimal_" in proc.output
    # the repro line carries the run's declarations (--dtypes fp32 here), then the shrunk case
    assert re.search(r"repro: flashcheck verify pkg\.attn:wrong_default_scale --dtypes fp32 --case "
                     r"\"Case\('hypothesis_minimal_", proc.output), explain(proc)


def test_parallel_under_xdist(repo):
    proc = pytest_in(repo, "--flashcheck=pkg.attn:forward", "-v", "-n", "2",
                     "--flashcheck-only", "hand_one_query_two_keys,partial_last_key_block", "--flashcheck-dtypes",
                     "fp32,fp16")
    assert proc.returncode == 0, explain(proc)
    assert "4 passed" in proc.output and "[gw1]" in proc.output, explain(proc)
    assert set(outcomes(proc.output)) == {f"flashcheck::{n}[{d}]" for n in ("hand_one_query_two_keys",
                                                                             "partial_last_key_block")
                                          for d in ("fp32", "fp16")}


def test_errors_are_reported_not_raised(repo):
    proc = pytest_in(repo, "--flashcheck=pkg.attn:nonesuch", "-q")
    assert proc.returncode == 2, explain(proc)                       # interrupted: an error during collection
    assert "ERROR collecting flashcheck" in proc.output and "pkg.attn has no attribute 'nonesuch'" in proc.output
    proc = pytest_in(repo, "--flashcheck=pkg.attn:forward", "--flashcheck-dtypes", "fp64")
    assert proc.returncode == 4, explain(proc)                       # a usage error
    assert "expected a list of fp32, fp16, bf16" in proc.output


def test_inert_and_torch_free_without_a_target(repo):
    (repo / "test_plain.py").write_text("import sys\n\n\ndef test_no_torch():\n    assert 'torch' not in sys.modules\n")
    proc = pytest_in(repo, "-q")
    assert proc.returncode == 0, explain(proc)
    assert "1 passed" in proc.output and "flashcheck::" not in proc.output


@pytest.mark.skipif(not any(ep.name == "flashcheck" and ep.value == "flashcheck.plugin"
                            for ep in importlib.metadata.entry_points(group="pytest11")),
                    reason="flashcheck is not installed with its pytest11 entry point here")
def test_the_entry_point_loads_the_plugin(repo):
    proc = pytest_in(repo, "--flashcheck=pkg.attn:forward", "-q", "-p", "no:benchmark",
                     "--flashcheck-only", "hand_one_query_two_keys[fp32]", "-m", "flashcheck", autoload=True)
    assert proc.returncode == 0, explain(proc)
    assert "1 passed" in proc.output


def test_shards_collect_disjoint_parts_that_make_the_whole(repo):
    """--flashcheck-shard I/N collects the I-th part of the cases, as verify --shard shares them out: the shards
    are disjoint and together hold every item of the unsharded run."""
    args = ["--flashcheck=pkg.attn:forward", "-v", "--flashcheck-only",
            "hand_one_query_two_keys,partial_last_key_block,causal_square,one_key,cross_nq_gt_nk"]
    whole = outcomes(pytest_in(repo, *args).output)
    parts = [outcomes(pytest_in(repo, *args, "--flashcheck-shard", f"{i}/3").output) for i in (1, 2, 3)]
    assert len(whole) == 15 and sum(len(p) for p in parts) == len(whole), (whole, parts)
    merged = {}
    for p in parts:
        merged.update(p)
    assert merged == whole


def test_help_lists_every_declaration(repo):
    """`pytest --flashcheck=X --help` renders (argparse formats each help text with %) and lists every declaration."""
    from flashcheck.cases.declarations import FIELDS
    proc = pytest_in(repo, "--flashcheck=pkg.attn:forward", "--help")
    assert proc.returncode == 0, explain(proc)
    flags = [f"--flashcheck-{f.flag[2:]}" for f in FIELDS]
    assert [f for f in flags if f not in proc.output] == [], explain(proc)


def test_a_varlen_kernel_gets_the_packed_entries_and_the_dense_ones(repo):
    shutil.copy(ROOT / "examples" / "varlen_attention.py", repo / "varlen_attention.py")
    proc = pytest_in(repo, "--flashcheck=varlen_attention.py:attention_varlen", "-v", "--flashcheck-dtypes", "fp32",
                     "--flashcheck-only", "varlen_empty_sequences,paged_odd_page_size,causal_square")
    assert proc.returncode == 0, explain(proc)
    assert set(outcomes(proc.output).values()) == {"PASSED"} and "3 passed" in proc.output, explain(proc)
