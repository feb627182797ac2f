"""Kernels with the limits and habits of real ones, for tests/test_verify_real.py: each is correct where it
works, and verify must tell its documented limits (declared, or raised as NotImplementedError) from bugs.

The reference answers come from examples/plain_attention.py (fp32 scores, softmax, P.V)."""
import itertools
import time

import torch
import torch.nn.functional as F

from examples.plain_attention import matmul_softmax
from flashcheck import Unsupported, declare


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


def no_scale_keyword(q, k, v, *, causal=False):
    """A kernel whose signature has no scale= (it always uses 1/sqrt(D), as many serving kernels do)."""
    return matmul_softmax(q, k, v, causal=causal)


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


FIRST_CALL_SECONDS = 2.5
_specialised = set()


def slow_first_call(q, k, v, *, causal=False, scale=None):
    """Right, but its first call with each new set of shapes takes FIRST_CALL_SECONDS, as a kernel that compiles
    (or autotunes) for every shape does: a --timeout shorter than that must not fail it, the compile limit does."""
    key = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, causal)
    if key not in _specialised:
        time.sleep(FIRST_CALL_SECONDS)
        _specialised.add(key)
    return matmul_softmax(q, k, v, causal=causal, scale=scale)


def float32_without_out(q, k, v, *, causal=False, scale=None, out=None):
    """Right into an out= it is given, but without one it allocates its result in float32, whatever the inputs: the
    path most callers take breaks the output contract (the dtype of q)."""
    result = matmul_softmax(q, k, v, causal=causal, scale=scale)
    if out is None:
        return result.float()
    return out.copy_(result)


