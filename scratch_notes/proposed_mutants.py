"""The proposed mutants of the protocol-v3 features (scratch_notes/proposed_mutants.md), checked on the CPU
interpreter: each find-text occurs exactly once in the kernel; on the mutant's own small shape the real kernel
passes the oracle's per-element tolerance and the mutant fails it (or raises); and the first spec of
tests/test_kernel_features.py (fp32 then fp16) whose comparison the mutant fails, i.e. the test that kills it.

    python scratch_notes/proposed_mutants.py [--jobs 2] [NAME ...]      # a table, JSON lines with --json
    python scratch_notes/proposed_mutants.py --markdown OUT.md           # and the markdown (and OUT.json)

Each mutant runs in a process of its own (a mutant that reads out of bounds cannot take the others down); on
its own shape q, k and v sit at the start of NaN-filled buffers twice their size (a stray read shows as NaN).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from flashcheck.cases.corpus.mutants import Mutant  # noqa: E402

_SOFTCAP_BLOCK = ("            if SOFTCAP:\n"
                  "                # c tanh(s / c) of the scaled score, BEFORE the masks (a capped -inf would be a "
                  "finite -c) and\n"
                  "                # before the bias. Proposed mutant: softcap_after_mask\n"
                  "                qk = _softcap(qk, softcap)\n")
_MASK_LINE = '                qk = tl.where(valid, qk, float("-inf"))\n'


def M(name, module, find, replace_, breaks, edits=()):
    return Mutant(name, module, find, replace_, breaks, "proposed (protocol v3 features)", (), edits=edits)


# (feature, mutant, its shape: a spec of tests/test_kernel_features.py by name, or a Spec; dtype)
PROPOSED = [
    # --- GQA ---------------------------------------------------------------------------------------------
    ("gqa", M("gqa_interleaved_map", "fused", "off_hkv = off_h // KV_GROUP", "off_hkv = off_h % (H // KV_GROUP)",
              "query head h reads kv head h % Hkv (the interleaved map) instead of h // (Hq // Hkv): right only "
              "for MQA (Hkv = 1) and Hq == Hkv"), "gqa_6_2", "fp32"),
    ("gqa", M("gqa_group_inverted", "fused", "KV_GROUP=H // Hkv,", "KV_GROUP=max(1, Hkv // H),",
              "the group size computed as Hkv // Hq (clamped to 1): every query head reads the kv head of its own "
              "index, past Hkv into the next batch's heads (or past the tensor)"), "gqa_6_2", "fp32"),
    ("gqa", M("gqa_v_reads_query_head", "fused",
              "v_base = V + off_b.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh",
              "v_base = V + off_b.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh",
              "the head map applied to K but not to V: V is read at the query head's index (the pointer path; "
              "descriptor loads take their own coordinates)"),
     "mqa", "fp32"),
    ("gqa", M("gqa_group_from_batch", "fused", "KV_GROUP=H // Hkv,", "KV_GROUP=H // k.shape[0],",
              "the group size from k's batch dim (shape[0]) instead of its head dim: right only where B == Hkv"),
     "gqa_8_2_causal_nq_gt_nk", "fp32"),
    # --- Dv ----------------------------------------------------------------------------------------------
    ("dv", M("dv_load_mask_head_dim", "fused",
             "v = _load_kv(v_ptrs, desc_v, off_b, off_hkv, start_n, kv_rows, 0, BLOCK_N, BLOCK_DV, HEAD_DIM_V, MASKED,",
             "v = _load_kv(v_ptrs, desc_v, off_b, off_hkv, start_n, kv_rows, 0, BLOCK_N, BLOCK_DV, HEAD_DIM, MASKED,",
             "V's load masked with Q/K's head dim D: with Dv > D the columns past D load as 0"),
     "dv_gt_d_not_pow2", "fp32"),
    ("dv", M("dv_block_from_d", "fused", "BLOCK_DV=head_dim_block(Dv) // (2 if d_split else 1)",
             "BLOCK_DV=head_dim_block(D) // (2 if d_split else 1)",
             "V's and the output's block sized by D: with Dv > the padded D the columns past it are never "
             "computed nor stored"), "dv_gt_d_causal", "fp32"),
    ("dv", M("dv_descriptor_shape_from_d", "fused", "TensorDescriptor(v, [B, Hkv, Nk, Dv]",
             "TensorDescriptor(v, [B, Hkv, Nk, D]",
             "V's tensor descriptor declares K's head dim: with Dv > D, TMA zero-fills V's columns past D"),
     None, "fp16"),
    ("dv", M("dv_split_partial_row_stride", "fused", "tl.store(Out + row[:, None] * HEAD_DIM_V + offs_dv[None, :]",
             "tl.store(Out + row[:, None] * HEAD_DIM + offs_dv[None, :]",
             "split-KV partial outputs stored with rows of D columns while the combine reads rows of Dv"),
     "split_kv_decode", "fp32"),
    # --- window ------------------------------------------------------------------------------------------
    ("window", M("window_left_off_by_one", "fused", ">= offs_m[:, None] + left_shift)",
                 "> offs_m[:, None] + left_shift)",
                 "the window's left side exclusive: each row loses its leftmost key"),
     "window_crossing_blocks", "fp32"),
    ("window", M("window_right_off_by_one", "fused", "right_shift = causal_shift + window_right\n",
                 "right_shift = causal_shift + window_right + 1\n",
                 "the window's right side counted one too far: each row sees one key past it"),
     "window_crossing_blocks", "fp16"),
    ("window", M("window_left_top_left", "fused", "left_shift = causal_shift - window_left",
                 "left_shift = -window_left",
                 "the window's left side counted from the top-left diagonal (j >= i - left) while the causal side "
                 "is bottom-right: wrong keys whenever Nq != Nk"), "window_causal_overrides_right", "fp32"),
    ("window", M("window_lead_block_unmasked", "fused",
                 "full_lo = tl.minimum((tl.maximum(start_m + BLOCK_M - 1 + left_shift, 0) + BLOCK_N - 1) // BLOCK_N "
                 "* BLOCK_N,",
                 "full_lo = tl.minimum(tl.maximum(start_m + BLOCK_M - 1 + left_shift, 0) // BLOCK_N * BLOCK_N,",
                 "the first fully-seen block rounded down: the block holding the last row's first key runs on the "
                 "unmasked fast path, so that row sees keys left of its window"),
     "window_left_many_key_blocks", "fp32"),
    ("window", M("window_lo_skips_partial_block", "fused", "lo = tl.maximum(start_m + left_shift, 0) // BLOCK_N * BLOCK_N",
                 "lo = (tl.maximum(start_m + left_shift, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N",
                 "the first visited block rounded up: the partial block at the first row's left edge is skipped"),
     "window_crossing_blocks", "fp32"),
    # --- softcap -----------------------------------------------------------------------------------------
    ("softcap", M("softcap_textbook_tanh", "fused",
                  "e = tl.math.exp2(-2.8853900817779268 * tl.abs(x))", "e = tl.math.exp2(2.8853900817779268 * x)",
                  "tanh as (e^2x - 1) / (e^2x + 1): inf / inf = NaN once |s / c| passes ~44",
                  edits=(("t = (1.0 - e) / (1.0 + e)", "t = (e - 1.0) / (e + 1.0)"),
                         ("return cap * tl.where(x < 0, -t, t)", "return cap * t"))),
     "softcap_tanh_region", "fp32"),
    ("softcap", M("softcap_ratio_times_tanh", "fused", "return cap * tl.where(x < 0, -t, t)",
                  "return x * tl.where(x < 0, -t, t)", "the capped score as (s / c) tanh(s / c)"),
     "softcap_negative_scale", "fp32"),
    ("softcap", M("softcap_after_mask", "fused", _SOFTCAP_BLOCK, "",
                  "the softcap applied after the masks (and the bias): a masked -inf becomes -c, so keys past Nk "
                  "and outside the causal/window mask get weight",
                  edits=((_MASK_LINE, _MASK_LINE + "            if SOFTCAP:\n                qk = _softcap(qk, softcap)\n"),)),
     "softcap_causal", "fp16"),
    ("softcap", M("softcap_natural_units", "fused", "softcap_log2 = None if softcap is None else softcap * LOG2E",
                  "softcap_log2 = softcap",
                  "the cap passed in natural units into the log2-domain loop: scores capped at c ln 2"),
     "softcap_negative_scale", "fp16"),
    # --- ALiBi -------------------------------------------------------------------------------------------
    ("alibi", M("alibi_sign", "fused", "qk = qk - alibi * tl.abs(", "qk = qk + alibi * tl.abs(",
                "the bias added with the wrong sign: far keys weigh more"), "alibi_heads", "fp32"),
    ("alibi", M("alibi_top_left", "fused",
                "tl.abs(offs_m[:, None] + causal_shift - (start_n + offs_n)[None, :])",
                "tl.abs(offs_m[:, None] - (start_n + offs_n)[None, :])",
                "the distance counted from the top-left diagonal |i - j|: wrong whenever Nq != Nk"),
     "alibi_gqa_nq_lt_nk", "fp32"),
    ("alibi", M("alibi_no_abs", "fused",
                "tl.abs(offs_m[:, None] + causal_shift - (start_n + offs_n)[None, :]).to(tl.float32)",
                "(offs_m[:, None] + causal_shift - (start_n + offs_n)[None, :]).to(tl.float32)",
                "the signed distance i + Nk - Nq - j (right for causal rows only): keys right of the diagonal get "
                "a bonus"), "alibi_heads", "fp16"),
    ("alibi", M("alibi_batch_slopes_ignored", "fused",
                "alibi = tl.load(Alibi + off_b.to(tl.int64) * stride_az + off_h.to(tl.int64) * stride_ah)",
                "alibi = tl.load(Alibi + off_h.to(tl.int64) * stride_ah)",
                "the slope read by head only: right for (Hq,) slopes, wrong for (B, Hq)"),
     "alibi_batch_heads_causal", "fp32"),
    ("alibi", M("alibi_natural_units", "fused", "* stride_ah) * 1.4426950408889634", "* stride_ah)",
                "the slope used in natural units in the log2-domain loop (missing log2 e)"), "alibi_heads", "fp32"),
    # --- the unfused baseline ----------------------------------------------------------------------------
    ("gqa", M("unfused_gqa_v_reads_query_head", "unfused",
              "v_base = V + off_b.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh",
              "v_base = V + off_b.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh",
              "unfused P.V reads V at the query head's index"), "gqa_6_2", "fp32"),
    ("window", M("unfused_window_left_off_by_one", "unfused",
                 "offs_n[None, :] >= offs_m[:, None] + (Nk - Nq) - window_left",
                 "offs_n[None, :] > offs_m[:, None] + (Nk - Nq) - window_left",
                 "unfused window's left side exclusive"), "window_crossing_blocks", "fp32"),
    ("softcap", M("unfused_softcap_textbook_tanh", "unfused", "e = tl.exp(-2.0 * tl.abs(x))", "e = tl.exp(2.0 * x)",
                  "unfused tanh as (e^2x - 1) / (e^2x + 1)",
                  edits=(("t = (1.0 - e) / (1.0 + e)", "t = (e - 1.0) / (e + 1.0)"),
                         ("s = softcap * tl.where(x < 0, -t, t)", "s = softcap * t"))),
     "softcap_tanh_region", "fp16"),
    ("alibi", M("unfused_alibi_top_left", "unfused", "tl.abs(offs_m[:, None] + (Nk - Nq) - offs_n[None, :])",
                "tl.abs(offs_m[:, None] - offs_n[None, :])", "unfused ALiBi distance counted top-left"),
     "alibi_gqa_nq_lt_nk", "fp32"),
]
BY_NAME = {m.name: (feature, m, shape, dtype) for feature, m, shape, dtype in PROPOSED}


def _spec(shape):
    import test_kernel_features as T

    if shape is None:   # dv_descriptor_shape_from_d: fp16 K, V in aligned layouts (descriptors), Dv > D
        return T.Spec(B=2, Hq=4, Hkv=2, Nq=19, Nk=33, D=16, Dv=32, block_m=8, block_n=8)
    return T.SPECS.get(shape) or T.FP32_SPECS[shape]


def _guarded(t):
    """t at the start of a NaN-filled buffer twice its size along B (a read past the tensor's end shows as NaN)."""
    import torch

    buf = torch.full((2 * t.shape[0],) + tuple(t.shape[1:]), float("nan"), dtype=t.dtype)
    buf[:t.shape[0]] = t
    return buf[:t.shape[0]]


def judge(attention, spec, dtype, guarded=False):
    """None if attention passes the oracle's comparison (out and lse) on the spec, else why it does not."""
    import torch

    import test_kernel_features as T
    from flashcheck.cases.oracle import compare, tolerance

    q, k, v, out, kwargs, pb = T.make_call(spec, dtype, "cpu")
    if guarded:
        q, k, v = _guarded(q), _guarded(k), _guarded(v)
    try:
        got, lse = attention(q, k, v, out=out, return_lse=True, block_m=spec.block_m, block_n=spec.block_n,
                             **kwargs)
    except Exception as exc:  # noqa: BLE001  (a mutant that raises is caught too)
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    e = tolerance.expectation(dtype, q, k, v, problem=pb, half_scores=False)
    fail, worst = compare(got.double().numpy(), e.out, e.tol)
    if fail is not None:
        return f"out {fail.line()}"
    fail, worst = compare(lse.double().numpy()[..., None], e.lse[..., None], e.tol_lse[..., None])
    if fail is not None:
        return f"lse {fail.line()}"
    return None


def one(name):
    """The record of one mutant (run in a process of its own)."""
    import warnings

    import torch

    import test_kernel_features as T
    from flashcheck.cases.corpus import mutants
    from flashcheck.kernel import fused, unfused

    warnings.simplefilter("ignore")
    feature, m, shape, dtype_name = BY_NAME[name]
    dtypes = {"fp32": torch.float32, "fp16": torch.float16}
    mutants.source(m)                                   # raises MutantDrift unless each find occurs exactly once
    real = {"fused": fused, "unfused": unfused}[m.module].attention
    mutant = mutants.kernel(m)
    spec = _spec(shape)
    t0 = time.perf_counter()
    real_verdict = judge(real, spec, dtypes[dtype_name], guarded=True)
    mutant_verdict = judge(mutant, spec, dtypes[dtype_name], guarded=True)
    killer = None
    for d in ("fp32", "fp16"):
        for spec_name in sorted(T.SPECS) + (sorted(T.FP32_SPECS) if d == "fp32" else []):
            why = judge(mutant, _spec(spec_name), dtypes[d])
            if why is not None:
                killer = (f"test_feature_against_reference[{m.module}-{spec_name}-{d}]"
                          if spec_name in T.SPECS else f"test_fp32_head_dim_128[{m.module}-{spec_name}]", why)
                break
        if killer:
            break
    return {"name": name, "feature": feature, "module": m.module, "shape": shape or "descriptor_dv_gt_d",
            "spec": _short(spec), "dtype": dtype_name, "real": real_verdict, "mutant": mutant_verdict,
            "killed_by": killer, "seconds": round(time.perf_counter() - t0, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", metavar="PATH", help="also write the mutants and their results as markdown")
    ap.add_argument("--from-json", metavar="PATH", help="with --markdown: render the results a run saved, no run")
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one)), flush=True)
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        with open(args.markdown, "w") as f:
            f.write(markdown(results))
        return 0
    names = args.names or list(BY_NAME)

    def run(name):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name], capture_output=True,
                              text=True, cwd=ROOT)
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        return {"name": name, "crashed": done.returncode, "stderr": done.stderr[-2000:]}

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, names))
    ok = True
    for r in results:
        if args.json:
            print(json.dumps(r))
            continue
        if "crashed" in r:
            ok = False
            print(f"{r['name']}: the check itself died (rc {r['crashed']}):\n{r['stderr']}")
            continue
        good = r["real"] is None and r["mutant"] is not None and r["killed_by"] is not None
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {r['name']:32} {r['shape']} {r['dtype']}: real "
              f"{'passes' if r['real'] is None else 'FAILS ' + r['real']}; mutant: {r['mutant']}; first killing "
              f"test: {r['killed_by'][0] if r['killed_by'] else 'NONE'} ({r['seconds']} s)")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results))
        with open(os.path.splitext(args.markdown)[0] + ".json", "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


def _code(text):
    """text as a fenced block (find/replace texts hold newlines, backticks never); a final newline is said."""
    if not text:
        return "(the empty text)\n"
    note = "\n(the text ends with a newline)\n" if text.endswith("\n") else ""
    return "```\n" + text.rstrip("\n") + "\n```\n" + note


def _short(spec):
    """The spec with only the fields that differ from Spec's defaults."""
    import dataclasses

    parts = [f"{f.name}={getattr(spec, f.name)!r}" for f in dataclasses.fields(spec)
             if getattr(spec, f.name) != f.default]
    return "Spec(" + ", ".join(parts) + ")"


def markdown(results):
    by = {r["name"]: r for r in results}
    out = ["| mutant | feature | kernel | shape, dtype | real kernel | mutant | first killing test |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for f, m, shape, dtype in PROPOSED:
        r = by.get(m.name)
        if r is None or "crashed" in r:
            continue
        verdict = "PASSES"
        if r["mutant"]:
            head, _, rest = r["mutant"].partition("; ")
            verdict = "fails: " + (f"{head.split()[0]}: {rest}" if rest else head[:80])
        out.append(f"| `{m.name}` | {f} | {m.module} | `{r['shape']}` {r['dtype']} | "
                   f"{'passes' if r['real'] is None else 'FAILS'} | {verdict.replace('|', '/')} | "
                   f"{'`' + r['killed_by'][0] + '`' if r['killed_by'] else 'none'} |")
    for feature in ("gqa", "dv", "window", "softcap", "alibi"):
        out.append(f"\n## {feature}\n")
        for f, m, shape, dtype in PROPOSED:
            if f != feature or m.name not in by:
                continue
            r = by[m.name]
            out.append(f"### `{m.name}` (kernel/{m.module}.py)\n\n{m.breaks}.\n")
            for i, (find, rep) in enumerate(m.all_edits):
                label = f"edit {i + 1}: " if len(m.all_edits) > 1 else ""
                out.append(f"{label}find (exactly once):\n\n{_code(find)}\n{label}replace:\n\n{_code(rep)}")
            if "crashed" in r:
                out.append(f"**the check died** (rc {r['crashed']})\n")
                continue
            out.append(f"- shape: `{r['shape']}`, {r['dtype']}: `{r['spec']}`")
            out.append(f"- real kernel: {'passes' if r['real'] is None else 'FAILS: ' + r['real']}")
            out.append(f"- mutant: fails: {r['mutant']}" if r["mutant"] else "- mutant: PASSES (not killed)")
            out.append(f"- first killing test of tests/test_kernel_features.py: "
                       f"{'`' + r['killed_by'][0] + '`' if r['killed_by'] else 'NONE'}\n")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
