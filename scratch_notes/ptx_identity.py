"""Does the default call (no optional feature) compile to the same kernel as before the features?

Compiles _attn_fwd of two copies of kernel/fused.py (default: the one at git HEAD~N given by --old, and the
working tree's) for sm_90 without a GPU (as scripts/resources.py does), on configurations that attention
launches, and compares their PTX with the debug lines (.loc, .file, the debug sections) and the kernel's name
left out. The new kernel gets its feature constexprs off (fused.FEATURES_OFF) and None for the feature arguments.

    git show HEAD~1:kernel/fused.py > /tmp/fused_old.py; git show HEAD~1:kernel/unfused.py > /tmp/unfused_old.py
    python scratch_notes/ptx_identity.py --old /tmp/fused_old.py --old-unfused /tmp/unfused_old.py
"""
import argparse
import hashlib
import importlib.util
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}
# (name, dtype, D, BM, BN, warps, stages, causal, precision, split, lse, negative scale[, tensor descriptors])
CONFIGS = [
    ("fp16 D=64 descriptors", torch.float16, 64, 128, 128, 4, 3, False, "ieee", False, False, False, True),
    ("bf16 D=128 descriptors causal lse", torch.bfloat16, 128, 128, 128, 8, 3, True, "ieee", False, True, False,
     True),
    ("fp16 D=128 descriptors split-KV", torch.float16, 128, 16, 128, 4, 4, False, "ieee", True, True, False, True),
    ("fp16 D=64", torch.float16, 64, 128, 64, 8, 3, False, "ieee", False, False, False),
    ("fp16 D=64 causal lse", torch.float16, 64, 128, 64, 8, 3, True, "ieee", False, True, False),
    ("bf16 D=128 causal", torch.bfloat16, 128, 128, 64, 8, 3, True, "ieee", False, False, False),
    ("fp16 D=40 split-KV lse", torch.float16, 40, 16, 64, 4, 3, False, "ieee", True, True, False),
    ("fp16 D=16 negative scale", torch.float16, 16, 64, 32, 4, 2, False, "ieee", False, False, True),
    ("fp32 D=64 fp64 dots", torch.float32, 64, 64, 64, 4, 2, False, "fp64", False, True, False),
    ("fp32 D=128 split head dim causal", torch.float32, 128, 64, 32, 4, 2, True, "fp64", False, False, False),
    ("fp32 D=111 tf32x3 split head dim (Q in loop)", torch.float32, 111, 128, 64, 8, 2, False, "tf32x3", False,
     False, False),
    ("fp32 D=256 ieee FMA", torch.float32, 256, 32, 32, 4, 2, True, "ieee", False, False, False),
]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compile_ptx(mod, cfg):
    _, dtype, D, bm, bn, warps, stages, causal, prec, split, lse, neg, *tma = cfg
    tma = bool(tma and tma[0])
    k = mod._attn_fwd
    names = list(k.arg_names)
    d_split = mod.head_dim_split(D, dtype)
    two_pass = mod.fused_then_exact(dtype, "ieee" if prec == "fp64" else prec)
    constants = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=mod.launch_block_d(D, dtype), HEAD_DIM=D, IS_CAUSAL=causal,
                     STORE_LSE=lse, NEGATIVE_SCALE=neg, INPUT_PRECISION=prec, SPLIT=split, USE_TMA=False,
                     D_SPLIT=d_split, Q_IN_LOOP=d_split and prec == "tf32x3", MUL_RN=True, TWO_PASS=two_pass)
    if tma:
        constants["USE_TMA"] = True
    else:
        constants.update(DescK=None, DescV=None)
    if hasattr(mod, "features_off"):
        constants.update(mod.features_off(D, dtype))
    sig = {}
    for n in names:
        if n in constants:
            sig[n] = "constexpr"
        elif n in ("Q", "K", "V"):
            sig[n] = POINTER[dtype]
        elif n == "Out":
            sig[n] = "*fp32" if split else POINTER[dtype]
        elif n == "Lse":
            sig[n] = "*fp32"
        elif n == "qk_scale":
            sig[n] = "fp32"
        elif n in ("DescK", "DescV"):
            sig[n] = f"tensordesc<{POINTER[dtype][1:]}[1, 1, {bn}, {mod.head_dim_block(D)}]>"
        else:
            sig[n] = "i32"
    src = ASTSource(k, sig, constexprs={(names.index(a),): b for a, b in constants.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages, enable_fp_fusion=True))
    ptx = compiled.asm["ptx"]
    ptx = ptx.split("\t.section\t.debug", 1)[0]
    lines = [ln for ln in ptx.splitlines() if not re.match(r"\s*\.(loc|file)\b", ln)]
    text = "\n".join(lines)
    text = re.sub(r"_attn_fwd\w*", "_attn_fwd", text)
    return text


