"""What a kernel declares about itself: the limits its documentation states and the conventions it follows.

One table (FIELDS) defines every declaration once; from it come the `flashcheck verify` flags, the keyword
arguments of flashcheck.verify() and flashcheck.declare(), the pytest plugin's options, and the checks of
invalid combinations. A kernel may carry its declarations itself, so that `flashcheck verify pkg:fn` needs
no flags:

    @flashcheck.declare(dtypes="fp16,bf16", head_dims="64,128", seq_multiple=128)
    def forward(q, k, v, *, causal=False, scale=None): ...

which sets `forward.flashcheck_declarations` (a dict of the same names; setting it by hand works too).
Flags given on the command line override the kernel's own values.

A limit makes the cases outside it "skipped: not declared", never passed and never failed. A convention
changes what the kernel is judged against: causal_align="top-left" kernels (SDPA's is_causal,
FlashAttention before 2.1) are judged against a top-left reference, not skipped.

The protocol's optional features (GQA, windows, softcap, varlen, backward) arrive as more rows of FIELDS:
each is a declaration (or is discovered from the signature) and a skip reason for the cases that need it.
"""
from dataclasses import dataclass, field

ALIGNS = ("bottom-right", "top-left")
SUPPORT = ("auto", "yes", "no")
HEAD_MAPS = ("grouped", "interleaved")
EMPTY_LSE = ("-inf", "+inf")
PROTOCOLS = ("auto", "dense", "varlen", "paged")
PAGED_Q = ("bhnd", "bnhd")   # a paged kernel's q and output: (B, H, Nq, D) or (B, Nq, H, D)
WINDOW_COUNTS = ("distance", "size")        # how window=(left, right) counts (cases/oracle/verdict.py as_declared)
LSE_LAYOUTS = ("heads-first", "tokens-first")
LSE_BASES = ("e", "2")
# the protocol's optional keywords, for a kernel whose **kwargs signature cannot show them (--keywords)
KEYWORDS = ("out", "return_lse", "block_m", "block_n", "window", "softcap", "alibi_slopes")
STRIDES = ("any", "last-dim-contiguous", "aligned", "contiguous")
ATTRIBUTE = "flashcheck_declarations"
# layouts of cases/inputs.py whose every tensor has a unit stride along the head dim ("mixed" holds a
# d_major v)
_LAST_DIM_CONTIGUOUS = ("contiguous", "bthd", "gapped")
_DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16",
                "bf16": "bf16", "bfloat16": "bf16"}


class DeclarationError(ValueError):
    """A declaration that cannot be: a bad value, or two that contradict each other (a usage error)."""


def parse_dtypes(value):
    if isinstance(value, str):
        value = value.split(",")
    names = [str(x).strip().lower().replace("torch.", "") for x in value if str(x).strip()]
    bad = [x for x in names if x not in _DTYPE_NAMES]
    if bad or not names:
        raise DeclarationError(f"dtypes {value!r}: expected a list of fp32, fp16, bf16")
    return tuple(dict.fromkeys(_DTYPE_NAMES[x] for x in names))


def parse_ranges(value):
    """Head dims as ((lo, hi), ...) from "64,128", "1-128", "16-64,128" or a list of ints."""
    if isinstance(value, int):
        value = [value]
    parts = value.split(",") if isinstance(value, str) else value
    ranges = []
    for part in parts:
        text = str(part).strip()
        lo, sep, hi = text.partition("-")
        try:
            lo, hi = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise DeclarationError(f"head dims {value!r}: {text!r} is not a number or a range like 1-128") from None
        if lo < 1 or hi < lo:
            raise DeclarationError(f"head dims {value!r}: {text!r} is not a range of head dims >= 1")
        ranges.append((lo, hi))
    if not ranges:
        raise DeclarationError(f"head dims {value!r}: empty")
    return tuple(ranges)


def parse_keywords(value):
    """--keywords: names among KEYWORDS, a "window,softcap" string or a sequence of them."""
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value)
    bad = [n for n in names if n not in KEYWORDS]
    if bad or not names:
        raise DeclarationError(f"keywords {value!r}: expected names among {', '.join(KEYWORDS)}"
                               + (f" (not: {', '.join(map(str, bad))})" if bad else ""))
    if ("block_m" in names) != ("block_n" in names):
        raise DeclarationError("keywords: block_m and block_n go together (a case pins both tiles)")
    return tuple(dict.fromkeys(names))


