"""Probe PyTorch's scaled_dot_product_attention backends with the scales the protocol allows (GPU).

    python scripts/sdpa_probe.py            # a table: backend x scale x dtype, on the shapes below

Each cell: "ok" (within 1e-2 of the float64 answer, relative to the output's magnitude), "NaN" (a NaN or inf
where the answer is finite), "wrong" (finite but off), or "-" (the backend declines the input). The answer
for scale = 0 is the mean of V; for a negative scale the softmax favours the smallest scores. This is the
evidence behind examples/sdpa_attention.py's routing of scale <= 0 and docs/found-bugs.md.
"""
import contextlib
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
SCALES = (None, 1.0, 0.5, 0.0, -0.5, -1.0)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
SHAPES = ((1, 1, 1, 1, 1), (1, 2, 17, 33, 64))    # (B, H, Nq, Nk, D)


def reference(q, k, v, scale):
    q, k, v = q.double(), k.double(), v.double()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v


def cell(backend, q, k, v, scale):
    try:
        with sdpa_kernel(BACKENDS[backend]):
            out = F.scaled_dot_product_attention(q, k, v, scale=scale)
        torch.cuda.synchronize()
    except RuntimeError:
        return "-"
    ref = reference(q, k, v, scale)
    if not torch.isfinite(out).all():
        return "NaN"
    err = (out.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-3)
    return "ok" if err < 1e-2 else f"wrong ({err:.2g})"


def main():
    if not torch.cuda.is_available():
        print("sdpa_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    g = torch.Generator(device="cuda").manual_seed(0)
    bad = 0
    for shape in SHAPES:
        B, H, Nq, Nk, D = shape
        print(f"\nq (B, H, Nq, D) = {(B, H, Nq, D)}, k, v (B, H, Nk, D) with Nk = {Nk}")
        head = f"{'backend':10} {'dtype':5} " + " ".join(f"{str(s):>10}" for s in SCALES)
        print(head + "\n" + "-" * len(head))
        for backend in BACKENDS:
            for name, dtype in DTYPES.items():
                q = torch.randn(B, H, Nq, D, device="cuda", generator=g).to(dtype)
                k = torch.randn(B, H, Nk, D, device="cuda", generator=g).to(dtype)
                v = torch.randn(B, H, Nk, D, device="cuda", generator=g).to(dtype)
                cells = [cell(backend, q, k, v, s) for s in SCALES]
                bad += sum(c not in ("ok", "-") for c in cells)
                print(f"{backend:10} {name:5} " + " ".join(f"{c:>10}" for c in cells))
    # a length-1 sequence whose (ignored) stride is 1: torch calls such a tensor contiguous
    print("\nq, k, v of shape (1, 1, 1, 4) stored as (1, 1, 4, 1) and transposed: strides (4, 4, 1, 1), "
          "is_contiguous() True")
    for backend in (None, *BACKENDS):
        for name, dtype in DTYPES.items():
            q, k, v = (torch.randn(1, 1, 4, 1, device="cuda", generator=g).to(dtype).transpose(-1, -2)
                       for _ in range(3))
            try:
                with sdpa_kernel(BACKENDS[backend]) if backend else contextlib.nullcontext():
                    out = F.scaled_dot_product_attention(q, k, v)
                torch.cuda.synchronize()
                err = (out.double() - reference(q, k, v, None)).abs().max().item()
                result = "ok" if err < 1e-2 else f"wrong ({err:.2g})"
            except RuntimeError as e:
                result = "error: " + str(e).splitlines()[0][:90]
            print(f"  {backend or 'default':10} {name:5} {result}")
    print(f"\n{bad} cell(s) wrong or NaN")
    return 0


if __name__ == "__main__":
    sys.exit(main())
