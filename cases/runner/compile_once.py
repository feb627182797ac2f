"""A Triton cache manager under which a kernel specialisation that several processes want at once is compiled by one
of them, while the others wait for it and load it from the cache.

Triton looks a specialisation up in its cache, compiles it on a miss and stores it at the end; nothing stops two
processes that miss the same key at the same time from both compiling it. On a GPU that is the normal case for a
cold run: the suite's 16 pytest workers, and verify's workers, start on the same kernels together, and a
specialisation of the fused kernel costs about 1.2 s of CPU (H200 host: ptxas 0.5, LLVM 0.4, MLIR passes 0.2), the
launcher's C stub more. Here the first process to miss a key takes an exclusive lock on a file in that key's cache
directory (flock: the kernel releases it when the holder exits or dies) and holds it until it stores the result; a
process that misses the same key waits for the lock, looks again and finds the result. A compile that fails stores
nothing: its lock goes with the next compile of that thread, with release() (flashcheck calls it after each case),
or with the process; a waiter gives up after WAIT seconds and compiles on its own, as without this manager.

flashcheck selects it (TRITON_CACHE_MANAGER) only for its own cache directory, never over a manager of the user's.
"""
import fcntl
import os
import threading
import time

from triton.runtime.cache import FileCacheManager

WAIT = 120.0          # seconds a process waits for another's compile before compiling on its own
LOCK = "compiling.lock"
_local = threading.local()     # .held: this thread's locks of compiles not yet stored, [fd] cells ([None]: closed)


def _held():
    if not hasattr(_local, "held"):
        _local.held = []
    return _local.held


def release():
    """Releases this thread's locks of compiles that ended without storing (an error)."""
    held = _held()
    while held:
        _close(held.pop())


def _close(cell):
    if cell[0] is not None:
        os.close(cell[0])
        cell[0] = None


class CompileOnce(FileCacheManager):
    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self._locking = not (override or dump)
        self._pending = None      # the file whose put ends this process's compile
        self._fd = None

    def get_group(self, filename):
        group = super().get_group(filename)
        if group is None and self._locking and self._wait_for_lock():
            group = super().get_group(filename)
            if group is None:
                self._pending = f"__grp__{filename}"         # what put_group stores last
            else:
                self._release()
        return group

    def get_file(self, filename):
        path = super().get_file(filename)
        if path is None and self._locking and filename.endswith(".so") and self._wait_for_lock():
            path = super().get_file(filename)                # a launcher stub (runtime/build.py)
            if path is None:
                self._pending = filename
            else:
                self._release()
        return path

    def put(self, data, filename, binary=True):
        try:
            return super().put(data, filename, binary=binary)
        finally:
            if filename == self._pending:
                self._release()

    def _wait_for_lock(self):
        """Whether this process now holds the key's lock (False: waited WAIT seconds, or no lock can be had)."""
        release()             # a compile of this process that never stored has ended
        try:
            fd = os.open(os.path.join(self.cache_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return False
        deadline = time.monotonic() + WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    return False
                time.sleep(0.02)
            except OSError:   # a file system without flock
                os.close(fd)
                return False
        self._fd = [fd]
        _held().append(self._fd)
        return True

    def _release(self):
        self._pending = None
        if self._fd is not None:
            _held()[:] = [cell for cell in _held() if cell is not self._fd]
            _close(self._fd)
            self._fd = None
