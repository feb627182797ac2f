"""Packed sequences and a paged KV cache in plain PyTorch: the two calling protocols beside the dense one
(docs/design.md), written for clarity, one sequence at a time, in float32.

    flashcheck verify examples/varlen_attention.py:attention_varlen
    flashcheck verify examples/varlen_attention.py:attention_paged

verify finds the protocol in the signature (cu_seqlens_q: varlen; block_table: paged), replays the dense
catalogue through it (each batch a sequence, each paged through a shuffled pool with NaN in every unused slot) and
adds the packed entries (empty sequences, block edges, page sizes 1, 7, 16 and 128). Both take GQA (k and v with
fewer heads than q, head h reads kv head h // (H // Hkv)), a value head dim of their own, out= and return_lse.
"""
import math

import torch


def _one(q, k, v, causal, scale):
    """One sequence: q (H, Nq, D), k (Hkv, Nk, D), v (Hkv, Nk, Dv) -> out (H, Nq, Dv), lse (H, Nq), in float32."""
    H, nq, nk = q.shape[0], q.shape[1], k.shape[1]
    group = H // k.shape[0]
    k, v = k.float().repeat_interleave(group, 0), v.float().repeat_interleave(group, 0)
    s = (q.float() @ k.transpose(1, 2)) * scale
    if causal:   # bottom-right: query i sees key j iff j <= i + Nk - Nq
        sees = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        s = s.masked_fill(~sees, float("-inf"))
    # the softmax from the row max, not exp(s - lse): with scores near 1e9, lse = max + log(count) rounds to the max
    # in fp32 and every tied key would weigh 1 (verify's duplicated keys found that)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)          # a row that sees no key: p 0, out 0, lse -inf
    return p @ v, torch.logsumexp(s, dim=-1)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, causal=False,
                     scale=None, out=None, return_lse=False):
    """q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv); sequence b is rows cu_seqlens[b]:cu_seqlens[b+1].
    Returns out (total_q, H, Dv) in q's dtype (and lse (H, total_q), float32)."""
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    res = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for b in range(len(cq) - 1):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        o, l = _one(q[rows].transpose(0, 1), k[keys].transpose(0, 1), v[keys].transpose(0, 1), causal, scale)
        res[rows] = o.transpose(0, 1).to(q.dtype)
        lse[:, rows] = l
    return (res, lse) if return_lse else res


def attention_paged(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None, out=None,
                    return_lse=False):
    """q (B, H, Nq, D); k_cache (num_pages, page_size, Hkv, D), v_cache (.., Dv); key j of sequence b is slot
    j % page_size of page block_table[b, j // page_size]. Returns out (B, H, Nq, Dv) (and lse (B, H, Nq))."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    page = k_cache.shape[1]
    res = torch.empty(*q.shape[:3], v_cache.shape[3], dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    for b, n in enumerate(cache_seqlens.tolist()):
        j = torch.arange(n, device=q.device)
        pages, slots = block_table[b, j // page].long(), j % page
        k, v = k_cache[pages, slots].transpose(0, 1), v_cache[pages, slots].transpose(0, 1)   # (Hkv, n, D)
        o, l = _one(q[b], k, v, causal, scale)
        res[b] = o.to(q.dtype)
        lse[b] = l
    return (res, lse) if return_lse else res
