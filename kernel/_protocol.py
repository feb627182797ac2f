"""Input checks shared by the project's kernels: bad input gets a named ValueError/TypeError here, never a
crash inside Triton or a silently wrong answer."""
import math
import os

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def interpreter_active():
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_attention_inputs(q, k, v, causal, scale, out, block_m, block_n):
    """Validate a call of the attention protocol; return (B, H, Nq, Nk, D, scale)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 (B, H, N, D), got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float32, float16, bfloat16")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, Nq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != B or k.shape[1] != H:
        raise ValueError(f"batch/heads differ: q has (B, H) = {(B, H)}, k and v have {tuple(k.shape[:2])}")
    if k.shape[3] != D:
        raise ValueError(f"head dim differs: q has D = {D}, k and v have D = {k.shape[3]}")
    Nk = k.shape[2]
    if Nk == 0:
        raise ValueError("Nk = 0: attention over no keys is undefined (the softmax has no terms)")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D = {D} is outside the supported range 1..{MAX_HEAD_DIM}")
    if interpreter_active():
        if q.device.type != "cpu":
            raise ValueError(f"Triton's interpreter (TRITON_INTERPRET=1) runs on CPU tensors, got device {q.device}")
    elif q.device.type != "cuda":
        raise ValueError(f"the compiled backend needs CUDA tensors, got device {q.device} "
                         "(set TRITON_INTERPRET=1 before importing triton to run on the CPU)")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite real number, got {scale!r}")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(f"out must match q: shape {tuple(q.shape)}, {q.dtype}, {q.device}; "
                             f"got {tuple(out.shape)}, {out.dtype}, {out.device}")
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        if blk is None:
            continue
        if not isinstance(blk, int) or blk < 1 or blk & (blk - 1):
            raise ValueError(f"{name} must be a power of two, got {blk!r}")
        if not interpreter_active() and blk < 16:
            raise ValueError(f"{name} = {blk}: tl.dot needs every dimension >= 16 on the GPU")
    return B, H, Nq, Nk, D, float(scale)


def check_launch(num_warps, num_stages):
    """Validate optional launch overrides (tuning knobs of the project's own kernels)."""
    if num_warps is not None and (not isinstance(num_warps, int) or num_warps < 1 or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two, got {num_warps!r}")
    if num_stages is not None and (not isinstance(num_stages, int) or num_stages < 1):
        raise ValueError(f"num_stages must be a positive integer, got {num_stages!r}")
