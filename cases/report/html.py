"""The HTML report of a verify run (`flashcheck verify ... --html report.html`): one self-contained file.

No external CSS, script or font, and the images inline as base64 PNG: the file is mailed, attached to a CI
run or opened from an artifact store, where nothing beside it survives. It holds the header (target,
backend, declarations, capabilities), the summary line with a count per status, the legend, the table of
every case, and for every failing case its failure text, its repro line and the error maps that
cases/oracle/diagnose.py drew in the worker: err/tol over the (row, column) plane, on a log colour scale
that turns red at 1, so that where the error sits (a partial last block, the causal diagonal, every second
key block, the keys past Nq) shows at a glance.

The plots use matplotlib's Agg canvas directly (no pyplot): no global backend is switched in the caller's
process, which may be a notebook with a backend of its own.
"""
import base64
import io
import math
import time
from html import escape

import numpy as np

from flashcheck import __version__
from flashcheck.cases import report

VMIN = 1e-3              # err/tol below this shows as the palest colour (a correct kernel's cells are ~1e-2)
VCAP = 1e6               # the colour scale's top at most: past a million tolerances the size no longer matters
NONFINITE = "#e000e0"    # magenta: a cell whose finiteness is wrong (NaN, inf, an unwritten poison NaN)
DROPPED = "#111111"      # black: a key the row sees that the kernel gave no weight at all
DIAGONAL = "#00897b"     # the causal diagonal
MAX_EDGES = 128          # block edges per axis past which they would hide the map; then not drawn
MAX_DRAWN = 50           # failing cases whose maps are drawn (~0.5 s each); the others keep their text


def missing():
    """Why the HTML report cannot be written here (matplotlib is not installed), or None."""
    try:
        import matplotlib  # noqa: F401   (lazy here and below: matplotlib is the optional extra flashcheck[plot])
    except ImportError:
        return "--html needs matplotlib: pip install 'flashcheck[plot]' (or pip install matplotlib)"
    return None


def write(run, path, partial=False):
    """Write the report of `run` to `path` (atomically: a reader never sees half a file)."""
    data = render(run, partial).encode("utf-8")
    report.atomic_write(path, lambda f: f.write(data))


def render(run, partial=False):
    """The report as one HTML string."""
    failing = [(n, r) for n, r in enumerate(run.results) if r.status == "fail"]
    parts = [_HEAD.format(title=escape(f"flashcheck verify {run.target}"), css=_CSS),
             f"<header><h1>flashcheck verify <code>{escape(run.target)}</code></h1>"]
    if partial or run.stopped:
        why = run.stopped or "the run did not finish"
        parts.append(f'<p class="partial">{"partial run: " if partial else "stopped early: "}{escape(why)}; '
                     f"the results below are the cases judged before it ended</p>")
    parts.append('<dl class="meta">')
    for term, text in (("backend", run.describe),
                       ("declared", " ".join(run.declared) or "nothing (the kernel's defaults)"),
                       ("capabilities", report.capabilities_line(run).removeprefix("capabilities: ")),
                       ("written", f"{time.strftime('%Y-%m-%d %H:%M:%S')} by flashcheck {__version__}")):
        parts.append(f"<dt>{escape(term)}</dt><dd>{escape(text)}</dd>")
    parts.append("</dl>")
    parts.append(f'<p class="summary">{escape(report.summary(run))}</p><p class="counts">')
    for status in report.ORDER:
        n = run.count(status)
        parts.append(f'<span class="badge {_cls(status)}{"" if n else " zero"}">{n} {escape(status)}</span>')
    parts.append("</p>")
    lines = (report.reduced_lines(run) + report.kinds_line(run) + report.outcome_lines(run) + list(run.notes))
    if lines:
        parts.append('<ul class="notes">' + "".join(f"<li>{escape(x)}</li>" for x in lines) + "</ul>")
    parts.append("</header>")
    parts.append(_legend())
    parts.append(_table(run))
    if failing:
        parts.append(f'<h2 id="failures">Failures ({len(failing)})</h2>')
        parts.append(_MAPS_KEY)
        for shown, (n, r) in enumerate(failing):
            parts.append(_section(n, r, draw=shown < MAX_DRAWN))
    parts.append("</body></html>\n")
    return "".join(parts)


