"""The failure vocabulary: one enumeration of what can go wrong, and one classifier of exceptions and
process deaths, used alike by verify, the bug corpus and the power measurement.

A Kind is a str (its value is the name reports print), so JSON and JUnit carry it as plain text.
"""
import enum


class Kind(str, enum.Enum):
    # (value, one-letter code of the kill matrix, what it means)
    MISMATCH = ("mismatch", "M", "an output element is further from the float64 reference than its tolerance")
    NAN = ("NaN", "N", "a NaN or inf where the reference is finite")
    UNWRITTEN = ("unwritten", "U", "an output element still holds the poison it started with: never written")
    OOB_READ = ("out-of-bounds read", "R", "a NaN that comes from the guard bands around q, k, v")
    OOB_WRITE = ("out-of-bounds write", "W", "memory around the output (or an input) changed")
    INPUT_WRITTEN = ("input written", "I", "q, k or v changed")
    EXCEPTION = ("exception", "E", "the kernel raised")
    COMPILE_ERROR = ("compile error", "C", "Triton (or torch.compile) could not compile the kernel")
    DEVICE_FAULT = ("device fault", "D", "a CUDA error: illegal address, launch failure, device-side trap")
    CRASH = ("crash", "X", "the process running the kernel died (a signal, an abort)")
    BAD_RETURN = ("bad return", "B", "not a tensor of the right shape, dtype and device")
    HAND_VALUE = ("hand value", "H", "an exact hand-computed answer (7.5) is not bit-exact")
    LSE = ("lse", "L", "the log-sum-exp is off")
    INVARIANT = ("invariant", "V", "a relation every correct kernel satisfies does not hold (a property)")
    TIMEOUT = ("timeout", "T", "no answer within the time limit")
    NONDETERMINISTIC = ("nondeterministic", "Q", "identical calls gave different bits (--repeat)")
    MEMCHECK = ("memcheck", "K", "compute-sanitizer memcheck reported an error (--sanitize)")
    MEMORY = ("memory complexity", "Y", "extra memory grows like Nq x Nk in a kernel declared --fused")
    LEAK = ("leak", "S", "a sequence's output changed when another sequence's inputs did (varlen, paged)")
    GRADIENT = ("gradient", "G", "a gradient of the backward (autograd) is off, missing or not of its input's shape")

    def __new__(cls, value, code, meaning):
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.code = code
        obj.meaning = meaning
        return obj

    def __str__(self):
        return self.value

    __format__ = str.__format__


CUDA_FAULT_TEXT = ("illegal memory access", "an illegal instruction", "unspecified launch failure",
                   "device-side assert", "misaligned address", "CUDA error", "cudaError", "CUDA_ERROR")


def names_cuda_fault(text):
    """Whether a text (an exception's, a traceback's, a dead worker's last words) names a CUDA error."""
    return any(s in (text or "") for s in CUDA_FAULT_TEXT)


def _chain(exc):
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _is_compile_error(exc):
    """Compilation failures by the exception's type (and the types it was raised from), never by its text."""
    for e in _chain(exc):
        for cls in type(e).__mro__:
            mod, name = cls.__module__ or "", cls.__name__
            if mod.startswith("triton.compiler") or name in ("CompilationError", "CompileTimeAssertionFailure",
                                                             "BackendCompilerFailed", "InductorError"):
                return True
    return False


def classify_exception(exc):
    """(Kind, one-line text) of an exception raised by (or while calling) a kernel."""
    text = f"{type(exc).__name__}: {exc}"
    if _is_compile_error(exc):
        return Kind.COMPILE_ERROR, text
    if any(names_cuda_fault(str(e)) for e in _chain(exc)):
        return Kind.DEVICE_FAULT, text
    return Kind.EXCEPTION, text


def classify_escaped(text):
    """Kind of an exception that escaped the judging of a case, known only by its traceback's text (from a worker):
    a device fault when it names a CUDA error (the kernel's, reported at a later CUDA call), else an exception."""
    return Kind.DEVICE_FAULT if names_cuda_fault(text) else Kind.EXCEPTION


def classify_death(signal_number, log_tail=""):
    """Kind of a worker process that died: a device fault when its last words name a CUDA error, else a
    crash (a segfault or an abort, on the CPU or the GPU alike)."""
    return Kind.DEVICE_FAULT if names_cuda_fault(log_tail) else Kind.CRASH


class Unsupported(NotImplementedError):
    """Raise it (or NotImplementedError) from a kernel for an input it does not support: the case is reported
    as unsupported, with the message, never passed and never failed."""


OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "CUBLAS_STATUS_ALLOC_FAILED")


def is_out_of_memory(exc):
    """An exception that says the device (or the host) ran out of memory."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in OOM_TEXT)
