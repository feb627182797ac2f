"""Kernels that fault the GPU on purpose (illegal address), for the fault-isolation tests. GPU only."""
import torch
import triton
import triton.language as tl


@triton.jit
def _store_far_away(Out, FAR: tl.constexpr):
    tl.store(Out + FAR + tl.arange(0, 16), tl.zeros([16], dtype=tl.float32))


def attention(q, k, v, *, causal=False, scale=None):
    """Follows the protocol's signature, then writes 2^40 elements past its output: a sticky CUDA error."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    _store_far_away[(1,)](out, FAR=1 << 40)
    torch.cuda.synchronize()
    return out.to(q.dtype)