UNFUSED_CONFIGS = [("unfused fp16 D=64 causal", torch.float16, 64, True), ("unfused fp32 D=40", torch.float32, 40, False)]


def compile_unfused(mod, cfg):
    """The PTX of the unfused baseline's scores and P.V kernels (32 x 32 tiles, as on the GPU)."""
    _, dtype, D, causal = cfg
    texts = []
    new = {"KV_GROUP": 1, "WINDOW_LEFT": False, "WINDOW_RIGHT": False, "SOFTCAP": False, "HAS_ALIBI": False,
           "window_left": None, "window_right": None, "softcap": None, "Alibi": None, "stride_az": None,
           "stride_ah": None}
    for fn, constants in ((mod._scores, dict(BLOCK_M=32, BLOCK_N=32, BLOCK_D=max(16, triton.next_power_of_2(D)),
                                             HEAD_DIM=D, IS_CAUSAL=causal, INPUT_PRECISION="ieee")),
                          (mod._weights_v, dict(BLOCK_M=32, BLOCK_N=32, BLOCK_D=max(16, triton.next_power_of_2(D)),
                                                HEAD_DIM=D, INPUT_PRECISION="ieee"))):
        names = list(fn.arg_names)
        constants.update({n: x for n, x in new.items() if n in names})
        sig = {}
        for n in names:
            if n in constants:
                sig[n] = "constexpr"
            elif n in ("Q", "K", "V", "Out"):
                sig[n] = POINTER[dtype]
            elif n in ("S", "W"):
                sig[n] = "*fp32"
            elif n == "scale":
                sig[n] = "fp32"
            else:
                sig[n] = "i32"
        src = ASTSource(fn, sig, constexprs={(names.index(a),): b for a, b in constants.items()})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
        ptx = ptx.split("\t.section\t.debug", 1)[0]
        text = "\n".join(ln for ln in ptx.splitlines() if not re.match(r"\s*\.(loc|file)\b", ln))
        texts.append(re.sub(r"_(scores|weights_v)\w*", r"_\1", text))
    return "\n".join(texts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernel",
                                                   "fused.py"))
    ap.add_argument("--dump", default=None, help="folder to write the PTX of both into")
    ap.add_argument("--old-unfused", default=None, help="an older kernel/unfused.py to compare the baseline with")
    args = ap.parse_args()
    old, new = load(args.old, "fused_old_copy"), load(args.new, "fused_new_copy")
    same = True
    for cfg in CONFIGS:
        a, b = compile_ptx(old, cfg), compile_ptx(new, cfg)
        ha, hb = (hashlib.sha256(t.encode()).hexdigest()[:16] for t in (a, b))
        ok = a == b
        same &= ok
        print(f"{cfg[0]:48} old {ha} new {hb} {'identical' if ok else 'DIFFERENT'} ({len(a.splitlines())} lines)")
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            tag = re.sub(r"\W+", "_", cfg[0])
            for which, t in (("old", a), ("new", b)):
                with open(os.path.join(args.dump, f"{tag}.{which}.ptx"), "w") as f:
                    f.write(t)
    if args.old_unfused:
        new_path = os.path.join(os.path.dirname(args.new), "unfused.py")
        old_u, new_u = load(args.old_unfused, "unfused_old_copy"), load(new_path, "unfused_new_copy")
        for cfg in UNFUSED_CONFIGS:
            a, b = compile_unfused(old_u, cfg), compile_unfused(new_u, cfg)
            ok = a == b
            same &= ok
            print(f"{cfg[0]:48} {'identical' if ok else 'DIFFERENT'} ({len(a.splitlines())} lines)")
    print("all identical" if same else "SOME DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
