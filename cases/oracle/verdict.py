"""What a judged run comes to: the Verdict (one case given to one kernel), its Failures, and what the kernel's
signature accepts (Capabilities).

Outcomes (Verdict.status):
  pass           every layer held, with a tolerance tight enough to tell a wrong answer
  fail           a Failure of a named Kind (cases/oracle/kinds.py)
  inconclusive   nothing failed, but the tolerance of this case is so wide that a trivially wrong answer
                 (zeros, the plain mean of V) would pass it: never counted as passed
  unsupported    the kernel raised NotImplementedError (or flashcheck.Unsupported) for this input
  out of memory  the kernel (or the inputs of this case) did not fit in memory
"""
import inspect
from dataclasses import dataclass, field, replace

from flashcheck.cases import features
from flashcheck.cases.oracle.kinds import Kind


@dataclass
class Capabilities:
    """What a kernel accepts beyond the core protocol: read off its signature, and for the protocol-v3 features the
    shapes carry (GQA, Dv != D) declared or probed (cases/features.py, verify's engine)."""
    out: bool = False
    lse: bool = False
    blocks: bool = False
    causal: bool = True        # the signature takes causal= (a kernel without it is judged on non-causal cases)
    scale: bool = True         # the signature takes scale=
    features: frozenset = frozenset()   # the optional features it has (cases/features.py names)
    notes: dict = None                  # feature -> how its support (or its lack) was found out, when probed
    protocol: str = "dense"             # dense, varlen or paged (cases/protocols.py): the signature's or declared
    var_kw: bool = False                # the signature has **kwargs (its keywords are declared: --keywords)
    paged_q: str = "bhnd"               # a paged kernel's q and output layout: declared (--paged-q) or probed

    @classmethod
    def of(cls, kernel):
        try:
            params = inspect.signature(kernel).parameters
        except (TypeError, ValueError):
            return cls()
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        return cls(out="out" in params, lse="return_lse" in params,
                   blocks="block_m" in params and "block_n" in params,
                   causal=var_kw or "causal" in params, scale=var_kw or "scale" in params,
                   features=features.from_signature(params), var_kw=var_kw,
                   # the calling protocol by its positional arguments' names (cases/protocols.py; --protocol)
                   protocol="varlen" if "cu_seqlens_q" in params else "paged" if "block_table" in params else "dense")


    def with_keywords(self, names):
        """These capabilities with the keywords `names` (declared: --keywords) taken too."""
        names = set(names or ())
        return replace(self, out=self.out or "out" in names, lse=self.lse or "return_lse" in names,
                       blocks=self.blocks or {"block_m", "block_n"} <= names,
                       features=self.features | features.from_signature(names))

    def lacks(self, names):
        """Of the keywords `names`, those this signature cannot take (no such parameter and no **kwargs)."""
        if self.var_kw:
            return []
        has = {"out": self.out, "return_lse": self.lse, "block_m": self.blocks, "block_n": self.blocks}
        has.update({f.keyword: f.name in self.features for f in features.FEATURES if f.keyword})
        return [n for n in names if not has.get(n)]


def showing_keywords(kernel, names):
    """The kernel as the oracle sees it when keywords its **kwargs takes are declared (--keywords): the same callable
    with a signature that shows them, so that every reading of its capabilities (Capabilities.of, here and in the
    properties, the adapters, the backward) finds them."""
    if not names:
        return kernel
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):
        return kernel
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    var = [p for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD]
    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
             for n in names if n not in {p.name for p in params}]

    def call(*args, **kwargs):
        return kernel(*args, **kwargs)
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(call, attr, getattr(kernel, attr, None))
    call.__signature__ = sig.replace(parameters=params + extra + var)
    return call


def as_declared(kernel, conventions):
    """The kernel as the oracle calls it, where its declared calling conventions differ from the protocol's
    (cases/declarations.py): each case's window=(left, right) handed over in the kernel's count (--window-count size:
    one more key on each bounded side, the diagonal's own), and the log-sum-exp it returns brought to the protocol's
    (--lse-layout tokens-first: its last two axes swapped back; --lse-base 2: times ln 2). The judgement, the
    references and every report then speak the protocol alone. The same callable and signature otherwise
    (Capabilities.of reads the kernel's own)."""
    sized = conventions.window_count == "size"
    swapped = conventions.lse_layout == "tokens-first"
    base2 = conventions.lse_base == "2"
    if not (sized or swapped or base2):
        return kernel

    def call(*args, **kwargs):
        window = kwargs.get("window")
        if sized and window is not None:
            kwargs["window"] = tuple(None if side is None else side + 1 for side in window)
        result = kernel(*args, **kwargs)
        if not kwargs.get("return_lse") or not (isinstance(result, (tuple, list)) and len(result) == 2):
            return result       # the oracle says what is wrong with a return it cannot read
        out, lse = result
        if hasattr(lse, "transpose") and getattr(lse, "ndim", 0) >= 2 and swapped:
            lse = lse.transpose(-1, -2)
        if hasattr(lse, "is_floating_point") and lse.is_floating_point() and base2:
            lse = lse * LN2
        return type(result)((out, lse))
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(call, attr, getattr(kernel, attr, None))
    try:
        call.__signature__ = inspect.signature(kernel)
    except (TypeError, ValueError):
        pass
    return call


