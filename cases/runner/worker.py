"""The one isolation runner: a kernel under test runs where it can be killed, and verify, the bug corpus and
the power measurement all use it.

    Worker(timeout).open("my_pkg.attn:forward")        -> what the target is (capabilities, backend, ...)
    Worker.call("flashcheck.cases.verify.judging:judge_case", case, settings)   -> fn(target, case, settings)

Two processes stand between the caller and the kernel. A server (a fresh interpreter) selects the backend and
imports torch, Triton and flashcheck once, without ever touching CUDA. For each target it forks a child,
which imports the target and then runs the calls it is sent, one at a time. So a new target (a mutant, the
next kernel) starts warm and clean; a child that segfaults, aborts or faults the GPU takes only itself down:
the server reports how it ended ("gone") and forks the next child on demand; a call that hangs past its
timeout gets the whole process group killed, and the next call starts a fresh server.

Compile time is not the kernel's answer. The child tells the caller when each call of the kernel starts and ends,
and whether its inputs (shapes, strides, dtypes, alignment, keyword arguments) are new to this process: a Triton
kernel compiles (and an autotuned one tunes, torch.compile traces) on such a call. A new call gets compile_timeout
(default 15 minutes, verify's --compile-timeout), a call whose inputs ran before gets timeout (a kernel's call ends
when its device work has, so an asynchronous launch is timed whole), and the oracle's own work between calls gets
the call's timeout but never less than WORK_FLOOR; a timeout says which of the three ran out.

Frames: length-prefixed pickles, the caller -> the worker on its stdin, the worker -> the caller on a pipe
that was its stdout. Both worker processes move their own stdout onto stderr first, so whatever a kernel
prints cannot corrupt a frame; stdout and stderr go to a log file whose tail names the cause of a death.
Reads are unbuffered and exact, so the child can read its frames from the stdin it shares with the server.
"""
import atexit
import faulthandler
import functools
import importlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import torch

from flashcheck.cases.backend import keep_freed_memory, select_backend, sleep_while_waiting
from flashcheck.cases.oracle.kinds import classify_death
from flashcheck.cases.runner.target import TargetError, check_signature, load_target, python_command, target_info

_HEADER = struct.Struct(">Q")
START_TIMEOUT = 300.0      # importing torch, Triton and a target can take a while on a loaded machine
# Servers kept for the next run of this process (Worker.close parks, Worker._start adopts): a server costs a fresh
# interpreter importing torch, Triton and flashcheck (about 1.6 s on this 2-core CPU per verify() call of a small
# selection, most of the call), and never touches CUDA, so the next target's child forks from it as clean as from
# a new one. Adopted only by a worker of the same environment, working directory and wrapper; at most PARK_AT_MOST
# are kept, the oldest stopped first; the rest stop when this process exits (atexit, or their stdin's end).
PARK_AT_MOST = 4
_parked = []                # Workers holding a parked server (and nothing else)
_NOT_KEYED = ("PYTEST_CURRENT_TEST",)   # left out of the adoption key: pytest rewrites it for every test
_parked_lock = threading.Lock()


class Hung(Exception):
    """No answer within the time limit; the worker was killed."""


class Died(Exception):
    """The process running the target died; .kind is a Kind (crash or device fault), the text says how."""

    def __init__(self, kind, text):
        super().__init__(text)
        self.kind = kind


class Raised(Exception):
    """The called function raised (outside what it handles itself); the text is its traceback's end."""


@atexit.register
def _stop_all_parked():
    """At exit, every server this process parked (not those a forked copy of it inherited), all asked at once."""
    with _parked_lock:
        mine = [w for w in _parked if w._key[-1] == os.getpid()]
        _parked.clear()
    for w in mine:
        w._send(("stop",))
    for w in mine:
        w._stop()


def _traceback_tail(exc):
    """The end of an exception's traceback (its last frames and message), at most 2,000 characters."""
    return "".join(traceback.format_exception(exc)[-3:])[-2000:]


