"""Kernels with the limits and habits of real ones, for tests/test_verify_real.py: each is correct where it
works, and verify must tell its documented limits (declared, or raised as NotImplementedError) from bugs.

The reference answers come from examples/plain_attention.py (fp32 scores, softmax, P.V)."""
import itertools

import torch
import torch.nn.functional as F

from examples.plain_attention import matmul_softmax
from flashcheck import declare


def same_length_only(q, k, v, *, causal=False, scale=None):
    """Self-attention only, as many fused kernels document: declines Nq != Nk."""
    if q.shape[-2] != k.shape[-2]:
        raise NotImplementedError(f"this kernel needs Nq == Nk, got Nq = {q.shape[-2]}, Nk = {k.shape[-2]}")
    return matmul_softmax(q, k, v, causal=causal, scale=scale)


def fp16_only(q, k, v, *, causal=False, scale=None):
    """Half precision only: fp32 and bf16 inputs are a TypeError (as a kernel without that path raises)."""
    if q.dtype != torch.float16:
        raise TypeError(f"fp16 only, got {q.dtype}")
    return matmul_softmax(q, k, v, causal=causal, scale=scale)


_calls = itertools.count()


def last_bit_differs(q, k, v, *, causal=False, scale=None):
    """Right to the last bit but one: every second call flips the lowest bit of the first output element,
    as a race between two blocks writing one element would."""
    out = matmul_softmax(q, k, v, causal=causal, scale=scale)
    if next(_calls) % 2 and out.numel():
        bits = out.view({4: torch.int32, 2: torch.int16}[out.element_size()])
        bits.view(-1)[0] ^= 1
    return out


def sdpa_is_causal(q, k, v, *, causal=False, scale=None):
    """torch's SDPA (math backend, fp32) with its own is_causal: the diagonal aligned top-left (query i sees
    keys j <= i), which is right only when declared: --causal-align top-left."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale)
    return out.to(q.dtype)


def no_causal_keyword(q, k, v, *, scale=None):
    """A kernel whose signature has no causal=: it is judged on the non-causal cases alone."""
    return matmul_softmax(q, k, v, scale=scale)


def raises_inside(q, k, v, *, causal=False, scale=None):
    """Raises from a helper: the report must say where (this file and line)."""
    return _helper(q)


def _helper(q):
    raise ValueError("unexpected stride")


def out_of_memory_when_long(q, k, v, *, causal=False, scale=None):
    """Runs out of memory (as PyTorch reports it) when the sequence is long, right otherwise."""
    if q.shape[-2] * k.shape[-2] > 2000:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.50 GiB. GPU 0 has a total "
                                     "capacity of 139.81 GiB of which 1.2 GiB is free.")
    return matmul_softmax(q, k, v, causal=causal, scale=scale)


@declare(max_seq=48)
def garbage_beyond_max_seq(q, k, v, *, causal=False, scale=None):
    """Documents (and declares) Nq, Nk <= 48, and beyond that returns zeros without a word, as a kernel with
    a fixed-size buffer might: verify must never judge it there, not even through a relation's transformed
    input (duplication doubles Nk)."""
    if max(q.shape[-2], k.shape[-2]) > 48:
        return torch.zeros_like(q)
    return matmul_softmax(q, k, v, causal=causal, scale=scale)
