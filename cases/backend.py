"""Backend choice: the compiled GPU path, or Triton's interpreter on the CPU.

Must run before Triton is imported: TRITON_INTERPRET is read when a kernel is decorated. FLASHCHECK_BACKEND
(cpu | gpu) forces a choice; otherwise CUDA is used when a GPU is visible. Under pytest-xdist each worker
is pinned to one GPU (worker n -> GPU n mod count), through CUDA_VISIBLE_DEVICES, before CUDA starts.
"""
import os
import sys
import threading


class BackendError(Exception):
    """The backend asked for cannot be had (a usage error: the CLI exits with 2)."""


def _visible_gpu_ids():
    """The GPU ids this process may use, counted through NVML so that CUDA is not initialised yet."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch   # lazy: this module is the first the CLI and the plugin import, before anything needs torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = torch.cuda.device_count()
    if listed:
        ids = [x.strip() for x in listed.split(",") if x.strip()]
        return ids[:count]
    return [str(i) for i in range(count)]


def select_backend():
    """Choose and set up the backend; returns "gpu" or "cpu". Idempotent."""
    chosen = os.environ.get("FLASHCHECK_BACKEND", "").lower()
    if chosen not in ("", "cpu", "gpu"):
        raise BackendError(f"FLASHCHECK_BACKEND must be cpu or gpu, got {chosen!r}")
    if chosen == "cpu" and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # a kernel module imported under the other backend keeps it; say so instead of mixing the two
        print("flashcheck: triton was imported before the backend was chosen", file=sys.stderr)
    ids = [] if chosen == "cpu" else _visible_gpu_ids()
    if chosen == "cpu" or (not chosen and not ids):
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["FLASHCHECK_BACKEND"] = "cpu"
        quicken_interpreter()
        return "cpu"
    if not ids:
        raise BackendError("the GPU backend was asked for (--backend gpu or FLASHCHECK_BACKEND=gpu), but torch sees no "
                           "CUDA device here (torch.cuda.is_available() is False); run on a machine with a GPU, "
                           "or use --backend cpu (Triton's interpreter)")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and len(ids) > 1 and "FLASHCHECK_PINNED" not in os.environ:
        n = int(worker[2:])
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[n % len(ids)]
        os.environ["FLASHCHECK_PINNED"] = ids[n % len(ids)]
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["FLASHCHECK_BACKEND"] = "gpu"
    return "gpu"


def quicken_interpreter():
    """Make Triton's interpreter patch triton.language once per launch. It patches the language (inspect.getmembers
    over triton.language, its tensor, math and core) when a kernel is launched, restoring it when the launch ends,
    and again, never restored, at every call of a @triton.jit helper from inside the kernel (triton 3.9): a fused
    kernel calling its helpers in the key loop spent 26 % of a property test there (cProfile, 82 s). Inside a
    launch the language is patched already, so a helper's call skips it when the language modules its globals
    hold were patched in this launch; the launch itself, and a helper whose module holds others, patch as before.
    Outputs are bitwise the same. Where the interpreter has another shape (other Triton versions), it is left
    as it is. Idempotent."""
    from triton.runtime import interpreter   # lazy: only on the CPU backend, after TRITON_INTERPRET is set

    real, grid = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "GridExecutor", None)
    if real is None or grid is None or getattr(real, "flashcheck", False) or not hasattr(interpreter, "tl"):
        return
    lang = (interpreter.tl, interpreter.tl.core)
    state = threading.local()      # per thread: the language modules patched in the launch under way

    class _Patched:
        def restore(self):
            pass

    def patch_lang(fn):
        langs = frozenset(id(v) for v in fn.__globals__.values() if any(v is m for m in lang))
        done = getattr(state, "done", None)
        if done is not None and langs <= done:
            return _Patched()
        scope = real(fn)
        if done is not None:
            state.done = done | langs
        return scope

    launch = grid.__call__

    def call(self, *args, **kwargs):
        outer = getattr(state, "done", None)
        state.done = frozenset()
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.done = outer

    patch_lang.flashcheck, patch_lang.real = True, real
    interpreter._patch_lang = patch_lang
    grid.__call__ = call


CU_CTX_SCHED_BLOCKING_SYNC = 0x04


def sleep_while_waiting():
    """Make this process's waits for the GPU sleep until the device is done, instead of spinning on a core: the
    primary contexts' scheduling flag CU_CTX_SCHED_BLOCKING_SYNC, set through the driver before CUDA's first use
    here. CUDA's default spins whenever a process holds fewer contexts than the machine has cores, so each of the
    many processes the suite and verify's workers run beside each other on one GPU burned a core for as long as
    it waited, its kernels queued behind the other processes' on the time-sliced device (a cost of the host
    only: the kernels and their timing on the device are the same). Only for processes flashcheck owns (a
    runner's child, the suite's pytest processes): cuInit must not run in a process that forks later (the
    runner's server). Returns whether the flag was set; anything missing (no driver, an old one) leaves CUDA's
    default."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or getattr(cuda, "cuDevicePrimaryCtxSetFlags",
                                                                                 None)
    count, dev = ctypes.c_int(0), ctypes.c_int(0)
    if set_flags is None or cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    done = [cuda.cuDeviceGet(ctypes.byref(dev), i) == 0 and set_flags(dev, CU_CTX_SCHED_BLOCKING_SYNC) == 0
            for i in range(count.value)]
    return bool(done) and all(done)


