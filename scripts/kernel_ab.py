"""Time the working tree's fused kernel against the same kernel at another commit, interleaved in one process (GPU).

    python scripts/kernel_ab.py [--against REV] [--rounds 5]

A change to kernel/fused.py that is not meant to change its speed (a restructured rare path, a comment, a cheaper
compile) is checked here: the two versions run one after the other on the same inputs, `rounds` times each shape,
and each shape's figure is the median of its do_bench medians, new / old; the summary is the median over the shapes
and their range. Shapes: dense fp16/bf16 with and without causal, an odd length, decode with and without split-KV,
GQA, a window, a softcap, fp32, varlen, and one shape with scores past 2^24, where fp16 runs its exact second pass
(both versions' outputs are first checked against a float64 reference there). torch's SDPA (flash or efficient) is
timed beside the plain shapes, as the usual peer. The old version is `git show REV:kernel/fused.py`, imported as a
module of its own (it must import only what the working tree still provides).
"""
import argparse
import importlib.util
import itertools
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_at(rev):
    """kernel/fused.py as it was at rev, as a module."""
    text = subprocess.run(["git", "show", f"{rev}:kernel/fused.py"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    path = Path(tempfile.mkdtemp()) / "fused_at_rev.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("fused_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shapes(torch, dev):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def dense(dt, B, Hq, Hkv, Nq, Nk, D, magnitude=1.0, **kw):
        q = torch.randn(B, Hq, Nq, D, dtype=dt, device=dev) * magnitude
        k = torch.randn(B, Hkv, Nk, D, dtype=dt, device=dev) * magnitude
        v = torch.randn(B, Hkv, Nk, D, dtype=dt, device=dev)
        peer = None
        if not kw.get("window") and not kw.get("softcap") and (Nq == Nk or not kw.get("causal")):
            def peer():
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=kw.get("causal", False), enable_gqa=Hq != Hkv)
        return (lambda m: m.attention(q, k, v, **kw)), peer, (q, k, v, kw)

    def varlen(dt, lengths, H, D):
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=dev)
        q, k, v = (torch.randn(sum(lengths), H, D, dtype=dt, device=dev) for _ in range(3))
        return (lambda m: m.attention_varlen(q, k, v, cu, cu, causal=True)), None, None

    h, b, f = torch.float16, torch.bfloat16, torch.float32
    return {
        "fp16 B4 H16 N4096 D128": dense(h, 4, 16, 16, 4096, 4096, 128),
        "fp16 B4 H16 N4096 D128 causal": dense(h, 4, 16, 16, 4096, 4096, 128, causal=True),
        "fp16 B8 H16 N2048 D64": dense(h, 8, 16, 16, 2048, 2048, 64),
        "bf16 B8 H16 N1024 D64": dense(b, 8, 16, 16, 1024, 1024, 64),
        "bf16 B1 H16 N16384 D128 causal": dense(b, 1, 16, 16, 16384, 16384, 128, causal=True),
        "bf16 B4 H32 N1000 D128 (odd N)": dense(b, 4, 32, 32, 1000, 1000, 128),
        "bf16 decode B8 H16 Nq1 Nk32768 D128": dense(b, 8, 16, 16, 1, 32768, 128),
        "bf16 decode B2 H16 Nq1 Nk32768 D128 (split)": dense(b, 2, 16, 16, 1, 32768, 128),
        "bf16 GQA 32:4 N4096 D128 causal": dense(b, 2, 32, 4, 4096, 4096, 128, causal=True),
        "bf16 window 1024 N8192 D128": dense(b, 2, 16, 16, 8192, 8192, 128, window=(1024, 0)),
        "bf16 softcap N4096 D128": dense(b, 2, 16, 16, 4096, 4096, 128, softcap=30.0),
        "fp32 N4096 D64": dense(f, 2, 16, 16, 4096, 4096, 64),
        "bf16 varlen 16 seqs D128": varlen(b, [517, 1024, 2048, 300, 4096, 64, 999, 1500] * 2, 16, 128),
        "fp16 scores past 2^24 N2048 D64": dense(h, 2, 8, 8, 2048, 2048, 64, magnitude=3000.0),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default="HEAD", help="the commit whose kernel/fused.py is the old version")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    import torch
    from triton.testing import do_bench

    import flashcheck.kernel.fused as new
    if not torch.cuda.is_available():
        sys.exit("kernel_ab: needs a GPU")
    old = load_at(args.against)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; new = the working tree, old = {args.against}")
    table = shapes(torch, "cuda")
    call, _, (q, k, v, kw) = table["fp16 scores past 2^24 N2048 D64"]
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v.double()
    for label, module in (("old", old), ("new", new)):
        o = call(module).double()
        print(f"scores past 2^24, {label}: finite {bool(torch.isfinite(o).all())}, "
              f"largest error {float((o - ref).abs().max()):.2e}")
    ratios = []
    for name, (call, peer, _) in table.items():
        for module in (old, new):
            call(module)          # compile outside the timing
        times = {"old": [], "new": [], "sdpa": []}
        for _ in range(args.rounds):
            for label, module in (("old", old), ("new", new)):
                times[label].append(do_bench(lambda: call(module), warmup=25, rep=100))
            if peer is not None:
                times["sdpa"].append(do_bench(peer, warmup=25, rep=100))
        med = {label: statistics.median(t) for label, t in times.items() if t}
        ratios.append(med["new"] / med["old"])
        against = f"  old/sdpa {med['old'] / med['sdpa']:.3f}  new/sdpa {med['new'] / med['sdpa']:.3f}" \
            if "sdpa" in med else ""
        print(f"{name:46s} old {med['old']:8.3f} ms  new {med['new']:8.3f} ms  new/old {ratios[-1]:.3f}{against}",
              flush=True)
    print(f"new/old over {len(ratios)} shapes: median {statistics.median(ratios):.3f}, "
          f"{min(ratios):.3f} to {max(ratios):.3f}")


if __name__ == "__main__":
    main()
