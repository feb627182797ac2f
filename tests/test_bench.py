"""flashcheck bench: the FLOP formula, the shape suites (features: GQA, a window, a softcap; packed: varlen and a paged
cache, their bytes and bandwidth), the spot-check and the peers' conventions, the writers (on synthetic results;
--show of the committed runs), the sweep's launcher, and the command end to end on four tiny shapes (--smoke)."""
import argparse
import csv
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashcheck.cases import bench, cli
from flashcheck.cases.backend import backend

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
    # "all" is the committed runs' suites: features and packed are asked for by name
    assert len(everything) == 48 + 8 + 6 and not {"features", "packed"} & {s.suite for s in everything}
    assert [s.suite for s in everything] == sorted((s.suite for s in everything), key=bench.SUITES.index)
    only_bf16 = bench.select_shapes(("all",), ("bf16",))
    assert {s.dtype for s in only_bf16} == {"bf16"} and {s.suite for s in only_bf16} == {"paper", "decode"}
    assert {s.suite for s in bench.select_shapes(("decode",))} == {"decode"}
    assert bench.select_shapes(("fp32",), ("bf16", "fp16")) == []
    features = bench.select_shapes(("features",))
    assert features == bench.feature_shapes() and len(features) == 36
    both = bench.select_shapes(("all", "features"))
    assert both == everything + features
    assert bench.select_shapes(("features",), ("fp32",)) == []
    assert len(bench.select_shapes(("features",), quick=True)) == 28
    assert _args("--suite", "features").suite == ["features"]
    packed = bench.select_shapes(("packed",))
    assert packed == bench.packed_shapes() and len(packed) == 4 + 2
    assert bench.select_shapes(("all", "packed")) == everything + packed
    assert bench.select_shapes(("packed",), ("fp16",)) == [s for s in packed if s.dtype == "fp16"]
    assert bench.select_shapes(("packed",), ("fp32",)) == []
    assert len(bench.select_shapes(("packed",), quick=True)) == 2 + 2   # varlen bf16 only, both page sizes
    assert _args("--suite", "packed").suite == ["packed"]
    with pytest.raises(SystemExit):
        _args("--suite", "gqa")


def test_feature_suite_shapes_flops_bytes_and_labels():
    shapes = bench.feature_shapes()
    assert {s.dtype for s in shapes} == {"bf16", "fp16"} and all(s.suite == "features" for s in shapes)
    assert all(s.B * s.Nq == 16384 and s.Nq == s.Nk and s.D == 128 for s in shapes)
    gqa = [s for s in shapes if s.Hkv != s.H]
    assert {(s.H, s.Hkv, s.Nq, s.causal) for s in gqa} == {(32, hkv, n, c) for hkv in (4, 8)
                                                          for n in (1024, 4096, 16384) for c in (False, True)}
    assert all(s.window is None and s.softcap is None for s in gqa)
    window = [s for s in shapes if s.window]
    assert {(s.Nq, s.window, s.causal, s.H, s.Hkv) for s in window} == {(n, (1024, 0), True, 16, 16)
                                                                         for n in (4096, 16384)}
    softcap = [s for s in shapes if s.softcap]
    assert {(s.Nq, s.causal, s.softcap) for s in softcap} == {(n, c, 50.0) for n in (4096, 16384)
                                                              for c in (False, True)}
    assert len(gqa) + len(window) + len(softcap) == len(shapes) == 36
    assert all(s.contenders == ("kernel", *bench.SDPA_PEERS, "flex") for s in shapes)  # flex joins SDPA on each
    assert all("flex" not in s.contenders for s in bench.select_shapes())

    g = next(s for s in gqa if (s.Hkv, s.Nq, s.causal, s.dtype) == (4, 4096, True, "bf16"))
    assert g.label() == "features bf16 B=4 H=32 N=4096 D=128 causal gqa 8:1"
    # FLOPs count the query heads; bytes read K and V of Hkv heads: 2 B * D * (2*Hq*N + 2*Hkv*N)
    assert g.flops == 4 * 4 * 32 * 4096 * 4096 * 128 // 2
    assert g.bytes == 2 * 4 * 128 * (2 * 32 * 4096 + 2 * 4 * 4096)
    w = next(s for s in window if (s.Nq, s.dtype) == (4096, "fp16"))
    assert w.label() == "features fp16 B=4 H=16 N=4096 D=128 causal window 1024,0"
    # row i sees keys max(0, i - 1024) .. i: i + 1 of them for the first 1024 rows, 1025 after
    pairs = sum(min(i, 1024) + 1 for i in range(4096))
    assert pairs == 1024 * 1025 // 2 + (4096 - 1024) * 1025
    assert w.flops == 4 * 4 * 16 * 128 * pairs and w.bytes == 2 * 4 * 16 * 128 * 4 * 4096
    c = next(s for s in softcap if (s.Nq, s.causal, s.dtype) == (16384, False, "bf16"))
    assert c.label() == "features bf16 B=1 H=16 N=16384 D=128 softcap 50"
    assert c.flops == 4 * 16 * 16384 * 16384 * 128  # the tanh is not counted
    # a window of unbounded sides is no window; a window counts exactly what it lets through, bottom-right aligned
    assert bench.Shape("x", "fp32", 1, 1, 8, 8, 16, False, window=(None, None)) == bench.Shape("x", "fp32", 1, 1, 8,
                                                                                                8, 16, False)
    cross = bench.Shape("x", "fp32", 1, 1, 4, 8, 16, False, window=(1, 1))   # row i sees keys i+3 .. i+5, clipped
    assert cross.flops == 4 * 16 * (3 + 3 + 3 + 2) and cross.band() == (3, 5)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        bench.Shape("x", "bf16", 1, 6, 8, 8, 16, False, Hkv=4)


