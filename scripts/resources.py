"""Compile the fused kernel for a GPU target without a GPU, and print each configuration's registers, stack
(spilled registers: local memory, slow) and shared memory, as cuobjdump reports them for the cubin.

Usage: python scripts/resources.py [--dtype fp32] [--head-dims 64,128] [--arch 90] [--config BMxBNwWsS ...]
Example: the FMA-path fp32 tile of 64 x 64 with 4 warps that ran 1.0 TFLOP/s at D = 128 on an H200 showed
REG:32 STACK:16704 under triton 3.6 (16 KB of spills per thread); 32 x 32 showed STACK:976. fp32 on sm_90 now
compiles its dots for the fp64 tensor cores (64 x 32, 4 warps, 2 stages at D = 128: STACK:968).
Resource use depends on the Triton version: run it with the version of the GPU runner
(pip install --target DIR triton==X; PYTHONPATH=DIR:. python scripts/resources.py).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.pop("TRITON_INTERPRET", None)   # compiled for the GPU target, never interpreted

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashcheck.cases.bench import config_text  # noqa: E402
import torch  # noqa: E402

from flashcheck.kernel.fused import (_attn_fwd, features_off, fp64_dots_measured, fused_then_exact,  # noqa: E402
                                     head_dim_split, launch_block_d)

POINTER = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_CONFIGS = {"fp32": ["64x64w4s1", "64x64w4s2", "32x32w4s2", "64x32w4s1", "64x32w8s1", "64x16w4s1",
                            "32x64w2s1", "32x16w2s1"],
                   "fp16": ["128x64w8s3", "64x64w4s3", "128x128w8s2"]}
DEFAULT_CONFIGS["bf16"] = DEFAULT_CONFIGS["fp16"]


def parse_config(text):
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected BMxBNwWsS (e.g. 64x32w4s2), got {text!r}")
    return tuple(int(x) for x in m.groups())


def compile_kernel(dtype, D, config, causal, arch):
    bm, bn, warps, stages = config
    names = list(_attn_fwd.arg_names)
    torch_dtype = TORCH_DTYPE[dtype]
    # the pointer path, unsplit keys, ieee (tensor-descriptor arguments need a GPU to describe; Q_IN_LOOP is
    # tf32x3's), compiled as attention launches it: MUL_RN on, two passes except for fp32 (ieee), fp fusion on,
    # fp32 dots on the fp64 tensor cores where the target takes them
    fp64 = dtype == "fp32" and fp64_dots_measured(divmod(arch, 10))
    constants = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=launch_block_d(D, torch_dtype), HEAD_DIM=D,
                     IS_CAUSAL=causal, STORE_LSE=False, NEGATIVE_SCALE=False,
                     INPUT_PRECISION="fp64" if fp64 else "ieee", SPLIT=False,
                     USE_TMA=False, D_SPLIT=head_dim_split(D, torch_dtype), Q_IN_LOOP=False, MUL_RN=True,
                     TWO_PASS=fused_then_exact(torch_dtype, "ieee"), DescK=None, DescV=None)
    constants.update(features_off(D, torch_dtype))        # the protocol-v3 features, all off
    signature = {}
    for name in names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in ("Q", "K", "V", "Out"):
            signature[name] = POINTER[dtype]
        elif name == "Lse":
            signature[name] = "*fp32"
        elif name == "qk_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    source = ASTSource(_attn_fwd, signature, constexprs={(names.index(k),): v for k, v in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=warps, num_stages=stages, enable_fp_fusion=True))


def resource_usage(kernel):
    """{'REG': n, 'STACK': bytes, 'SHARED': bytes} from cuobjdump (the one Triton ships) on the cubin."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    usage = {k: int(v) for k, v in re.findall(r"\b(REG|STACK):(\d+)", out)}
    usage["SHARED"] = kernel.metadata.shared   # dynamic shared memory, which cuobjdump does not count
    return usage


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=sorted(POINTER), default="fp32")
    parser.add_argument("--head-dims", default="64,128", help="comma-separated head dims (default 64,128)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (default 90: Hopper)")
    parser.add_argument("--config", type=parse_config, action="append",
                        help="BMxBNwWsS (repeatable; default a set per dtype)")
    args = parser.parse_args(argv)
    configs = args.config or [parse_config(c) for c in DEFAULT_CONFIGS[args.dtype]]
    print(f"triton {triton.__version__}, sm_{args.arch}, {args.dtype}{' causal' if args.causal else ''}")
    print(f"{'D':>4}  {'config':12}  {'REG':>4}  {'STACK':>6}  {'SHARED':>7}")
    for D in (int(x) for x in args.head_dims.split(",")):
        for config in configs:
            try:
                u = resource_usage(compile_kernel(args.dtype, D, config, args.causal, args.arch))
                line = f"{u.get('REG', '?'):>4}  {u.get('STACK', '?'):>6}  {u['SHARED']:>7}"
            except Exception as exc:   # out of shared memory, a compile error: say so and go on
                line = f"error: {str(exc).splitlines()[0][:100]}"
            print(f"{D:>4}  {config_text(config):12}  {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
