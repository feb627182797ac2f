"""Machine-wide worker slots: verify's default --jobs counts the cores that other flashcheck runs on this machine
are not already using.

One lock file per core in the temporary directory (flashcheck-slots-<uid>); a run holds an flock on one for each
worker it starts, and the kernel releases them when the run ends or its process dies, however it dies. Without
them, N runs started side by side on one machine (a CI matrix, a reviewer's batch) each took one worker per core:
15 runs on 16 cores made 240 worker processes, each with torch imported and, on a GPU, a CUDA context of its own
(host memory and device memory for 16 runs of 16, where 16 workers in all keep every core busy). Now the first run
takes what is free and the later ones what is left, never fewer than one worker. An explicit --jobs N is kept as
given (its slots are taken where free, so that later runs see them used). Where flock or the directory is not
available, nothing is counted (claim returns None) and the default stays one worker per core.
"""
import os
import tempfile

try:
    import fcntl
except ImportError:          # not on this platform: no slots, the default as before
    fcntl = None


class Slots:
    """The slot files one run holds (closing a file releases its lock)."""

    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def release(self):
        for f in self.files:
            f.close()
        self.files = []


def directory():
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"flashcheck-slots-{uid}")


def claim(count, total):
    """Up to `count` of the machine's `total` slots, each held until release() or this process's end; None where
    slots cannot be kept here."""
    if fcntl is None:
        return None
    where = directory()
    try:
        os.makedirs(where, exist_ok=True)
    except OSError:
        return None
    held = []
    for i in range(total):
        if len(held) >= count:
            break
        try:
            f = open(os.path.join(where, str(i)), "a")
        except OSError:
            for g in held:
                g.close()
            return None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:       # held by another run
            f.close()
            continue
        held.append(f)
    return Slots(held)
