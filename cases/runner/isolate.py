"""Run the kernel under test where it can be killed: one long-lived worker process per target.

The worker imports the target once (importing Triton and the kernel costs seconds on the CPU, so it is
paid once, not per case), then judges the cases it is sent over a pipe, one at a time, and sends back the
verdicts. A case that takes longer than the timeout, or a worker that dies (a segfault, an abort, or on
the GPU a device fault, after which CUDA refuses every further call in that process), is a named failure
of that case; the worker is started afresh for the next case.

Protocol: length-prefixed pickles over the worker's stdin and the file descriptor that was its stdout.
The worker moves its own stdout onto stderr first, so whatever the kernel prints cannot corrupt a frame;
stdout and stderr go to a log file whose tail is quoted when the worker dies or hangs.

Also here: loading a target ("MODULE:FUNCTION" or "path/to/file.py:FUNCTION"), shared by the worker and
the in-process mode (--no-isolate).
"""
import importlib
import importlib.util
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback

_HEADER = struct.Struct(">Q")
# The worker starts in the user's directory (a target "my_pkg.attn:forward" is imported from there), but
# flashcheck itself must come from where this process got it, never from a same-named folder of the user's:
# the directory holding the flashcheck package goes first on the worker's path.
_FLASHCHECK_HOME = os.path.dirname(os.path.dirname(importlib.util.find_spec("flashcheck").origin))


def python_command(code):
    """argv of a fresh interpreter that runs `code` with this flashcheck first on its path."""
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {_FLASHCHECK_HOME!r}); {code}"]
# Importing torch, Triton and the target can take a while on a loaded machine; a hang here is still an error.
START_TIMEOUT = 300.0


class TargetError(Exception):
    """The target cannot be used: bad MODULE:FUNCTION, file missing, import failed, not callable."""


def split_target(spec):
    """("module or absolute .py path", "attribute.path") of a target, checked as far as possible without
    importing anything. Raises TargetError."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise TargetError(f"target {spec!r} is not MODULE:FUNCTION (e.g. flashcheck.kernel.fused:attention or "
                          f"examples/buggy_attention.py:attention)")
    if not all(part.isidentifier() for part in attr.split(".")):
        raise TargetError(f"target {spec!r}: {attr!r} is not a function name")
    if module.endswith(".py") or os.sep in module or "/" in module:
        path = os.path.abspath(module)
        if not module.endswith(".py"):
            raise TargetError(f"target {spec!r}: a path must name a .py file")
        if not os.path.isfile(path):
            raise TargetError(f"target {spec!r}: file {module} does not exist")
        return path, attr
    if not all(part.isidentifier() for part in module.split(".")):
        raise TargetError(f"target {spec!r}: {module!r} is neither a module name nor a .py path")
    return module, attr


def load_target(spec):
    """Import the target's module and return the callable. Raises TargetError with a readable reason."""
    module_ref, attr = split_target(spec)
    try:
        if module_ref.endswith(".py"):
            module = _import_file(module_ref)
        else:
            # like `python -m`: the current directory is importable, also through the installed script
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_ref)
    except (Exception, SystemExit) as exc:  # whatever the target's import raises is a usage error
        # the innermost frame of the target's own code (not of importlib) says where it went wrong
        machinery = (os.path.abspath(__file__), os.path.dirname(os.path.abspath(importlib.__file__)))
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(machinery)]
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        raise TargetError(f"cannot import {module_ref}: {type(exc).__name__}: {exc}{where}") from None
    obj = module
    for name in attr.split("."):
        if not hasattr(obj, name):
            raise TargetError(f"{module_ref} has no attribute {attr!r}")
        obj = getattr(obj, name)
    if not callable(obj):
        raise TargetError(f"{module_ref}:{attr} is a {type(obj).__name__}, not callable")
    return obj