def fp16_accumulator(q, k, v, *, causal=False, scale=None, block_n=64):
    """An online softmax whose running P.V sum is kept in fp16 between key blocks (a tensor-core accumulator in the
    input dtype): right while the unnormalised sums stay small, inf once they pass fp16's 65504."""
    import math

    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    m = torch.full((B, H, Nq, 1), float("-inf"), device=q.device)
    l = torch.zeros((B, H, Nq, 1), device=q.device)
    acc = torch.zeros((B, H, Nq, D), dtype=torch.float16, device=q.device)
    rows = torch.arange(Nq, device=q.device)[:, None]
    for start in range(0, Nk, block_n):
        s = (q.float() @ k[:, :, start:start + block_n].float().transpose(-1, -2)) * scale
        if causal:
            cols = torch.arange(start, start + s.shape[-1], device=q.device)[None, :]
            s = s.masked_fill(cols > rows + Nk - Nq, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        c, p = torch.exp(m - shift), torch.exp(s - shift)
        l = l * c + p.sum(-1, keepdim=True)
        acc = (acc.float() * c + p @ v[:, :, start:start + block_n].float()).half()
        m = m_new
    return (acc.float() / torch.where(l == 0, torch.ones_like(l), l)).to(q.dtype)


def oracle_work(target, seconds):
    """Worker.call's function standing in for the oracle: `seconds` of its own work (no call of the kernel)."""
    time.sleep(seconds)
    return "done"


def output_sized_by_d(q, k, v, *, causal=False, scale=None):
    """Right while v's head dim is q's; with a value head dim of its own it returns D columns (cut, or padded with
    zeros): the output sized by the query/key head dim."""
    out = matmul_softmax(q, k, v, causal=causal, scale=scale)
    D, Dv = q.shape[-1], v.shape[-1]
    return F.pad(out, (0, D - Dv)) if Dv < D else out[..., :D]


def top_left_window(q, k, v, *, causal=False, scale=None, window=None):
    """Causal mask and window counted from the first key (query i sees keys i - left .. i + right, and j <= i when
    causal), as kernels written before FlashAttention 2.1 do: right only when declared --causal-align top-left."""
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    nq, nk = q.shape[-2], k.shape[-2]
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    sees = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if causal:
        sees &= j <= i
    if window is not None:
        left, right = window
        if left is not None:
            sees &= j >= i - left
        if right is not None:
            sees &= j <= i + right
    s = (q.float() @ k.float().transpose(-1, -2) * scale).masked_fill(~sees, float("-inf"))
    return (torch.softmax(s, dim=-1).nan_to_num(0.0) @ v.float()).to(q.dtype)


def waiting_cost(target, cycles):
    """(wall, CPU) seconds of this process around one wait for the GPU to run torch.cuda._sleep(cycles)."""
    import resource

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter() - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def chunked_keys_partial_chunk_dropped(q, k, v, *, causal=False, scale=None):
    """Memory-efficient attention in plain PyTorch (Rabe and Staats: keys in chunks of 4096, each chunk's softmax
    state merged into the running one), with the loop over whole chunks only, as if Nk were a multiple of the chunk
    (a partial last chunk is dropped): right on every row of up to 4096 keys, wrong past them (among the catalogue's
    entries only long_cross_decode, Nk = 4099, has so many). No causal mode."""
    if causal:
        raise NotImplementedError("no causal mode")
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    qf, kf, vf = q.float(), k.float(), v.float()
    nk = k.shape[2]
    stop = nk // 4096 * 4096 or nk          # the bug: keys past the last whole chunk are never read
    m = l = acc = None
    for start in range(0, stop, 4096):
        s = torch.matmul(qf, kf[:, :, start:start + 4096].transpose(-1, -2)) * scale
        m_new = s.amax(-1, keepdim=True) if m is None else torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        c = 0.0 if m is None else torch.exp(m - m_new)
        l = p.sum(-1, keepdim=True) + (0.0 if m is None else l * c)
        acc = torch.matmul(p, vf[:, :, start:start + 4096]) + (0.0 if m is None else acc * c)
        m = m_new
    return (acc / l).to(q.dtype)


DECODE_QUERIES = 8


def _decode(q, k, v, causal, scale, window, chunk_skip_off_by_one):
    """Decode attention over keys in chunks of 16, chunks left of every row's window skipped (the float32 scores
    of the chunks kept are softmaxed together): at most DECODE_QUERIES queries, like a decode kernel's documented
    limit. chunk_skip_off_by_one: the first chunk kept is found as (lo + 1) // 16, so a chunk whose last key is the
    first one a row's window sees is skipped with it."""
    B, H, Nq, D = q.shape
    if Nq > DECODE_QUERIES:
        raise Unsupported(f"decode: at most {DECODE_QUERIES} queries, got {Nq}")
    Nk = k.shape[2]
    scale = 1.0 / D ** 0.5 if scale is None else scale
    group = H // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    rows = torch.arange(Nq).view(-1, 1) + (Nk - Nq)            # each row's diagonal key (bottom-right)
    cols = torch.arange(Nk).view(1, -1)
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    sees = torch.ones(Nq, Nk, dtype=torch.bool)
    if left is not None:
        sees &= cols >= rows - left
    if right is not None:
        sees &= cols <= rows + right
    first = 0
    if left is not None and Nq:
        lo = max(int(rows.min()) - left, 0)
        first = ((lo + 1) if chunk_skip_off_by_one else lo) // 16 * 16
    s = torch.matmul(q.float(), kf[:, :, first:].transpose(-1, -2)) * scale
    s = s.masked_fill(~sees[:, first:].to(q.device), float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    l = p.sum(-1, keepdim=True)
    out = torch.matmul(p, vf[:, :, first:]) / torch.where(l > 0, l, torch.ones_like(l))
    return out.to(q.dtype)


def decode_only(q, k, v, *, causal=False, scale=None, window=None):
    """Right for up to DECODE_QUERIES queries, which is all it takes (flashcheck.Unsupported past them)."""
    return _decode(q, k, v, causal, scale, window, False)


def decode_window_chunk_skipped(q, k, v, *, causal=False, scale=None, window=None):
    """decode_only with its first chunk found one key too far: wrong wherever a row's window starts on the last key
    of a chunk of 16 (Nq = 1, Nk = 40, window (8, 0): its keys are 31..39, and chunk 16..31 is skipped)."""
    return _decode(q, k, v, causal, scale, window, True)


def _causal_prefill(q, k, v, causal, scale, padded_scale):
    """A decoder's prefill kernel: every call masks causally (flashcheck.Unsupported for causal=False), as vLLM's
    unified attention asserts. padded_scale: the default scale taken from the head dim rounded up to 8, the width
    its tiles pad D to (right at D = 8, 16, 64, ...; wrong at odd head dims, which only non-causal entries have)."""
    if not causal:
        raise Unsupported("causal attention only")
    D = q.shape[-1]
    if scale is None:
        scale = 1.0 / ((-(-D // 8) * 8) if padded_scale else D) ** 0.5
    return matmul_softmax(q, k, v, causal=True, scale=scale)


def causal_only(q, k, v, *, causal=True, scale=None):
    """Right wherever it works, which is causal attention alone (--causal-only)."""
    return _causal_prefill(q, k, v, causal, scale, False)


def causal_only_scale_from_padded_d(q, k, v, *, causal=True, scale=None):
    """causal_only with its default scale taken from the padded head dim: 1/sqrt(8) at D = 3."""
    return _causal_prefill(q, k, v, causal, scale, True)


def keys_cover_queries(q, k, v, *, causal=False, scale=None):
    """A prefill kernel over a KV cache that holds the queries' own tokens: each sequence has at least as many keys
    as queries (--nk-ge-nq), and it declines fewer (a row past the keys would divide 0 by 0)."""
    if k.shape[-2] < q.shape[-2]:
        raise Unsupported(f"Nk = {k.shape[-2]} < Nq = {q.shape[-2]}: the cache holds the queries' tokens")
    return matmul_softmax(q, k, v, causal=causal, scale=scale)
