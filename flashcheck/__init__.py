"""flashcheck: a correctness-verification suite and bug-regression corpus for fused FlashAttention-style
attention kernels.

One import name holds everything:

    flashcheck.kernel      the project's Triton kernels (kernel/ in the repository)
    flashcheck.reference   the float64 NumPy oracle of record and the PyTorch baseline (reference/)
    flashcheck.cases       the catalogue, the oracle, the runner, the reports, the corpus, the bench (cases/)
    flashcheck.api         the Python API below (docs/api.md)
    flashcheck.plugin      the pytest plugin (`pytest --flashcheck=MODULE:FUNCTION`, docs/api.md)

In a wheel those three are ordinary subpackages of this one. In a source checkout they stay at the top of
the repository (its layout is the design card's) and this package extends its own search path to the
checkout, so that `flashcheck.kernel` is kernel/ there too, with or without an install.

The Python API, loaded on first use (docs/api.md):

    flashcheck.verify(fn, **options) -> Report     the engine of `flashcheck verify`, from Python
    flashcheck.assert_attention(fn, cases=None)    for a kernel's own tests: AssertionError with the oracle's text
    flashcheck.declare(dtypes=..., ...)            a kernel's declarations, carried by the kernel
    flashcheck.Unsupported                         raise it for an input the kernel does not support
    flashcheck.Case, flashcheck.Declarations, flashcheck.Report
    flashcheck.UsageError, flashcheck.TargetError, flashcheck.DeclarationError, flashcheck.NotJudgedWarning
    flashcheck.select_backend()                    GPU or Triton's CPU interpreter (before Triton is imported)

Nothing here imports torch or Triton: the backend (GPU or Triton's CPU interpreter) must be chosen first, so
every name above is imported lazily, when it is first looked up (module __getattr__).
"""
import importlib
import os as _os

__version__ = "0.2.0"

_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "cases")) and _os.path.isfile(
        _os.path.join(_checkout, "cases", "oracle", "__init__.py")):
    __path__.append(_checkout)   # noqa: F821  (a package's __path__; see the module docstring)

# public name -> (module, attribute): imported on first use, so that `import flashcheck` stays cheap
_LAZY = {
    "verify": ("flashcheck.api", "verify"),
    "assert_attention": ("flashcheck.api", "assert_attention"),
    "Report": ("flashcheck.api", "Report"),
    "NotJudgedWarning": ("flashcheck.api", "NotJudgedWarning"),
    "UsageError": ("flashcheck.api", "UsageError"),
    "TargetError": ("flashcheck.api", "TargetError"),
    "DeclarationError": ("flashcheck.cases.declarations", "DeclarationError"),
    "declare": ("flashcheck.cases.declarations", "declare"),
    "Declarations": ("flashcheck.cases.declarations", "Declarations"),
    "Unsupported": ("flashcheck.cases.oracle.kinds", "Unsupported"),
    "Case": ("flashcheck.cases.case", "Case"),
    "select_backend": ("flashcheck.cases.backend", "select_backend"),
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'flashcheck' has no attribute {name!r}") from None

    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value      # looked up once
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
