"""The Triton kernels under test: ``fused`` (FlashAttention-2 forward) and ``unfused`` (three-kernel baseline).

Both implement the attention protocol (docs/design.md)::

    attention(q, k, v, *, causal=False, scale=None, out=None, return_lse=False,
              block_m=None, block_n=None) -> out | (out, lse)

Import the modules directly (``from flashcheck.kernel import fused``); this package imports nothing eagerly so that
the backend (GPU or Triton's interpreter) can be chosen before Triton is loaded.
"""