def _cls(status):
    return "st-" + status.replace(" ", "-")


def _legend():
    rows = "".join(f'<dt><span class="badge {_cls(s)}">{escape(s)}</span></dt><dd>{escape(report.LEGEND[s])}</dd>'
                   for s in report.ORDER)
    return f'<details class="legend" open><summary>Statuses</summary><dl>{rows}</dl></details>'


def _table(run):
    """The text report's table (report._row), a row per case; the peak extra memory when it was measured (GPU)."""
    peaks = any(r.verdict is not None and r.verdict.peak_bytes is not None for r in run.results)
    reason = "first bad element / reason"
    head = ("case", "verdict", "err/tol", "failure") + (("peak extra",) if peaks else ()) + (reason,)
    out = [f'<table id="cases"><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead><tbody>']
    for n, r in enumerate(run.results):
        name, status, err, kind, element = (str(x) for x in report._row(r))
        peak = ""
        if peaks:
            v = r.verdict
            mib = "-" if v is None or v.peak_bytes is None else f"{v.peak_bytes / 2 ** 20:.1f} MiB"
            peak = f'<td class="num">{mib}</td>'
        if r.status == "fail":
            name_cell = f'<a href="#case-{n}">{escape(name)}</a>'
        else:
            name_cell = escape(name)
        origin = "" if r.origin == "catalogue" else f' <span class="origin">{escape(r.origin)}</span>'
        out.append(f'<tr class="{_cls(r.status)}"><td class="name">{name_cell}{origin}</td>'
                   f'<td><span class="badge {_cls(r.status)}">{escape(status)}</span></td>'
                   f'<td class="num">{escape(err)}</td><td>{escape(kind)}</td>{peak}'
                   f'<td class="why">{escape(element)}</td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def _section(n, result, draw=True):
    v = result.verdict
    repro = v.repro()
    text = v.report().splitlines()
    if text and text[-1].strip() == f"repro: {repro}":
        text = text[:-1]       # shown on its own line below, ready to copy
    out = [f'<section class="failure" id="case-{n}"><h3><span class="badge st-fail">FAIL</span> '
           f"{escape(result.case.name)} <small>{escape(str(v.kind))}</small></h3>",
           f'<pre class="report">{escape(chr(10).join(text))}</pre>',
           f'<p class="repro"><span>repro</span><code>{escape(repro)}</code></p>']
    out.append(_maps(v.maps, v) if draw else
               f'<p class="note">maps are drawn for the first {MAX_DRAWN} failing cases only</p>')
    out.append('<p class="back"><a href="#cases">back to the table</a></p></section>')
    return "".join(out)


def _maps(maps, verdict):
    if not maps:
        why = ("the worker stopped before it could draw them" if str(verdict.kind) in ("timeout", "device fault",
                                                                                         "crash") else
               "none came back with this verdict")
        return f'<p class="note">no error maps: {escape(why)}</p>'
    out = []
    if "Nq" in maps:
        out.append(f'<p class="shape">{escape(_shape_line(maps))}</p>')
    if "error" in maps:
        out.append(f'<p class="note">no error maps: {escape(maps["error"])}</p>')
        return "".join(out)
    figures = []
    for key, title in (("out", "output: |got - expected| / tol"), ("weights", "attention weights: |P - P_ref| / tol")):
        m = maps.get(key)
        if m is None:
            continue
        if "skipped" in m:
            figures.append(f'<figure class="skipped"><figcaption><b>{escape(title)}</b>: not drawn: '
                           f"{escape(m['skipped'])}</figcaption></figure>")
            continue
        try:
            png = _png(m, maps, key, title)
        except Exception as exc:  # noqa: BLE001  (one odd map must not cost the whole report)
            figures.append(f'<figure class="skipped"><figcaption>{escape(title)}: could not be drawn: '
                           f"{escape(f'{type(exc).__name__}: {exc}')}</figcaption></figure>")
            continue
        figures.append(f'<figure><img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" '
                       f'alt="{escape(title)}"><figcaption>{escape(_caption(m, maps, key))}</figcaption></figure>')
    out.append('<div class="maps">' + "".join(figures) + "</div>")
    m = maps.get("out") or {}
    if m.get("max", 0) <= 1 and not m.get("nonfinite", 1):
        out.append(f'<p class="note">On a fresh call the output is within tolerance everywhere: this failure '
                   f"({escape(str(verdict.kind))}) comes from another check than the reference comparison, or the "
                   "kernel does not give the same answer twice.</p>")
    return "".join(out)


def _shape_line(maps):
    causal = f"causal ({maps['align']})" if maps["causal"] else "not causal"
    bm, bn = maps.get("block_m"), maps.get("block_n")
    tiles = (f"tiles {bm or '?'} x {bn or '?'} (BLOCK_M x BLOCK_N)" if bm or bn
             else "tile sizes unknown (neither pinned by the case nor a default flashcheck knows): no tile edges")
    return f"Nq={maps['Nq']}, Nk={maps['Nk']}, D={maps['D']}, {maps['dtype']}, {causal}; {tiles}"


def _caption(m, maps, key):
    worst = "non-finite cells" if m["nonfinite"] else f"max {m['max']:.3g} at (row {m['at'][0]}, col {m['at'][1]})"
    cells = m["shape"][0] * m["shape"][1]
    heads = maps.get("B", 1) * maps.get("H", 1)
    text = f"b={m['b']} h={m['h']}" + (f" (the worst of {heads} heads)" if heads > 1 else "")
    text += f"; {worst}; {m['over']} of {cells} cells over 1"
    if m["nonfinite"]:
        text += f", {m['nonfinite']} non-finite (magenta)"
    if m.get("dropped_count"):
        text += f", {m['dropped_count']} with weight 0 where the row sees the key (black)"
    if m["pool"] != (1, 1):
        text += f"; each pixel the max of {m['pool'][0]} x {m['pool'][1]} cells"
    if key == "weights":
        text += f"; {m['calls']} probe call(s); tolerance {'exact' if m['tol'] == 'exact' else 'bounded per row'}"
    return text


def _cmap(vmax):
    """Pale blues below err/tol = 1 (within tolerance), yellow to dark red above: the break sits at 1 on the
    log scale whatever the range, so red always means out of tolerance."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    n = 256
    low = max(1, min(n - 1, round(n * math.log(1 / VMIN) / math.log(vmax / VMIN))))
    colours = np.vstack([colormaps["Blues"](np.linspace(0.03, 0.4, low)),
                         colormaps["YlOrRd"](np.linspace(0.3, 0.9, n - low))])
    return ListedColormap(colours).with_extremes(bad=NONFINITE)


def _png(m, maps, key, title):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ratio = np.asarray(m["ratio"], dtype=np.float64)
    rows, cols = m["shape"]
    fr, fc = m["pool"]
    finite = ratio[np.isfinite(ratio)]
    highest = float(finite.max()) if finite.size else 1.0
    vmax = min(VCAP, 10.0 ** max(1, math.ceil(math.log10(max(highest, 1e-300)))))
    data = np.ma.masked_invalid(np.maximum(ratio, VMIN))     # NaN stays NaN: the cmap's "bad" colour
    # the weights map is as wide as the keys need; a map of a row or two needs little height
    width = 4.2 if key == "out" else 4.2 + 2.0 * min(1.0, cols / max(rows, 1) / 2)
    height = 2.4 if rows <= 4 else 3.6
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    # fixed margins in inches (labels, title, colour bar): a layout engine measures every text several times and
    # would take most of the drawing time
    left, right, bottom, top, bar_w, gap = 0.62, 0.78, 0.48, 0.3, 0.14, 0.12
    ax = fig.add_axes((left / width, bottom / height, 1 - (left + right + bar_w + gap) / width,
                       1 - (bottom + top) / height))
    cax = fig.add_axes((1 - (right + bar_w) / width, bottom / height, bar_w / width, 1 - (bottom + top) / height))
    im = ax.imshow(data, cmap=_cmap(vmax), norm=LogNorm(VMIN, vmax), aspect="auto", interpolation="nearest",
                   extent=(0, ratio.shape[1] * fc, ratio.shape[0] * fr, 0))
    dropped = m.get("dropped")
    if dropped is not None and np.any(dropped):
        from matplotlib.colors import ListedColormap

        ax.imshow(np.ma.masked_where(~np.asarray(dropped, dtype=bool), np.ones(dropped.shape)),
                  cmap=ListedColormap([DROPPED]), vmin=0, vmax=1, aspect="auto", interpolation="nearest",
                  extent=(0, dropped.shape[1] * fc, dropped.shape[0] * fr, 0))
    bm, bn = maps.get("block_m"), maps.get("block_n")
    col_block = bn if key == "weights" else None
    xmax = _padded(cols, col_block)
    ymax = _padded(rows, bm)
    ax.set_xlim(0, xmax)
    ax.set_ylim(ymax, 0)
    # the part of the last tile past Nq (Nk): drawn hatched, so that a partial last block is seen as one
    if xmax > cols:
        ax.axvspan(cols, xmax, facecolor="#eeeeee", hatch="//", edgecolor="#aaaaaa", linewidth=0)
    if ymax > rows:
        ax.axhspan(rows, ymax, facecolor="#eeeeee", hatch="//", edgecolor="#aaaaaa", linewidth=0)
    # tile edges as one collection: an artist per line makes the layout pass 3x slower
    edges = []
    if bm and math.ceil(rows / bm) <= MAX_EDGES:
        edges += [((0, y), (xmax, y)) for y in range(bm, ymax, bm)]
    if col_block and math.ceil(cols / col_block) <= MAX_EDGES:
        edges += [((x, 0), (x, ymax)) for x in range(col_block, xmax, col_block)]
    if edges:
        ax.add_collection(LineCollection(edges, colors="#444444", linewidths=0.6, linestyles=(0, (3, 3)), alpha=0.7),
                          autolim=False)
    ax.axvline(cols, color="black", linewidth=1.2)
    ax.axhline(rows, color="black", linewidth=1.2)
    if key == "weights" and maps.get("causal"):
        # query i sees key j iff j <= i + shift: the boundary runs through each row's centre half a key past
        # its last visible key (bottom-right: shift = Nk - Nq; top-left: 0)
        shift = maps["Nk"] - maps["Nq"] if maps.get("align") == "bottom-right" else 0
        ys = np.array([0.0, float(rows)])
        ax.plot(ys + shift + 0.5, ys, color=DIAGONAL, linewidth=1.6, label="causal diagonal")
    if not m["nonfinite"] and m["max"] > 1:
        r, c = m["at"]
        for colour, width in (("black", 2.6), ("white", 1.0)):      # seen on any colour, black included
            ax.plot(c + 0.5, r + 0.5, marker="o", markersize=9, markerfacecolor="none", markeredgecolor=colour,
                    markeredgewidth=width)
    ax.set_title(f"{title}  (b={m['b']}, h={m['h']})", fontsize=9.5)
    ax.set_xlabel("key column j" if key == "weights" else "head-dim column d", fontsize=9)
    ax.set_ylabel("query row i", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    bar = fig.colorbar(im, cax=cax, extend="both" if highest > vmax else "min")
    bar.minorticks_off()          # a log bar has dozens: they cost a third of the drawing and say little
    # decades as plain text ("1e4", not mathtext's 10^4: parsing it is most of what is left of the drawing time)
    decades = range(round(math.log10(VMIN)), round(math.log10(vmax)) + 1)
    step = 1 if len(decades) <= 7 else 2
    bar.set_ticks([10.0 ** e for e in decades if e % step == 0])
    bar.set_ticklabels([_decade(e) for e in decades if e % step == 0])
    bar.set_label("err / tol (log)", fontsize=8.5)
    bar.ax.tick_params(labelsize=7.5)
    bar.ax.axhline(1.0, color="black", linewidth=1.2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _decade(e):
    return f"{10.0 ** e:g}" if -2 <= e <= 3 else f"1e{e}"


def _padded(n, block):
    """n rounded up to a multiple of the block (n itself when the block is unknown)."""
    return math.ceil(n / block) * block if block else n


_HEAD = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
         '<meta name="viewport" content="width=device-width, initial-scale=1">'
         "<title>{title}</title><style>{css}</style></head><body>")

_MAPS_KEY = ('<p class="key">Each map is err/tol of one (batch, head), the worst: pale blue is within tolerance, '
             "yellow to dark red is out of it (the colour bar's black line is 1); "
             f'<span style="color:{NONFINITE}">magenta</span>: a non-finite cell (NaN, inf, never written); black, '
             "in the weights map: a key the row sees that got no weight at all (dropped by a loop bound, a mask, a "
             "skipped block). Solid black lines: Nq and Nk (hatched: the rest of the last tile); dashed: tile edges, "
             f'when known; <span style="color:{DIAGONAL}">green</span>: the causal diagonal; a circle: the worst '
             "cell. The weights are the ones the kernel used, recovered by calling it with V one-hot over D keys at a "
             "time (the output is then P itself): a bug in how V is read shows there too.</p>")

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1d232b;
 margin:0 auto;padding:16px 24px 48px;max-width:1320px;background:#fff}
code,pre{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,"Liberation Mono",monospace;font-size:12.5px}
h1{font-size:21px;margin:4px 0 10px}h1 code{font-size:19px}h2{font-size:18px;margin:28px 0 8px}
h3{font-size:15px;margin:0 0 8px}h3 small{font-weight:normal;color:#666;margin-left:6px}
header{border-bottom:1px solid #dde2e8;padding-bottom:8px}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0 0 8px;font-size:13px}
dl.meta dt{color:#667;font-weight:600}dl.meta dd{margin:0}
.summary{font-weight:600;margin:8px 0 6px}
.partial{background:#fff3cd;border:1px solid #e0b000;padding:6px 10px;font-weight:700;border-radius:4px}
.badge{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600;margin-right:4px;
 border:1px solid transparent;white-space:nowrap}
.badge.zero{opacity:.35}
.st-pass .badge,.badge.st-pass{background:#dff3e4;color:#14632c;border-color:#9bd3aa}
.st-fail .badge,.badge.st-fail{background:#fbe0e0;color:#9b1111;border-color:#ef9a9a}
.badge.st-inconclusive{background:#fff1cc;color:#7a5600;border-color:#e8c760}
.badge.st-unsupported{background:#e3ecf7;color:#27466e;border-color:#a9c1e0}
.badge.st-out-of-memory{background:#efe3f6;color:#5c2a7a;border-color:#c9a4de}
.badge.st-skip{background:#eceff2;color:#4a525c;border-color:#c9d0d7}
ul.notes{margin:6px 0;padding-left:20px;font-size:13px;color:#444}
details.legend{margin:10px 0;font-size:13px}details.legend summary{cursor:pointer;font-weight:600}
details.legend dl{display:grid;grid-template-columns:max-content 1fr;gap:3px 10px;margin:6px 0 0}
details.legend dd{margin:0;color:#333}
table{border-collapse:collapse;width:100%;font-size:13px;margin-top:10px}
th{text-align:left;background:#f3f5f8;border-bottom:2px solid #d5dbe2;padding:4px 8px;position:sticky;top:0}
td{border-bottom:1px solid #eceff3;padding:3px 8px;vertical-align:top}
td.name{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.why{color:#333;word-break:break-word}
tr.st-fail td{background:#fff7f7}tr.st-skip td{color:#6a737d}
.origin{font-family:system-ui,sans-serif;font-size:11px;color:#777;border:1px solid #ccc;border-radius:3px;
 padding:0 3px}
a{color:#0b57b5;text-decoration:none}a:hover{text-decoration:underline}
section.failure{border:1px solid #e6c3c3;border-left:4px solid #c62828;border-radius:4px;padding:10px 14px;
 margin:14px 0}
pre.report{background:#fafbfc;border:1px solid #eceff3;padding:8px;margin:0 0 6px;white-space:pre-wrap;
 word-break:break-word}
p.repro{margin:4px 0 8px;display:flex;gap:8px;align-items:baseline}
p.repro span{font-size:12px;font-weight:700;color:#666;text-transform:uppercase}
p.repro code{background:#f3f5f8;padding:3px 6px;border-radius:3px;user-select:all;word-break:break-all}
p.shape{margin:4px 0;font-size:13px;color:#333}
.maps{display:flex;flex-wrap:wrap;gap:12px}
figure{margin:0;width:min-content}figure img{display:block;border:1px solid #eceff3}
figcaption{font-size:12px;color:#444;margin-top:3px}
figure.skipped{max-width:420px;padding:10px;border:1px dashed #ccc;align-self:flex-start}
.note{color:#6a4a00;font-size:13px}.key{font-size:13px;color:#333;max-width:1100px}
.back{font-size:12px;margin:6px 0 0}
"""
