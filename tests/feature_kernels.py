"""Kernels for tests/test_features.py: plain PyTorch attention (fp32 scores, examples/plain_attention.py) with
protocol v3's grouped-query heads done right, under the other head map, wrong, or refused, and with the
log-sum-exp of an empty row under either convention, so that verify's discovery of features, its
declarations and its verdicts on them can be told apart."""
import math

import torch

from examples.plain_attention import matmul_softmax


def _attend(q, k, v, causal, scale, kv_head, return_lse=False, empty_lse=-math.inf):
    """Attention with query head h reading kv head kv_head(h, H, Hkv); the lse of a row that sees no key is
    empty_lse."""
    H, Hkv = q.shape[1], k.shape[1]
    idx = torch.tensor([kv_head(h, H, Hkv) for h in range(H)], dtype=torch.long, device=k.device)
    k, v = k.index_select(1, idx), v.index_select(1, idx)
    out = matmul_softmax(q, k, v, causal=causal, scale=scale)
    if not return_lse:
        return out
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:
        Nq, Nk = q.shape[-2], k.shape[-2]
        sees = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).tril(Nk - Nq)
        s = s.masked_fill(~sees, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)              # -inf where a row sees no key
    return out, torch.where(torch.isneginf(lse), torch.full_like(lse, empty_lse), lse)


