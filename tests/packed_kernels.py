"""Varlen and paged kernels for tests/test_packed.py: examples/varlen_attention.py's plain PyTorch kernels with one
bug each from the classes public varlen and paged kernels keep reporting, so that each is seen to be caught by the
packed cases, the replayed dense catalogue or the leak check, and the correct kernels to pass."""
import math

import torch

from examples.varlen_attention import _one, attention_paged, attention_varlen  # noqa: F401  (the correct ones)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, keys=None, order=None, stray=None):
    """The plain varlen loop; keys(b, cq, ck, total_k) -> the key slice of sequence b; order: the sequences' order
    (a parallel kernel's programs run in any); stray(res, b, cq): a write of sequence b's program."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    res = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    n = len(cq) - 1
    for b in (order(n) if order else range(n)):
        rows = slice(cq[b], cq[b + 1])
        ks = keys(b, cq, ck, k.shape[0]) if keys else slice(ck[b], ck[b + 1])
        o, _ = _one(q[rows].transpose(0, 1), k[ks].transpose(0, 1), v[ks].transpose(0, 1), causal, scale)
        res[rows] = o.transpose(0, 1).to(q.dtype)
        if stray:
            stray(res, b, cq)
    return res


def reads_one_key_past_its_sequence(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None):
    """The key mask off by one at the end of a sequence (j <= len instead of j < len): it reads the next
    sequence's first key."""
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale,
                   keys=lambda b, cq, ck, total: slice(ck[b], min(ck[b + 1] + 1, total)))


def max_seqlen_as_length(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None,
                         causal=False, scale=None):
    """max_seqlen_k taken as every sequence's key count (right only when the sequences are equally long and the
    bound is exact)."""
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale,
                   keys=lambda b, cq, ck, total: slice(ck[b], min(ck[b] + max_seqlen_k, total)))


def empty_sequence_writes_next(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None):
    """A zero-length query sequence's program stores one tile row anyway, bounded by the packed total instead of its
    own length: it zeroes the first row of the next sequence (the programs run last to first here)."""
    def stray(res, b, cq):
        if cq[b + 1] == cq[b] and cq[b] < res.shape[0]:
            res[cq[b]] = 0
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, order=lambda n: range(n - 1, -1, -1),
                   stray=stray)


def causal_from_packed_totals(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None):
    """The causal diagonal of every sequence offset by total_k - total_q (the packed tensors'), not by its own
    Nk - Nq: right only where the two agree."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    res = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    off = k.shape[0] - q.shape[0]
    for b in range(len(cq) - 1):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        qb, kb, vb = q[rows].transpose(0, 1).float(), k[keys].transpose(0, 1).float(), v[keys].transpose(0, 1).float()
        g = qb.shape[0] // kb.shape[0]
        kb, vb = kb.repeat_interleave(g, 0), vb.repeat_interleave(g, 0)
        s = (qb @ kb.transpose(1, 2)) * scale
        if causal:
            sees = torch.ones(s.shape[1], s.shape[2], dtype=torch.bool, device=q.device).tril(off)
            s = s.masked_fill(~sees, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        res[rows] = (p @ vb).transpose(0, 1).to(q.dtype)
    return res


def leaks_a_little(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None):
    """Correct but for one leak too small for the reference to see on ordinary inputs: each sequence's output gets
    1e-4 of the mean of the next sequence's values (a reduction that spans sequences). The leak check's large values
    make it show."""
    res = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 2):
        nxt = v[ck[b + 1]:ck[b + 2]]
        if nxt.shape[0]:
            res[cq[b]:cq[b + 1]] += (1e-4 * nxt.float().mean()).to(res.dtype)
    return res


def _paged(q, k_cache, v_cache, block_table, cache_seqlens, causal, scale, locate):
    """The plain paged loop; locate(block_table, b, j, page) -> (pages, slots) of sequence b's keys j."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    page = k_cache.shape[1]
    res = torch.empty(*q.shape[:3], v_cache.shape[3], dtype=q.dtype, device=q.device)
    for b, n in enumerate(cache_seqlens.tolist()):
        pages, slots = locate(block_table, b, torch.arange(n, device=q.device), page)
        o, _ = _one(q[b], k_cache[pages, slots].transpose(0, 1), v_cache[pages, slots].transpose(0, 1), causal,
                    scale)
        res[b] = o.to(q.dtype)
    return res