def test_packed_suite_shapes_flops_bytes_and_labels():
    """varlen: mixed lengths, 16k tokens, H*D = 2048; paged decode: B = 32 caches of 1k..32k keys, GQA 4:1, pages of
    16 and 256. FLOPs and bytes are summed over the sequences (the padded dense peer's padding is not counted)."""
    shapes = bench.packed_shapes()
    varlen = [s for s in shapes if s.page_size is None]
    paged = [s for s in shapes if s.page_size is not None]
    assert {(s.dtype, s.causal) for s in varlen} == {(d, c) for d in ("bf16", "fp16") for c in (False, True)}
    lengths = bench.PACKED_LENGTHS
    assert sum(lengths) == 16384 and all(128 <= n <= 4096 for n in lengths) and len(set(lengths)) == len(lengths)
    for s in varlen:
        assert (s.suite, s.lengths, s.H, s.Hkv, s.D, s.H * s.D) == ("packed", lengths, 16, 16, 128, 2048)
        # B sequences, padded to the longest: the dense peer's shape
        assert (s.B, s.Nq, s.Nk) == (len(lengths), max(lengths), max(lengths))
        assert s.contenders == ("kernel", "flex", "dense") and s.features == "varlen"
        assert s.flops == sum(4 * 16 * n * n * 128 // (2 if s.causal else 1) for n in lengths)
        assert s.bytes == 2 * 128 * 4 * 16 * 16384   # Q, K, V and O of every token
    v = next(s for s in varlen if (s.dtype, s.causal) == ("bf16", True))
    assert v.label() == "packed bf16 B=10 H=16 N=178..4096 (16384 tokens) D=128 causal varlen"
    assert v.scores == 16 * sum(n * n for n in lengths)
    assert {s.page_size for s in paged} == {16, 256}
    caches = bench.PAGED_LENGTHS
    assert len(caches) == 32 and all(1024 <= n <= 32768 for n in caches)
    for s in paged:
        assert (s.dtype, s.B, s.H, s.Hkv, s.Nq, s.Nk, s.D, s.causal) == ("bf16", 32, 32, 8, 1, max(caches), 128,
                                                                          False)
        assert s.contenders == ("kernel", "dense") and s.features == f"paged {s.page_size} gqa 4:1"
        assert s.flops == sum(4 * 32 * 1 * n * 128 for n in caches)
        # K and V of every cached key read once (Hkv heads), q read and out written (Hq heads, Nq rows), bf16
        assert s.bytes == sum(caches) * 8 * 128 * 2 * 2 + 2 * 32 * 32 * 1 * 128 * 2
    # the references: float64 sequence by sequence fits the paged rows (32 heads x 421,760 keys), not the varlen ones
    # (flex_attention checks them on the GPU)
    assert all(s.scores <= bench.FLOAT64_MAX_SCORES for s in paged) and v.scores > bench.FLOAT64_MAX_SCORES
    p = next(s for s in paged if s.page_size == 16)
    assert p.label() == f"packed bf16 B=32 H=32 Nq=1 Nk=1426..32162 ({sum(caches)} keys) D=128 paged 16 gqa 4:1"
    assert [s.dtype for s in bench.packed_shapes(quick=True)] == ["bf16"] * 4
    # one spelling per problem; B, Nq, Nk are the sequences' count and the longest lengths
    assert bench.varlen_shape("x", "fp32", 2, 16, [5, 0, 17], True) == bench.Shape("x", "fp32", 3, 2, 17, 17, 16, True,
                                                                                   lengths=(5, 0, 17))
    with pytest.raises(ValueError, match="longest lengths"):
        bench.Shape("x", "fp32", 3, 2, 16, 16, 16, False, lengths=(5, 0, 17))
    with pytest.raises(ValueError, match="longest lengths"):
        bench.Shape("x", "fp32", 2, 2, 1, 17, 16, False, lengths=(5, 0, 17), page_size=7)
    with pytest.raises(ValueError, match="no window or softcap"):
        bench.Shape("x", "fp32", 1, 2, 5, 5, 16, False, lengths=(5,), softcap=1.0)
    with pytest.raises(ValueError, match="needs the cache lengths"):
        bench.Shape("x", "fp32", 1, 2, 1, 5, 16, False, page_size=7)
    with pytest.raises(ValueError, match="page size >= 1"):
        bench.paged_shape("x", "fp32", 2, 2, 1, 16, (5,), 0)


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
    for peer in shape.contenders[1:]:
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


def test_table_summary_and_records_of_feature_rows(tmp_path, capsys):
    """flex and the features column appear only where a features row is; records keep the features, and --show
    reads them back."""
    f = {s.label(): s for s in bench.feature_shapes()}
    gqa = f["features bf16 B=1 H=32 N=16384 D=128 gqa 8:1"]
    cap = f["features bf16 B=1 H=16 N=16384 D=128 softcap 50"]
    rows = _synthetic_rows()[:1] + [
        _row(gqa, 1.0, {"flash": 2.0, "cudnn": 1.0, "flex": 1.5}),
        _row(cap, 1.0, {"flex": 3.0}),
    ]
    assert bench.contenders_of(rows) == [c for c in bench.CONTENDERS if c != "dense"]   # dense: packed rows only
    lines = bench.format_table(rows).splitlines()
    assert lines[1].split()[8:10] == ["features", "kernel"] and "k/flex" in lines[1]
    paper = lines[2].split()
    assert (paper[8], paper[13], paper[17]) == ("-", "-", "-")  # no features, no flex cell, no k/flex
    assert lines[3].split()[8:10] == ["gqa", "8:1"] and lines[3].split()[-6] == "1.50"
    assert lines[4].split()[8:10] == ["softcap", "50"] and lines[4].split()[-6] == "3.00"
    summary = bench.summarize(rows)
    by_features = {e["features"]: e for e in summary}
    assert by_features["softcap 50"]["kernel/flex"] == pytest.approx(3.0)
    assert by_features["softcap 50"]["kernel/flash"] is None and "kernel/flex" not in by_features[""]
    assert "features" in bench.format_summary(summary).splitlines()[1]
    records = [bench.row_record(r) for r in rows]
    assert "flex_status" not in records[0] and records[1]["flex_status"] == "ok"
    assert (records[1]["Hkv"], records[2]["softcap"], records[0]["Hkv"], records[0]["window_left"]) == (4, 50.0, 32, None)
    assert [bench.row_from_record(r).shape for r in records] == [r.shape for r in rows]
    columns = bench.csv_columns(bench.contenders_of(rows))
    bench.write_csv(tmp_path / "f.csv", {}, columns, records)
    _, got = _read_csv(tmp_path / "f.csv")
    assert (got[0]["flex_status"], got[1]["Hkv"], got[2]["softcap"], got[0]["window_left"]) == ("", "4", "50", "")
    assert bench.csv_columns(["kernel", "flash"])[-11:-9] == ["flash_note", "kernel/flash"]
    bench.write_json(tmp_path / "f.json", {"meta": {"tool": "flashcheck bench", "options": "--suite features",
                                                     "gpu": "test", "torch": "-", "triton": "-", "date": "-"},
                                            "results": records})
    assert bench.run(_args("--show", str(tmp_path / "f.json"))) == 0
    assert capsys.readouterr().out.splitlines()[1:len(lines) + 1] == lines


def test_table_summary_and_records_of_packed_rows(tmp_path, capsys):
    """Packed rows: the dense and flex columns, and where a paged row is, the kernel's GB/s and its fraction of the
    H200's HBM peak, n/a off an H200; lengths and page size go to the records and back (--show)."""
    assert bench.peak_hbm_gbps("NVIDIA H200") == bench.peak_hbm_gbps("NVIDIA H200 NVL") == 4800.0
    for other in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "", None):
        assert bench.peak_hbm_gbps(other) is None, other
    varlen = next(s for s in bench.packed_shapes() if s.features == "varlen" and s.causal)
    paged = next(s for s in bench.packed_shapes() if s.page_size == 256)
    elsewhere = _row(paged, 0.5, {"dense": 1.0})
    on_h200 = _row(paged, 0.5, {"dense": 1.0})
    on_h200.peak_gbps = bench.H200_HBM_GBPS
    rows = [_row(varlen, 2.0, {"flex": 3.0, "dense": 4.0}), on_h200, elsewhere]
    gbps = paged.bytes / 0.5e-3 / 1e9
    assert on_h200.gbps("kernel") == pytest.approx(gbps) and on_h200.hbm_fraction() == pytest.approx(gbps / 4800)
    assert elsewhere.hbm_fraction() is None and rows[0].ratio("dense") == pytest.approx(2.0)
    assert bench.contenders_of(rows) == ["kernel", "flex", "dense"]
    lines = bench.format_table(rows).splitlines()
    assert "packed sequences: summed over the sequences" in lines[0] and lines[1].startswith("GB/s: ")
    assert lines[2].split()[8:11] == ["features", "kernel", "flex"] and "GB/s  of HBM peak" in lines[2]
    assert lines[3].split()[8] == "varlen" and lines[3].split()[-7:-5] == [format(varlen.bytes / 2e-3 / 1e9, ".4g"),
                                                                           "n/a"]   # GB/s of every row, no peak
    assert lines[4].split()[8:12] == ["paged", "256", "gqa", "4:1"]
    assert lines[4].split()[-7:-5] == [format(gbps, ".4g"), format(gbps / 4800, ".2f")]
    assert lines[5].split()[-7:-5] == [format(gbps, ".4g"), "n/a"]   # not an H200
    v, p = bench.summarize(rows)
    assert (v["features"], v["kernel/flex"], v["kernel/dense"]) == ("varlen", pytest.approx(1.5), pytest.approx(2.0))
    assert (p["features"], p["shapes"], p["kernel/dense"]) == ("paged 256 gqa 4:1", 2, pytest.approx(2.0))
    records = [bench.row_record(r) for r in rows]
    assert (records[0]["lengths"], records[0]["page_size"]) == (" ".join(map(str, bench.PACKED_LENGTHS)), None)
    assert "flash_status" not in records[0] and "flex_status" not in records[1] and records[1]["dense_status"] == "ok"
    assert records[1]["hbm_peak_gbps"] == 4800.0 and records[1]["kernel_hbm_fraction"] == pytest.approx(gbps / 4800)
    assert records[2]["hbm_peak_gbps"] is None and records[2]["kernel_hbm_fraction"] is None
    back = [bench.row_from_record(r) for r in records]
    assert [r.shape for r in back] == [r.shape for r in rows] and [r.peak_gbps for r in back] == [None, 4800.0, None]
    bench.write_csv(tmp_path / "p.csv", {}, bench.csv_columns(bench.contenders_of(rows)), records)
    _, got = _read_csv(tmp_path / "p.csv")
    assert (got[1]["lengths"], got[1]["page_size"], got[1]["Hkv"], got[0]["page_size"]) == \
        (" ".join(map(str, bench.PAGED_LENGTHS)), "256", "8", "")
    assert (got[1]["hbm_peak_gbps"], got[2]["kernel_hbm_fraction"], got[0]["flex_status"]) == ("4800", "", "ok")
    bench.write_json(tmp_path / "p.json", {"meta": {"tool": "flashcheck bench", "options": "--suite packed",
                                                     "gpu": "test", "torch": "-", "triton": "-", "date": "-"},
                                            "results": records})
    assert bench.run(_args("--show", str(tmp_path / "p.json"))) == 0
    assert capsys.readouterr().out.splitlines()[1:len(lines) + 1] == lines


