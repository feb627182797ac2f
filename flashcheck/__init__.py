"""flashcheck: a correctness-verification suite and bug-regression corpus for fused FlashAttention-style
attention kernels.

One import name holds everything:

    flashcheck.kernel      the project's Triton kernels (kernel/ in the repository)
    flashcheck.reference   the float64 NumPy oracle of record and the PyTorch baseline (reference/)
    flashcheck.cases       the catalogue, the oracle, the runner, the reports, the corpus, the bench (cases/)

In a wheel those three are ordinary subpackages of this one. In a source checkout they stay at the top of
the repository (its layout is the design card's) and this package extends its own search path to the
checkout, so that `flashcheck.kernel` is kernel/ there too, with or without an install.

Nothing here imports torch or Triton: the backend (GPU or Triton's CPU interpreter) must be chosen first.
"""
import os as _os

__version__ = "0.2.0"

_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "cases")) and _os.path.isfile(
        _os.path.join(_checkout, "cases", "oracle", "__init__.py")):
    __path__.append(_checkout)   # noqa: F821  (a package's __path__; see the module docstring)
