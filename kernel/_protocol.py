"""Input checks shared by the project's kernels: bad input gets a named ValueError/TypeError here, never a
crash inside Triton or a silently wrong answer. And jit_unspecialised, the kernels' way of keeping arguments out of
Triton's specialisation."""
import inspect
import math
import numbers
import os
from typing import NamedTuple, Optional

import torch
import triton

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def interpreter_active():
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def jit_unspecialised(fn, names):
    """triton.jit(fn), with the arguments in names plain runtime values to the compiler: Triton otherwise
    specialises an integer argument on its value being 1 (then a constant) and on its divisibility by 16, and a
    pointer on its 16-byte alignment, and compiles every combination it meets anew."""
    options = {"do_not_specialize": list(names)}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        options["do_not_specialize_on_alignment"] = list(names)
    return triton.jit(**options)(fn)


def check_attention_inputs(q, k, v, causal, scale, out, block_m, block_n):
    """Validate a call of the attention protocol; return (B, Hq, Nq, Nk, D, scale).

    q: (B, Hq, Nq, D); k: (B, Hkv, Nk, D) and v: (B, Hkv, Nk, Dv) with Hq a multiple of Hkv (GQA/MQA) and Dv in
    1..MAX_HEAD_DIM (V's own head dim); out, if given: (B, Hq, Nq, Dv) in q's dtype and device."""
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
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must have the same shape (B, Hkv, Nk) in their first three dims (only the head "
                         f"dim may differ), got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != B:
        raise ValueError(f"batch/heads differ: q has B = {B}, k and v have B = {k.shape[0]}")
    if (Hkv == 0 and Hq != 0) or (Hkv and Hq % Hkv):
        raise ValueError(f"batch/heads: q has Hq = {Hq} heads, k and v have Hkv = {Hkv}; Hq must be a multiple of "
                         f"Hkv (GQA/MQA: query head h reads kv head h // (Hq // Hkv))")
    if k.shape[3] != D:
        raise ValueError(f"head dim differs: q has D = {D}, k has D = {k.shape[3]}")
    if Nk == 0:
        raise ValueError("Nk = 0: attention over no keys is undefined (the softmax has no terms)")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D = {D} is outside the supported range 1..{MAX_HEAD_DIM}")
    if not 1 <= Dv <= MAX_HEAD_DIM:
        raise ValueError(f"v's head dim Dv = {Dv} is outside the supported range 1..{MAX_HEAD_DIM}")
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
        shape = (B, Hq, Nq, Dv)
        if tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(f"out must match q (B, Hq, Nq) and v's head dim Dv: shape {shape}, {q.dtype}, "
                             f"{q.device}; got {tuple(out.shape)}, {out.dtype}, {out.device}")
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        if blk is None:
            continue
        if not isinstance(blk, int) or blk < 1 or blk & (blk - 1):
            raise ValueError(f"{name} must be a power of two, got {blk!r}")
        if not interpreter_active() and blk < 16:
            raise ValueError(f"{name} = {blk}: tl.dot needs every dimension >= 16 on the GPU")
    return B, Hq, Nq, Nk, D, float(scale)


class Features(NamedTuple):
    """The optional features of one call, checked: the window's sides (None: unbounded; causal folded in as the
    right side 0), the softcap (a float > 0, or None) and the ALiBi slopes as a (B, Hq) fp32 view (stride 0 along
    B for slopes of shape (Hq,)), or None."""
    left: Optional[int]
    right: Optional[int]
    softcap: Optional[float]
    slopes: Optional[torch.Tensor]


def _window_side(name, x):
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"window's {name} side must be None or an int >= 0, got {x!r}")
    if x < 0:
        raise ValueError(f"window's {name} side must be >= 0 (keys on that side of the diagonal), got {x}")
    return int(x)