def pages_assumed_contiguous(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None):
    """Only a sequence's first page looked up; the next ones assumed to follow it in the pool."""
    return _paged(q, k_cache, v_cache, block_table, cache_seqlens, causal, scale,
                  lambda t, b, j, page: ((t[b, 0].long() + j // page) % k_cache.shape[0], j % page))


def block_table_row_stride_off_by_one(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None):
    """The block table read with a row stride of its width minus one (a stride recomputed from the pages a sequence
    needs): right for the first sequence only."""
    flat = None

    def locate(t, b, j, page):
        nonlocal flat
        flat = t.flatten()
        return flat[b * (t.shape[1] - 1) + j // page].long(), j % page
    return _paged(q, k_cache, v_cache, block_table, cache_seqlens, causal, scale, locate)


def reads_whole_last_page(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None):
    """Every key of the last page attended, its unused slots too (the length rounded up to the page size)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    page = k_cache.shape[1]
    lens = ((cache_seqlens + page - 1) // page) * page
    return _paged(q, k_cache, v_cache, block_table, lens, causal, scale,
                  lambda t, b, j, page: (t[b, j // page].long(), j % page))


def named_offsets(q, k, v, offsets_q, offsets_k, *, causal=False, scale=None):
    """A correct varlen kernel whose offsets have other names: it declares its protocol (--protocol varlen)."""
    return attention_varlen(q, k, v, offsets_q, offsets_k, causal=causal, scale=scale)


def ignores_out(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, out=None, return_lse=False):
    """Takes out= and never writes it: the answer comes back in a fresh tensor (a wrapper that forgets to pass out
    on to its launcher)."""
    return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale, return_lse=return_lse)


def _alibi_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, alibi_slopes, row_of):
    """A varlen loop with ALiBi: sequence b's scores get -slope * |i + Nk - Nq - j|, its slopes alibi_slopes[row_of(b)]
    when they are (B, H), alibi_slopes when (H,)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    res = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    group = q.shape[1] // k.shape[1]
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]].transpose(0, 1).float()
        ks = k[ck[b]:ck[b + 1]].transpose(0, 1).float().repeat_interleave(group, 0)
        vs = v[ck[b]:ck[b + 1]].transpose(0, 1).float().repeat_interleave(group, 0)
        nq, nk = qs.shape[1], ks.shape[1]
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[row_of(b)]
        s = (qs @ ks.transpose(1, 2)) * scale
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        if slopes is not None:
            s = s - slopes.float()[:, None, None] * (i + nk - nq - j).abs()
        if causal:
            s = s.masked_fill(j > i + nk - nq, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        res[cq[b]:cq[b + 1]] = (p @ vs).transpose(0, 1).to(q.dtype)
    return res


def alibi_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, alibi_slopes=None):
    """A correct varlen kernel with ALiBi: per-sequence slopes (B, H) read at each sequence's own row."""
    return _alibi_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, alibi_slopes, lambda b: b)


def alibi_slopes_of_sequence_0(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, alibi_slopes=None):
    """(B, H) slopes read at row 0 for every sequence (the batch index left out of the slopes' offset)."""
    return _alibi_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, alibi_slopes, lambda b: 0)


def max_seqlen_of_first_sequence(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None,
                                 causal=False, scale=None):
    """max_seqlen_k not given: the bound taken from the first sequence (cu_seqlens_k[1] - cu_seqlens_k[0]), so a
    longer sequence's keys past it are never read (right whenever the bound is passed)."""
    mk = max_seqlen_k if max_seqlen_k is not None else int(cu_seqlens_k[1] - cu_seqlens_k[0])
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale,
                   keys=lambda b, cq, ck, total: slice(ck[b], min(ck[b + 1], ck[b] + mk)))


