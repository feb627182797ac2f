"""The CPU backend's interpreter (cases/backend.py: quicken_interpreter): Triton's interpreter patches triton.language
once per launch, not again at every call of a @triton.jit helper inside the kernel, and kernels give bitwise the
same results as under Triton's own patching; and processes flashcheck owns reuse the memory they free
(keep_freed_memory)."""
import os

import pytest
import torch
import triton
import triton.language as tl

from flashcheck.cases import inputs as inp
from flashcheck.cases.case import Case
from flashcheck.kernel import fused


@pytest.fixture
def interpreter(backend):
    if backend != "cpu":
        pytest.skip("the interpreter is the CPU backend's (on the GPU, kernels compile)")
    from triton.runtime import interpreter
    if not getattr(interpreter._patch_lang, "flashcheck", False):
        pytest.fail("select_backend() chose the CPU but left Triton's interpreter as it was (quicken_interpreter)")
    return interpreter


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _doubled(X, N: tl.constexpr):
    x = tl.load(X + tl.arange(0, 16))
    for _ in range(N):
        x = _twice(x)
    tl.store(X + tl.arange(0, 16), x)


def _patches(interpreter, monkeypatch, n):
    calls = []
    real = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.ones(16)
    _doubled[(1,)](x, n)
    assert torch.equal(x, torch.full((16,), 2.0 ** n))
    monkeypatch.setattr(interpreter, "_patch_builtin", real)
    return len(calls)


def test_a_launch_patches_the_language_once_whatever_its_helpers_calls(interpreter, monkeypatch):
    once = _patches(interpreter, monkeypatch, 0)
    assert once > 0
    assert _patches(interpreter, monkeypatch, 8) == once
    # Triton's own: once more per helper call
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.real)
    assert _patches(interpreter, monkeypatch, 8) == 9 * once


def test_the_fused_kernel_is_bitwise_as_under_tritons_own_patching(interpreter, monkeypatch):
    case = Case("quick", B=2, H=4, Hkv=2, Nq=37, Nk=70, D=24, causal=True, window=(9, 3), softcap=20.0, seed=3,
                dtype="fp16")
    q, k, v = inp.values(case)
    kw = dict(causal=True, window=(9, 3), softcap=20.0, return_lse=True)
    out, lse = fused.attention(q, k, v, **kw)
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.real)
    out0, lse0 = fused.attention(q, k, v, **kw)
    assert torch.equal(out, out0) and torch.equal(lse, lse0)


def test_freed_memory_is_reused_instead_of_mapped_again():
    """cases/backend.py keep_freed_memory: a process flashcheck owns reuses the memory it frees. The oracle's
    expectation of a causal fp16 case of 128 queries and keys, made five times after a first: about 41,000 page
    faults under glibc's defaults (fresh mappings, zeroed by the kernel, for its float64 temporaries) and under
    3,000 with it (glibc only: elsewhere the function says it did nothing)."""
    import subprocess
    import sys

    probe = ("import resource, sys\n"
             "from flashcheck.cases.backend import keep_freed_memory\n"
             "kept = keep_freed_memory() if sys.argv[1] == '1' else None\n"
             "from flashcheck.cases import inputs, oracle\n"
             "from flashcheck.cases.case import Case\n"
             "case = Case('probe', H=2, Nq=128, Nk=128, D=64, dtype='fp16', causal=True, seed=1)\n"
             "qkv = inputs.values(case)\n"
             "oracle.expectation(case, qkv, 'cpu')\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
             "for _ in range(5):\n"
             "    oracle.expectation(case, qkv, 'cpu')\n"
             "print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    env = {**os.environ, "FLASHCHECK_BACKEND": "cpu"}
    faults = {}
    for kept in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", probe, kept], capture_output=True, text=True, timeout=300,
                             env=env)
        assert out.returncode == 0, out.stderr
        faults[kept] = out.stdout.split()
    if faults["1"][0] != "True":
        pytest.skip("not glibc: malloc's parameters cannot be set here")
    assert int(faults["1"][1]) * 5 < int(faults["0"][1]), faults