@pytest.mark.parametrize("run", ["", "tf32x3", "quick-8cfa8af", "fp32-1de7b74"])
def test_show_reads_the_committed_runs_as_they_were(run, capsys):
    """Records written before the features suite (no Hkv, window, softcap or flex columns) read back into the same
    table: --show of each committed run prints its table.txt."""
    folder = ROOT / "docs" / "bench" / "h200" / run
    assert bench.run(_args("--show", str(folder / "bench.json"))) == 0
    assert capsys.readouterr().out == (folder / "table.txt").read_text()


@pytest.mark.skipif(backend() == "gpu", reason="CPU only: eager flex_attention and the fused kernel on CPU tensors "
                    "(on the GPU, test_smoke_end_to_end checks the feature row against compiled flex_attention)")
def test_peer_calls_compute_the_protocols_function():
    """The bench's SDPA call (enable_gqa, the window as a boolean mask) and its flex_attention call (block mask,
    softcap score_mod, enable_gqa; eager here) against the float64 reference, on the CPU; and a kernel that drops
    a feature is WRONG against it."""
    import dataclasses
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    rt = bench.Runtime(on_gpu=False, warmup=1, rep=1)
    assert rt.flex is None and "GPU" in rt.flex_note
    rt.flex = flex_attention
    full = bench.Shape("smoke", "fp32", 1, 4, 40, 40, 16, True, Hkv=2, window=(7, 0), softcap=1.0)
    cross = bench.Shape("smoke", "fp32", 1, 4, 24, 40, 16, False, Hkv=1, window=(5, 3))
    for shape in (full, dataclasses.replace(full, softcap=None), dataclasses.replace(full, window=None), cross):
        calls = bench.Calls(rt, shape)
        ref = calls.float64()()
        assert ref.dtype == torch.float64
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # eager flex_attention warns that it is not compiled
            assert bench.judge(calls.flex()(), ref, "fp32")[0] == "ok", shape.label()
        if shape.softcap is None:
            with rt.sdpa_kernel([rt.backend_enum("math")]):
                assert bench.judge(calls.sdpa()(), ref, "fp32")[0] == "ok", shape.label()
        else:
            with pytest.raises(bench.NotApplicable, match="SDPA has no softcap"):
                calls.sdpa()
    calls = bench.Calls(rt, full)
    ref = calls.float64()()
    assert bench.judge(calls.kernel()(), ref, "fp32")[0] == "ok"
    for dropped in ({"window": None}, {"softcap": None}):   # the same inputs (seed), one feature ignored
        assert bench.judge(bench.Calls(rt, dataclasses.replace(full, **dropped)).kernel()(), ref, "fp32")[0] == \
            "WRONG", dropped
    calls.k, calls.v = calls.k.flip(1), calls.v.flip(1)   # each query head reads the other group's kv head
    assert bench.judge(calls.kernel()(), ref, "fp32")[0] == "WRONG"


