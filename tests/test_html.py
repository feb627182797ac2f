"""The HTML report (`flashcheck verify ... --html`) and the error maps behind it (cases/oracle/diagnose.py).

The structure test runs verify on the buggy example as a user does and reads the file back with html.parser:
one self-contained file, a row per case, a section per failure with its repro line and a PNG that decodes.
The maps are tested on kernels whose error sits somewhere known (every second key block, the last partial key
block, NaN rows): the weights map must light up there and nowhere else. The browser test (opt-in,
FLASHCHECK_BROWSER=1) renders the report in headless Chromium and checks the screenshot is not blank.
"""
import base64
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

from flashcheck.cases import oracle, report
from flashcheck.cases.case import Case
from flashcheck.cases.oracle import diagnose
from flashcheck.cases.report import html
from flashcheck.kernel import fused

ROOT = Path(__file__).resolve().parents[1]
BUGGY = "examples/buggy_attention.py:attention"
SELECTION = "hand_one_query_two_keys,causal_square,cross_nq_lt_nk"
PNG = b"\x89PNG\r\n\x1a\n"
CHROMIUM = "/usr/bin/chromium"
# --strict-markers refuses a marker pyproject does not list: the browser test carries its marker once pyproject
# registers it, and is opt-in through FLASHCHECK_BROWSER=1 either way
_REGISTERED = '"browser:' in (ROOT / "pyproject.toml").read_text()
browser = pytest.mark.browser if _REGISTERED else (lambda f: f)

# ---------------------------------------------------------------------------------------------------------------
# the structure of a real report


class Page(HTMLParser):
    """What the tests look at in a report: every tag's attributes, the case table's rows, the failure sections
    (their images and repro lines) and the summary line."""

    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.sections = [], [], {}
        self.summary = ""
        self._stack, self._section, self._cell, self._row = [], None, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        self._stack.append((tag, a))
        cls = a.get("class") or ""
        if tag == "section" and "failure" in cls:
            self._section = self.sections.setdefault(a["id"], {"imgs": [], "repro": "", "text": ""})
        if tag == "tr" and self._inside("tbody"):
            self._row = {"cells": [], "href": None}
            self.rows.append(self._row)
        if tag == "td" and self._row is not None:
            self._row["cells"].append("")
        if tag == "a" and self._row is not None:
            self._row["href"] = a.get("href")
        if tag == "img" and self._section is not None:
            self._section["imgs"].append(a.get("src", ""))

    def handle_endtag(self, tag):
        while self._stack:
            t, _ = self._stack.pop()
            if t == tag:
                break
        if tag == "section":
            self._section = None
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._row is not None and self._row["cells"]:
            self._row["cells"][-1] += data
        if self._section is not None:
            self._section["text"] += data
            if self._inside("code", within="p", cls="repro"):
                self._section["repro"] += data
        if self._inside("p", cls="summary"):
            self.summary += data

    def _inside(self, tag, within=None, cls=None):
        names = [t for t, _ in self._stack]
        if tag not in names:
            return False
        if within is None:
            return cls is None or any(t == tag and cls in (a.get("class") or "") for t, a in self._stack)
        return any(t == within and cls in (a.get("class") or "") for t, a in self._stack)


