"""PyTorch's scaled_dot_product_attention (SDPA) wrapped in the attention protocol (docs/design.md), so that
`flashcheck verify` can judge it:

    flashcheck verify examples/sdpa_attention.py:attention

Where SDPA differs from the protocol, the wrapper bridges the difference instead of declaring it away:
  * SDPA's is_causal=True is aligned top-left (query i sees keys j <= i); the protocol, like
    FlashAttention, aligns bottom-right (j <= i + Nk - Nq). The two agree only when Nq == Nk, so the
    wrapper never uses is_causal: it passes the bottom-right mask explicitly.
  * A query row that sees no key (causal, Nq > Nk) is a softmax over nothing. The protocol says 0; what
    SDPA gives there has changed with versions and backends (a plain softmax gives NaN, 0/0). The wrapper
    writes 0 into those rows itself.
  * scale <= 0: on an NVIDIA H200 with torch 2.11.0+cu130, SDPA's flash backend returns NaN for scale = 0
    and for negative scales (scale = -1) in fp16 and bf16 (q, k, v of shape (1, 1, 1, 1) are enough), and
    its cuDNN backend for scale = 0 too; flash is what SDPA picks by default. The math backend is right. This
    is a bug of PyTorch's kernels, which flashcheck's generated cases found (docs/found-bugs.md); the wrapper
    routes every scale <= 0 to the math backend, so that this example shows the rest of SDPA.
  * Two more bugs of SDPA's kernels on the same H200, found the same way (docs/found-bugs.md, rows 7 and 8):
    with raw scores |q . k| from about 1e8 (flash) and 1e6 (cuDNN) up (legal fp16 and bf16 inputs), flash
    doubles the output when the winning key appears twice, and cuDNN, given a boolean attn_mask, lets masked
    keys through (the same mask as an additive -inf mask is right). The wrapper passes its causal mask as an
    additive float mask, and sends calls whose scaled scores can reach 1e6 (a bound: max|q| * max|k| * D *
    |scale|, about 16 times the typical score) to the math backend, which computes fp16/bf16 in fp32 and is
    right there; the catalogue's large-score cases (about 1e3 to 1e4) still go through SDPA's own choice.
  * The backward: on the same H200 (cuDNN 9.19), SDPA's default backend for fp16 and bf16 (cuDNN) gives wrong
    gradients, silently, for an output gradient whose rows have gaps (a legal strided dO) when a contiguous dO of
    the same shapes went through the same process before it: it reads dO as if it were laid out as the first
    one was (NaN gradients where the gaps hold NaN, off by about 2 where they hold zeros); the flash and
    memory-efficient backends are right (docs/found-bugs.md, row 17). The wrapper hands SDPA's backward a
    contiguous copy of dO (_contiguous_grad).
  * The backward on the CPU (torch 2.13.0+cpu): in fp16 and bf16, SDPA's CPU flash kernel's dK and dV drift with the
    number of query blocks they are summed over; at 65536 queries (backward_sums_over_query_blocks) they were 11 to
    43 times as far from float64 as the math backend's, which is as close as plain matmul-softmax-matmul autograd
    (docs/found-bugs.md, row 18). The wrapper sends fp16/bf16 calls on the CPU whose gradients are wanted to the
    math backend (_cpu_half_backward); the CPU forward stays SDPA's own choice.
Everything else matches: q (B, H, Nq, D), k and v (B, H, Nk, D), any strides, scale defaulting to
1/sqrt(D), the output in q's dtype. Two of protocol v3's features are SDPA's own: grouped-query heads (k and v
with Hkv heads, H a multiple of Hkv: SDPA's enable_gqa=True, torch >= 2.5, the protocol's head map h // (H // Hkv))
and a value head dim of its own (v of head dim Dv != D); verify finds both by probing. SDPA has no out= and no log-sum-exp, so verify reports the output
guard as a reduced check and does not judge the log-sum-exp.
"""
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def attention(q, k, v, *, causal=False, scale=None):
    """q: (B, H, Nq, D); k: (B, Hkv, Nk, D), v: (B, Hkv, Nk, Dv), H a multiple of Hkv; one float dtype and device.
    Returns (B, H, Nq, Dv)."""
    # SDPA's memory-efficient CUDA kernel needs rows aligned to 8 elements ("cutlassF: no kernel found to
    # launch!" on the H200 for a row pitch of D + 3), and it checks the stride of a length-1 sequence too
    # ("query is not correctly aligned (strideM)" for q of shape (1, 1, 1, 4) with strides (4, 4, 1, 1), which
    # torch calls contiguous, so .contiguous() keeps it): hand it fresh row-major copies; the protocol allows
    # any strides.
    q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    backends = (sdpa_kernel(SDPBackend.MATH) if (scale is not None and scale <= 0) or _huge_scores(q, k, scale)
                or _cpu_half_backward(q, k, v) else contextlib.nullcontext())
    # grouped-query heads: SDPA's enable_gqa (only when the head counts differ: torch < 2.5 has no such keyword)
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    with backends:
        if not causal:
            return _contiguous_grad(F.scaled_dot_product_attention(q, k, v, scale=scale, **gqa))
        Nq, Nk = q.shape[-2], k.shape[-2]
        # query i sees key j iff j <= i + (Nk - Nq): the lower triangle shifted right by Nk - Nq
        sees = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).tril(Nk - Nq)
        # an additive mask: cuDNN lets keys of a boolean mask through once scores are large (found-bugs row 8)
        mask = torch.zeros(Nq, Nk, dtype=q.dtype, device=q.device).masked_fill(~sees, float("-inf"))
        out = _contiguous_grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa))
    return out.masked_fill(~sees.any(dim=-1, keepdim=True), 0.0)


class _ContiguousGrad(torch.autograd.Function):
    """The identity; its backward passes on a contiguous copy of the output gradient (found-bugs row 17)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _contiguous_grad(out):
    return _ContiguousGrad.apply(out) if out.requires_grad else out


def _cpu_half_backward(q, k, v):
    """Whether this is an fp16/bf16 call on the CPU whose gradients will be asked for: SDPA's CPU flash kernel's
    backward drifts with the number of query blocks there (found-bugs row 18), the math backend's does not."""
    return (q.device.type == "cpu" and q.dtype in (torch.float16, torch.bfloat16) and torch.is_grad_enabled()
            and any(t.requires_grad for t in (q, k, v)))


def _huge_scores(q, k, scale):
    """Whether some scaled score can reach 1e6 (a bound, computed in fp32: max|q| * max|k| * D * |scale|)."""
    if q.numel() == 0 or k.numel() == 0:
        return False
    D = q.shape[-1]
    s = 1.0 / D ** 0.5 if scale is None else abs(scale)
    return float(q.detach().abs().amax().float()) * float(k.detach().abs().amax().float()) * D * s >= 1e6