@pytest.mark.skipif(backend() == "gpu", reason="CPU only: eager flex_attention and the kernel on CPU tensors (on the "
                    "GPU, the packed suite checks the kernel against compiled flex_attention and the dense kernel)")
def test_packed_calls_compute_the_protocols_function():
    """The packed rows' calls on the CPU: the varlen and paged kernels, flex_attention with the document mask (eager
    here) and the fused dense kernel run sequence by sequence all agree with the float64 reference computed sequence
    by sequence; the padded dense peer computes another function (the padding keys are not masked); the paged pool
    is shuffled, and a kernel that read it in order would be WRONG."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    rt = bench.Runtime(on_gpu=False, warmup=1, rep=1)
    assert rt.peak_gbps is None   # not an H200: the fraction of the HBM peak is n/a
    rt.flex = flex_attention
    for causal in (True, False):
        calls = bench.calls_for(rt, bench.varlen_shape("smoke", "fp32", 2, 16, (5, 0, 17, 40), causal))
        assert isinstance(calls, bench.PackedCalls) and calls.references() == ("float64", "flex")
        assert calls.cu_seqlens.tolist() == [0, 5, 5, 22, 62] and tuple(calls.q.shape) == (62, 2, 16)
        ref = calls.float64()()
        assert ref.dtype == torch.float64 and tuple(ref.shape) == (62, 2, 16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # eager flex_attention warns that it is not compiled
            assert bench.judge(calls.flex()(), ref, "fp32")[0] == "ok", causal
        assert bench.judge(calls.kernel()(), ref, "fp32")[0] == "ok", causal
        assert bench.judge(calls.dense_per_sequence()(), ref, "fp32")[0] == "ok", causal
        padded = calls.dense()()   # (B, H, 40, D): the rows of sequence b are its first lengths[b] queries
        assert tuple(padded.shape) == (4, 2, 40, 16)
        rows = torch.cat([padded[b, :, :n].transpose(0, 1) for b, n in enumerate((5, 0, 17, 40))])
        # causal: the padding keys lie after every real query, hidden; not causal, the short sequences see them
        assert bench.judge(rows, ref, "fp32")[0] == ("ok" if causal else "WRONG"), causal
    shape = bench.paged_shape("smoke", "fp32", 4, 2, 3, 16, (5, 0, 17, 40), 7)
    calls = bench.calls_for(rt, shape)
    assert calls.references() == ("float64", bench.PER_SEQUENCE) and "flex" not in shape.contenders
    assert [len(p) for p in calls.page_lists] == [1, 0, 3, 6] and tuple(calls.k.shape) == (10, 7, 2, 16)
    used = sorted(p for pages in calls.page_lists for p in pages)
    assert used == list(range(10)) and [p for pages in calls.page_lists for p in pages] != used   # shuffled
    ref = calls.float64()()
    assert tuple(ref.shape) == (4, 4, 3, 16) and ref[1].abs().max() == 0   # no keys: rows of 0
    assert bench.judge(calls.kernel()(), ref, "fp32")[0] == "ok"
    assert bench.judge(calls.dense_per_sequence()(), ref, "fp32")[0] == "ok"
    assert tuple(calls.dense()().shape) == (4, 4, 3, 16)
    with pytest.raises(bench.NotApplicable, match="not a peer of the paged rows"):
        calls.flex_inputs()
    in_order = torch.zeros_like(calls.block_table)
    for b, pages in enumerate(calls.page_lists):
        in_order[b, :len(pages)] = torch.arange(len(pages)) + sum(map(len, calls.page_lists[:b]))
    calls.block_table = in_order
    assert bench.judge(calls.kernel()(), ref, "fp32")[0] == "WRONG"


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
    assert "k/flash" in out.out and "k/flex" in out.out and "k/dense" in out.out and "[1/4] smoke fp32" in out.err
    assert "[2/4] smoke fp32 B=1 H=4 N=64 D=16 causal gqa 2:1 window 24,0 softcap 1" in out.err
    assert "[3/4] smoke fp32 B=4 H=2 N=0..40 (62 tokens) D=16 causal varlen" in out.err
    assert "[4/4] smoke fp32 B=4 H=4 Nq=1 Nk=0..40 (62 keys) D=16 paged 7 gqa 2:1" in out.err
    meta, (row, featured, varlen, paged) = _read_csv(tmp_path / "smoke.csv")
    assert {"torch", "triton", "date", "timer", "kernel_source"} <= set(meta)
    assert meta["kernel_source"].startswith("fused.py sha256 "), meta["kernel_source"]
    assert ("gpu" in meta) != ("device" in meta)
    for r in (row, featured, varlen, paged):
        assert (r["kernel_status"], r["check"]) == ("ok", "ok")
        assert float(r["kernel_tflops"]) > 0 and float(r["max_abs_diff"]) <= 1e-3 * float(r["ref_max_abs"])
    for r in (row, featured):
        assert r["cudnn_status"] == "n/a", r["cudnn_note"]  # cuDNN has no fp32 attention (and no CPU one)
    assert all(row[f"{c}_status"] in ("ok", "n/a", "error") for c in bench.SDPA_PEERS) and row["flex_status"] == ""
    # the features row: no SDPA softcaps; flex_attention computes it on the GPU (and checks it there), and is not
    # compiled on the CPU, where the float64 reference checks it
    assert (featured["Hkv"], featured["window_left"], featured["window_right"], featured["softcap"]) == \
        ("2", "24", "0", "1")
    on_gpu = backend() == "gpu"
    assert featured["ref_backend"] == ("flex" if on_gpu else "float64"), featured
    assert all(featured[f"{c}_status"] == "n/a" for c in bench.SDPA_PEERS), featured
    assert featured["flex_status"] == ("ok" if on_gpu else "n/a"), featured
    assert featured["flash_note"] == "SDPA has no softcap"
    assert int(featured["flops"]) == 4 * 4 * 16 * sum(min(i, 24) + 1 for i in range(64))
    # the packed rows: the varlen and paged kernels against the float64 reference, sequence by sequence; the
    # padded dense kernel timed beside them (flex_attention too for varlen, on the GPU); no SDPA
    for r in (varlen, paged):
        assert (r["lengths"], r["ref_backend"], r["dense_status"], r["flash_status"]) == ("5 0 17 40", "float64",
                                                                                          "ok", ""), r
    assert (varlen["page_size"], varlen["flex_status"], paged["page_size"], paged["flex_status"]) == \
        ("", "ok" if on_gpu else "n/a", "7", "")
    assert int(varlen["flops"]) == sum(4 * 2 * n * n * 16 // 2 for n in (5, 0, 17, 40))
    assert int(paged["flops"]) == 4 * 4 * 62 * 16 and int(paged["bytes"]) == 4 * 16 * (2 * 4 * 4 + 2 * 2 * 62)
    # the fraction of the HBM peak: n/a off an H200 (the table), empty in the CSV
    h200 = "H200" in meta.get("gpu", "")
    assert (paged["hbm_peak_gbps"] != "", paged["kernel_hbm_fraction"] != "") == (h200, h200), paged
    header, *body = [re.split(r" {2,}", line.strip()) for line in out.out.splitlines()[2:7]]
    cells = dict(zip(header, body[3]))
    assert cells["features"] == "paged 7 gqa 2:1" and float(cells["GB/s"]) > 0
    assert (cells["of HBM peak"] == "n/a") != h200, cells
    doc = _strict_json(tmp_path / "smoke.json")
    assert doc["meta"]["torch"] == torch.__version__ and len(doc["results"]) == 4
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
    for shape in bench.smoke_shapes():   # the features shape's candidates run with its features, packed ones packed
        mine = [r for r in records if (r["H"], r["Hkv"], r["Nq"], r["page_size"]) ==
                (str(shape.H), str(shape.Hkv), str(shape.Nq), str(shape.page_size or ""))]
        assert len(mine) in (len(candidates), len(candidates) + 1)
        assert sum(r["is_default"] == "True" for r in mine) == 1
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