@pytest.fixture(scope="module")
def buggy_report(tmp_path_factory):
    """verify on the buggy example with --html (and --json, for the list of cases to compare with)."""
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("html")
    json_dir = tmp_path_factory.mktemp("json")
    proc = subprocess.run([sys.executable, "-m", "flashcheck", "verify", BUGGY, "--only", SELECTION, "--examples", "0",
                           "--html", str(out / "report.html"), "--json", str(json_dir / "r.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return {"dir": out, "path": out / "report.html", "stdout": proc.stdout,
            "json": json.loads((json_dir / "r.json").read_text())}


def test_report_is_one_self_contained_file(buggy_report):
    assert [p.name for p in buggy_report["dir"].iterdir()] == ["report.html"]
    text = buggy_report["path"].read_text(encoding="utf-8")
    page = Page()
    page.feed(text)
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe", "object", "embed"), (tag, attrs)
        if "src" in attrs:
            assert attrs["src"].startswith("data:image/png;base64,"), (tag, attrs["src"][:80])
        if "href" in attrs:
            assert attrs["href"].startswith("#"), (tag, attrs["href"])   # anchors within the page only
    lowered = text.lower()
    assert "@import" not in lowered and "url(" not in lowered and "http://" not in lowered \
        and "https://" not in lowered


def test_report_has_summary_table_sections_and_images(buggy_report):
    page = Page()
    page.feed(buggy_report["path"].read_text(encoding="utf-8"))
    summary = buggy_report["stdout"].strip().splitlines()[-1]
    assert summary.startswith("verify ") and page.summary.strip() == summary
    cases = buggy_report["json"]["cases"]
    assert [r["cells"][0].split()[0] for r in page.rows] == [c["name"] for c in cases]
    assert [r["cells"][1].strip() for r in page.rows] == [c["status"].upper() for c in cases]
    failing = [(r, c) for r, c in zip(page.rows, cases) if c["status"] == "fail"]
    passing = [c for c in cases if c["status"] == "pass"]
    assert failing and passing, "the selection must give both a passing and a failing case"
    assert len(page.sections) == len(failing)
    for row, case in failing:
        assert row["href"] and row["href"][1:] in page.sections, row
        section = page.sections[row["href"][1:]]
        assert case["name"] in section["text"]
        assert section["repro"].strip() == case["repro"]
        assert len(section["imgs"]) == 2, f"{case['name']}: the output map and the weights map"
        for src in section["imgs"]:
            data = base64.b64decode(src.split(",", 1)[1], validate=True)
            assert data.startswith(PNG)
            from PIL import Image

            with Image.open(io.BytesIO(data)) as im:
                im.verify()
    for row in page.rows:
        if row["cells"][1].strip() != "FAIL":
            assert row["href"] is None


def test_missing_names_the_extra(monkeypatch):
    if html.missing() is None:
        monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib now raises ImportError
    message = html.missing()
    assert message and "matplotlib" in message and "flashcheck[plot]" in message


def _run(maps, target="k<script>alert(1)</script>", stopped=""):
    case = Case("odd<name>&co", Nq=20, Nk=53, seed=7)
    failing = oracle.Verdict(case, target, [oracle.Failure("mismatch", "1 element(s) out of tolerance",
                                                             where=(0, 0, 1, 2), got=1.0, expected=2.0, tol=1e-6)])
    failing.maps = maps
    passing = oracle.Verdict(Case("fine", seed=1), target, ratio=0.1, tol=1e-6, peak_bytes=3 << 20)
    run = report.Run(target, "CPU (test)", oracle.Capabilities(), declared=["--no-causal"], stopped=stopped)
    run.results = [report.Result.of(passing.case, passing, "catalogue"),
                   report.Result.of(case, failing, "hypothesis"),
                   report.Result(Case("skipped"), "skip", reason="GPU only: <why>", skip_group="GPU only")]
    return run


@pytest.mark.parametrize("maps, words", [
    (None, "no error maps: none came back"),
    ({"error": "the diagnostic call of the kernel failed: <boom>"}, "no error maps: the diagnostic call"),
    ({"B": 1, "H": 1, "Nq": 20, "Nk": 53, "D": 16, "dtype": "fp32", "causal": False, "align": "bottom-right",
      "block_m": None, "block_n": None, "max": 5.0,
      "out": {"b": 0, "h": 0, "ratio": np.full((20, 16), 5.0, np.float32), "pool": (1, 1), "shape": (20, 16),
              "max": 5.0, "at": (1, 2), "over": 320, "nonfinite": 0},
      "weights": {"skipped": "more than 64 <calls>"}}, "not drawn: more than 64 &lt;calls&gt;"),
])
def test_render_escapes_and_degrades(maps, words):
    pytest.importorskip("matplotlib")
    text = html.render(_run(maps, stopped="interrupted"), partial=True)
    assert "<script>" not in text and "&lt;script&gt;" in text and "odd&lt;name&gt;&amp;co" in text
    assert "partial run: interrupted" in text
    assert "<th>peak extra</th>" in text and "3.0 MiB" in text, "the GPU's memory column, as in the text table"
    assert words in text
    assert text.count('<section class="failure"') == 1


def test_write_is_readable_by_others(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "r.html"
    html.write(_run(None), str(path))
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


@browser
@pytest.mark.skipif(os.environ.get("FLASHCHECK_BROWSER") != "1",
                    reason="opt-in: FLASHCHECK_BROWSER=1 renders the report in headless Chromium")
def test_report_renders_in_chromium(buggy_report, tmp_path):
    if not shutil.which(CHROMIUM):
        pytest.fail(f"FLASHCHECK_BROWSER=1 but there is no {CHROMIUM} (apt-get install chromium)")
    from PIL import Image

    shot = tmp_path / "shot.png"
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                           "--window-size=1400,2400", buggy_report["path"].as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.exists(), proc.stderr[-2000:]
    assert shot.read_bytes().startswith(PNG)
    with Image.open(shot) as im:
        rgb = np.asarray(im.convert("RGB")).astype(int)
    assert rgb.shape[:2] == (2400, 1400)
    colours = np.unique(rgb.reshape(-1, 3)[::7], axis=0)
    assert len(colours) > 50, "a blank (or nearly blank) page"
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    red = (r > 150) & (g < 90) & (b < 90)
    assert red.sum() > 5000, "the failing cases' maps (red: out of tolerance) are not on the page"


# ---------------------------------------------------------------------------------------------------------------
# the maps, on kernels whose error sits somewhere known

CASE = Case("maps", B=1, H=2, Nq=24, Nk=64, D=16, seed=3)
BLOCK = 16


def doubled_odd_key_blocks(q, k, v, *, causal=False, scale=None):
    """The fused kernel with V's rows of every second key block doubled: a V tile read with the wrong scale
    (or the wrong pointer) on odd iterations. Only in head 1, so the maps must pick the worst head."""
    v = v.clone()
    for start in range(BLOCK, v.shape[2], 2 * BLOCK):
        v[:, 1, start:start + BLOCK] *= 2
    return fused.attention(q, k, v, causal=causal, scale=scale)


def dropped_last_partial_block(q, k, v, *, causal=False, scale=None):
    """Keys past the last whole block of 16 get no weight: a loop bound that forgets the partial block
    (not causal: with fewer keys the bottom-right diagonal would move too)."""
    Nk = k.shape[2]
    keep = Nk // BLOCK * BLOCK
    return fused.attention(q, k[:, :, :keep], v[:, :, :keep], causal=causal, scale=scale)


def nan_rows(q, k, v, *, causal=False, scale=None):
    out = fused.attention(q, k, v, causal=causal, scale=scale)
    out[:, :, 16:] = float("nan")
    return out


def _maps(kernel, case=CASE, conventions=oracle.Conventions()):
    return diagnose.error_maps(kernel, case, oracle.Capabilities.of(kernel), conventions)


def _blocks(columns, size=BLOCK):
    return [list(range(s, min(s + size, columns))) for s in range(0, columns, size)]


def test_weights_map_localises_every_second_key_block():
    maps = _maps(doubled_odd_key_blocks)
    assert "error" not in maps, maps
    w = maps["weights"]
    assert (w["b"], w["h"], maps["b"], maps["h"]) == (0, 1, 0, 1), "the worst head is the corrupted one"
    assert w["tol"] == "exact" and w["calls"] == 4 and w["pool"] == (1, 1) and w["shape"] == (24, 64)
    ratio = w["ratio"]
    odd = [j for n, cols in enumerate(_blocks(64)) if n % 2 for j in cols]
    even = [j for n, cols in enumerate(_blocks(64)) if not n % 2 for j in cols]
    assert ratio[:, odd].min() > 100, "every weight of an odd key block is off by a factor 2"
    assert ratio[:, even].max() <= 1, "the even key blocks are right"
    assert w["nonfinite"] == 0 and w["dropped_count"] == 0
    assert maps["out"]["max"] > 100 and maps["max"] == max(maps["out"]["max"], w["max"])
    assert (maps["Nq"], maps["Nk"], maps["D"], maps["causal"], maps["align"]) == (24, 64, 16, False, "bottom-right")
    assert (maps["block_m"], maps["block_n"]) == (None, None), "a foreign kernel's tiles are unknown"
    assert len(pickle.dumps(maps)) < 64 << 10


def test_dropped_keys_and_nan_rows_are_marked_apart():
    w = _maps(dropped_last_partial_block, CASE.replace(Nk=53))["weights"]
    dropped = np.zeros((24, 53), dtype=bool)
    dropped[:, 48:] = True
    assert (w["dropped"] == dropped).all() and w["dropped_count"] == dropped.sum()
    assert w["ratio"][:, :48].min() > 1, "the others share the dropped keys' weight"
    maps = _maps(nan_rows)
    for m in (maps["out"], maps["weights"]):
        nan = np.isnan(m["ratio"])
        assert nan[16:].all() and not nan[:16].any() and m["max"] == float("inf")
        assert m["nonfinite"] == nan.sum()


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_correct_kernel_stays_within_both_weight_tolerances(monkeypatch, dtype):
    """The exact tolerance and the per-row bound used past EXACT_WORK must both hold for a correct kernel (the
    bound is sound), and the bound must still see a corrupted key block."""
    case = CASE.replace(Nq=37, Nk=70, causal=True, dtype=dtype, block_m=16, block_n=32)
    caps = oracle.Capabilities.of(fused.attention)
    exact = diagnose.error_maps(fused.attention, case, caps, oracle.Conventions())
    assert (exact["block_m"], exact["block_n"]) == (16, 32), "the case's pins, which the fused kernel takes"
    monkeypatch.setattr(diagnose, "EXACT_WORK", 0)
    bound = diagnose.error_maps(fused.attention, case, caps, oracle.Conventions())
    assert exact["weights"]["tol"] == "exact" and bound["weights"]["tol"] == "row bound"
    for m in (exact["out"], exact["weights"], bound["weights"]):
        assert 0 <= m["max"] <= 1 and m["over"] == 0 and m["nonfinite"] == 0
    # the bound is the row's, not the weight's: the smallest of the doubled weights can hide under it
    ratio = _maps(doubled_odd_key_blocks, CASE.replace(dtype=dtype))["weights"]["ratio"]
    assert np.median(ratio[:, 16:32]) > 1 and ratio[:, 0:16].max() <= 1


def flush_to_zero(q, k, v, *, causal=False, scale=None):
    """The fused kernel as the GPU runs it: fp32 subnormals flushed to 0 (exp2.approx, -ftz)."""
    out = fused.attention(q, k, v, causal=causal, scale=scale)
    return out.masked_fill(out.abs() < torch.finfo(torch.float32).smallest_normal, 0.0)


def test_weights_flushed_to_zero_are_within_tolerance():
    """On an H200 the fp32 cases with large scores showed weights maps of 16 to 2.7e3 for the correct kernel:
    their weights below fp32's smallest normal came out as 0. The same flush here must stay within tolerance."""
    from flashcheck.cases import catalogue

    for name in ("many_key_chunks_growing_max", "large_scores", "negative_scale_large_scores"):
        case = catalogue.BY_NAME[name].instances(("fp32",))[0]
        maps = _maps(flush_to_zero, case)
        assert maps["weights"]["max"] <= 1 and maps["out"]["max"] <= 1, (name, maps["weights"]["max"])


def test_maps_never_raise_and_say_why():
    def raises(q, k, v, *, causal=False, scale=None):
        raise RuntimeError("no <kernel> today")

    maps = _maps(raises)
    assert "diagnostic call" in maps["error"] and "no <kernel> today" in maps["error"]
    assert "huge case" in _maps(fused.attention, CASE.replace(sample_heads=2))["error"]
    assert "error" in diagnose.error_maps(None, CASE, None, oracle.Conventions())
    wide = _maps(fused.attention, CASE.replace(Nk=65 * 2, D=2))["weights"]
    assert "skipped" in wide and "65 calls" in wide["skipped"]


def test_pool_keeps_the_max_and_the_nan():
    a = np.random.default_rng(0).random((1000, 700))
    a[999, 699] = 50.0
    a[3, 600] = np.nan
    pooled, (fr, fc) = diagnose._pool(a)
    assert pooled.shape == (500, 350) and (fr, fc) == (2, 2) and pooled.dtype == np.float32
    assert pooled[499, 349] == 50.0 and np.isnan(pooled[1, 300]) and np.isnan(pooled).sum() == 1
    assert np.nanmax(pooled) == 50.0
    assert diagnose._pool(np.full((3, 3), 1e44))[0].max() < np.inf, "float32 keeps huge ratios finite"