# glibc's malloc parameters (malloc.h): M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MMAP_BELOW = 64 << 20         # allocations up to this size come from the heap, not a fresh mapping each
KEEP_FREED = 256 << 20        # free memory the heap keeps at its top before handing it back
TOP_PAD = 64 << 20            # and takes in advance when it grows


def keep_freed_memory():
    """Make this process's malloc (glibc) reuse the memory it frees instead of mapping it afresh. The oracle's
    float64 temporaries (a case's scores, weights and their bounds, for the reference and for each property's
    transformed run) are allocated and freed thousands of times in a run, and under glibc's defaults much of that
    memory went back to the system and came back as fresh pages the kernel zeroed. On a 2-core CPU, the oracle's
    expectation of a causal fp16 case (H = 2, D = 64, 256 queries and keys) five times: 199,000 page faults, 0.6 s
    of system CPU and 1.16 s, against 11,000, 0.02 s and 0.54 s with it (512 queries and keys: 3.9 s against
    2.0 s); `flashcheck verify examples/sdpa_attention.py:attention`, paired, four runs each: 0.91 times the wall
    time (17.6 s against 18.9 s, medians), system CPU 5.2 s against 6.8 s, and its largest process 1.68 GB at its
    peak against 1.29 GB. For processes flashcheck owns (the command, the runner's server, whose children
    inherit it, the suite's processes); a process keeps up to KEEP_FREED + TOP_PAD more than it uses. Returns
    whether it was set (only glibc has these parameters)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt, _ = libc.mallopt, libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in ((_M_MMAP_THRESHOLD, MMAP_BELOW),
                                                               (_M_TRIM_THRESHOLD, KEEP_FREED),
                                                               (_M_TOP_PAD, TOP_PAD)))


def backend():
    """The backend chosen by select_backend() ("gpu" or "cpu")."""
    return os.environ.get("FLASHCHECK_BACKEND") or select_backend()


def device():
    """The torch device the active backend runs kernels on."""
    return "cuda" if backend() == "gpu" else "cpu"


def describe():
    """One line: backend, device name, torch and triton versions (for reports and benchmarks)."""
    # lazy: Triton reads TRITON_INTERPRET when imported, so only after select_backend()
    import torch
    import triton

    if backend() == "gpu":
        name = torch.cuda.get_device_name()
        pinned = os.environ.get("FLASHCHECK_PINNED")
        where = f"GPU {name}" + (f" (CUDA_VISIBLE_DEVICES={pinned})" if pinned else "")
    else:
        where = "CPU (Triton interpreter)"
    return f"{where}, torch {torch.__version__}, triton {triton.__version__}"