def resolve(path):
    """The function named "package.module:function"."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


class Worker:
    """A target judged in worker processes, with a timeout per call (see the module docstring).

    wrap: argv put in front of the worker's interpreter (compute-sanitizer); env: extra environment; fresh: a
    server of its own, never one parked before, and never parked after."""

    def __init__(self, timeout, wrap=(), env=None, compile_timeout=None, fresh=False):
        self.timeout = timeout
        self.fresh = fresh
        self.compile_timeout = compile_timeout or max(timeout, COMPILE_TIMEOUT)
        self.wrap = list(wrap)
        self.env = dict(env or {})
        self.proc = None
        self.log = None
        self.spec = None          # the target the current (or next) child serves
        self.child_open = False
        self.info = None
        self.log_from = 0         # where the current target's part of the log starts (park)
        self._key = None          # what a parked server must match to be adopted (_start)

    # ---- the caller's side ----
    def open(self, spec, reuse=False):
        """Fork a child serving `spec`; returns target_info. Raises TargetError (a bad or broken target).

        reuse: where this worker's child is open (its last call neither died, hung nor left a sticky CUDA error),
        that child imports `spec` in place of its target and keeps its CUDA context: a new context costs a child
        about 0.5 s of CPU, and 2.4 s (1.0 s of CPU) when 16 processes make theirs at once (an H200 host). Only
        for targets that leave nothing behind that the next one would see: the corpus's mutants
        (cases/corpus/mutants.py), never a user's kernel."""
        if self.child_open and (not reuse or self._answer_waiting()):
            self._close_child()       # (a child that ended since its last answer has left its "gone" waiting)
        self.spec = spec
        if self.proc is None:
            self._start()
        else:
            self._log_starts_here()
        self._send(("open", spec))
        try:
            reply = self._receive(START_TIMEOUT)
        except Hung:
            self.kill()
            raise TargetError(f"the worker importing {_name(spec)} did not answer within {START_TIMEOUT:g} s") \
                from None
        if reply[0] == "gone":
            raise TargetError(f"the worker importing {_name(spec)} {self._death(reply[1])}")
        if reply[0] == "error":
            self._expect_gone()
            raise TargetError(reply[1])
        self.child_open = True
        self.info = reply[1]
        return self.info

    def call(self, fn, *args, timeout=None, **kwargs):
        """fn(target, *args, **kwargs) in the child (fn: "module:function"). Raises Hung, Died or Raised.

        timeout: the limit of the oracle's own work between the kernel's calls (default self.timeout); each call of
        the kernel has self.timeout, or self.compile_timeout when its inputs are new to the child."""
        if not self.child_open:
            self.open(self.spec)
        self._send(("call", fn, args, kwargs))
        # the oracle's own work (inputs, the float64 reference, the comparisons; the child's first touch of the GPU
        # makes its CUDA context, seconds) is not the kernel's: a --timeout of a second must not cut it
        work = max(timeout or self.timeout, WORK_FLOOR)
        limit, state = work, "work"
        while True:
            try:
                reply = self._receive(limit)
            except Hung:
                self.kill()
                raise Hung(_hung(state, limit) + "; the worker was killed and the next case runs in a fresh one") \
                    from None
            if reply[0] != "tick":
                break
            if reply[1] == "call":
                limit, state = (self.compile_timeout, "first") if reply[2] else (self.timeout, "call")
            else:
                limit, state = work, "work"
        if reply[0] == "gone":
            self.child_open = False
            status = reply[1]

            tail = self._log_tail()
            raise Died(classify_death(-status if status < 0 else None, tail),
                       f"the process running the kernel {self._death(status, tail)}; the next case runs in a "
                       "fresh one")
        _, (how, value), poisoned = reply
        if poisoned:
            # a sticky CUDA error: the child exits by itself; the next call forks a fresh one
            self._expect_gone()
        if how == "raised":
            raise Raised(value)
        return value

    def close(self):
        """Done with this run: the server is parked for the next worker of the same environment (see _parked), or,
        where it cannot be kept, stopped."""
        if self.proc is not None and self._key is not None and self.park():
            kept = Worker(self.timeout)
            kept.proc, kept.log, kept._key = self.proc, self.log, self._key
            self.proc, self.log = None, None
            with _parked_lock:
                _parked.append(kept)
                evicted = _parked[:-PARK_AT_MOST]
                del _parked[:-PARK_AT_MOST]
            for w in evicted:
                w._stop()
            return
        self._stop()

    def _stop(self):
        if self.proc is not None:
            try:
                if self.child_open:
                    self._close_child()
                self._send(("stop",))
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, Hung):
                pass
            self.kill()

    def park(self, keep_child=False):
        """Close the child and keep the server for another target (the server never touches CUDA, so a child
        forked for the next target starts as clean as from a new one, and warm); a death's log tail then shows
        only the next target's lines. Returns whether the server is alive to be reused (else it is gone).
        keep_child: an open child stays open, for the next target to reuse (open's reuse)."""
        if self.proc is None or self.proc.poll() is not None:
            self.kill()
            return False
        if self.child_open and not keep_child:
            self._close_child()
        if self.proc is None:
            return False
        self._log_starts_here()
        return True

    def _log_starts_here(self):
        """A death's log tail starts at the log's present end: the lines of earlier targets are not the next one's."""
        self.log.seek(0, os.SEEK_END)
        self.log_from = self.log.tell()

    def kill(self):
        """Kill the server and its child (their process group) and forget them."""
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout, self.log):
                try:
                    stream.close()
                except OSError:   # unsent bytes to a dead worker
                    pass
            self.proc = None
        self.child_open = False

    def _start(self):
        env = dict(os.environ, **self.env)
        # a compute-sanitizer's server (wrap) and a fresh one are not kept: each run of them starts its own
        # (pytest names the running test in PYTEST_CURRENT_TEST: with it in the key, no test of a pytest-xdist
        # worker adopted a server an earlier test parked; the H200 suite's workers started 73, 3.1 s of CPU each)
        keyed = tuple(sorted((k, v) for k, v in env.items() if k not in _NOT_KEYED))
        self._key = None if self.wrap or self.fresh else (keyed, os.getcwd(), os.getpid())
        with _parked_lock:
            found = [i for i, w in enumerate(_parked) if w._key == self._key and w.proc.poll() is None]
            adopted = _parked.pop(found[-1]) if found else None
        if adopted is not None:
            self.proc, self.log = adopted.proc, adopted.log
            self._log_starts_here()
            return
        self.log, self.log_from = tempfile.TemporaryFile(), 0
        self.proc = subprocess.Popen(
            self.wrap + python_command("from flashcheck.cases.runner.worker import serve; serve()"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=os.getcwd(), env=env,
            start_new_session=True)

    def _close_child(self):
        self._send(("close",))
        self._expect_gone()

    def _answer_waiting(self):
        """Whether a frame waits unread: with no call in flight, only the server's word that the child is gone."""
        return self.proc is not None and bool(select.select([self.proc.stdout.fileno()], [], [], 0)[0])

    def _expect_gone(self):
        try:
            self._receive(60.0)
        except Hung:
            self.kill()
        self.child_open = False

    def _death(self, status, tail=None):
        if status < 0:
            try:
                how = f"died from signal {-status} ({signal.Signals(-status).name})"
            except ValueError:
                how = f"died from signal {-status}"
        else:
            how = f"exited with code {status}"
        tail = self._log_tail() if tail is None else tail
        lines = [ln for ln in tail.splitlines() if ln.strip()]
        # faulthandler's headline names the signal and ends in a long stack; otherwise the last line says most
        fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
        words = (fatal or lines[-1:] or [""])[0].strip()[:300]
        return how + (f"; its last words: {words}" if words else "")

    def _log_tail(self, n=4096):
        if self.log is None:
            return ""
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(self.log_from, self.log.tell() - n))
        return self.log.read().decode(errors="replace")

    def _send(self, message):
        data = pickle.dumps(message)
        try:
            self.proc.stdin.write(_HEADER.pack(len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass    # the worker is dead; _receive sees it

    def _receive(self, timeout):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        header = _read_exact(fd, _HEADER.size, deadline)
        if header is None:
            return ("gone", self._server_status())
        body = _read_exact(fd, _HEADER.unpack(header)[0], deadline)
        if body is None:
            return ("gone", self._server_status())
        return pickle.loads(body)

    def _server_status(self):
        """The worker's pipe closed: the server itself ended (killed with its child, or crashed)."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = -signal.SIGKILL
        proc, self.proc = self.proc, None
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.child_open = False
        return code


COMPILE_TIMEOUT = 900.0    # seconds a kernel's first call with new inputs may take (compiling, autotuning)
WORK_FLOOR = 60.0          # seconds the oracle's work between the kernel's calls may take at least, whatever --timeout


def _hung(state, limit):
    if state == "first":
        return (f"the kernel's first call with these inputs (shapes, strides, dtypes, arguments) did not return within "
                f"the compile limit of {limit:g} s (--compile-timeout): it compiles or autotunes for longer than that, "
                "or it hangs")
    if state == "call":
        return (f"a call of the kernel did not return within {limit:g} s (--timeout); it had run on the same inputs' "
                "shapes and arguments before in this worker, so this is not compile time")
    return (f"no answer within {limit:g} s while the oracle worked between the kernel's calls (its own limit: "
            f"--timeout, at least {WORK_FLOOR:g} s, more for long cases)")


def _name(spec):
    return spec if isinstance(spec, str) else getattr(spec, "name", repr(spec))


def _read_exact(fd, n, deadline=None):
    """n bytes from fd, None at end of file; past the deadline (when one is given) raises Hung."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise Hung()
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# ---- the worker's side ----

def _read_frame(fd):
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def _write_frame(fd, message):
    data = pickle.dumps(message)
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def serve():
    """The server's loop (started by Worker._start in a fresh interpreter)."""
    faulthandler.enable()     # a segfault in a kernel leaves a stack in the log
    keep_freed_memory()       # its children inherit it: the oracle's arrays reuse freed memory (cases/backend.py)
    _die_with_parent()
    out = os.dup(1)
    os.dup2(2, 1)             # prints go to the log, never into a frame
    gpu = select_backend() == "gpu"
    # lazy: Triton reads TRITON_INTERPRET when it is imported, so only after the backend is chosen; imported once
    # here, every forked child starts warm
    import triton  # noqa: F401
    _warm_up(gpu)
    while True:
        message = _read_frame(0)
        if message is None or message[0] == "stop":
            return
        if message[0] != "open":
            continue      # a stale frame for a child that is gone
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(message[1], out, gpu)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        _write_frame(out, ("gone", os.waitstatus_to_exitcode(status)))


def _die_with_parent(every=1.0):
    """The server runs in a session of its own (Worker._start), out of reach of the signals its parent gets: when
    the parent dies without killing it (SIGTERM from a CI runner's timeout, SIGKILL), a watch thread sees that the
    parent changed and kills the server's process group, its child included, within `every` seconds. Without it, a
    child in the middle of a long call ran on at full CPU after verify was gone. (Not PR_SET_PDEATHSIG: that fires
    when the thread that started the server ends, and verify --jobs starts servers from worker threads.)"""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    threading.Thread(target=watch, name="flashcheck-parent-watch", daemon=True).start()


def _warm_up(gpu):
    """Done once in the server, before any fork, what every child would otherwise do for itself, none of it touching
    CUDA: import the judging code (the oracle, the properties, hypothesis) and, on the GPU, compute Triton's hash of
    its own installation, part of every compile's cache key. On an H200 host each child spent 0.35 s on the hash
    and 0.2 s on those imports, of 1.3 s in all for a mutant whose kernels were in the compile cache."""
    import flashcheck.cases.verify.judging  # noqa: F401  (lazy: the server imports nothing before its backend)
    if gpu:
        from triton.runtime import cache   # lazy: as triton above

        key = getattr(cache, "triton_key", None)     # functools.lru_cache'd in Triton 3.x
        if key is not None:
            key()


def _child(spec, out, gpu):
    if gpu:
        sleep_while_waiting()     # before the target (its import may touch CUDA): cases/backend.py says why
    target = _opened(spec, out)
    while target is not None:
        message = _read_frame(0)
        if message is None or message[0] == "close":
            return 0
        if message[0] == "open":          # Worker.open(reuse=True): the next target, in this process
            target = _opened(message[1], out)
            continue
        _, fn, args, kwargs = message
        try:
            reply = ("ok", resolve(fn)(target, *args, **kwargs))
        except BaseException as exc:  # noqa: BLE001  (a kernel can raise anything, SystemExit included)
            reply = ("raised", _traceback_tail(exc))
        poisoned = gpu and not _cuda_usable()
        _write_frame(out, ("result", reply, poisoned))
        if poisoned:
            return 0
    return 0


def _opened(spec, out):
    """The target `spec` as the child calls it, after telling the caller what it is; None (the child ends) where it
    cannot be loaded."""
    try:
        target = load_target(spec)
        info = target_info(target)
    except TargetError as exc:
        _write_frame(out, ("error", str(exc)))
        return None
    _write_frame(out, ("ready", info))
    return _watched(target, out)


def _watched(kernel, out):
    """The kernel as the child calls it: every call tells the caller that it starts (and whether its inputs are new
    to this process, so that compiling or autotuning may happen) and that it ended (Worker.call's limits)."""
    seen = set()

    @functools.wraps(kernel)
    def call(*args, **kwargs):
        key = _inputs_key(args, kwargs)
        _write_frame(out, ("tick", "call", key not in seen))
        seen.add(key)
        try:
            result = kernel(*args, **kwargs)
            if torch.cuda.is_initialized():
                # the kernel's device work is the kernel's time: a launch returns at once, and its work would
                # otherwise run out the oracle's limit at the next synchronisation
                torch.cuda.synchronize()
            return result
        finally:
            _write_frame(out, ("tick", "done", None))
    return call


def _inputs_key(args, kwargs):
    """What a kernel may specialise on: every tensor's shape, strides, dtype, device and 16-byte alignment (Triton
    specialises on the divisibility of pointers and integers), every other argument's value."""
    def one(x):
        if isinstance(x, torch.Tensor):
            return ("tensor", tuple(x.shape), x.stride(), str(x.dtype), x.device.type, x.data_ptr() % 16 == 0)
        if isinstance(x, (tuple, list)):
            return tuple(one(y) for y in x)
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        return type(x).__name__
    return tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in kwargs.items()))


def _cuda_usable():
    if not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001  (any CUDA error here is the sticky kind)
        return False


class InProcess:
    """The same interface, in this process (--no-isolate): for debugging, no timeout, no crash isolation."""

    def __init__(self, timeout=None, **_):
        self.target = None
        self.spec = None
        self.info = None

    def open(self, spec):
        """spec: what load_target takes, or the kernel itself (a callable: flashcheck.verify(fn) with a lambda
        or a closure, which no worker process could import)."""
        self.spec = spec
        if callable(spec) and not isinstance(spec, str):
            check_signature(spec, getattr(spec, "__qualname__", repr(spec)))
            self.target = spec
        else:
            self.target = load_target(spec)
        self.info = target_info(self.target)
        return self.info

    def call(self, fn, *args, timeout=None, **kwargs):
        if self.target is None:
            self.open(self.spec)
        try:
            return resolve(fn)(self.target, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            raise Raised(_traceback_tail(exc)) from exc

    def close(self):
        self.target = None