def check_offsets(cu_seqlens_q, cu_seqlens_k, total_q, total_k, device, max_seqlen_q=None, max_seqlen_k=None):
    """Validate the cumulative offsets of packed sequences (attention_varlen); return (batch, longest query
    sequence, longest key sequence). Each is an int32 vector of length batch + 1 on the tensors' device, starting at
    0, non-decreasing, ending at the packed row count; max_seqlen_q/k, when given, must bound every sequence's
    length (a smaller one would silently truncate the longer sequences). Reads the offsets on the host."""
    batch, longest = None, []
    for name, cu, total, bound in (("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q),
                                   ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be int32 (the packed layout's offsets), got {cu.dtype}")
        if cu.dim() != 1 or cu.numel() < 1:
            raise ValueError(f"{name} must be a vector of batch + 1 offsets, got shape {tuple(cu.shape)}")
        if cu.device != device:
            raise ValueError(f"{name} must be on the tensors' device {device}, got {cu.device}")
        if batch is not None and cu.numel() - 1 != batch:
            raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have one length (batch + 1), got {batch + 1} and "
                             f"{cu.numel()}")
        batch = cu.numel() - 1
        at = cu.tolist()
        if at[0] != 0:
            raise ValueError(f"{name} must start at 0, got {at[0]}")
        lengths = [b - a for a, b in zip(at, at[1:])]
        bad = next((i for i, n in enumerate(lengths) if n < 0), None)
        if bad is not None:
            raise ValueError(f"{name} must be non-decreasing: entry {bad + 1} ({at[bad + 1]}) is below entry {bad} "
                             f"({at[bad]})")
        if at[-1] != total:
            raise ValueError(f"{name}'s last entry must be the packed row count {total}, got {at[-1]}")
        most = max(lengths, default=0)
        if bound is not None:
            if isinstance(bound, bool) or not isinstance(bound, numbers.Integral):
                raise TypeError(f"max_seqlen_{name[-1]} must be None or an int, got {bound!r}")
            if bound < most:
                raise ValueError(f"max_seqlen_{name[-1]} = {bound} is smaller than sequence {lengths.index(most)}'s "
                                 f"length {most}: it would be truncated")
        longest.append(most)
    return batch, longest[0], longest[1]


def check_pages(block_table, cache_seqlens, batch, num_pages, page_size, device):
    """Validate a paged KV cache's block table and lengths (attention_paged); return the longest cache length.
    block_table: int32 (batch, max_pages); cache_seqlens: int32 (batch,), each at most max_pages * page_size (the
    table's capacity); the pages a sequence uses (the first ceil(length / page_size) entries of its row) must lie in
    the pool [0, num_pages). Entries past them may hold anything. Reads both on the host."""
    for name, t, rank in (("block_table", block_table, 2), ("cache_seqlens", cache_seqlens, 1)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
        if t.dim() != rank or t.shape[0] != batch:
            want = "(B, max_pages)" if rank == 2 else "(B,)"
            raise ValueError(f"{name} must have shape {want} with B = {batch} (q's batch), got {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} must be on the tensors' device {device}, got {t.device}")
    capacity = block_table.shape[1] * page_size
    table = block_table.tolist()
    lengths = cache_seqlens.tolist()
    for b, n in enumerate(lengths):
        if not 0 <= n <= capacity:
            raise ValueError(f"cache_seqlens[{b}] = {n} is outside 0..{capacity}, the block table's capacity "
                             f"({block_table.shape[1]} pages of {page_size})")
        used = table[b][:-(-n // page_size)]
        bad = next((i for i, page in enumerate(used) if not 0 <= page < num_pages), None)
        if bad is not None:
            raise ValueError(f"block_table[{b}, {bad}] = {used[bad]} is outside the pool of {num_pages} pages")
    return max(lengths, default=0)


def check_features(q, causal, window, softcap, alibi_slopes, batch=None):
    """Validate the protocol-v3 options of a call whose q is (B, Hq, Nq, D); return its Features.

    window: None or (left, right), each None or an int >= 0: query i sees key j iff
    i + Nk - Nq - left <= j <= i + Nk - Nq + right; causal=True sets right = 0, whatever window says.
    softcap: None or a finite real c > 0. alibi_slopes: None or a float32 tensor of shape (Hq,) or (B, Hq) on q's
    device (batch: B when q's first dim is not the batch, as for packed sequences)."""
    left = right = None
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise TypeError(f"window must be None or a pair (left, right) of None or ints >= 0, got {window!r}")
        left, right = _window_side("left", window[0]), _window_side("right", window[1])
    if causal:
        right = 0
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"softcap must be None or a real number > 0, got {softcap!r}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be a finite number > 0, got {softcap!r}")
        softcap = float(softcap)
    slopes = None
    if alibi_slopes is not None:
        B, Hq = q.shape[0] if batch is None else batch, q.shape[1]
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a torch.Tensor, got {type(alibi_slopes).__name__}")
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
        if tuple(alibi_slopes.shape) not in ((Hq,), (B, Hq)):
            raise ValueError(f"alibi_slopes must have shape ({Hq},) or ({B}, {Hq}) (Hq = query heads), got "
                             f"{tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes must be on q's device {q.device}, got {alibi_slopes.device}")
        slopes = alibi_slopes.expand(B, Hq)
    return Features(left, right, softcap, slopes)


def check_launch(num_warps, num_stages):
    """Validate optional launch overrides (tuning knobs of the project's own kernels)."""
    if num_warps is not None and (not isinstance(num_warps, int) or num_warps < 1 or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two, got {num_warps!r}")
    if num_stages is not None and (not isinstance(num_stages, int) or num_stages < 1):
        raise ValueError(f"num_stages must be a positive integer, got {num_stages!r}")
