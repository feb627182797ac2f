"""The compile caches verify's workers share, across workers and across runs.

A Triton kernel is compiled for every specialisation it meets (its head dim and tiles, the divisibility of its
integer arguments and pointers), an autotuned one tunes again for every new key, and torch.compile traces anew:
most of a cold verify of a Triton kernel is compiling. Triton and TorchInductor keep what they compiled on disk
when told where. flashcheck owns one directory for both (FLASHCHECK_CACHE_DIR, default $XDG_CACHE_HOME/flashcheck
or ~/.cache/flashcheck), given to every worker, so a second, unchanged run finds its kernels compiled (a warm run)
and a case's kernels compiled by one worker serve the others. A user's own TRITON_CACHE_DIR or
TORCHINDUCTOR_CACHE_DIR is kept. --no-cache gives a run a fresh, temporary directory instead (a cold run).
CUDA's own cache of the kernels its driver compiles at run time (~/.nv/ComputeCache, or $CUDA_CACHE_PATH) is not
flashcheck's, and neither --no-cache nor an empty FLASHCHECK_CACHE_DIR empties it: on a fresh H200 machine the SDPA
example's tests and the fused kernel's fp16 catalogue took 50.5 s with it empty and 30.6 s with it filled by that
first run (flashcheck's caches empty both times).

Python's own bytecode goes there too where Python would keep none: torch installed without it (no __pycache__
beside its sources, as uv and `pip --no-compile` install) in an environment that forbids writing it
(PYTHONDONTWRITEBYTECODE, set in many container images: the H200 machine's is one). Every process flashcheck starts
(verify's workers, the test suite's) then compiled torch's, sympy's and Triton's sources again: import torch, triton
took 3.3-3.5 s there, and 1.6 s with the bytecode kept in <dir>/pycache (PYTHONPYCACHEPREFIX), outside the source
trees. An install that has its bytecode is left as it is (a prefix would make Python ignore that bytecode).
"""
import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field


def default_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("FLASHCHECK_CACHE_DIR") or os.path.join(base, "flashcheck")


def _torch_without_bytecode():
    """torch installed without its bytecode (no __pycache__ beside its sources), found without importing it."""
    spec = importlib.util.find_spec("torch")
    return bool(spec and spec.origin) and not os.path.isdir(os.path.join(os.path.dirname(spec.origin), "__pycache__"))


def bytecode_env():
    """The environment that keeps the bytecode of the processes flashcheck starts in its cache directory, or {}
    where Python keeps it already (see the module docstring)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX") \
            or not _torch_without_bytecode():
        return {}
    return {"PYTHONPYCACHEPREFIX": os.path.join(default_dir(), "pycache"), "PYTHONDONTWRITEBYTECODE": ""}


def keep_bytecode():
    """For a process flashcheck owns (its command, the test suite), before it imports torch: bytecode_env for
    this process's own imports and for everything it starts."""
    env = bytecode_env()
    if env:
        os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = env["PYTHONPYCACHEPREFIX"]
        del os.environ["PYTHONDONTWRITEBYTECODE"]
        sys.dont_write_bytecode = False


@dataclass
class Cache:
    """The directories a run's workers compile into (env: what they get in their environment)."""
    root: str
    env: dict = field(default_factory=dict)
    temporary: bool = False
    before: int = 0

    @classmethod
    def open(cls, enabled=True):
        if enabled:
            root = default_dir()
            try:
                os.makedirs(root, exist_ok=True)
            except OSError:        # an unwritable home: a run still works, only cold
                root, enabled = tempfile.mkdtemp(prefix="flashcheck-cache-"), False
        else:
            root = tempfile.mkdtemp(prefix="flashcheck-cache-")
        env = bytecode_env()      # a process that did not keep_bytecode() itself: verify() from a user's Python
        for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
            if enabled and os.environ.get(var):
                continue           # the user's own choice stands
            env[var] = os.path.join(root, sub)
        cache = cls(root, env, temporary=not enabled)
        cache.before = cache.kernels()
        return cache

    @property
    def triton_dir(self):
        return self.env.get("TRITON_CACHE_DIR") or os.environ.get("TRITON_CACHE_DIR") or ""

    def kernels(self):
        """How many compiled Triton kernels the cache holds (one directory each)."""
        try:
            return sum(1 for e in os.scandir(self.triton_dir) if e.is_dir())
        except OSError:
            return 0

    def line(self):
        """What the summary line says about the cache."""
        if self.temporary:
            return f"compile cache none (--no-cache: {self.kernels()} kernel(s) compiled)"
        return f"compile cache {self.triton_dir or self.root} ({self.kernels() - self.before} new, {self.before} before)"

    def close(self):
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)
