"""Backend choice: the compiled GPU path, or Triton's interpreter on the CPU.

Must run before Triton is imported: TRITON_INTERPRET is read when a kernel is decorated. FLASHCHECK_BACKEND
(cpu | gpu) forces a choice; otherwise CUDA is used when a GPU is visible. Under pytest-xdist each worker
is pinned to one GPU (worker n -> GPU n mod count), through CUDA_VISIBLE_DEVICES, before CUDA starts.
"""
import os
import sys


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
