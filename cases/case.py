"""A case: one attention problem, as data. The catalogue, the oracle, the mutants and the CLI share it.

A case prints itself in the catalogue's own syntax (``Case.source()``), so a failing or shrunk case can be
pasted back into cases/catalogue.py as a regression.
"""
import ast
import dataclasses
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# A catalogue case's dtype says which dtypes it is about: None (the default), every dtype the kernel declares;
# "half", fp16 and bf16; a dtype's name, that dtype alone (the dtype is the point of the case). Expanded, each
# instance has one dtype and a name saying it: partial_last_key_block[fp16].
EXPANSIONS = {None: tuple(DTYPES), "half": ("fp16", "bf16")}
# q, k, v, out each sit in a buffer of their own; the layout says how (see cases/inputs.py):
LAYOUTS = ("contiguous", "bthd", "gapped", "d_major", "mixed")
DATA = ("randn", "large", "very_negative", "equal_scores", "explicit", "nan_input", "negative_first_keys",
        "large_sums", "below_finite_masks", "gradient_sums")


@dataclass(frozen=True)
class Case:
    name: str
    why: str = ""
    B: int = 1
    H: int = 1
    Nq: int = 16
    Nk: int = 16
    D: int = 16
    dtype: str = None            # see EXPANSIONS; a case that runs is concrete (fp32 when None)
    causal: bool = False
    scale: float = None
    layout: str = "contiguous"
    block_m: int = None
    block_n: int = None
    seed: int = 0
    data: str = "randn"
    # data="explicit": q, k, v as nested tuples of shape (Nq, D) / (Nk, D), used for every (batch, head)
    q: tuple = None
    k: tuple = None
    v: tuple = None
    # a hand-computed answer, checked besides the float64 reference: "mean_v" (all scores equal: the mean
    # of V), "v_row0" (one key: that key's value row), or nested tuples (Nq, D) for every (batch, head)
    expected: object = None
    exact: bool = False          # the hand value must come out bit-exact (e.g. 7.5)
    gpu_only: str = ""           # why only the compiled GPU path can judge this case (skipped on CPU)
    sample_heads: int = 0        # > 0, huge cases: inputs made on the device, this many (b, h) judged
    magnitude: float = None      # data="large": the typical |q . k| (default 1e4, 1e3 in fp16/bf16);
    #                              data="negative_first_keys": how negative the first keys score (default 1e9);
    #                              data="large_sums": the values' mean (default 2^18 / Nk, within 4..2048)
    point: tuple = ()            # what must stay true for the case to test its bug (cases/projection.py POINTS):
    #                              verify projects an entry onto a kernel's declarations only where it does
    # protocol v3's optional features (cases/features.py); the defaults are the dense protocol without them
    Hkv: int = None              # kv heads (GQA/MQA: H is a multiple of it); None: H
    Dv: int = None               # v's and the output's head dim; None: D
    window: tuple = None         # (left, right), each None (unbounded) or an int >= 0, bottom-right aligned
    softcap: float = None        # c > 0: scores become c tanh(s / c)
    alibi: str = None            # ALiBi slopes: "heads" ((H,): the geometric slopes) or "batch_heads" ((B, H))
    # packed sequences and paged caches (cases/protocols.py): judged on varlen and paged kernels only
    seqlens: tuple = None        # ((Nq, Nk), ...) per sequence, zero lengths legal; B, Nq, Nk follow (count, longest)
    page_size: int = None        # a paged kernel's page size (None: protocols.DEFAULT_PAGE)
    max_seqlen_extra: int = 0    # max_seqlen_q/k passed this much above the longest sequence (a bound, not a length);
                                 # None: not passed (the protocol's default, None: the kernel finds the lengths itself)
    gpu_only_interpreted: bool = False   # gpu_only only for a Triton kernel (the interpreter's time): a kernel of
                                         # plain PyTorch is judged on it on the CPU too

    def __post_init__(self):
        if self.dtype not in DTYPES and self.dtype not in EXPANSIONS:
            raise ValueError(f"case {self.name}: dtype {self.dtype!r} not in {sorted(DTYPES)} (or None, 'half')")
        if self.layout not in LAYOUTS:
            raise ValueError(f"case {self.name}: layout {self.layout!r} not in {LAYOUTS}")
        if self.data not in DATA:
            raise ValueError(f"case {self.name}: data {self.data!r} not in {DATA}")
        if min(self.B, self.H, self.Nq, self.Nk, self.D) < 0 or self.Nk < 1 or self.D < 1:
            raise ValueError(f"case {self.name}: needs B, H, Nq >= 0 and Nk, D >= 1")
        if self.magnitude is not None and (self.data not in ("large", "negative_first_keys", "large_sums")
                                           or not self.magnitude > 0):
            raise ValueError(f"case {self.name}: magnitude (> 0) goes with data='large', 'negative_first_keys' or "
                             "'large_sums'")
        if self.data == "explicit" and (self.q is None or self.k is None or self.v is None):
            raise ValueError(f"case {self.name}: data='explicit' needs q, k and v")
        if self.Hkv is not None and (self.Hkv < 1 or self.H % self.Hkv):
            raise ValueError(f"case {self.name}: H = {self.H} is not a multiple of Hkv = {self.Hkv}")
        if self.Dv is not None and self.Dv < 1:
            raise ValueError(f"case {self.name}: Dv must be >= 1")
        if self.window is not None and (len(self.window) != 2 or any(
                x is not None and (not isinstance(x, int) or x < 0) for x in self.window)):
            raise ValueError(f"case {self.name}: window must be (left, right), each None or an int >= 0")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"case {self.name}: softcap must be > 0")
        if self.alibi not in (None, "heads", "batch_heads"):
            raise ValueError(f"case {self.name}: alibi must be None, 'heads' or 'batch_heads'")
        if self.seqlens is not None:
            pairs = tuple(tuple(p) for p in self.seqlens)
            if not pairs or any(len(p) != 2 or any(not isinstance(n, int) or n < 0 for n in p) for p in pairs):
                raise ValueError(f"case {self.name}: seqlens must be ((Nq, Nk), ...), each length an int >= 0")
            object.__setattr__(self, "seqlens", pairs)
            # the count and the longest sequence: what footprints, declarations and reports read
            object.__setattr__(self, "B", len(pairs))
            object.__setattr__(self, "Nq", max(p[0] for p in pairs))
            object.__setattr__(self, "Nk", max(1, max(p[1] for p in pairs)))
        if self.page_size is not None and (not isinstance(self.page_size, int) or self.page_size < 1):
            raise ValueError(f"case {self.name}: page_size must be an int >= 1")
        if self.max_seqlen_extra is not None and not (isinstance(self.max_seqlen_extra, int)
                                                      and self.max_seqlen_extra >= 0):
            raise ValueError(f"case {self.name}: max_seqlen_extra must be None or an int >= 0")

    @property
    def kv_heads(self):
        return self.H if self.Hkv is None else self.Hkv

    @property
    def v_dim(self):
        return self.D if self.Dv is None else self.Dv

    @property
    def torch_dtype(self):
        return DTYPES[self.dtype or "fp32"]

    @property
    def dtypes(self):
        """The dtypes this case is about (one, for a concrete case)."""
        return EXPANSIONS[self.dtype] if self.dtype in EXPANSIONS else (self.dtype,)

    def instances(self, allowed=None):
        """The concrete cases of this one, one per dtype it is about (and `allowed` admits), named
        name[dtype]; a case with one dtype of its own is its own instance."""
        if self.dtype in DTYPES:
            return [self] if allowed is None or self.dtype in allowed else []
        return [self.replace(name=f"{self.name}[{d}]", dtype=d) for d in self.dtypes
                if allowed is None or d in allowed]

    def source(self, why=True):
        """This case in the catalogue's syntax: only the fields that differ from their defaults
        (without the `why` text and the point when why=False, for one-line reproductions)."""
        parts = [repr(self.name)]
        for f in dataclasses.fields(self):
            if f.name == "name" or (f.name in ("why", "point") and not why):
                continue
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(f"{f.name}={value!r}")
        return "Case(" + ", ".join(parts) + ")"

    def key(self):
        """This case without its name (and why): two cases with the same key are the same case, drawn twice."""
        return self.source(why=False).split(",", 1)[-1]

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def parse_case(text):
    """A Case from its source() text (the only name it may use is Case; nothing else is evaluated)."""
    tree = ast.parse(text.strip(), mode="eval")
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Case"):
        raise ValueError(f"not a Case(...) expression: {text!r}")
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    return Case(*args, **kwargs)
