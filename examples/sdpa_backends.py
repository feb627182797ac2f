"""Each backend of PyTorch's scaled_dot_product_attention, forced and wrapped honestly, for `flashcheck verify`
on the GPU (docs/found-bugs.md has what it found):

    flashcheck verify examples/sdpa_backends.py:flash       # FlashAttention-2 inside PyTorch
    flashcheck verify examples/sdpa_backends.py:efficient   # the memory-efficient (cutlass) kernel
    flashcheck verify examples/sdpa_backends.py:cudnn       # cuDNN's fused attention
    flashcheck verify examples/sdpa_backends.py:math        # the unfused reference, in the input dtype

Honest means: SDPA's own conventions are declared, not bridged, and nothing is fixed. Its causal mode is
is_causal=True, aligned top-left, so each function declares causal_align="top-left" (flashcheck then judges
it against a top-left reference). When the dispatcher declines an input for the forced backend ("No available
kernel"), the wrapper raises NotImplementedError with PyTorch's reason, so verify reports the case as
unsupported instead of failed. Every other exception, and every wrong answer, is SDPA's.
"""
import warnings

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def _sdpa(backend, q, k, v, causal, scale):
    with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
        warnings.simplefilter("always")
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        except RuntimeError as exc:
            if "No available kernel" not in str(exc):
                raise
            # PyTorch warns once per backend it tried ("... not used because:", "... runtime disabled"), then once
            # per reason: keep the reasons
            lines = [str(w.message).splitlines()[0] for w in caught]
            reasons = [ln for ln in lines if not ln.rstrip().endswith("because:") and "runtime disabled" not in ln]
            why = "; ".join(dict.fromkeys(reasons)) or str(exc).splitlines()[0]
            raise NotImplementedError(f"SDPA {backend.name} declines this input: {why}") from None


def flash(q, k, v, *, causal=False, scale=None):
    return _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal, scale)


def efficient(q, k, v, *, causal=False, scale=None):
    return _sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v, causal, scale)


def cudnn(q, k, v, *, causal=False, scale=None):
    return _sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal, scale)


def math(q, k, v, *, causal=False, scale=None):
    return _sdpa(SDPBackend.MATH, q, k, v, causal, scale)


for _fn in (flash, efficient, cudnn, math):
    _fn.flashcheck_declarations = {"causal_align": "top-left"}