LN2 = 0.6931471805599453


def lse_layout_hint(got_shape, expected_shape):
    """A hint for an lse of the wrong shape that is the protocol's with its last two axes swapped."""
    got, want = tuple(got_shape), tuple(expected_shape)
    if len(got) >= 2 and got != want and got[:-2] + (got[-1], got[-2]) == want:
        return " (the protocol's shape with its last two axes swapped: --lse-layout tokens-first declares that layout)"
    return ""


@dataclass
class Failure:
    kind: Kind
    message: str
    where: tuple = None       # (b, h, row, col) of the first bad element
    got: float = None
    expected: float = None
    tol: float = None
    location: str = ""        # file:line where the kernel raised (exceptions)
    axes: tuple = None        # the names of where's four axes, when not (b, h, row, col): dK's are a kv head's keys
    worst: tuple = None       # where the error is largest against its tolerance, when not at where

    def __post_init__(self):
        self.kind = Kind(self.kind)

    def element(self, sep=", ", at=None):
        """"b=0, h=1, row=2, col=3" of where (or of at: another element of the same array), in its axes' own
        names, without the col for an lse: an lse has one value per row (the col of its where is always 0)."""
        names = self.axes or ("b", "h", "row", "col")
        parts = [f"{n}={x}" for n, x in zip(names, self.where if at is None else at)]
        return sep.join(parts[:3] if self.kind == Kind.LSE else parts)

    def line(self):
        s = f"{self.kind}"
        if self.where is not None:
            s += f" at ({self.element()})"
        if self.got is not None and self.expected is None:
            s += f": got {self.got:.7g}"           # no expected value at hand (a relation's base run, say)
        elif self.got is not None:
            s += f": got {self.got:.7g}, expected {self.expected:.7g}"
            if self.tol is not None:
                s += f" (|err| {abs(self.got - self.expected):.3g} > tol {self.tol:.3g})"
        s += f"; {self.message}" if self.message else ""
        if self.worst is not None and self.worst != self.where:
            s += f"; the largest at ({self.element(at=self.worst)})"
        return s + (f" (raised at {self.location})" if self.location else "")


@dataclass
class Verdict:
    case: object
    target: str
    failures: list = field(default_factory=list)
    max_err: float = 0.0      # |err| at the worst element (largest err/tol)
    tol: float = 0.0          # the tolerance there
    ratio: float = 0.0        # the largest err/tol of the reference comparison
    reduced: list = field(default_factory=list)   # checks that could not run in full, with why
    seconds: float = 0.0
    status: str = ""          # an outcome of the module docstring; derived from failures when left empty
    note: str = ""            # why inconclusive, the kernel's unsupported message, the memory figures
    peak_bytes: int = None    # the kernel's own device memory beyond its inputs (GPU), when measured
    maps: dict = None         # error maps of a failing case, for the HTML report (oracle/diagnose.py)
    timing: tuple = None      # (start, seconds, worker) of judging it, as verify saw it: start from the run's start
    declared: list = field(default_factory=list)   # the declarations it was judged under, as flags (for repro)

    def __post_init__(self):
        if not self.status:
            self.status = "fail" if self.failures else "pass"

    @property
    def passed(self):
        return self.status == "pass"

    @property
    def failed(self):
        return self.status == "fail"

    @property
    def kind(self):
        return self.failures[0].kind if self.failures else self.status

    def fail(self, failure):
        self.failures.append(failure)
        self.status = "fail"

    def repro(self):
        """The command that judges this case again, under the same declarations (a convention declared on the
        command line, --head-map or --empty-lse, changes what is right)."""
        flags = "".join(f" {flag}" for flag in self.declared)
        return f"flashcheck verify {self.target}{flags} --case \"{self.case.source(why=False)}\""

    def report(self):
        head = f"{self.status.upper()} {self.case.name} [{self.target}]"
        if self.passed:
            return head + f" max err/tol {self.ratio:.3g}"
        if not self.failed:
            return head + (f": {self.note}" if self.note else "")
        lines = [head] + ["  " + f.line() for f in self.failures]
        if self.case.why:
            # an entry's why is about the forward: a failure of the gradients alone says the case was written for that
            backward_only = all(f.kind == Kind.GRADIENT for f in self.failures)
            lines.append(f"  {'the case was written for the forward; it ' if backward_only else ''}guards against: "
                         f"{self.case.why}")
        lines.append(f"  repro: {self.repro()}")
        return "\n".join(lines)


class RunFailed(Exception):
    """A failure that ends the judging of this run (carries the Failure)."""

    def __init__(self, failure):
        super().__init__(failure.line())
        self.failure = failure


class Outcome(Exception):
    """The run ends with another outcome than pass or fail (unsupported, out of memory), and why."""

    def __init__(self, status, note):
        super().__init__(note)
        self.status, self.note = status, note