def ranges_text(ranges):
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def _positive(name, minimum):
    def parse(value):
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise DeclarationError(f"{name} {value!r}: not a whole number") from None
        if n < minimum or isinstance(value, bool):
            raise DeclarationError(f"{name} must be >= {minimum}, got {value!r}")
        return n
    return parse


def _choice(name, options):
    def parse(value):
        if value not in options:
            raise DeclarationError(f"{name} {value!r}: expected one of {', '.join(options)}")
        return value
    return parse


def _flag(value):
    if not isinstance(value, bool):
        raise DeclarationError(f"expected True or False, got {value!r}")
    return value


@dataclass(frozen=True)
class Field:
    name: str            # the Python keyword and the kernel attribute's key
    flag: str            # the command-line flag
    parse: object        # value -> normalised value (raises DeclarationError)
    default: object
    help: str
    metavar: str = None  # None: a switch (store_true)
    text: object = None  # normalised value -> the flag's argument as a user writes it


FIELDS = (
    Field("dtypes", "--dtypes", parse_dtypes, None, "supported dtypes, e.g. fp16,bf16 (default: all three)",
          "LIST", ",".join),
    Field("head_dims", "--head-dims", parse_ranges, None,
          "supported head dims: values and ranges, e.g. 64,128 or 1-128 or 16-64,128", "LIST", ranges_text),
    Field("causal", "--no-causal", _flag, True, "the kernel has no causal mode"),
    Field("causal_align", "--causal-align", _choice("causal_align", ALIGNS), "bottom-right",
          "where the causal diagonal sits when Nq != Nk: bottom-right (FlashAttention >= 2.1, the protocol; the "
          "default) or top-left (SDPA's is_causal, FlashAttention < 2.1); top-left kernels are judged against a "
          "top-left reference; the window and ALiBi count from that same diagonal (i - j, not i + Nk - Nq - j)", "ALIGN"),
    Field("causal_same_length", "--causal-same-length", _flag, False, "causal only when Nq == Nk"),
    Field("causal_only", "--causal-only", _flag, False,
          "the kernel always masks causally (decoder-only prefill and decode kernels, such as vLLM's unified "
          "attention): the catalogue's other entries are judged causal where their point survives the mask, "
          "and the generated cases are drawn causal"),
    Field("same_length", "--same-length", _flag, False, "Nq == Nk only (self-attention)"),
    Field("nk_ge_nq", "--nk-ge-nq", _flag, False,
          "every sequence has at least as many keys as queries (Nk >= Nq: a prefill kernel whose queries are the "
          "last tokens of their KV cache, as vLLM's and SGLang's); entries with Nq > Nk are projected onto Nk >= Nq "
          "where their point survives"),
    Field("seq_multiple", "--seq-multiple", _positive("seq_multiple", 1), 1,
          "Nq and Nk must be multiples of N (e.g. 64 or 128)", "N", str),
    Field("min_seq", "--min-seq", _positive("min_seq", 0), 0, "shortest supported Nq and Nk (e.g. 1: no Nq = 0)",
          "N", str),
    Field("max_seq", "--max-seq", _positive("max_seq", 1), None, "longest supported Nq and Nk", "N", str),
    Field("max_seq_q", "--max-seq-q", _positive("max_seq_q", 1), None,
          "longest supported Nq alone (a decode kernel: e.g. 1 or 16 queries against any number of keys); the "
          "catalogue's entries are projected onto it where their point survives", "N", str),
    Field("strides", "--strides", _choice("strides", STRIDES), "any",
          "the strides the kernel accepts: any (the protocol), last-dim-contiguous (unit stride along D), aligned "
          "(unit stride along D, every other stride a multiple of 16 bytes: what TMA and vectorised loads need) or "
          "contiguous ((B, H, N, D) dense)", "KIND"),
    Field("fp32_scores", "--fp32-scores", _flag, False,
          "the kernel keeps its scores in fp32 (fused kernels do): fp16/bf16 cases are judged without the "
          "allowance for scores rounded to the input dtype, so more of them are judged tightly"),
    Field("fused", "--fused", _flag, False,
          "the kernel never materialises the Nq x Nk scores: its extra memory must not grow like Nq x Nk (GPU)"),
    Field("gqa", "--gqa", _choice("gqa", SUPPORT), "auto",
          "grouped-query heads, k and v with fewer heads than q: yes, no, or auto (the default: one small case "
          "tells, since no signature can)", "auto|yes|no"),
    Field("dv", "--dv", _choice("dv", SUPPORT), "auto",
          "a value head dim of its own, v and the output with Dv != D: yes, no, or auto (probed, as --gqa)",
          "auto|yes|no"),
    Field("head_map", "--head-map", _choice("head_map", HEAD_MAPS), "grouped",
          "which kv head query head h reads: grouped, h // (H // Hkv) (FlashAttention, SDPA's enable_gqa; the "
          "protocol), or interleaved, h mod Hkv", "grouped|interleaved"),
    Field("protocol", "--protocol", _choice("protocol", PROTOCOLS), "auto",
          "the calling protocol: dense, varlen (q, k, v, cu_seqlens_q, cu_seqlens_k: packed sequences) or paged "
          "(q, k_cache, v_cache, block_table, cache_seqlens); auto (the default) reads it off the signature's names",
          "auto|dense|varlen|paged"),
    Field("backward", "--backward", _choice("backward", SUPPORT), "auto",
          "the backward (q, k and v's gradients through autograd): yes (judged on every case; an output without an "
          "autograd graph fails), no (not judged), or auto (the default: judged when the kernel's output carries "
          "autograd, which one small call tells)", "auto|yes|no"),
    Field("keywords", "--keywords", parse_keywords, None,
          "the protocol keywords a kernel with a **kwargs signature takes, which no signature shows: any of "
          f"{', '.join(KEYWORDS)} (e.g. window,softcap,out); cases of those features are then judged",
          "LIST", ",".join),
    Field("empty_lse", "--empty-lse", _choice("empty_lse", EMPTY_LSE), "-inf",
          "the log-sum-exp of a row that sees no key: -inf (the protocol; on a command line --empty-lse=-inf, "
          "since a bare -inf reads as an option) or +inf (FlashAttention's kernels)", "-inf|+inf"),
    Field("paged_q", "--paged-q", _choice("paged_q", PAGED_Q), "bhnd",
          "a paged kernel's q and output layout: bhnd, (B, H, Nq, D) as the dense protocol's (the default), or bnhd, "
          "(B, Nq, H, D) as FlashAttention's flash_attn_with_kvcache; when not declared, one small paged case "
          "judged both ways tells", "bhnd|bnhd"),
    Field("window_count", "--window-count", _choice("window_count", WINDOW_COUNTS), "distance",
          "how the kernel counts window=(left, right): distance (the protocol, FlashAttention's window_size: each "
          "side is the farthest key seen from the diagonal, so (0, 0) sees the diagonal key alone) or size (each side "
          "counts its keys with the diagonal's own, as a sliding_window=W of Mistral's and Hugging Face's models "
          "does: (1, 1) sees the diagonal key alone); verify hands each case's window to the kernel in its count",
          "distance|size"),
    Field("lse_layout", "--lse-layout", _choice("lse_layout", LSE_LAYOUTS), "heads-first",
          "the layout of the log-sum-exp that return_lse=True gives: heads-first, the protocol's ((B, H, Nq); "
          "varlen (H, total_q)), or tokens-first ((B, Nq, H); varlen (total_q, H), as FlashInfer's)",
          "heads-first|tokens-first"),
    Field("lse_base", "--lse-base", _choice("lse_base", LSE_BASES), "e",
          "the base of the log-sum-exp that return_lse=True gives: e, the protocol's natural log, or 2 (FlashInfer's, "
          "and kernels that return the log2-domain state of an exp2 loop)", "e|2"),
    Field("nan_stays_in_row", "--nan-stays-in-row", _flag, False,
          "a NaN in one query row of q stays in that row's output (FlashAttention and SDPA keep it there; a kernel "
          "that scales q per tensor or per block, as quantised ones do, cannot): the case with a NaN in q is judged "
          "only with this declaration, since the protocol admits finite inputs only"),
)
BY_NAME = {f.name: f for f in FIELDS}