def grouped(q, k, v, *, causal=False, scale=None, return_lse=False):
    """The protocol's head map, h // (H // Hkv)."""
    return _attend(q, k, v, causal, scale, lambda h, H, Hkv: h // (H // Hkv), return_lse)


def interleaved(q, k, v, *, causal=False, scale=None):
    """The other head map, h % Hkv: right under --head-map interleaved, wrong under the protocol's."""
    return _attend(q, k, v, causal, scale, lambda h, H, Hkv: h % Hkv)


def group_counted_as_kv_heads(q, k, v, *, causal=False, scale=None):
    """A bug: the group size taken as Hkv, h // Hkv, right only when H // Hkv == Hkv (as for the probe's 4 query
    heads on 2 kv heads); elsewhere it reads the wrong kv head, or one past the last (an IndexError)."""
    return _attend(q, k, v, causal, scale, lambda h, H, Hkv: h // Hkv)


def heads_must_match(q, k, v, *, causal=False, scale=None):
    """No GQA: k and v must have q's heads (as a kernel without the feature checks)."""
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k has {k.shape[1]} heads, q has {q.shape[1]}: this kernel needs them equal")
    return matmul_softmax(q, k, v, causal=causal, scale=scale)


def window_ignored(q, k, v, *, causal=False, scale=None, window=None):
    """A bug: takes window= and ignores it."""
    return grouped(q, k, v, causal=causal, scale=scale)


def empty_lse_plus_inf(q, k, v, *, causal=False, scale=None, return_lse=False):
    """Right, with FlashAttention's convention for the lse of a row that sees no key: +inf."""
    return _attend(q, k, v, causal, scale, lambda h, H, Hkv: h // (H // Hkv), return_lse, math.inf)


def empty_lse_plus_inf_out(q, k, v, *, causal=False, scale=None, out=None, return_lse=False):
    """The same, writing into out= when given (the oracle then also calls it without out=, and holds that call's lse
    to the declared convention as well)."""
    result = empty_lse_plus_inf(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    o = result[0] if return_lse else result
    if out is not None:
        out.copy_(o)
        o = out
    return (o, result[1]) if return_lse else o


def grouped_head_dims_64_128(q, k, v, *, causal=False, scale=None):
    """Right (GQA, differentiable), for head dims 64 and 128 only, as many real kernels are: it declares them."""
    if q.shape[-1] not in (64, 128) or v.shape[-1] != q.shape[-1]:
        raise NotImplementedError(f"head dims 64 and 128 only, got {q.shape[-1]} and {v.shape[-1]}")
    return grouped(q, k, v, causal=causal, scale=scale)


def fused_through_kwargs(q, k, v, **kwargs):
    """The project's fused kernel behind a **kwargs wrapper (a common way to forward options): its signature shows
    none of the keywords it takes."""
    from flashcheck.kernel import fused

    return fused.attention(q, k, v, **kwargs)


def same_head_dims(q, k, v, *, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None):
    """The project's fused kernel for Dv == D only, as FlashAttention 2 is: a value head dim of its own raises."""
    from flashcheck.kernel import fused

    if v.shape[-1] != q.shape[-1]:
        raise NotImplementedError(f"Dv = {v.shape[-1]} != D = {q.shape[-1]}")
    return fused.attention(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
                           alibi_slopes=alibi_slopes)


def softcap_dropped_beside_alibi(q, k, v, *, causal=False, scale=None, window=None, softcap=None,
                                 alibi_slopes=None):
    """same_head_dims, wrong where two features meet: the softcap is left out when ALiBi slopes come too."""
    return same_head_dims(q, k, v, causal=causal, scale=scale, window=window,
                          softcap=None if alibi_slopes is not None else softcap, alibi_slopes=alibi_slopes)



def q_scaled_per_tensor(q, k, v, *, causal=False, scale=None):
    """Right for every finite input: matmul_softmax on q divided by a power of two taken from its absolute maximum
    over the whole tensor (as per-tensor scaling before a low-precision product does), in fp32 so exactly, with
    that power multiplied back into the scale. A NaN anywhere in q makes the maximum NaN, so every row wrong:
    outside the protocol's finite inputs, which is what the declaration nan_stays_in_row is about."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qf = q.float()
    amax = qf.abs().amax() if qf.numel() else qf.new_ones(())
    p2 = float(torch.exp2(torch.ceil(torch.log2(amax.clamp_min(2.0 ** -100)))))
    return matmul_softmax(qf / p2, k, v, causal=causal, scale=scale * p2).to(q.dtype)


def _windowed(q, k, v, causal, scale, window):
    """Plain attention (fp32 scores, grouped heads) with the protocol's window=(left, right): row i sees key j iff
    i + Nk - Nq - left <= j <= i + Nk - Nq + right (None: that side unbounded); a row that sees no key gives 0."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    H, Hkv = q.shape[1], k.shape[1]
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    Nq, Nk = q.shape[-2], k.shape[-2]
    i = torch.arange(Nq, device=q.device)[:, None] + (Nk - Nq)
    j = torch.arange(Nk, device=q.device)[None, :]
    sees = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device)
    left, right = window if window is not None else (None, None)
    if left is not None:
        sees &= j >= i - left
    if right is not None:
        sees &= j <= i + right
    if causal:
        sees &= j <= i
    s = (torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale).masked_fill(~sees, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)      # a row of -inf alone: NaN from softmax, 0 here
    return torch.matmul(p, v.float()).to(q.dtype)


def window_counted_in_keys(q, k, v, *, causal=False, scale=None, window=None):
    """Right, with the window counted as Mistral's and Hugging Face's sliding_window=W is: each side of
    window=(left, right) counts its keys with the diagonal's own, so (1, 1) sees the diagonal key alone
    (--window-count size). Under the protocol's count its windows are one key narrower on each side."""
    if window is not None:
        if any(side is not None and side < 1 for side in window):
            raise ValueError(f"window sides count keys with the diagonal's own: at least 1, got {window}")
        window = tuple(None if side is None else side - 1 for side in window)
    return _windowed(q, k, v, causal, scale, window)


def window_counted_as_distance(q, k, v, *, causal=False, scale=None, window=None):
    """Right by the protocol's count (each side the farthest key seen from the diagonal)."""
    return _windowed(q, k, v, causal, scale, window)


def lse_tokens_first(q, k, v, *, causal=False, scale=None, return_lse=False):
    """Right, with its log-sum-exp laid out (B, Nq, H), as FlashInfer's (total_q, H) is (--lse-layout
    tokens-first)."""
    result = grouped(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    return (result[0], result[1].transpose(-1, -2).contiguous()) if return_lse else result


def lse_in_log2(q, k, v, *, causal=False, scale=None, return_lse=False):
    """Right, with its log-sum-exp in base 2, as an exp2 loop keeps it and FlashInfer returns it (--lse-base 2)."""
    result = grouped(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    return (result[0], result[1] / math.log(2.0)) if return_lse else result


def answers_in_out_alone(q, k, v, *, causal=False, scale=None, out=None, return_lse=False):
    """Right: given out=, it writes the answer there and returns None (with return_lse, (None, lse)), as in-place
    APIs do; without out=, it returns the answer."""
    result = grouped(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    o, lse = result if return_lse else (result, None)
    if out is None:
        return result
    out.copy_(o)
    return (None, lse) if return_lse else None


def returns_none_and_leaves_out(q, k, v, *, causal=False, scale=None, out=None):
    """A bug: given out=, it returns None and never writes out (the answer computed and dropped)."""
    o = grouped(q, k, v, causal=causal, scale=scale)
    return o if out is None else None


def own_block_defaults(q, k, v, *, causal=False, scale=None, block_m=16, block_n=16):
    """Right, with tiles of its own by default (as many kernels' wrappers have): a case that pins one tile gets the
    other's default, not None."""
    if not (isinstance(block_m, int) and isinstance(block_n, int)):
        raise TypeError(f"block_m and block_n must be ints, got {block_m!r}, {block_n!r}")
    return grouped(q, k, v, causal=causal, scale=scale)
