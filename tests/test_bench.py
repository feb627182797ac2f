"""flashcheck bench: the FLOP formula, the shape suites, the spot-check, the writers (on synthetic results), the
sweep's launcher, and the command end to end on one tiny shape (--smoke)."""
import argparse
import csv
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashcheck.cases import bench, cli

ROOT = Path(__file__).resolve().parent.parent


def _args(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def _read_csv(path):
    """(header comments as a dict, rows as dicts) of a bench CSV."""
    meta, body = {}, []
    for line in Path(path).read_text().splitlines():
        if line.startswith("# "):
            key, _, value = line[2:].partition(": ")
            meta[key] = value
        else:
            body.append(line)
    return meta, list(csv.DictReader(body))


def _strict_json(path):
    def no_constants(name):
        raise AssertionError(f"{path} holds {name}, which strict JSON readers reject")

    return json.loads(Path(path).read_text(), parse_constant=no_constants)


# -- FLOPs and shapes --------------------------------------------------------------------------------------

def test_flops_formula():
    assert bench.attention_flops(2, 3, 5, 7, 11, False) == 4 * 2 * 3 * 5 * 7 * 11
    assert bench.attention_flops(2, 3, 8, 8, 16, True) == 4 * 2 * 3 * 8 * 8 * 16 // 2
    # causal with Nq != Nk is counted in full (documented convention; no suite uses it)
    assert bench.attention_flops(1, 1, 4, 8, 16, True) == 4 * 4 * 8 * 16


def test_paper_suite_is_the_flashattention_paper_grid():
    shapes = bench.paper_shapes()
    got = {(s.dtype, s.Nq, s.D, s.causal) for s in shapes}
    want = {(dtype, n, d, causal) for dtype in ("bf16", "fp16") for n in (512, 1024, 2048, 4096, 8192, 16384)
            for d in (64, 128) for causal in (False, True)}
    assert got == want and len(shapes) == len(want) == 48
    for s in shapes:
        assert s.Nq == s.Nk, s
        assert s.B * s.Nq == 16384 and s.H * s.D == 2048, f"{s.label()}: want B*N = 16k tokens and H*D = 2048"
        # 16k tokens x width 2048: 4 * 16384 * N * 2048 FLOPs, halved when causal
        assert s.flops == 4 * 16384 * s.Nq * 2048 // (2 if s.causal else 1), s.label()
    quick = bench.paper_shapes(quick=True)
    assert {s.Nq for s in quick} == {1024, 4096, 16384} and len(quick) == 24
    assert set(quick) <= set(shapes)


def test_fp32_and_decode_suites():
    fp32 = bench.fp32_shapes()
    assert {s.dtype for s in fp32} == {"fp32"}
    assert {(s.Nq, s.D, s.causal) for s in fp32} == {(n, d, c) for n in (1024, 4096) for d in (64, 128)
                                                    for c in (False, True)}
    decode = bench.decode_shapes()
    assert {(s.Nq, s.Nk) for s in decode} == {(q, k) for q in (1, 16, 128) for k in (8192, 32768)}
    assert all(not s.causal and s.dtype == "bf16" and (s.B, s.H, s.D) == (8, 16, 128) for s in decode)


def test_select_shapes_filters_suites_and_dtypes():
    everything = bench.select_shapes()
    assert len(everything) == 48 + 8 + 6
    assert [s.suite for s in everything] == sorted((s.suite for s in everything), key=bench.SUITES.index)
    only_bf16 = bench.select_shapes(("all",), ("bf16",))
    assert {s.dtype for s in only_bf16} == {"bf16"} and {s.suite for s in only_bf16} == {"paper", "decode"}
    assert {s.suite for s in bench.select_shapes(("decode",))} == {"decode"}
    assert bench.select_shapes(("fp32",), ("bf16", "fp16")) == []


def test_causal_shapes_need_equal_lengths():
    """SDPA's is_causal is aligned top-left; the protocol's bottom-right: they agree only when Nq == Nk."""
    with pytest.raises(ValueError, match="Nq == Nk"):
        bench.Shape("decode", "bf16", 1, 1, 16, 8192, 128, True)


def test_parse_blocks():
    assert bench.parse_blocks("128x64") == (128, 64)
    assert bench.parse_blocks("32X16") == (32, 16)
    for bad in ("128x48", "128", "axb", "0x16"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_blocks(bad)


# -- the spot-check and SDPA's refusals ----------------------------------------------------------------------

def test_judge_is_relative_to_the_reference_scale():
    ref = torch.linspace(-0.05, 0.05, 64).reshape(1, 1, 8, 8)
    tol = bench.TOLERANCE["bf16"] * 0.05
    assert bench.judge(ref.clone(), ref, "bf16")[0] == "ok"
    near = ref.clone()
    near[0, 0, 3, 3] += 0.5 * tol
    assert bench.judge(near, ref, "bf16")[0] == "ok"
    far = ref.clone()
    far[0, 0, 3, 3] += 2 * tol  # 2e-3 absolute: would pass an absolute 2e-2, is 4% of the output scale
    check, diff, ref_max = bench.judge(far, ref, "bf16")
    assert check == "WRONG" and diff == pytest.approx(2 * tol, rel=1e-3) and ref_max == pytest.approx(0.05)
    nan = ref.clone()
    nan[0, 0, 0, 0] = float("nan")
    assert bench.judge(nan, ref, "fp32")[0] == "WRONG"
    assert bench.judge(ref, nan, "fp32")[0] == "no reference"


def test_refusal_reason_picks_the_forced_backends_lines():
    messages = [
        "Memory efficient kernel not used because: (Triggered internally at sdp_utils.cpp:1)",
        "Memory Efficient attention has been runtime disabled. (Triggered internally at sdp_utils.cpp:2)",
        "Flash attention kernel not used because: (Triggered internally at sdp_utils.cpp:3)",
        "Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float "
        "(Triggered internally at sdp_utils.cpp:4)",
        "CuDNN attention kernel not used because: (Triggered internally at sdp_utils.cpp:5)",
        "cuDNN needs head dim <= 128 (Triggered internally at sdp_utils.cpp:6)",
    ]
    assert bench.refusal_reason("flash", messages) == \
        "Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float"
    assert bench.refusal_reason("cudnn", messages) == "cuDNN needs head dim <= 128"
    assert bench.refusal_reason("efficient", messages) == ""
    assert bench.is_refusal(RuntimeError("No available kernel. Aborting execution."))
    assert not bench.is_refusal(RuntimeError("CUDA error: an illegal memory access was encountered"))


# -- tables, summary, CSV and JSON on synthetic results --------------------------------------------------------

def _row(shape, kernel_ms, peer_ms, check="ok", diff=1e-3):
    """A Row as the runtime builds it; a peer_ms of None is a refusal, a kernel_ms of None an error."""
    row = bench.Row(shape, kernel_cfg="128x64 w4 s3", ref_backend="flash", max_abs_diff=diff, ref_max_abs=0.5,
                    check=check)
    row.cells["kernel"] = (bench.Cell("ok", ms=kernel_ms) if kernel_ms
                           else bench.Cell("error", note="OutOfResources: shared memory"))
    for peer in bench.PEERS:
        ms = peer_ms.get(peer)
        row.cells[peer] = bench.Cell("ok", ms=ms) if ms else bench.Cell("n/a", note=f"{peer} refuses fp32")
    return row


def _synthetic_rows():
    p = {s.Nq: s for s in bench.paper_shapes() if s.dtype == "bf16" and s.D == 64 and not s.causal}
    return [
        _row(p[4096], 1.0, {"flash": 1.0, "cudnn": 2.0, "efficient": 4.0}),
        _row(p[8192], 1.0, {"flash": 2.0, "cudnn": 2.0, "efficient": 4.0}),
        _row(p[16384], 1.0, {"flash": 3.0, "cudnn": 2.0, "efficient": 4.0}),
        _row(p[1024], 1.0, {"flash": 100.0, "cudnn": 2.0, "efficient": 4.0}),  # Nk < 4096: not summarised
        _row(p[2048], 0.5, {"flash": 1.0}, check="WRONG", diff=float("nan")),
        _row(bench.fp32_shapes()[1], None, {"efficient": 1.0}),
    ]


def test_summary_takes_medians_of_checked_long_shapes():
    (entry,) = bench.summarize(_synthetic_rows())
    assert (entry["suite"], entry["dtype"], entry["D"], entry["causal"], entry["shapes"]) == \
        ("paper", "bf16", 64, False, 3)
    assert entry["kernel/flash"] == pytest.approx(2.0)  # ratios 1, 2, 3: the 1k row and the WRONG row are out
    assert entry["kernel/cudnn"] == pytest.approx(2.0) and entry["kernel/efficient"] == pytest.approx(4.0)


def test_table_shows_ratios_refusals_and_wrong_results():
    rows = _synthetic_rows()
    assert rows[0].tflops("kernel") == pytest.approx(rows[0].shape.flops / 1e-3 / 1e12)
    assert rows[1].ratio("flash") == pytest.approx(2.0) and rows[5].ratio("efficient") is None
    text = bench.format_table(rows)
    lines = text.splitlines()
    assert "k/flash" in lines[1] and "k/efficient" in lines[1]
    assert "WRONG" in lines[2 + 4] and "2.00" in lines[2 + 1]
    assert "] kernel error: OutOfResources: shared memory" in text and "error[" in lines[2 + 5]
    assert "flash n/a: flash refuses fp32" in text
    summary = bench.format_summary(bench.summarize(rows))
    assert "2.00" in summary and "4.00" in summary


def test_csv_and_json_writers(tmp_path):
    rows = _synthetic_rows()
    meta = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-01-01T00:00:00+00:00"}
    bench.write_csv(tmp_path / "b.csv", meta, bench.CSV_COLUMNS, [bench.row_record(r) for r in rows])
    got_meta, got = _read_csv(tmp_path / "b.csv")
    assert got_meta == meta
    assert len(got) == len(rows) and list(got[0]) == bench.CSV_COLUMNS
    assert float(got[1]["kernel/flash"]) == pytest.approx(2.0)
    assert float(got[0]["kernel_tflops"]) == pytest.approx(rows[0].tflops("kernel"), rel=1e-5)
    assert (got[4]["check"], got[4]["max_abs_diff"]) == ("WRONG", "nan")
    assert (got[5]["kernel_status"], got[5]["kernel_tflops"], got[5]["cudnn_status"]) == ("error", "", "n/a")
    bench.write_json(tmp_path / "b.json", {"meta": meta, "results": [bench.row_record(r) for r in rows],
                                           "summary": bench.summarize(rows)})
    doc = _strict_json(tmp_path / "b.json")
    assert doc["meta"]["gpu"] == "NVIDIA H200" and len(doc["results"]) == len(rows)
    assert doc["results"][4]["max_abs_diff"] == "nan" and doc["results"][5]["kernel_tflops"] is None


def test_plot_is_written_or_skipped_with_a_reason(tmp_path):
    meta = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-01-01"}
    note = bench.plot(_synthetic_rows(), meta, tmp_path / "b.png")
    if importlib.util.find_spec("matplotlib") is None:
        assert note == "matplotlib is not installed" and not (tmp_path / "b.png").exists()
    else:
        assert note is None and (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_best_configs_skip_wrong_candidates():
    shapes = bench.paper_shapes(quick=True)[:2]

    def rec(shape, config, ms, check="ok", default=False):
        return bench.SweepRecord(shape, config, default, bench.Cell("ok", ms=ms), check, 0.0)

    fast_wrong, good, default = (128, 128, 8, 4), (128, 64, 4, 3), (64, 64, 4, 2)
    records = [rec(s, fast_wrong, 0.1, check="WRONG") for s in shapes]
    records += [rec(s, good, 1.0) for s in shapes] + [rec(s, default, 2.0, default=True) for s in shapes]
    per_shape, (group,) = bench.best_configs(records)
    assert [e["best"] for e in per_shape] == ["128x64 w4 s3"] * 2
    assert (group["best"], group["default"]) == ("128x64 w4 s3", "64x64 w4 s2")
    assert group["speedup"] == pytest.approx(2.0)
    assert len(bench.sweep_candidates()) == 2 * 3 * 2 * 3
    fp32 = bench.sweep_candidates(dtype="fp32")
    assert len(fp32) == 2 * 3 * 2 * 2 and max(bm * bn for bm, bn, _, _ in fp32) <= 64 * 64
    assert {c[:2] for c in bench.sweep_candidates(blocks=(64, 32))} == {(64, 32)}


# -- the command -----------------------------------------------------------------------------------------------

def test_registered_and_light_to_import():
    assert cli.SUBCOMMANDS["bench"][0] == "flashcheck.cases.bench"
    code = ("import sys, flashcheck.cases.bench; heavy = [m for m in ('triton', 'torch', 'flashcheck.kernel.fused') if m in sys.modules];"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_cpu_without_smoke_exits_2():
    """Through the real command line, in a fresh process: the backend must be chosen before Triton loads."""
    done = subprocess.run([sys.executable, "-m", "flashcheck", "--backend", "cpu", "bench"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "needs a CUDA GPU" in done.stderr and "--smoke" in done.stderr, done.stderr


def test_smoke_end_to_end(tmp_path, capsys):
    assert bench.run(_args("--smoke", "--out-dir", str(tmp_path), "--warmup", "1", "--rep", "1")) == 0
    out = capsys.readouterr()
    assert "k/flash" in out.out and "[1/1] smoke fp32" in out.err
    meta, (row,) = _read_csv(tmp_path / "smoke.csv")
    assert {"torch", "triton", "date", "timer", "kernel_source"} <= set(meta)
    assert meta["kernel_source"].startswith("fused.py sha256 "), meta["kernel_source"]
    assert ("gpu" in meta) != ("device" in meta)
    assert (row["kernel_status"], row["check"]) == ("ok", "ok")
    assert float(row["kernel_tflops"]) > 0 and float(row["max_abs_diff"]) <= 1e-3 * float(row["ref_max_abs"])
    assert row["cudnn_status"] == "n/a", row["cudnn_note"]  # cuDNN has no fp32 attention (and no CPU one)
    assert all(row[f"{c}_status"] in ("ok", "n/a", "error") for c in bench.CONTENDERS)
    doc = _strict_json(tmp_path / "smoke.json")
    assert doc["meta"]["torch"] == torch.__version__ and len(doc["results"]) == 1
    has_png = (tmp_path / "smoke.png").exists()
    assert has_png == (importlib.util.find_spec("matplotlib") is not None), doc["meta"]["plot"]
    # --show re-prints a saved run's table and summary from its JSON, without measuring anything
    assert bench.run(_args("--show", str(tmp_path / "smoke.json"))) == 0
    shown = capsys.readouterr().out
    assert shown.splitlines()[1:] == out.out.splitlines()


def test_smoke_sweep(tmp_path, capsys):
    assert bench.run(_args("--smoke", "--sweep-blocks", "--out-dir", str(tmp_path), "--warmup", "1",
                           "--rep", "1")) == 0
    assert "best per group" in capsys.readouterr().out
    _, records = _read_csv(tmp_path / "smoke_sweep.csv")
    candidates = bench.sweep_candidates(smoke=True)
    assert len(records) in (len(candidates), len(candidates) + 1)
    assert sum(r["is_default"] == "True" for r in records) == 1
    bad = [r for r in records if (r["status"], r["check"]) != ("ok", "ok")]
    assert not bad, bad
    assert not math.isnan(float(records[0]["tflops"]))


def test_offline_resource_report():
    """scripts/resources.py compiles the kernel for sm_90 without a GPU and reads registers and spills."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parent.parent / "scripts" / "resources.py"),
                           "--dtype", "fp16", "--head-dims", "16", "--config", "64x32w4s2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[-1].split()
    assert row[:4] == ["16", "64x32", "w4", "s2"], done.stdout
    reg, stack, shared = (int(x) for x in row[4:7])
    assert 0 < reg <= 255 and stack >= 0 and shared > 0, done.stdout
