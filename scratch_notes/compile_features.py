"""Compile _attn_fwd with the optional features for sm_90 without a GPU (as scripts/resources.py compiles the
default call), so that a feature's code is known to lower for the GPU target, not only to run in the interpreter;
prints registers, stack and shared memory of each configuration.

    python scratch_notes/compile_features.py
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from resources import resource_usage  # noqa: E402

from flashcheck.kernel import fused  # noqa: E402

POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}
# name, dtype, D, Dv, group, (BM, BN, warps, stages), causal, window (left, right), softcap, alibi, precision, split,
# tma
CONFIGS = [
    ("fp16 GQA 4 Dv=64 D=128 window+softcap+alibi", torch.float16, 128, 64, 4, (128, 64, 8, 3), False, (256, 0),
     True, True, "ieee", False, False),
    ("bf16 D=64 Dv=128 causal window left, descriptors", torch.bfloat16, 64, 128, 2, (128, 128, 8, 3), True,
     (512, None), False, False, "ieee", False, True),
    ("fp16 D=128 descriptors softcap alibi right window", torch.float16, 128, 128, 1, (128, 128, 8, 3), False,
     (None, 64), True, True, "ieee", False, True),
    ("fp16 decode split-KV window+alibi Dv=96", torch.float16, 128, 96, 8, (16, 64, 4, 3), False, (1024, None),
     False, True, "ieee", True, False),
    ("fp32 fp64 dots D=128 split head dim window+softcap", torch.float32, 128, 128, 2, (64, 32, 4, 2), True,
     (128, None), True, True, "fp64", False, False),
    ("fp32 fp64 dots D=128 Dv=64 (whole head dims)", torch.float32, 128, 64, 1, (64, 32, 4, 2), False, (64, 8),
     False, False, "fp64", False, False),
    ("fp32 tf32x3 D=64 softcap alibi", torch.float32, 64, 64, 2, (128, 64, 8, 3), False, None, True, True,
     "tf32x3", False, False),
]


def compile_config(cfg):
    name, dtype, D, Dv, group, (bm, bn, warps, stages), causal, window, softcap, alibi, prec, split, tma = cfg
    left, right = window or (None, None)
    d_split = fused.head_dim_split(D, dtype, Dv)
    constants = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=fused.launch_block_d(D, dtype, Dv), HEAD_DIM=D,
                     IS_CAUSAL=causal or right == 0, STORE_LSE=True, NEGATIVE_SCALE=False, INPUT_PRECISION=prec,
                     SPLIT=split, USE_TMA=tma, D_SPLIT=d_split, Q_IN_LOOP=d_split and prec == "tf32x3", MUL_RN=True,
                     TWO_PASS=fused.fused_then_exact(dtype, "ieee" if prec == "fp64" else prec), KV_GROUP=group,
                     BLOCK_DV=fused.head_dim_block(Dv) // (2 if d_split else 1), HEAD_DIM_V=Dv,
                     WINDOW_LEFT=left is not None, WINDOW_RIGHT=right not in (None, 0) and not causal,
                     SOFTCAP=softcap, HAS_ALIBI=alibi)
    if not constants["WINDOW_LEFT"]:
        constants["window_left"] = None
    if not constants["WINDOW_RIGHT"]:
        constants["window_right"] = None
    if not softcap:
        constants["softcap"] = None
    if not alibi:
        constants.update(Alibi=None, stride_az=None, stride_ah=None)
    if not tma:
        constants.update(DescK=None, DescV=None)
    names = list(fused._attn_fwd.arg_names)
    sig = {}
    for n in names:
        if n in constants:
            sig[n] = "constexpr"
        elif n in ("Q", "K", "V"):
            sig[n] = POINTER[dtype]
        elif n == "Out":
            sig[n] = "*fp32" if split else POINTER[dtype]
        elif n in ("Lse", "Alibi"):
            sig[n] = "*fp32"
        elif n in ("qk_scale", "softcap"):
            sig[n] = "fp32"
        elif n == "DescK":
            sig[n] = f"tensordesc<{POINTER[dtype][1:]}[1, 1, {bn}, {fused.head_dim_block(D)}]>"
        elif n == "DescV":
            sig[n] = f"tensordesc<{POINTER[dtype][1:]}[1, 1, {bn}, {fused.head_dim_block(Dv)}]>"
        else:
            sig[n] = "i32"
    src = ASTSource(fused._attn_fwd, sig, constexprs={(names.index(a),): b for a, b in constants.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=stages, enable_fp_fusion=True))


def main():
    print(f"triton {triton.__version__}, sm_90")
    bad = 0
    for cfg in CONFIGS:
        try:
            u = resource_usage(compile_config(cfg))
            line = f"REG {u.get('REG')} STACK {u.get('STACK')} SHARED {u['SHARED']}"
        except Exception as exc:  # noqa: BLE001
            bad += 1
            line = f"error: {str(exc).splitlines()[0][:200]}"
        print(f"{cfg[0]:55} {line}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