def _paged_features(q, k_cache, v_cache, block_table, cache_seqlens, causal, scale, window, interleaved, offset):
    """A plain paged loop with GQA and a window; interleaved(page) -> whether query head h reads kv head h % Hkv;
    offset(b, nq, nk, lens) -> the diagonal's offset of sequence b (right: nk - nq)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    page, Hq, Hkv = k_cache.shape[1], q.shape[1], k_cache.shape[2]
    lens = cache_seqlens.tolist()
    heads = (torch.arange(Hq) % Hkv) if interleaved(page) else (torch.arange(Hq) // (Hq // Hkv))
    res = torch.empty(*q.shape[:3], v_cache.shape[3], dtype=q.dtype, device=q.device)
    for b, n in enumerate(lens):
        j = torch.arange(n, device=q.device)
        pages, slots = block_table[b, j // page].long(), j % page
        k = k_cache[pages, slots].transpose(0, 1)[heads].float()
        v = v_cache[pages, slots].transpose(0, 1)[heads].float()
        nq = q.shape[2]
        s = (q[b].float() @ k.transpose(1, 2)) * scale
        i = torch.arange(nq, device=q.device)[:, None] + offset(b, nq, n, lens)
        sees = torch.ones(nq, n, dtype=torch.bool, device=q.device)
        if causal:
            sees &= j[None, :] <= i
        if window is not None:
            if window[0] is not None:
                sees &= j[None, :] >= i - window[0]
            if window[1] is not None:
                sees &= j[None, :] <= i + window[1]
        p = torch.softmax(s.masked_fill(~sees, float("-inf")), dim=-1).nan_to_num(0.0)
        res[b] = (p @ v).to(q.dtype)
    return res


def heads_interleaved_on_small_pages(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None,
                                     window=None):
    """GQA heads mapped h % Hkv (not h // group) on the path for pages smaller than a 16-key tile."""
    return _paged_features(q, k_cache, v_cache, block_table, cache_seqlens, causal, scale, window,
                           lambda page: page < 16, lambda b, nq, nk, lens: nk - nq)


def window_offset_from_the_longest_cache(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False,
                                         scale=None, window=None):
    """The window's (and causal diagonal's) offset taken from the longest cache, max(cache_seqlens) - Nq, for every
    sequence: right for the longest only."""
    return _paged_features(q, k_cache, v_cache, block_table, cache_seqlens, causal, scale, window,
                           lambda page: False, lambda b, nq, nk, lens: max(lens) - nq)


def paged_q_bnhd(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None, out=None,
                 return_lse=False):
    """The correct paged kernel with FlashAttention's flash_attn_with_kvcache layout for q and out, (B, Nq, H, D);
    the lse stays (B, H, Nq). Right under --paged-q bnhd (or its probe), wrong under the default (B, H, Nq, D)."""
    res = attention_paged(q.transpose(1, 2), k_cache, v_cache, block_table, cache_seqlens, causal=causal,
                          scale=scale, return_lse=return_lse)
    o, lse = res if return_lse else (res, None)
    o = o.transpose(1, 2)
    if out is not None:
        out.copy_(o)
        o = out
    return (o, lse) if return_lse else o



def paged_q_bnhd_drops_last_key(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None):
    """paged_q_bnhd with a bug: each sequence's last key is left out."""
    return paged_q_bnhd(q, k_cache, v_cache, block_table, (cache_seqlens - 1).clamp_min(0), causal=causal,
                        scale=scale)


def lse_tokens_first(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, return_lse=False):
    """Right, with its log-sum-exp laid out (total_q, H), as FlashInfer's is (--lse-layout tokens-first)."""
    res = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale, return_lse=return_lse)
    return (res[0], res[1].transpose(0, 1).contiguous()) if return_lse else res


def fused_slopes_of_sequence_0(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None,
                               causal=False, scale=None, window=None, softcap=None, alibi_slopes=None):
    """The project's fused varlen kernel handed the (B, H) ALiBi slopes of sequence 0 for every sequence (a
    launcher that drops the slopes' batch stride): right for (H,) slopes, wrong for per-sequence ones."""
    from flashcheck.kernel import fused

    if alibi_slopes is not None and alibi_slopes.dim() == 2:
        alibi_slopes = alibi_slopes[:1].expand_as(alibi_slopes)
    return fused.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                  max_seqlen_k=max_seqlen_k, causal=causal, scale=scale, window=window,
                                  softcap=softcap, alibi_slopes=alibi_slopes)