@dataclass(frozen=True)
class Declarations:
    dtypes: tuple = None
    head_dims: tuple = None
    causal: bool = True
    causal_align: str = "bottom-right"
    causal_same_length: bool = False
    causal_only: bool = False
    same_length: bool = False
    nk_ge_nq: bool = False
    seq_multiple: int = 1
    min_seq: int = 0
    max_seq: int = None
    max_seq_q: int = None
    strides: str = "any"
    fp32_scores: bool = False
    fused: bool = False
    gqa: str = "auto"
    dv: str = "auto"
    head_map: str = "grouped"
    empty_lse: str = "-inf"
    nan_stays_in_row: bool = False
    paged_q: str = "bhnd"
    window_count: str = "distance"
    lse_layout: str = "heads-first"
    lse_base: str = "e"
    keywords: tuple = None
    protocol: str = "auto"
    backward: str = "auto"
    given: tuple = field(default=(), compare=False)   # the names declared (not left at their default)

    @staticmethod
    def parse(values):
        """Each keyword value (as a user writes it) parsed on its own, {name: value}; raises DeclarationError. How
        the values combine is make()'s check."""
        unknown = [k for k in values if k not in BY_NAME]
        if unknown:
            raise DeclarationError(f"unknown declaration(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
        parsed = {}
        for k, v in values.items():
            try:
                parsed[k] = BY_NAME[k].parse(v) if v is not None else None
            except DeclarationError as exc:
                raise DeclarationError(f"{BY_NAME[k].flag} ({k}): {exc}") from None
        return parsed

    @classmethod
    def make(cls, **values):
        """Declarations from keyword values (as a user writes them); raises DeclarationError."""
        decl = cls(**cls.parse(values), given=tuple(k for k in BY_NAME if k in values))
        decl.check()
        return decl

    @classmethod
    def of(cls, kernel, **overrides):
        """The kernel's own declarations (its flashcheck_declarations attribute), with `overrides` (flags)
        taking precedence."""
        own = getattr(kernel, ATTRIBUTE, None) or {}
        if isinstance(own, Declarations):
            own = {k: getattr(own, k) for k in own.given}
        if not isinstance(own, dict):
            raise DeclarationError(f"{ATTRIBUTE} must be a dict of declarations, got {type(own).__name__}")
        return cls.make(**{**own, **overrides})

    def check(self):
        if not self.causal and "causal_align" in self.given and self.causal_align != "bottom-right":
            raise DeclarationError("--causal-align goes with a causal mode: not with --no-causal")
        if not self.causal and self.causal_same_length:
            raise DeclarationError("--causal-same-length goes with a causal mode: not with --no-causal")
        if not self.causal and self.causal_only:
            raise DeclarationError("--causal-only and --no-causal contradict each other")
        if self.max_seq is not None and self.min_seq > self.max_seq:
            raise DeclarationError(f"--min-seq {self.min_seq} > --max-seq {self.max_seq}: no length is supported")
        if self.max_seq is not None and self.seq_multiple > self.max_seq:
            raise DeclarationError(f"--seq-multiple {self.seq_multiple} > --max-seq {self.max_seq}: only "
                                   "empty sequences would be supported")
        if self.max_seq_q is not None and self.min_seq > self.max_seq_q:
            raise DeclarationError(f"--min-seq {self.min_seq} > --max-seq-q {self.max_seq_q}: no query length is "
                                   "supported")
        if self.max_seq_q is not None and self.seq_multiple > self.max_seq_q:
            raise DeclarationError(f"--seq-multiple {self.seq_multiple} > --max-seq-q {self.max_seq_q}: only "
                                   "empty query sequences would be supported")
        for axis, flag in (("Nk", "--max-seq"), ("Nq", "--max-seq-q")):
            hi = self.longest(axis)
            if hi is not None and hi // self.seq_multiple * self.seq_multiple < max(self.min_seq, 1):
                raise DeclarationError(f"no length from --min-seq {self.min_seq} to {flag} {hi} is a multiple of "
                                       f"--seq-multiple {self.seq_multiple}")

    def longest(self, axis):
        """The longest supported length of axis "Nq" or "Nk" (None: no limit): --max-seq bounds both, --max-seq-q
        the queries alone."""
        caps = [n for n in (self.max_seq, self.max_seq_q if axis == "Nq" else None) if n is not None]
        return min(caps) if caps else None

    def fit_length(self, n, axis="Nk", up=True):
        """The length of axis "Nq" or "Nk" these declarations admit nearest to n: rounded up to --seq-multiple (down
        with up=False), raised to --min-seq, cut to the axis's longest; 0 stays 0 where --min-seq admits it. None
        if none (n = 0 with --min-seq 1, or rounding down below --min-seq)."""
        m = self.seq_multiple
        if n == 0:
            return 0 if self.min_seq == 0 else None
        lo, hi = max(self.min_seq, 1), self.longest(axis)
        n = max(n, lo)
        n = -(-n // m) * m if up else max(n // m * m, m)
        if hi is not None and n > hi:
            n = hi // m * m
        return n if lo <= n and (hi is None or n <= hi) else None

    def flags(self):
        """The declarations as command-line flags (those that differ from the defaults)."""
        out = []
        for f in FIELDS:
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if f.metavar is None:
                out.append(f.flag)
            else:
                out.append(f"{f.flag} {(f.text or str)(value)}")
        return out

    def head_dim_ok(self, d):
        return self.head_dims is None or any(lo <= d <= hi for lo, hi in self.head_dims)

    def layouts(self):
        """The layouts of cases/inputs.py the kernel accepts."""
        # lazy, as below: this module stays free of torch (the pytest plugin builds its options from FIELDS in every
        # session, and a session without --flashcheck must not import torch)
        from flashcheck.cases.case import LAYOUTS

        return {"any": LAYOUTS, "last-dim-contiguous": _LAST_DIM_CONTIGUOUS, "aligned": _LAST_DIM_CONTIGUOUS,
                "contiguous": ("contiguous",)}[self.strides]

    def reasons(self, case):
        """Why the declarations exclude this case (empty when they do not)."""
        why = []
        if case.causal and not self.causal:
            why.append("causal (--no-causal)")
        if self.causal_only and not case.causal:
            why.append("not causal (--causal-only)")
        pairs = case.seqlens or [(case.Nq, case.Nk)]
        if case.causal and self.causal_same_length and any(nq != nk for nq, nk in pairs):
            why.append(f"causal with Nq = {case.Nq} != Nk = {case.Nk} (--causal-same-length)")
        if self.dtypes is not None and case.dtype not in self.dtypes:
            why.append(f"dtype {case.dtype} (--dtypes {','.join(self.dtypes)})")
        if not self.head_dim_ok(case.D):
            why.append(f"head dim {case.D} (--head-dims {ranges_text(self.head_dims)})")
        if case.Dv is not None and case.Dv != case.D and not self.head_dim_ok(case.Dv):
            why.append(f"v's head dim {case.Dv} (--head-dims {ranges_text(self.head_dims)})")
        if self.gqa == "no" and case.kv_heads != case.H:
            why.append(f"Hkv = {case.kv_heads} < H = {case.H} (--gqa no)")
        if self.dv == "no" and case.v_dim != case.D:
            why.append(f"Dv = {case.v_dim} != D = {case.D} (--dv no)")
        if case.data == "nan_input" and not self.nan_stays_in_row:
            # outside the protocol, which admits finite inputs: a kernel whose per-tensor or per-block scale of q
            # spreads a NaN over other rows is right by it (a false alarm when this case was judged by default)
            why.append("a NaN in q, outside the protocol's finite inputs (--nan-stays-in-row: it stays in its row)")
        # the lengths of every sequence of a packed case (cases/protocols.py), or the case's own
        before = len(why)
        for at, (nq, nk) in ([(f" (sequence {i})", p) for i, p in enumerate(case.seqlens)] if case.seqlens
                             else [("", (case.Nq, case.Nk))]):
            if len(why) > before:
                break          # the first sequence that is excluded says enough
            if self.same_length and nq != nk:
                why.append(f"Nq = {nq} != Nk = {nk}{at} (--same-length)")
            elif self.nk_ge_nq and nk < nq:
                why.append(f"Nk = {nk} < Nq = {nq}{at} (--nk-ge-nq)")
            for name, n in (("Nq", nq), ("Nk", nk)):
                if n < self.min_seq:
                    why.append(f"{name} = {n}{at} < --min-seq {self.min_seq}")
                elif self.max_seq is not None and n > self.max_seq:
                    why.append(f"{name} = {n}{at} > --max-seq {self.max_seq}")
                elif name == "Nq" and self.max_seq_q is not None and n > self.max_seq_q:
                    why.append(f"Nq = {n}{at} > --max-seq-q {self.max_seq_q}")
                elif n % self.seq_multiple:
                    why.append(f"{name} = {n}{at} not a multiple of --seq-multiple {self.seq_multiple}")
        if case.layout not in self.layouts():
            why.append(f"layout {case.layout} (--strides {self.strides})")
        elif self.strides == "aligned":
            from flashcheck.cases.inputs import strides   # lazy: see layouts()

            elt = case.torch_dtype.itemsize
            odd = [f"{name} {s}" for name, s in strides(case).items()
                   if any((x * elt) % 16 for x, n in zip(s[:-1], (case.B, case.H, 2, 2)) if n > 1)]
            if odd:
                why.append(f"strides not 16-byte aligned: {odd[0]} elements of {elt} bytes (--strides aligned)")
        return why


def declare(**values):
    """Decorator: attach declarations to a kernel (see the module docstring). Checked at once."""
    Declarations.make(**values)

    def attach(kernel):
        setattr(kernel, ATTRIBUTE, dict(values))
        return kernel
    return attach