def _import_file(path):
    """Import a .py file as a module named after it (its directory becomes importable, as for a script)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() and stem not in sys.modules else f"_flashcheck_target_{abs(hash(path))}"
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    return import_file_as(path, name)


def import_file_as(path, name):
    """Execute the .py file at `path` as the module `name` (also used for the bug corpus's mutants)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # registered before it runs: dataclasses and Triton's source lookup find their module by name
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def judge_safely(kernel, case, target):
    """oracle.judge, with anything that escapes it turned into a failure of this case (the oracle names
    what it knows; a kernel can still surprise it, e.g. by calling sys.exit)."""
    from flashcheck.cases import oracle

    try:
        return oracle.judge(kernel, case, target=target)
    except (Exception, SystemExit) as exc:
        verdict = oracle.Verdict(case, target)
        kind, text = oracle.classify_exception(exc)
        verdict.failures.append(oracle.Failure(kind, f"escaped the oracle: {text.splitlines()[0][:500]}"))
        return verdict


def target_info(kernel):
    """What the report needs to know about a loaded target and the backend it runs on."""
    from flashcheck.cases import backend, oracle

    return {"caps": oracle.Capabilities.of(kernel), "describe": backend.describe(),
            "backend": backend.backend()}


class InProcess:
    """The target judged in this process (--no-isolate): for debugging, no timeout, no crash isolation."""

    def __init__(self, spec):
        self.spec = spec
        self.kernel = None

    def start(self):
        self.kernel = load_target(self.spec)
        return target_info(self.kernel)

    def judge(self, case):
        return judge_safely(self.kernel, case, self.spec)

    def close(self):
        self.kernel = None


class Worker:
    """The target judged in a worker process, with a per-case timeout; restarted after a hang or a crash."""

    def __init__(self, spec, timeout):
        self.spec = spec
        self.timeout = timeout
        self.proc = None
        self.log = None
        self.info = None

    def start(self):
        """Start the worker and import the target there. Returns target_info; raises TargetError."""
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            python_command("from flashcheck.cases.runner.isolate import serve; serve()"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=os.getcwd())
        self._send(("start", self.spec))
        try:
            reply = self._receive(START_TIMEOUT)
        except _Silent as silent:
            how = f"did not answer within {START_TIMEOUT:g} s" if silent.alive else self._death("")
            self._kill()
            raise TargetError(f"the worker importing {self.spec} {how}") from None
        if reply[0] == "error":
            self._kill()
            raise TargetError(reply[1])
        self.info = reply[1]
        return self.info

    def judge(self, case):
        from flashcheck.cases import oracle

        if self.proc is None:
            try:
                self.start()
            except TargetError as exc:
                return oracle.Verdict(case, self.spec, failures=[oracle.Failure(
                    "crash", f"the worker could not be restarted after the previous case: {exc}")])
        t0 = time.perf_counter()
        self._send(("judge", case))
        try:
            reply = self._receive(self.timeout)
        except _Silent as silent:
            if silent.alive:
                failure = oracle.Failure("timeout", f"no verdict within {self.timeout:g} s; the worker was "
                                                    f"killed and the next case runs in a fresh one")
            else:
                # a dead process on the GPU is almost always a device fault (illegal address, trap)
                kind = "device fault" if self.info["backend"] == "gpu" else "crash"
                failure = oracle.Failure(kind, f"the worker process {self._death('while judging this case')}; "
                                               f"the next case runs in a fresh one")
            self._kill()
            verdict = oracle.Verdict(case, self.spec, failures=[failure])
            verdict.seconds = time.perf_counter() - t0
            return verdict
        _, verdict, poisoned = reply
        if poisoned:
            # a CUDA error is sticky: nothing else can run in that process
            self._kill()
        return verdict

    def close(self):
        if self.proc is not None:
            try:
                self._send(("stop",))
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill()

    def _kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout, self.log):
                try:
                    stream.close()
                except OSError:   # unsent bytes to a dead worker
                    pass
            self.proc = None

    def _death(self, when):
        """How the worker ended (`when`), with the last line it wrote (a fatal error, a traceback's end)."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            try:
                how = f"died from signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                how = f"died from signal {-code}"
        else:
            how = f"exited with code {code}"
        how += f" {when}" if when else ""
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, self.log.tell() - 4096))
        lines = [ln for ln in self.log.read().decode(errors="replace").splitlines() if ln.strip()]
        # faulthandler's headline names the signal and ends in a long stack; otherwise the last line says most
        fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
        words = (fatal or lines[-1:] or [""])[0].strip()[:300]
        return how + (f"; its last words: {words}" if words else "")

    def _send(self, message):
        data = pickle.dumps(message)
        try:
            self.proc.stdin.write(_HEADER.pack(len(data)) + data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass    # the worker is dead; _receive sees it

    def _receive(self, timeout):
        """The next message; raises _Silent when the worker died or the timeout passed."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        header = _read_exact(fd, _HEADER.size, deadline)
        return pickle.loads(_read_exact(fd, _HEADER.unpack(header)[0], deadline))


class _Silent(Exception):
    """No message came: the worker is still running past the deadline (alive) or its pipe closed (dead)."""

    def __init__(self, alive):
        self.alive = alive


def _read_exact(fd, n, deadline):
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise _Silent(alive=True)
        chunk = os.read(fd, n - got)
        if not chunk:
            raise _Silent(alive=False)
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def serve():
    """The worker's main loop (run by Worker.start in a fresh interpreter)."""
    import faulthandler

    faulthandler.enable()   # a segfault in the kernel leaves a stack in the log
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)   # the kernel's prints go to the log, never into a frame
    inbox = sys.stdin.buffer

    def send(message):
        data = pickle.dumps(message)
        channel.write(_HEADER.pack(len(data)) + data)
        channel.flush()

    def receive():
        header = inbox.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return ("stop",)
        return pickle.loads(inbox.read(_HEADER.unpack(header)[0]))

    from flashcheck.cases.backend import select_backend

    select_backend()
    _, spec = receive()
    try:
        kernel = load_target(spec)
    except TargetError as exc:
        send(("error", str(exc)))
        return
    info = target_info(kernel)
    send(("ready", info))
    while True:
        message = receive()
        if message[0] == "stop":
            return
        verdict = judge_safely(kernel, message[1], spec)
        send(("verdict", verdict, info["backend"] == "gpu" and not _cuda_usable()))


def _cuda_usable():
    import torch

    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # any CUDA error here is the sticky kind
        return False
