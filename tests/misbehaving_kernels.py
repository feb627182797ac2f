"""An attention "kernel" that misbehaves on purpose, for tests/test_verify.py: verify must give each
misbehaviour its named failure and carry on with the next case.

The head dim selects the misbehaviour (MISBEHAVIOURS); any other head dim gets the right answer (float64
PyTorch, rounded to the input dtype), so a case of another head dim after a hang or a crash shows that verify
recovered. It accepts out= so that a write outside the output can be seen (the oracle guards a given out).
"""
import ctypes
import time

from flashcheck.reference import torch_ref

# head dim -> (what the kernel does, the failure kind verify must report)
MISBEHAVIOURS = {
    1: ("raises", "exception"),
    2: ("wrong_shape", "bad return"),
    3: ("wrong_dtype", "bad return"),
    4: ("non_tensor", "bad return"),
    5: ("wrong_device", "bad return"),
    6: ("writes_input", "input written"),
    7: ("writes_past_output", "out-of-bounds write"),
    8: ("returns_nan", "NaN"),
    9: ("hangs", "timeout"),
    10: ("segfaults", "crash"),   # a crash on the GPU too: a host segfault is no device fault
}


def attention(q, k, v, *, causal=False, scale=None, out=None):
    how = MISBEHAVIOURS.get(q.shape[-1], ("correct", None))[0]
    if how == "raises":
        raise RuntimeError("deliberate failure inside the kernel")
    if how == "hangs":
        time.sleep(3600)
    if how == "segfaults":
        ctypes.string_at(0)   # reads address 0: SIGSEGV, the process dies
    if how == "writes_input":
        q.mul_(2.0)           # a classic: scaling q in place
        scale = (1.0 / q.shape[-1] ** 0.5 if scale is None else scale) / 2.0
    result = torch_ref.attention(q, k, v, causal, scale, upcast=True)[0].to(q.dtype)
    if how == "returns_nan":
        result[..., -1, 0] = float("nan")
    if how == "wrong_shape":
        return result[:, :, :-1]
    if how == "wrong_dtype":
        return result.double()
    if how == "non_tensor":
        return result.tolist()
    if how == "wrong_device":
        return result.to("meta")
    if out is None:
        return result
    out.copy_(result)
    if how == "writes_past_output":
        # one element past the view's last element, through the underlying storage
        last = out.storage_offset() + sum((n - 1) * s for n, s in zip(out.shape, out.stride()))
        out.as_strided((1,), (1,), last + 1).fill_(0.0)
    return out
