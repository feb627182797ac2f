"""The kernel under test, from what a user types: loading "MODULE:FUNCTION" or "path/to/file.py:FUNCTION"
(or a mutant of the bug corpus), checking that it can be called as the protocol says, and describing it.

The worker processes that load targets start in the user's directory (a target "my_pkg.attn:forward" is
imported from there), but flashcheck itself must come from where the caller got it, never from a
same-named folder of the user's: python_command puts the directory holding this flashcheck first.
"""
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass

import torch

from flashcheck.cases import backend, oracle, protocols
from flashcheck.cases.declarations import ATTRIBUTE

_FLASHCHECK_HOME = os.path.dirname(os.path.dirname(importlib.util.find_spec("flashcheck").origin))


def python_command(code):
    """argv of a fresh interpreter that runs `code` with this flashcheck imported first, from where this one
    was. Its directory then leaves the path again: in a source checkout it also holds kernel/, cases/ and
    reference/, which must not shadow a user's modules of those names (flashcheck's own parts are found
    through the package, flashcheck.kernel, not through the path)."""
    home = _FLASHCHECK_HOME
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {home!r}); import flashcheck; "
                                  f"sys.path.remove({home!r}); {code}"]


class TargetError(Exception):
    """The target cannot be used: bad MODULE:FUNCTION, file missing, import failed, not callable."""


def split_target(spec):
    """("module or absolute .py path", "attribute.path") of a target, checked as far as possible without
    importing anything. Raises TargetError."""
    if spec.startswith(MUTANT_PREFIX):
        return MUTANT_PREFIX.rstrip(":"), spec[len(MUTANT_PREFIX):]
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


@dataclass(frozen=True)
class Loaded:
    """A target that a function of flashcheck's own makes: loader ("module:function") called with arg in the worker
    (the bug corpus gives its mutants this way: the runner never needs to know the corpus)."""
    loader: str
    arg: object
    name: str

    def __str__(self):
        return self.name


MUTANT_PREFIX = "mutant:"
# "mutant:NAME" names a mutant of the bug corpus (flashcheck verify mutant:kv_mask_plus): the corpus's own loader
# makes it, by name, so that this module never imports the corpus (which sits above the runner)
MUTANT_LOADER = "flashcheck.cases.corpus.mutants:kernel_named"


def load_target(spec):
    """Import the target's module and return the callable. Raises TargetError with a readable reason.

    spec: "MODULE:FUNCTION", "path/to/file.py:FUNCTION", "mutant:NAME" (a mutant of the bug corpus), or a Loaded."""
    if isinstance(spec, str) and spec.startswith(MUTANT_PREFIX):
        spec = Loaded(MUTANT_LOADER, spec[len(MUTANT_PREFIX):], f"mutant {spec[len(MUTANT_PREFIX):]}")
    if isinstance(spec, Loaded):
        return _load_made(spec)
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
    check_signature(obj, f"{module_ref}:{attr}")
    return obj


def _load_made(spec):
    module, _, name = spec.loader.partition(":")
    try:
        return getattr(importlib.import_module(module), name)(spec.arg)
    except TargetError:
        raise
    except Exception as exc:  # noqa: BLE001  (drift, or a generated mutant that does not import)
        raise TargetError(f"{spec.name} could not be loaded: {type(exc).__name__}: {exc}") from None


def check_signature(kernel, name):
    """A kernel must take its protocol's tensors positionally (q, k, v; varlen and paged: cases/protocols.py).
    causal= and scale= are optional: a kernel without them is judged on the cases that need neither (reported as
    skipped: the signature has no causal=/scale=)."""
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):
        return    # a builtin or C extension: nothing to check before calling it
    protocol = oracle.Capabilities.of(kernel).protocol
    args = protocols.POSITIONAL[protocol]
    if protocol == protocols.DENSE and positional(kernel)[0] == len(POSITIONAL_PACKED):
        return     # five tensors under other names: a varlen or paged kernel that declares it (--protocol)
    try:
        sig.bind(*([None] * len(args)))
    except TypeError as exc:
        raise TargetError(f"{name}{sig} cannot be called as {name.rpartition(':')[2]}({', '.join(args)}): {exc}. "
                          f"flashcheck judges kernels of the protocol {protocols.CALL[protocol]}; wrap yours in a "
                          "function of that signature (examples/sdpa_attention.py shows one)") from None


POSITIONAL_PACKED = protocols.POSITIONAL[protocols.VARLEN]


def positional(kernel):
    """(required, most) positional arguments of the kernel's signature (most None: *args); (None, None) unknown."""
    try:
        params = inspect.signature(kernel).parameters.values()
    except (TypeError, ValueError):
        return None, None
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in pos)
    return required, None if any(p.kind is p.VAR_POSITIONAL for p in params) else len(pos)


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


def uses_triton(kernel):
    """Whether the kernel is written in Triton: its module (or the module of what it wraps) holds a
    @triton.jit function. On the CPU such a kernel runs in Triton's interpreter, whose bfloat16 is wrong."""
    seen = set()
    fn = kernel
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        if module is not None and any(type(v).__module__.startswith("triton.runtime") for v in vars(module).values()):
            return True
        fn = getattr(fn, "__wrapped__", None) or getattr(fn, "func", None)
        if fn is not None and not callable(fn):
            break
    return False


def target_info(kernel):
    """What the report needs to know about a loaded target and the backend it runs on."""
    own = getattr(kernel, ATTRIBUTE, None) or {}
    if not isinstance(own, dict):      # a Declarations object: its declared values
        own = {k: getattr(own, k) for k in getattr(own, "given", ())}
    host = _host_available()
    device_free = host
    if backend.backend() == "gpu":

        device_free = torch.cuda.mem_get_info()[0]
    return {"caps": oracle.Capabilities.of(kernel), "positional": positional(kernel),
            "describe": backend.describe(), "backend": backend.backend(),
            "triton": uses_triton(kernel), "declarations": dict(own), "device_free": device_free,
            "host_free": host}


def _host_available():
    """Bytes of host memory available (MemAvailable), or None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
