"""flashcheck bench: forward TFLOP/s of the fused kernel against torch's scaled_dot_product_attention (and
flex_attention on the features suite; packed sequences and a paged KV cache on the packed suite).

Every shape is run by its contenders on the same inputs in the same process: flashcheck.kernel.fused.attention and
torch.nn.functional.scaled_dot_product_attention with one backend forced at a time through
torch.nn.attention.sdpa_kernel (FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION); the features suite's
shapes add torch.nn.attention.flex_attention, compiled with torch.compile. A contender that refuses a shape or dtype
(or cannot compute its function: SDPA has no softcap) gives an "n/a" cell with the reason; anything that fails
gives an "error" cell, never a crash of the run. Before timing, the kernel's output is compared with a reference
that computes the same function: SDPA (with enable_gqa and, for a window, a boolean attn_mask), else
flex_attention, else (small shapes: the CPU smoke run) flashcheck.reference in float64. A fast wrong kernel is
marked WRONG, not celebrated.

Suites (--suite, default all):
  paper     the FlashAttention paper's shapes: B*N = 16k tokens, H*D = 2048, N in 512..16k, D in {64, 128},
            causal off and on, bf16 and fp16;
  fp32      fp32 (the kernel's dots are ieee) against the efficient backend (flash and cuDNN have no fp32),
            with tf32 switched off for the whole run so torch's matmuls are ieee too;
  decode    decode-like cross-attention: Nq in {1, 16, 128} against Nk in {8k, 32k}, B=8, H=16, D=128, bf16,
            non-causal only (SDPA's is_causal is aligned top-left, the protocol's bottom-right);
  features  the protocol's optional features, bf16 and fp16, D = 128, B*N = 16k tokens: grouped-query attention
            8:1 and 4:1 (Hq = 32, Hkv = 4 and 8, N in {1k, 4k, 16k}, causal off and on; SDPA's enable_gqa,
            flex_attention's enable_gqa), a causal sliding window of 1024 keys (window=(1024, 0), H = 16,
            N in {4k, 16k}; SDPA with a boolean attn_mask, flex_attention with a block mask) and Gemma 2's logit
            softcap c = 50 (H = 16, N in {4k, 16k}, causal off and on; flex_attention's score_mod; SDPA n/a).
  packed    the kernel's packed entry points, D = 128. varlen: attention_varlen on sequences of mixed lengths
            (PACKED_LENGTHS, 128..4096, 16k tokens in all), H = 16, causal off and on, bf16 and fp16, against
            flex_attention with a document mask and against the dense kernel on the sequences padded to the
            longest. paged: attention_paged on B = 32 decode rows (Nq = 1, Hq = 32, Hkv = 8, bf16) whose cache
            lengths (PAGED_LENGTHS, 1k..32k) lie in a shuffled pool of pages of 16 and of 256 slots, against the
            dense kernel on the keys laid out densely, padded to the longest; with its HBM bandwidth.
            The padded dense peer computes another function (the padding keys are not masked: the dense kernel
            has no key-padding mask): it is timed, never a reference.
"all" is paper, fp32 and decode, as in the committed runs saved with "--suite all" (docs/bench/h200/): features
and packed are asked for by name (--suite features packed, or --suite all features).

FLOPs = 4*B*H*Nq*Nk*D (two matmuls of 2*Nq*Nk*D each; H the query heads, whatever Hkv), halved when causal and
Nq == Nk. With a window, 4*B*H*D per (query, key) pair the window lets through, counted exactly (row i sees the
keys max(0, i + Nk - Nq - left) .. min(Nk - 1, i + Nk - Nq + right)): the work a kernel that skips the hidden
blocks must do. The softcap's tanh is not counted. Causal with Nq != Nk is counted in full (no suite runs it:
causal shapes must have Nq == Nk, where SDPA's top-left mask and the protocol's bottom-right mask agree).
Packed shapes sum the formula over their sequences, 4*H*nq*nk*D each (halved when causal with nq == nk), for
every contender: the padded dense peer's extra work on padding is not counted. GB/s: the bytes a fused kernel
must move (Q, K and V of Hkv heads read once, O written once; packed shapes: of every sequence) over the time;
the paged rows also give the kernel's GB/s as a fraction of the H200's peak (H200_HBM_GBPS), "n/a" on another
device.

Timing: triton.testing.do_bench medians on the GPU (warmup/rep in ms). On the CPU the command refuses to run
(the interpreter's timings mean nothing) unless --smoke, which runs four tiny shapes through the interpreter (one
plain, one with GQA, a window and a softcap, one varlen and one paged, checked against the float64 reference),
timed with time.perf_counter, to exercise the code path in CI.

--sweep-blocks times the kernel with each (BLOCK_M, BLOCK_N, num_warps, num_stages) candidate and prints the
best per shape and per group, for tuning flashcheck.kernel.fused.default_blocks.
"""
import argparse
import csv
import datetime
import hashlib
import itertools
import json
import math
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from flashcheck.cases.backend import backend

SDPA_PEERS = ("flash", "cudnn", "efficient")
# Every contender, in table order. A shape runs its own (Shape.contenders): flex only on the features suite and the
# varlen rows; dense (the fused dense kernel on the packed sequences padded to the longest) only on packed rows.
CONTENDERS = ("kernel", *SDPA_PEERS, "flex", "dense")
PEERS = CONTENDERS[1:]
SDPA_BACKEND_NAMES = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                      "math": "MATH"}
# torch's debug warnings open each backend's list of reasons with this line.
REFUSAL_HEADERS = {"flash": "flash attention kernel not used because",
                   "cudnn": "cudnn attention kernel not used because",
                   "efficient": "memory efficient kernel not used because"}
SUITES = ("paper", "fp32", "decode", "features", "packed")
# "all": the suites of the committed runs saved as "--suite all" (docs/bench/h200/); features and packed are asked
# for by name
ALL_SUITES = ("paper", "fp32", "decode")
DTYPES = ("bf16", "fp16", "fp32")
ELEMENT_SIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
# Spot-check tolerance on max|kernel - SDPA|, relative to the largest |SDPA output|: rounding errors scale with
# the output's magnitude, and the outputs of long random rows are averages far below 1, where an absolute 2e-2
# would pass a kernel that ignores half the keys. bf16 keeps 8 significant bits (one rounding of the output is
# up to 0.4% of the largest value), fp16 11 bits; fp32 compares ieee with ieee.
TOLERANCE = {"bf16": 2e-2, "fp16": 1e-2, "fp32": 1e-3}
# SDPA backends tried, in order, for the reference output (then flex_attention where it is a contender, then the
# float64 reference on small shapes). Half precision: the fused backends accumulate in
# fp32 and never materialise the scores (math at 16k tokens needs B*H*N*N scores). fp32: math first (ieee).
REFERENCE_ORDER = {"bf16": ("flash", "cudnn", "efficient", "math"), "fp16": ("flash", "cudnn", "efficient", "math"),
                   "fp32": ("math", "efficient")}

PAPER_TOKENS = 16384  # B*N
PAPER_WIDTH = 2048  # H*D
PAPER_N = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_PAPER_N = (1024, 4096, 16384)
FP32_N = (1024, 4096)
QUICK_FP32_N = (4096,)
DECODE_NQ = (1, 16, 128)
DECODE_NK = (8192, 32768)
QUICK_DECODE_NK = (32768,)
SUMMARY_MIN_NK = 4096
FEATURE_D = 128
GQA_HEADS = 32  # Hq; Hkv = 4 (8:1) and 8 (4:1)
GQA_KV_HEADS = (4, 8)
GQA_N = (1024, 4096, 16384)
QUICK_GQA_N = (4096, 16384)
WINDOW = (1024, 0)  # (left, right): causal, each query sees itself and the 1024 keys before it
WINDOW_N = (4096, 16384)
SOFTCAP = 50.0  # Gemma 2's attention logit cap
SOFTCAP_N = (4096, 16384)
# the packed suite. varlen: a fixed list of mixed lengths in 128..4096, 16k tokens in all like the paper's shapes;
# all but the longest end in a ragged key block, and the longest (4096) puts the rows in the summary (Nk >= 4096)
PACKED_LENGTHS = (178, 1894, 588, 3257, 1737, 704, 2929, 305, 696, 4096)
PACKED_HEADS = 16   # H*D = 2048 with D = 128, Hq = Hkv
# paged decode: 32 cache lengths in 1k..32k (random.Random(31).randint(1024, 32768), 32 draws), Nq = 1, GQA 4:1
PAGED_LENGTHS = (1426, 16411, 4707, 26057, 13896, 5639, 23432, 2441, 5568, 32162, 4708, 18561, 8619, 24338, 25848,
                 5598, 5854, 25293, 2109, 22721, 3010, 5499, 8598, 18576, 25022, 15695, 18262, 14543, 7739, 20458,
                 4075, 4895)
PAGED_HEADS, PAGED_KV_HEADS = 32, 8
PAGE_SIZES = (16, 256)
QUICK_PACKED_DTYPES = ("bf16",)
# An NVIDIA H200's peak HBM bandwidth in GB/s: 4.8 TB/s of HBM3e (NVIDIA's datasheet, SXM and NVL alike). The paged
# rows report the kernel's achieved GB/s as a fraction of it; on any other device the fraction is n/a.
H200_HBM_GBPS = 4800.0
# The float64 reference (flashcheck.reference) materialises B*H*Nq*Nk scores (Shape.scores; packed shapes one
# sequence at a time): only small shapes (the smoke run) and decode (the paged rows: 32 heads x 421,760 keys).
FLOAT64_MAX_SCORES = 1 << 24
# The paged rows' reference where the float64 one does not fit: the fused dense kernel on each sequence's own keys
# (its ref_backend).
PER_SEQUENCE = "dense per sequence"

# The sweep's candidates: the tiles and pipelining depths worth trying on a Hopper-class GPU.
SWEEP_GRID = {"block_m": (64, 128), "block_n": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3, 4)}
# ieee fp32 dots run on CUDA cores with twice the registers per element: smaller tiles, fewer warps (H200: 64 x 64
# with 4 warps ran D = 64 at 19.5 TFLOP/s but spilled at D = 128, 1.0 TFLOP/s).
FP32_SWEEP_GRID = {"block_m": (32, 64), "block_n": (16, 32, 64), "num_warps": (2, 4), "num_stages": (1, 2)}
SMOKE_SWEEP_GRID = {"block_m": (32,), "block_n": (16, 32), "num_warps": (4,), "num_stages": (1,)}

FLOPS_TEXT = "4*B*H*Nq*Nk*D, halved when causal with Nq == Nk"
WINDOW_FLOPS_TEXT = "; with a window, 4*B*H*D per visible (query, key) pair"
PACKED_FLOPS_TEXT = "; packed sequences: summed over the sequences (the padded dense peer's padding not counted)"
BANDWIDTH_TEXT = ("GB/s: Q, K and V (Hkv heads) of every sequence read once and O written once, over the kernel's "
                  f"time; of HBM peak: that against an H200's {H200_HBM_GBPS / 1e3:g} TB/s (n/a on another device)")

DEFAULT_OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "bench"
CPU_REFUSAL = ("flashcheck bench: needs a CUDA GPU. The CPU backend runs Triton's interpreter, whose timings "
               "mean nothing; use --smoke to run four tiny shapes through the code path.")


def attention_flops(B, H, Nq, Nk, D, causal):
    """Forward FLOPs: S = QK^T and O = PV are 2*Nq*Nk*D each per (batch, head); halved when causal with
    Nq == Nk (about half the pairs are masked). Causal with Nq != Nk is counted in full."""
    flops = 4 * B * H * Nq * Nk * D
    return flops // 2 if causal and Nq == Nk else flops


def peak_hbm_gbps(device_name):
    """The peak HBM bandwidth in GB/s of the device torch.cuda.get_device_name() names, where known (an H200),
    else None."""
    return H200_HBM_GBPS if device_name and "H200" in device_name else None


@dataclass(frozen=True)
class Shape:
    """One benchmark problem: q (B, H, Nq, D), k and v (B, Hkv, Nk, D), contiguous, of one dtype; the protocol's
    optional features: Hkv < H (grouped-query attention), window (left, right) (each side None or an int >= 0),
    softcap (c > 0). Hkv defaults to H.

    Packed shapes (the packed suite; varlen_shape, paged_shape) have lengths, one a sequence. varlen (no
    page_size): sequence b has lengths[b] queries and keys, packed (total, H, D); paged: each of the B sequences has
    Nq queries and a cache of lengths[b] keys in pages of page_size slots. B is the number of sequences and Nq, Nk
    the longest (the padded dense peer's shape); they take no window or softcap."""
    suite: str
    dtype: str
    B: int
    H: int
    Nq: int
    Nk: int
    D: int
    causal: bool
    Hkv: int = None
    window: tuple = None
    softcap: float = None
    lengths: tuple = None
    page_size: int = None

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.causal and self.Nq != self.Nk:
            # SDPA's is_causal is aligned top-left, the protocol's bottom-right: they agree only when Nq == Nk.
            raise ValueError(f"causal shapes need Nq == Nk to compare with SDPA, got Nq={self.Nq}, Nk={self.Nk}")
        # one spelling per problem (equal shapes compare equal): Hkv given, a window without a bound side is none
        window = None if self.window is None or tuple(self.window) == (None, None) else tuple(self.window)
        object.__setattr__(self, "Hkv", self.H if self.Hkv is None else int(self.Hkv))
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "softcap", None if self.softcap is None else float(self.softcap))
        if self.Hkv < 1 or self.H % self.Hkv:
            raise ValueError(f"H = {self.H} must be a multiple of Hkv = {self.Hkv}")
        if self.lengths is not None:
            self._check_packed()
        elif self.page_size is not None:
            raise ValueError("a page size needs the cache lengths (lengths=)")

    def _check_packed(self):
        lengths = tuple(int(n) for n in self.lengths)
        object.__setattr__(self, "lengths", lengths)
        if self.page_size is not None:
            object.__setattr__(self, "page_size", int(self.page_size))
        if not lengths or min(lengths) < 0 or (self.page_size is not None and self.page_size < 1):
            raise ValueError(f"packed shapes need lengths >= 0 and a page size >= 1, got {lengths}, "
                             f"page_size {self.page_size}")
        if self.window is not None or self.softcap is not None:
            raise ValueError("packed shapes take no window or softcap")
        longest = (self.Nq if self.page_size else max(lengths), max(lengths))
        if (self.B, self.Nq, self.Nk) != (len(lengths), *longest):
            raise ValueError(f"B, Nq, Nk must be the number of sequences and the longest lengths "
                             f"{(len(lengths), *longest)}, got {(self.B, self.Nq, self.Nk)}")

    @property
    def sequences(self):
        """(queries, keys) of each sequence: (Nq, Nk) B times; varlen (n, n), paged (Nq, n) for n in lengths."""
        if self.lengths is None:
            return ((self.Nq, self.Nk),) * self.B
        return tuple((self.Nq if self.page_size else n, n) for n in self.lengths)

    @property
    def scores(self):
        """How many (query head, query, key) scores the problem has: what the float64 reference materialises."""
        return sum(self.H * nq * nk for nq, nk in self.sequences)

    def problem(self, B=None, Nq=None, Nk=None):
        """The shape's reference.problem.Problem: the protocol's definition of what it computes (B, Nq, Nk given:
        of one packed sequence)."""
        from flashcheck.reference.problem import Problem   # lazy: numpy, only when a shape needs it

        return Problem.make(self.B if B is None else B, self.H, self.Hkv, self.Nq if Nq is None else Nq,
                            self.Nk if Nk is None else Nk, self.D, causal=self.causal, window=self.window,
                            softcap=self.softcap)

    def band(self):
        """(lo, hi): query i sees key j iff lo <= j - i <= hi (and 0 <= j < Nk), the protocol's window and causal
        mask; a side without a bound gets one no row reaches."""
        pb = self.problem()
        far = self.Nq + self.Nk
        return (pb.offset - (far if pb.left is None else pb.left),
                pb.offset + (far if pb.right is None else pb.right))

    @property
    def features(self):
        """The optional features the shape uses, as text ("" for plain attention), a packed shape's layout first."""
        parts = []
        if self.lengths is not None:
            parts.append("varlen" if self.page_size is None else f"paged {self.page_size}")
        if self.Hkv != self.H:
            parts.append(f"gqa {self.H // self.Hkv}:1")
        if self.window is not None:
            parts.append("window " + ",".join("inf" if x is None else str(x) for x in self.window))
        if self.softcap is not None:
            parts.append(f"softcap {self.softcap:g}")
        return " ".join(parts)

    @property
    def contenders(self):
        """The kernel and the peers run on this shape: flex_attention joins SDPA where a feature is in use; packed
        shapes run the padded dense kernel, and varlen flex_attention with a document mask (no SDPA)."""
        if self.lengths is not None:
            return ("kernel", *(() if self.page_size else ("flex",)), "dense")
        return ("kernel", *SDPA_PEERS, *(("flex",) if self.features else ()))

    @property
    def flops(self):
        if self.window is None:
            return sum(attention_flops(1, self.H, nq, nk, self.D, self.causal) for nq, nk in self.sequences)
        lo, hi = self.problem().bounds()   # each row's first and last key
        return 4 * self.B * self.H * self.D * int((hi - lo + 1).clip(min=0).sum())

    @property
    def bytes(self):
        """HBM traffic of a fused kernel: read Q, K, V (K and V of Hkv heads), write O, for every sequence (paged:
        each cached key once)."""
        return ELEMENT_SIZE[self.dtype] * self.D * sum(2 * self.H * nq + 2 * self.Hkv * nk
                                                       for nq, nk in self.sequences)

    def label(self):
        n = f"N={self.Nq}" if self.Nq == self.Nk else f"Nq={self.Nq} Nk={self.Nk}"
        if self.lengths is not None:
            span = f"{min(self.lengths)}..{max(self.lengths)}"
            n = (f"Nq={self.Nq} Nk={span} ({sum(self.lengths)} keys)" if self.page_size
                 else f"N={span} ({sum(self.lengths)} tokens)")
        return (f"{self.suite} {self.dtype} B={self.B} H={self.H} {n} D={self.D}"
                f"{' causal' if self.causal else ''}{' ' + self.features if self.features else ''}")


def paper_shapes(quick=False):
    """The FlashAttention paper's forward benchmark: 16k tokens per batch, hidden width 2048."""
    return [Shape("paper", dtype, PAPER_TOKENS // n, PAPER_WIDTH // d, n, n, d, causal)
            for dtype in ("bf16", "fp16") for causal in (False, True) for d in (64, 128)
            for n in (QUICK_PAPER_N if quick else PAPER_N)]


def fp32_shapes(quick=False):
    return [Shape("fp32", "fp32", PAPER_TOKENS // n, PAPER_WIDTH // d, n, n, d, causal)
            for causal in (False, True) for d in (64, 128) for n in (QUICK_FP32_N if quick else FP32_N)]


def decode_shapes(quick=False):
    return [Shape("decode", "bf16", 8, 16, nq, nk, 128, False)
            for nk in (QUICK_DECODE_NK if quick else DECODE_NK) for nq in DECODE_NQ]


def feature_shapes(quick=False):
    """The protocol's optional features on paper-like shapes (16k tokens, D = 128, bf16 and fp16): GQA 8:1 and 4:1
    with Hq = 32, a causal sliding window and Gemma 2's logit softcap with H*D = 2048."""
    d, halves = FEATURE_D, ("bf16", "fp16")
    gqa = [Shape("features", dtype, PAPER_TOKENS // n, GQA_HEADS, n, n, d, causal, Hkv=hkv)
           for dtype in halves for causal in (False, True) for hkv in GQA_KV_HEADS
           for n in (QUICK_GQA_N if quick else GQA_N)]
    window = [Shape("features", dtype, PAPER_TOKENS // n, PAPER_WIDTH // d, n, n, d, True, window=WINDOW)
              for dtype in halves for n in WINDOW_N]
    softcap = [Shape("features", dtype, PAPER_TOKENS // n, PAPER_WIDTH // d, n, n, d, causal, softcap=SOFTCAP)
               for dtype in halves for causal in (False, True) for n in SOFTCAP_N]
    return gqa + window + softcap


def varlen_shape(suite, dtype, H, D, lengths, causal):
    """Packed sequences of these lengths (queries and keys alike), Hq = Hkv = H: attention_varlen's problem."""
    return Shape(suite, dtype, len(lengths), H, max(lengths), max(lengths), D, causal, lengths=lengths)


def paged_shape(suite, dtype, H, Hkv, Nq, D, lengths, page_size):
    """B = len(lengths) sequences of Nq queries, not causal, over caches of these lengths in pages of page_size
    slots: attention_paged's problem."""
    return Shape(suite, dtype, len(lengths), H, Nq, max(lengths), D, False, Hkv=Hkv, lengths=lengths,
                 page_size=page_size)


def packed_shapes(quick=False):
    """The kernel's packed entry points: varlen on PACKED_LENGTHS (16k tokens, H*D = 2048, causal off and on, bf16
    and fp16; --quick: bf16), and paged decode on PAGED_LENGTHS (B = 32, Nq = 1, Hq = 32, Hkv = 8, bf16) in pages
    of each of PAGE_SIZES."""
    varlen = [varlen_shape("packed", dtype, PACKED_HEADS, FEATURE_D, PACKED_LENGTHS, causal)
              for dtype in (QUICK_PACKED_DTYPES if quick else ("bf16", "fp16")) for causal in (False, True)]
    paged = [paged_shape("packed", "bf16", PAGED_HEADS, PAGED_KV_HEADS, 1, FEATURE_D, PAGED_LENGTHS, page_size)
             for page_size in PAGE_SIZES]
    return varlen + paged


def smoke_shapes():
    """Four tiny fp32 shapes (bf16 is silently wrong in the interpreter), with several key blocks and a causal
    diagonal at the sweep's smoke tiles: plain causal attention, and GQA 2:1 with a window that hides whole key
    blocks and a softcap that bends the scores (no SDPA can compute it, and flex_attention is not compiled on the
    CPU: the float64 reference checks it); packed sequences with an empty one (varlen, causal) and a paged cache
    of 7-slot pages, GQA 2:1 (blocks cross pages), both checked against the float64 reference sequence by
    sequence."""
    return [Shape("smoke", "fp32", 1, 2, 64, 64, 16, True),
            Shape("smoke", "fp32", 1, 4, 64, 64, 16, True, Hkv=2, window=(24, 0), softcap=1.0),
            varlen_shape("smoke", "fp32", 2, 16, (5, 0, 17, 40), True),
            paged_shape("smoke", "fp32", 4, 2, 1, 16, (5, 0, 17, 40), 7)]


def select_shapes(suites=("all",), dtypes=DTYPES, quick=False):
    """The shapes of the chosen suites ("all": ALL_SUITES, with any others named beside it), keeping only the
    chosen dtypes."""
    chosen = set(suites) | (set(ALL_SUITES) if "all" in suites else set())
    makers = {"paper": paper_shapes, "fp32": fp32_shapes, "decode": decode_shapes, "features": feature_shapes,
              "packed": packed_shapes}
    return [s for name in SUITES if name in chosen for s in makers[name](quick) if s.dtype in dtypes]


@dataclass
class Cell:
    """One contender on one shape: status "ok" (ms is the median), "n/a" (refused) or "error"."""
    status: str
    ms: float | None = None
    note: str = ""


@dataclass
class Row:
    """One shape: a cell per contender, and the spot-check of the kernel's output against the reference; the peak
    HBM bandwidth (GB/s) of the device it ran on where known (peak_hbm_gbps)."""
    shape: Shape
    cells: dict = field(default_factory=dict)
    kernel_cfg: str = ""
    ref_backend: str = ""
    max_abs_diff: float | None = None
    ref_max_abs: float | None = None
    check: str = "not run"  # ok | WRONG | no reference | error | not run
    check_note: str = ""
    peak_gbps: float | None = None

    def tflops(self, contender):
        cell = self.cells.get(contender)
        if cell is None or cell.status != "ok" or not cell.ms or cell.ms <= 0:
            return None
        return self.shape.flops / (cell.ms * 1e-3) / 1e12

    def gbps(self, contender):
        cell = self.cells.get(contender)
        if cell is None or cell.status != "ok" or not cell.ms or cell.ms <= 0:
            return None
        return self.shape.bytes / (cell.ms * 1e-3) / 1e9

    def hbm_fraction(self):
        """The kernel's GB/s as a fraction of the device's peak HBM bandwidth, or None (no peak known, no time)."""
        gbps = self.gbps("kernel")
        return gbps / self.peak_gbps if gbps is not None and self.peak_gbps else None

    def ratio(self, peer):
        """kernel / peer throughput (> 1: the kernel is faster), or None when either did not run."""
        mine, theirs = self.tflops("kernel"), self.tflops(peer)
        return mine / theirs if mine is not None and theirs is not None else None


def judge(out, ref, dtype):
    """Spot-check: (check, max_abs_diff, ref_max_abs). check is "ok", "WRONG" (NaN counts as wrong) or
    "no reference" when the reference itself is not finite."""
    ref32 = ref.float()
    ref_max = ref32.abs().max().item()
    diff = (out.float() - ref32).abs().max().item()
    if not math.isfinite(ref_max):
        return "no reference", diff, ref_max
    # "not <=" so that a NaN difference fails
    return ("ok" if diff <= TOLERANCE[dtype] * ref_max else "WRONG"), diff, ref_max


def is_refusal(exc):
    """SDPA's answer when no enabled backend accepts the inputs (CUDA and CPU word it differently)."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("No available kernel" in text or "No viable backend" in text)


def refusal_reason(peer, messages):
    """torch's reasons for refusing `peer`, from the warnings it printed while refusing. Each backend's list
    opens with a header line; the lines about backends switched off by sdpa_kernel are noise."""
    reasons, mine = [], False
    for message in messages:
        text = message.split(" (Triggered internally at")[0].strip()
        low = text.lower()
        if "kernel not used because" in low:
            mine = low.startswith(REFUSAL_HEADERS[peer])
        elif mine and text and "has been runtime disabled" not in low:
            reasons.append(text)
    return "; ".join(dict.fromkeys(reasons))


def describe_error(exc):
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]


def cpu_time(fn, warmup_ms, rep_ms):
    """Median wall time of fn in ms, by time.perf_counter: warm up for warmup_ms (at least one call), then
    time calls for rep_ms (at least three)."""
    deadline = time.perf_counter() + warmup_ms / 1e3
    fn()
    while time.perf_counter() < deadline:
        fn()
    times = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


class NotApplicable(Exception):
    """A contender that cannot compute the shape's function at all; the message says why (an "n/a" cell)."""


class Runtime:
    """torch, triton, the kernel, flex_attention and the timer, imported after the backend is chosen."""

    def __init__(self, on_gpu, warmup, rep, precision="ieee"):
        # lazy, as the class says: Triton and the kernel only once the backend is chosen
        import torch
        import torch.nn.functional as F
        import triton
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from flashcheck.kernel import fused

        self.torch, self.triton, self.F, self.fused = torch, triton, F, fused
        self.SDPBackend, self.sdpa_kernel = SDPBackend, sdpa_kernel
        self.on_gpu = on_gpu
        try:
            # a lazy import: flex_attention is a peer of the features suite only, and older torches lack it
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError:
            create_block_mask = flex_attention = None
        self.create_block_mask = create_block_mask
        if flex_attention is None:
            self.flex, self.flex_note = None, f"torch {torch.__version__} has no flex_attention"
        elif not on_gpu:
            # compiling it for the CPU takes about 25 s a shape, and eager flex_attention is not what is timed
            self.flex, self.flex_note = None, "flex_attention is timed compiled, on the GPU only"
        else:
            # static shapes, one graph per shape (Calls.flex resets torch.compile between shapes: past the recompile
            # limit dynamo would fall back to the eager, unfused flex_attention)
            self.flex, self.flex_note = torch.compile(flex_attention, dynamic=False), ""
        self.precision = precision   # the kernel's fp32 products (--precision); half precision ignores it
        self.device = "cuda" if on_gpu else "cpu"
        self.peak_gbps = peak_hbm_gbps(torch.cuda.get_device_name()) if on_gpu else None
        self.dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        if on_gpu:
            from triton.testing import do_bench   # lazy: Triton, as above

            self.time = lambda fn: do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
            self.timer = f"triton.testing.do_bench median, warmup={warmup:g} ms, rep={rep:g} ms"
        else:
            self.time = lambda fn: cpu_time(fn, warmup, rep)
            self.timer = f"time.perf_counter median (Triton interpreter), warmup={warmup:g} ms, rep={rep:g} ms"

    def sync(self):
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def release(self):
        """Hand freed blocks back between shapes (and after an out-of-memory) so one shape's peak does not
        starve the next."""
        if self.on_gpu:
            self.torch.cuda.empty_cache()

    def inputs(self, shape, seed=0):
        gen = self.torch.Generator(device=self.device).manual_seed(seed)
        dtype = self.dtypes[shape.dtype]
        q = self.torch.randn((shape.B, shape.H, shape.Nq, shape.D), generator=gen, device=self.device, dtype=dtype)
        k = self.torch.randn((shape.B, shape.Hkv, shape.Nk, shape.D), generator=gen, device=self.device, dtype=dtype)
        v = self.torch.randn((shape.B, shape.Hkv, shape.Nk, shape.D), generator=gen, device=self.device, dtype=dtype)
        return q, k, v

    def backend_enum(self, name):
        return getattr(self.SDPBackend, SDPA_BACKEND_NAMES[name], None)

    def reference(self, calls):
        """(output, name, note): the output of the first that runs of calls.references() (SDPA's backends, other
        calls by name); the note says why none did."""
        tried = []
        for name in calls.references():
            try:
                if name in SDPA_BACKEND_NAMES:
                    enum = self.backend_enum(name)
                    if enum is None:
                        raise NotApplicable("not in this torch")
                    fn = calls.sdpa()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        with self.sdpa_kernel([enum]):
                            out = fn()
                else:
                    out = calls.builders()[name]()()
                self.sync()
                return out, name, ""
            except NotApplicable as exc:
                tried.append(f"{name}: {exc}")
            except Exception as exc:  # a refusal, an out-of-memory: try the next one
                tried.append(f"{name}: {describe_error(exc)}")
                self.release()
        return None, "", "; ".join(tried)

    def precision_of(self, shape):
        return self.precision if shape.dtype == "fp32" else "ieee"

    def uses_tma(self, shape):
        """Whether the kernel loads K and V through tensor descriptors: where available, never for packed rows."""
        return shape.lengths is None and self.fused.descriptors_available(self.dtypes[shape.dtype])

    def default_config(self, shape):
        """The kernel's (BLOCK_M, BLOCK_N, num_warps, num_stages) for the shape (its longest lengths)."""
        return tuple(self.fused.default_blocks(shape.Nq, shape.Nk, shape.D, self.dtypes[shape.dtype],
                                               self.precision_of(shape), self.uses_tma(shape)))

    def kernel_config(self, shape, blocks):
        bm, bn, warps, stages = self.default_config(shape)
        if blocks:
            bm, bn = blocks
        tma = self.uses_tma(shape)
        # the dots' precision where it is not fp16/bf16's: tf32x3, or fp32 "ieee" on the fp64 tensor cores
        chooser = getattr(self.fused, "dot_precision", None)
        dots = (chooser(self.dtypes[shape.dtype], self.precision_of(shape)) if chooser
                else self.precision_of(shape))
        return f"{bm}x{bn} w{warps} s{stages}" + (f" {dots}" if dots != "ieee" else "") + (" tma" if tma else "")

    def measure(self, fn):
        """(Cell, output of a trial call). The trial call compiles, and shows failures before the timer runs."""
        try:
            out = fn()
            self.sync()
        except Exception as exc:
            self.release()
            return Cell("error", note=describe_error(exc)), None
        try:
            return Cell("ok", ms=float(self.time(fn))), out
        except Exception as exc:
            self.release()
            return Cell("error", note=describe_error(exc)), out

    def prepared(self, build):
        """(call, None), or (None, the n/a or error Cell) when build() cannot make the call."""
        try:
            return build(), None
        except NotApplicable as exc:
            return None, Cell("n/a", note=str(exc))
        except Exception as exc:  # an out-of-memory building a mask, a compile failure
            self.release()
            return None, Cell("error", note=describe_error(exc))

    def measure_peer(self, peer, calls):
        """The Cell of one peer on one shape's inputs."""
        if peer not in SDPA_BACKEND_NAMES:
            fn, cell = self.prepared(calls.builders()[peer])
            return cell or self.measure(fn)[0]
        enum = self.backend_enum(peer)
        if enum is None:
            return Cell("n/a", note=f"torch {self.torch.__version__} has no SDPBackend.{SDPA_BACKEND_NAMES[peer]}")
        fn, cell = self.prepared(calls.sdpa)
        if cell:
            return cell
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with self.sdpa_kernel([enum]):
                    fn()
                self.sync()
            except Exception as exc:
                if is_refusal(exc):
                    reason = refusal_reason(peer, [str(w.message) for w in caught])
                    return Cell("n/a", note=reason or describe_error(exc))
                self.release()
                return Cell("error", note=describe_error(exc))
        with self.sdpa_kernel([enum]):
            cell, _ = self.measure(fn)
        return cell

    def bench_shape(self, shape, blocks):
        """One Row: the kernel (spot-checked against the reference), then each peer of the shape, on one set of
        inputs."""
        row, calls = Row(shape, peak_gbps=self.peak_gbps), None
        try:
            row.kernel_cfg = self.kernel_config(shape, blocks)
            calls = calls_for(self, shape)
            ref, row.ref_backend, ref_note = self.reference(calls)
            bm, bn = blocks or (None, None)
            row.cells["kernel"], out = self.measure(calls.kernel(bm, bn))
            if ref is None:
                row.check, row.check_note = "no reference", ref_note
            elif out is None:
                row.check, row.check_note = "error", "the kernel did not run"
            else:
                row.check, row.max_abs_diff, row.ref_max_abs = judge(out, ref, shape.dtype)
            del out, ref
            for peer in shape.contenders[1:]:
                row.cells[peer] = self.measure_peer(peer, calls)
        except Exception as exc:  # a fault outside any one contender (inputs, out of memory): record, go on
            note = describe_error(exc)
            for name in shape.contenders:
                row.cells.setdefault(name, Cell("error", note=note))
            if row.check == "not run":
                row.check, row.check_note = "error", note
        finally:
            calls = None   # the inputs and masks, before the cache is emptied
            self.release()
        return row

    def sweep_shape(self, shape, candidates):
        """A SweepRecord per candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) and for the kernel's default
        configuration, each output spot-checked against the reference."""
        default = self.default_config(shape)
        configs = list(candidates) + ([default] if default not in candidates else [])
        records, calls = [], None
        try:
            calls = calls_for(self, shape)
            ref, _, ref_note = self.reference(calls)
            for config in configs:
                cell, out = self.measure(calls.kernel(*config))
                if ref is None:
                    check, diff, note = "no reference", None, ref_note
                elif out is None:
                    check, diff, note = "error", None, "the kernel did not run"
                else:
                    check, diff, _ = judge(out, ref, shape.dtype)
                    note = ""
                del out
                records.append(SweepRecord(shape, config, config == default, cell, check, diff, note))
        except Exception as exc:  # inputs or reference failed: every remaining candidate is an error
            done = {r.config for r in records}
            note = describe_error(exc)
            records += [SweepRecord(shape, c, c == default, Cell("error", note=note), "error", None, note)
                        for c in configs if c not in done]
        finally:
            calls = None
            self.release()
        return records


class Calls:
    """One shape's inputs and the calls that compute its attention: the kernel, SDPA (the caller forces the
    backend), flex_attention and the float64 reference, each a function of no arguments. What a call needs besides
    q, k and v (SDPA's boolean mask, flex_attention's block mask and compiled graph) is built once, on first use,
    outside any timing. A call that cannot compute the shape's function raises NotApplicable."""

    def __init__(self, rt, shape):
        self.rt, self.shape = rt, shape
        self.q, self.k, self.v = rt.inputs(shape)
        self._built = {}

    def _once(self, build):
        if build.__name__ not in self._built:
            self._built[build.__name__] = build()
        return self._built[build.__name__]

    def references(self):
        """The names Runtime.reference tries, in order: SDPA's backends (REFERENCE_ORDER), flex_attention where it
        is one of the shape's contenders, the float64 reference."""
        s = self.shape
        return (*REFERENCE_ORDER[s.dtype], *(("flex",) if "flex" in s.contenders else ()), "float64")

    def builders(self):
        """What builds each call that is not SDPA's (a peer or a reference), by its name."""
        return {"flex": self.flex, "float64": self.float64}

    def options(self, block_m=None, block_n=None, num_warps=None, num_stages=None):
        """The kernel's keyword arguments: the shape's function, the launch overrides, the precision."""
        rt, s = self.rt, self.shape
        return dict(causal=s.causal, window=s.window, softcap=s.softcap, block_m=block_m, block_n=block_n,
                    num_warps=num_warps, num_stages=num_stages, precision=rt.precision_of(s))

    def kernel(self, block_m=None, block_n=None, num_warps=None, num_stages=None):
        options = self.options(block_m, block_n, num_warps, num_stages)
        return lambda: self.rt.fused.attention(self.q, self.k, self.v, **options)

    def visible(self):
        """(Nq, Nk) bool on the device, True where the query sees the key (Shape.band)."""
        torch, s = self.rt.torch, self.shape
        lo, hi = s.band()
        d = torch.arange(s.Nk, device=self.rt.device)[None, :] - torch.arange(s.Nq, device=self.rt.device)[:, None]
        return (d >= lo) & (d <= hi)

    def sdpa(self):
        return self._once(self._sdpa)

    def _sdpa(self):
        s, F = self.shape, self.rt.F
        if s.softcap is not None:
            raise NotApplicable("SDPA has no softcap")
        kwargs = {"enable_gqa": True} if s.Hkv != s.H else {}
        if s.window is not None:   # a boolean mask, True where a query attends (is_causal would align top-left)
            kwargs["attn_mask"] = self.visible()
        else:
            kwargs["is_causal"] = s.causal
        return lambda: F.scaled_dot_product_attention(self.q, self.k, self.v, **kwargs)

    def flex(self):
        return self._once(self._flex)

    def _flex(self):
        rt, s = self.rt, self.shape
        if rt.flex is None:
            raise NotApplicable(rt.flex_note)
        q, k, v, block_mask, score_mod = self.flex_inputs()
        gqa = s.Hkv != s.H
        rt.torch.compiler.reset()   # one graph per shape, never the recompile limit (Runtime.__init__)
        return lambda: rt.flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)

    def flex_inputs(self):
        """(q, k, v, block_mask, score_mod) of flex_attention's call: the window and causal mask as a block mask,
        the softcap as a score_mod."""
        rt, s = self.rt, self.shape
        block_mask = score_mod = None
        if s.window is not None or s.causal:
            lo, hi = s.band()

            def sees(b, h, q_idx, kv_idx):
                return (kv_idx - q_idx >= lo) & (kv_idx - q_idx <= hi)

            block_mask = rt.create_block_mask(sees, None, None, s.Nq, s.Nk, device=rt.device)
        if s.softcap is not None:
            cap, tanh = s.softcap, rt.torch.tanh

            def score_mod(score, b, h, q_idx, kv_idx):
                return cap * tanh(score / cap)

        return self.q, self.k, self.v, block_mask, score_mod

    def float64(self):
        if self.shape.scores > FLOAT64_MAX_SCORES:
            raise NotApplicable(f"{self.shape.scores} scores (H*Nq*Nk over the batch), above {FLOAT64_MAX_SCORES}")
        from flashcheck.reference.torch_ref import attention   # lazy, as Runtime's imports

        return self.float64_call(attention)

    def float64_call(self, attention):
        pb = self.shape.problem()
        return lambda: attention(self.q, self.k, self.v, upcast=True, problem=pb)[0]


class PackedCalls(Calls):
    """A packed shape's inputs and calls. varlen: q (total, H, D), k and v (total, Hkv, D), the sequences one after
    another (cu_seqlens). paged: q (B, H, Nq, D), k and v caches (num_pages, page_size, Hkv, D) whose pool is handed
    out in a fixed shuffled order (a sequence's pages lie anywhere, out of order), the block table and the cache
    lengths; the slots past a sequence's keys hold random values, never read.

    kernel: attention_varlen or attention_paged (their host checks of offsets or table, one synchronisation a
    call, are timed with them: a caller pays them). dense: the fused dense kernel on the sequences padded to the
    longest with zeros; nothing masks the padding keys (the dense kernel has no key-padding mask), so it computes
    another function: a timing peer, never a reference. flex (varlen): flex_attention with a document mask. The
    references, first that runs: the float64 reference sequence by sequence on each one's own keys (where
    FLOAT64_MAX_SCORES allows: the smoke shapes and the paged decode rows), then flex_attention (varlen) or the
    fused dense kernel run sequence by sequence (PER_SEQUENCE, paged)."""

    def __init__(self, rt, shape):
        self.rt, self.shape, self._built = rt, shape, {}
        torch, s = rt.torch, shape
        gen = torch.Generator(device=rt.device).manual_seed(0)

        def randn(*size):
            return torch.randn(size, generator=gen, device=rt.device, dtype=rt.dtypes[s.dtype])

        lengths = torch.tensor(s.lengths, dtype=torch.int32)
        if s.page_size is None:
            total = sum(s.lengths)
            self.q, self.k, self.v = randn(total, s.H, s.D), randn(total, s.Hkv, s.D), randn(total, s.Hkv, s.D)
            self.cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0, dtype=torch.int32)]).to(rt.device)
            return
        counts = [-(-n // s.page_size) for n in s.lengths]
        pool = max(sum(counts), 1)
        self.q = randn(s.B, s.H, s.Nq, s.D)
        self.k, self.v = randn(pool, s.page_size, s.Hkv, s.D), randn(pool, s.page_size, s.Hkv, s.D)
        order = torch.randperm(pool, generator=torch.Generator().manual_seed(1)).tolist()
        starts = itertools.accumulate(counts, initial=0)
        self.page_lists = [order[start:start + count] for start, count in zip(starts, counts)]
        table = torch.zeros((s.B, max(max(counts), 1)), dtype=torch.int32)   # entries past the pages: never read
        for b, pages in enumerate(self.page_lists):
            table[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.block_table, self.cache_seqlens = table.to(rt.device), lengths.to(rt.device)

    def references(self):
        return ("float64", "flex" if self.shape.page_size is None else PER_SEQUENCE)

    def builders(self):
        return {**super().builders(), "dense": self.dense, PER_SEQUENCE: self.dense_per_sequence}

    def kernel(self, block_m=None, block_n=None, num_warps=None, num_stages=None):
        rt, s = self.rt, self.shape
        options = self.options(block_m, block_n, num_warps, num_stages)
        if s.page_size is not None:
            return lambda: rt.fused.attention_paged(self.q, self.k, self.v, self.block_table, self.cache_seqlens,
                                                    **options)
        return lambda: rt.fused.attention_varlen(self.q, self.k, self.v, self.cu_seqlens, self.cu_seqlens,
                                                 max_seqlen_q=s.Nq, max_seqlen_k=s.Nk, **options)

    def sequences(self):
        """Each sequence's (q, k, v) as dense (1, H, nq, D) and (1, Hkv, nk, D) tensors: views of the packed rows,
        or a paged sequence's keys gathered from its pages."""
        s = self.shape
        if s.page_size is None:
            bounds = [0, *itertools.accumulate(s.lengths)]

            def dense(t, b):
                return t[bounds[b]:bounds[b + 1]].transpose(0, 1)[None]

            return [(dense(self.q, b), dense(self.k, b), dense(self.v, b)) for b in range(s.B)]

        def gathered(cache, b):
            return cache[self.page_lists[b]].flatten(0, 1)[:s.lengths[b]].transpose(0, 1)[None]

        return [(self.q[b:b + 1], gathered(self.k, b), gathered(self.v, b)) for b in range(s.B)]

    def each_sequence(self, attend):
        """A call computing attend(q, k, v, nq, nk) on each sequence (PackedCalls.sequences, gathered once), its
        outputs joined in the kernel's layout: packed (total, H, D), or (B, H, Nq, D)."""
        seqs, sizes, cat = self._once(self.sequences), self.shape.sequences, self.rt.torch.cat
        if self.shape.page_size is not None:
            return lambda: cat([attend(*qkv, *n) for qkv, n in zip(seqs, sizes)])
        return lambda: cat([attend(*qkv, *n)[0].transpose(0, 1) for qkv, n in zip(seqs, sizes)])

    def float64_call(self, attention):
        s = self.shape
        return self.each_sequence(lambda q, k, v, nq, nk: attention(q, k, v, upcast=True,
                                                                      problem=s.problem(1, nq, nk))[0])

    def dense_per_sequence(self):
        """The fused dense kernel on each sequence's own keys (cheap for decode): a reference for paged rows."""
        rt, options = self.rt, self.options()

        def attend(q, k, v, nq, nk):
            # the dense kernel refuses Nk = 0; the protocol gives 0 to rows without keys
            return rt.fused.attention(q, k, v, **options) if nk else q.new_zeros(q.shape)

        return self.each_sequence(attend)

    def dense(self):
        return self._once(self._dense)

    def _dense(self):
        """The fused dense kernel on the sequences padded with zeros to the longest: (B, H, Nq, D), (B, Hkv, Nk,
        D)."""
        rt, s = self.rt, self.shape
        seqs = self._once(self.sequences)

        def padded(part, heads, n):
            out = seqs[0][part].new_zeros((s.B, heads, n, s.D))
            for b, seq in enumerate(seqs):
                out[b, :, :seq[part].shape[2]] = seq[part][0]
            return out

        q, k, v = padded(0, s.H, s.Nq), padded(1, s.Hkv, s.Nk), padded(2, s.Hkv, s.Nk)
        options = self.options()
        return lambda: rt.fused.attention(q, k, v, **options)

    def flex_inputs(self):
        """flex_attention on the packed rows as one (1, H, total, D) sequence (copied once, outside the timing, to
        its own layout) with a document mask: a query sees the keys of its own sequence (causal: up to itself)."""
        rt, s, torch = self.rt, self.shape, self.rt.torch
        if s.page_size is not None:
            raise NotApplicable("flex_attention is not a peer of the paged rows")
        doc = torch.repeat_interleave(torch.arange(s.B, device=rt.device),
                                      torch.tensor(s.lengths, device=rt.device))
        causal, total = s.causal, sum(s.lengths)

        def same_sequence(b, h, q_idx, kv_idx):
            same = doc[q_idx] == doc[kv_idx]
            return same & (kv_idx <= q_idx) if causal else same

        block_mask = rt.create_block_mask(same_sequence, None, None, total, total, device=rt.device)
        q, k, v = (t.transpose(0, 1)[None].contiguous() for t in (self.q, self.k, self.v))
        return q, k, v, block_mask, None

    def flex(self):
        call = super().flex()
        return lambda: call()[0].transpose(0, 1)   # (total, H, D), the kernel's layout (a view)


def calls_for(rt, shape):
    """The Calls of a shape: PackedCalls for packed shapes."""
    return (Calls if shape.lengths is None else PackedCalls)(rt, shape)


@dataclass
class SweepRecord:
    """One kernel configuration on one shape."""
    shape: Shape
    config: tuple  # (block_m, block_n, num_warps, num_stages)
    is_default: bool
    cell: Cell
    check: str
    max_abs_diff: float | None
    note: str = ""

    def tflops(self):
        if self.cell.status != "ok" or not self.cell.ms or self.cell.ms <= 0:
            return None
        return self.shape.flops / (self.cell.ms * 1e-3) / 1e12

    def good(self):
        return self.tflops() is not None and self.check == "ok"


def config_text(config):
    bm, bn, warps, stages = config
    return f"{bm}x{bn} w{warps} s{stages}"


def sweep_candidates(smoke=False, blocks=None, dtype="bf16", precision="ieee"):
    """Every (block_m, block_n, num_warps, num_stages) of the dtype's grid; --blocks pins the tile and sweeps
    the rest."""
    grid = SMOKE_SWEEP_GRID if smoke else FP32_SWEEP_GRID if dtype == "fp32" and precision == "ieee" else SWEEP_GRID
    bms, bns = ((blocks[0],), (blocks[1],)) if blocks else (grid["block_m"], grid["block_n"])
    return [(bm, bn, w, s) for bm in bms for bn in bns for w in grid["num_warps"] for s in grid["num_stages"]]


def group_key(shape):
    return shape.suite, shape.dtype, shape.D, shape.causal, shape.features


def group_text(key):
    suite, dtype, d, causal, features = key
    return f"{suite} {dtype} D={d} {'causal' if causal else 'non-causal'}" + (f" {features}" if features else "")


def contenders_of(rows):
    """The contenders that ran on some row, in table order: the columns a table or a CSV needs (a run or a saved
    file without the features suite has no flex column)."""
    return [c for c in CONTENDERS if any(c in r.cells for r in rows)]


def contenders_of_shapes(shapes):
    return [c for c in CONTENDERS if any(c in s.contenders for s in shapes)]


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def best_configs(records):
    """(per shape, per group) winners among the candidates that ran and passed the spot-check. A group's
    winner has the best geometric-mean TFLOP/s over the group's shapes, among configs good on all of them."""
    per_shape = []
    by_shape = {}
    for r in records:
        by_shape.setdefault(r.shape, []).append(r)
    for shape, rs in by_shape.items():
        good = [r for r in rs if r.good()]
        default = next((r for r in rs if r.is_default), None)
        best = max(good, key=lambda r: r.tflops()) if good else None
        per_shape.append({
            "shape": shape.label(), "best": config_text(best.config) if best else None,
            "best_tflops": best.tflops() if best else None,
            "default": config_text(default.config) if default else None,
            "default_tflops": default.tflops() if default and default.good() else None,
            "candidates": len(rs), "good": len(good)})
    per_group = []
    groups = {}
    for shape in by_shape:
        groups.setdefault(group_key(shape), []).append(shape)
    for key, shapes in groups.items():
        scores = {}
        for shape in shapes:
            for r in by_shape[shape]:
                scores.setdefault(r.config, {})[shape] = r.tflops() if r.good() else None
        complete = {cfg: geomean(list(v.values())) for cfg, v in scores.items()
                    if len(v) == len(shapes) and None not in v.values()}
        best = max(complete, key=complete.get) if complete else None
        # The default may differ between the group's shapes (default_blocks sees Nq and Nk): each shape's own.
        defaults = [r for shape in shapes for r in by_shape[shape] if r.is_default]
        default_good = len(defaults) == len(shapes) and all(r.good() for r in defaults)
        entry = {"group": group_text(key), "shapes": len(shapes),
                 "best": config_text(best) if best else None, "best_tflops": complete.get(best),
                 "default": " / ".join(dict.fromkeys(config_text(r.config) for r in defaults)) or None,
                 "default_tflops": geomean([r.tflops() for r in defaults]) if default_good else None}
        both = entry["best_tflops"] and entry["default_tflops"]
        entry["speedup"] = entry["best_tflops"] / entry["default_tflops"] if both else None
        per_group.append(entry)
    return per_shape, per_group


def summarize(rows, min_nk=SUMMARY_MIN_NK):
    """Median kernel/peer ratio per (suite, dtype, D, causal, features) over the shapes with Nk >= min_nk where the
    kernel was timed and its output passed the spot-check (a WRONG kernel's speed is not counted)."""
    groups = {}
    for r in rows:
        if r.shape.Nk >= min_nk and r.check == "ok" and r.tflops("kernel") is not None:
            groups.setdefault(group_key(r.shape), []).append(r)
    summary = []
    for key, rs in groups.items():
        suite, dtype, d, causal, features = key
        entry = {"suite": suite, "dtype": dtype, "D": d, "causal": causal, "features": features, "shapes": len(rs)}
        for peer in contenders_of(rs)[1:]:
            ratios = [x for x in (r.ratio(peer) for r in rs) if x is not None]
            entry[f"kernel/{peer}"] = statistics.median(ratios) if ratios else None
            entry[f"n_{peer}"] = len(ratios)
        summary.append(entry)
    return summary


def _fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def _columns_text(headers, body, left):
    """Fixed-width columns; the first `left` are left-aligned (names), the rest right-aligned (numbers)."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *body)]
    lines = []
    for values in [headers, *body]:
        parts = [str(v).ljust(w) if i < left else str(v).rjust(w) for i, (v, w) in enumerate(zip(values, widths))]
        lines.append("  ".join(parts).rstrip())
    return lines


def format_table(rows):
    """The per-shape table: TFLOP/s of each contender, kernel/peer ratios, the spot-check; n/a and error cells
    point to numbered notes below the table."""
    notes = {}

    def noted(text, note):
        if not note:
            return text
        return f"{text}[{notes.setdefault(note, len(notes) + 1)}]"

    contenders = contenders_of(rows)
    featured = any(r.shape.features for r in rows)
    paged = any(r.shape.page_size for r in rows)   # the kernel's GB/s and its fraction of the HBM peak
    headers = ["suite", "dtype", "B", "H", "Nq", "Nk", "D", "causal", *(["features"] if featured else []), *contenders,
               *(f"k/{p}" for p in contenders[1:]), *(["GB/s", "of HBM peak"] if paged else []), "kernel cfg",
               "max|diff|", "check"]
    body = []
    for r in rows:
        s = r.shape
        cells = []
        for c in contenders:
            cell = r.cells.get(c)
            if cell is None:
                cells.append("-")
            elif cell.status == "ok":
                cells.append(_fmt(r.tflops(c)))
            else:
                cells.append(noted(cell.status, f"{c} {cell.status}: {cell.note}"))
        check_note = f"check {r.check}: {r.check_note}" if r.check_note else ""
        body.append([s.suite, s.dtype, s.B, s.H, s.Nq, s.Nk, s.D, "yes" if s.causal else "no",
                     *([s.features or "-"] if featured else []), *cells,
                     *(_fmt(r.ratio(p), ".2f") for p in contenders[1:]),
                     *([_fmt(r.gbps("kernel"), ".4g"), "n/a" if r.peak_gbps is None else _fmt(r.hbm_fraction(), ".2f")]
                       if paged else []),
                     r.kernel_cfg, _fmt(r.max_abs_diff, ".2g"), noted(r.check, check_note)])
    flops = (FLOPS_TEXT + (WINDOW_FLOPS_TEXT if any(r.shape.window for r in rows) else "")
             + (PACKED_FLOPS_TEXT if any(r.shape.lengths for r in rows) else ""))
    lines = [f"TFLOP/s (FLOPs = {flops}); k/peer > 1: the kernel is faster"] + ([BANDWIDTH_TEXT] if paged else [])
    lines += _columns_text(headers, body, left=2)
    lines += [f"[{n}] {text}" for text, n in notes.items()]
    return "\n".join(lines)


def format_summary(summary):
    if not summary:
        return f"summary: no spot-checked shape with Nk >= {SUMMARY_MIN_NK}"
    peers = [p for p in PEERS if any(f"kernel/{p}" in e for e in summary)]
    featured = any(e.get("features") for e in summary)
    headers = ["suite", "dtype", "D", "causal", *(["features"] if featured else []), "shapes",
               *(f"k/{p}" for p in peers)]
    body = [[e["suite"], e["dtype"], e["D"], "yes" if e["causal"] else "no",
             *([e.get("features") or "-"] if featured else []), e["shapes"],
             *(_fmt(e.get(f"kernel/{p}"), ".2f") for p in peers)] for e in summary]
    return "\n".join([f"median kernel/peer TFLOP/s ratio over shapes with Nk >= {SUMMARY_MIN_NK}:",
                      *_columns_text(headers, body, left=2)])


def format_sweep(per_shape, per_group):
    lines = ["best kernel configuration (BLOCK_M x BLOCK_N, num_warps, num_stages) per shape:"]
    body = [[e["shape"], e["best"] or "none", _fmt(e["best_tflops"]), e["default"] or "-",
             _fmt(e["default_tflops"]), f"{e['good']}/{e['candidates']}"] for e in per_shape]
    lines += _columns_text(["shape", "best", "TFLOP/s", "default", "TFLOP/s", "good"], body, left=2)
    lines.append("best per group (geometric mean TFLOP/s over the group's shapes):")
    body = [[e["group"], e["best"] or "none", _fmt(e["best_tflops"]), e["default"] or "-",
             _fmt(e["default_tflops"]), _fmt(e["speedup"], ".2f")] for e in per_group]
    lines += _columns_text(["group", "best", "TFLOP/s", "default", "TFLOP/s", "speedup"], body, left=2)
    return "\n".join(lines)


def _num(x):
    """A float for JSON and CSV: finite as is, NaN/inf as text (strict JSON has no NaN)."""
    if x is None:
        return None
    return x if math.isfinite(x) else str(x)


SHAPE_COLUMNS = ["suite", "dtype", "B", "H", "Hkv", "Nq", "Nk", "D", "causal", "window_left", "window_right",
                 "softcap", "lengths", "page_size", "flops", "bytes"]


def csv_columns(contenders=CONTENDERS):
    """The columns of bench.csv for these contenders (a run writes those of contenders_of(its rows))."""
    return (SHAPE_COLUMNS
            + [f"{c}_{x}" for c in contenders for x in ("status", "ms", "tflops", "gbps", "note")]
            + [f"kernel/{p}" for p in contenders if p != "kernel"]
            + ["kernel_cfg", "ref_backend", "max_abs_diff", "ref_max_abs", "tolerance", "check", "check_note",
               "hbm_peak_gbps", "kernel_hbm_fraction"])


CSV_COLUMNS = csv_columns()
SWEEP_COLUMNS = (SHAPE_COLUMNS + ["block_m", "block_n", "num_warps", "num_stages", "is_default", "status", "ms",
                                  "tflops", "max_abs_diff", "check", "note"])


def _shape_record(s):
    left, right = s.window or (None, None)
    return {"suite": s.suite, "dtype": s.dtype, "B": s.B, "H": s.H, "Hkv": s.Hkv, "Nq": s.Nq, "Nk": s.Nk, "D": s.D,
            "causal": s.causal, "window_left": left, "window_right": right, "softcap": s.softcap,
            "lengths": None if s.lengths is None else " ".join(map(str, s.lengths)), "page_size": s.page_size,
            "flops": s.flops, "bytes": s.bytes}


def row_record(r):
    """One Row as a flat dict keyed by csv_columns(): the columns of the shape's own contenders (no flex_* keys
    for a shape without features)."""
    rec = _shape_record(r.shape)
    for c in r.shape.contenders:
        cell = r.cells.get(c, Cell("error", note="not run"))
        rec.update({f"{c}_status": cell.status, f"{c}_ms": _num(cell.ms), f"{c}_tflops": _num(r.tflops(c)),
                    f"{c}_gbps": _num(r.gbps(c)), f"{c}_note": cell.note})
    rec.update({f"kernel/{p}": _num(r.ratio(p)) for p in r.shape.contenders[1:]})
    rec.update({"kernel_cfg": r.kernel_cfg, "ref_backend": r.ref_backend, "max_abs_diff": _num(r.max_abs_diff),
                "ref_max_abs": _num(r.ref_max_abs), "tolerance": TOLERANCE[r.shape.dtype], "check": r.check,
                "check_note": r.check_note, "hbm_peak_gbps": r.peak_gbps,
                "kernel_hbm_fraction": _num(r.hbm_fraction())})
    return rec


def row_from_record(rec):
    """The Row a row_record came from (times, not derived figures, are what it keeps): for --show. Reads the
    records of older runs too (no Hkv, window or softcap: plain attention; no flex_* keys: flex did not run; no
    lengths: not packed; no hbm_peak_gbps: no peak known)."""
    window = (rec.get("window_left"), rec.get("window_right"))
    lengths = rec.get("lengths")
    shape = Shape(rec["suite"], rec["dtype"], int(rec["B"]), int(rec["H"]), int(rec["Nq"]), int(rec["Nk"]),
                  int(rec["D"]), bool(rec["causal"]), Hkv=rec.get("Hkv"), window=window, softcap=rec.get("softcap"),
                  lengths=None if lengths is None else lengths.split(), page_size=rec.get("page_size"))
    cells = {c: Cell(rec[f"{c}_status"], rec[f"{c}_ms"] if isinstance(rec[f"{c}_ms"], (int, float)) else None,
                     rec[f"{c}_note"]) for c in CONTENDERS if rec.get(f"{c}_status")}
    return Row(shape, cells, rec["kernel_cfg"], rec["ref_backend"], rec["max_abs_diff"], rec["ref_max_abs"],
               rec["check"], rec["check_note"], rec.get("hbm_peak_gbps"))


def show(path):
    """Print the table and summary of a run saved by flashcheck bench (its JSON sidecar)."""
    document = json.loads(Path(path).read_text())
    meta = document["meta"]
    rows = [row_from_record(r) for r in document["results"]]
    print(f"{meta['tool']} {meta['options']} on {meta.get('gpu') or meta.get('device')}, torch {meta['torch']}, "
          f"triton {meta['triton']}, {meta['date']}" + (f"; kernel {meta['kernel_source']}" if "kernel_source" in meta
                                                         else ""))
    print(format_table(rows))
    print()
    print(format_summary(summarize(rows)))
    return 0


def sweep_record(r):
    rec = _shape_record(r.shape)
    bm, bn, warps, stages = r.config
    rec.update({"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages, "is_default": r.is_default,
                "status": r.cell.status, "ms": _num(r.cell.ms), "tflops": _num(r.tflops()),
                "max_abs_diff": _num(r.max_abs_diff), "check": r.check, "note": r.cell.note or r.note})
    return rec


def _csv_value(x):
    if x is None:
        return ""
    return format(x, ".6g") if isinstance(x, float) else x


def write_csv(path, meta, columns, records):
    """Header lines "# key: value" (GPU, versions, date, options), then one row per record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        for key, value in meta.items():
            f.write(f"# {key}: {' '.join(str(value).split())}\n")
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for rec in records:
            # a contender that did not run on this row (flex beside a paper shape) leaves its columns empty
            writer.writerow({k: _csv_value(rec.get(k)) for k in columns})


def write_json(path, document):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(document, f, indent=1, allow_nan=False)
        f.write("\n")


def plot(rows, meta, path):
    """A PNG: one panel per (suite, dtype, D, causal, features) (decode: per Nk too), TFLOP/s of each contender against
    the sequence length. Returns None, or why no plot was written (matplotlib is optional).

    Drawn with matplotlib from the measured rows rather than through triton.testing.perf_report, which
    re-runs its function per point, needs pandas and writes one file per Benchmark."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    panels = {}
    for r in rows:
        s = r.shape
        key = group_text(group_key(s)) + ("" if s.Nq == s.Nk else f" Nk={s.Nk}")
        panels.setdefault(key, []).append(r)
    if not panels:
        return "no results to plot"
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.4 * ncols, 7.0), 3.4 * nrows + 0.6), squeeze=False)
    for ax, (title, rs) in zip(axes.flat, panels.items()):
        rs = sorted(rs, key=lambda r: r.shape.Nq)
        xs = [r.shape.Nq for r in rs]
        for c in CONTENDERS:
            ys = [r.tflops(c) for r in rs]
            if any(y is not None for y in ys):
                ax.plot(xs, [math.nan if y is None else y for y in ys], marker="o", label=c)
        wrong = [(r.shape.Nq, r.tflops("kernel")) for r in rs if r.check == "WRONG" and r.tflops("kernel")]
        if wrong:
            ax.scatter(*zip(*wrong), marker="x", s=80, color="red", zorder=3, label="kernel WRONG")
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs], fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("N" if all(r.shape.Nq == r.shape.Nk for r in rs) else "Nq")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"flashcheck bench: {meta.get('gpu', meta.get('device'))}\n"
                 f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def options_text(args):
    parts = ["--smoke"] if args.smoke else [f"--suite {' '.join(args.suite)}", f"--dtypes {' '.join(args.dtypes)}"]
    if args.quick and not args.smoke:
        parts.append("--quick")
    parts += [f"--warmup {args.warmup:g}", f"--rep {args.rep:g}"]
    if args.blocks:
        parts.append(f"--blocks {args.blocks[0]}x{args.blocks[1]}")
    if args.sweep_blocks:
        parts.append("--sweep-blocks")
    if args.precision != "ieee":
        parts.append(f"--precision {args.precision}")
    return " ".join(parts)


def kernel_source(path):
    """What kernel was measured: the sha256 of its source file (12 hex digits), and where the file lies in a git
    checkout, the commit, marked "+modified" when the file differs from it (a device copy of a working tree may
    have no .git: the hash still names the source)."""
    path = Path(path)
    text = f"{path.name} sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
    try:
        git = ["git", "-C", str(path.parent)]
        commit = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        modified = subprocess.run(git + ["diff", "--quiet", "HEAD", "--", path.name], timeout=10).returncode != 0
        text += f", commit {commit}" + ("+modified" if modified else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return text


def collect_meta(rt, args, date):
    torch = rt.torch
    meta = {"tool": "flashcheck bench", "options": options_text(args), "date": date}
    if rt.on_gpu:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        meta.update({"gpu": props.name, "capability": f"{props.major}.{props.minor}",
                     "gpu_memory_gib": round(props.total_memory / 2**30, 1)})
    else:
        meta["device"] = "CPU (Triton interpreter)"
    meta.update({"torch": torch.__version__, "triton": rt.triton.__version__, "cuda": torch.version.cuda or "none",
                 "cudnn": str(torch.backends.cudnn.version()), "python": platform.python_version(),
                 "timer": rt.timer, "tf32": "off (torch.backends.cuda.matmul.allow_tf32 = False, cudnn too)",
                 "flops": FLOPS_TEXT + WINDOW_FLOPS_TEXT + PACKED_FLOPS_TEXT,
                 "hbm_peak_gbps": rt.peak_gbps if rt.peak_gbps else "n/a (peak_hbm_gbps knows the H200 only)",
                 "check": "max|kernel - reference| <= tol * max|reference| (the reference: ref_backend), tol " +
                          ", ".join(f"{k} {v:g}" for k, v in TOLERANCE.items()),
                 "kernel_blocks": (f"{args.blocks[0]}x{args.blocks[1]} (--blocks)" if args.blocks
                                   else "flashcheck.kernel.fused.default_blocks"),
                 "kernel_source": kernel_source(rt.fused.__file__)})
    return meta


def output_paths(args):
    base = ("smoke" if args.smoke else "bench") + ("_sweep" if args.sweep_blocks else "")
    out_dir = Path(args.out_dir)
    return {"csv": Path(args.csv) if args.csv else out_dir / f"{base}.csv",
            "plot": Path(args.plot) if args.plot else out_dir / f"{base}.png",
            "json": Path(args.json) if args.json else out_dir / f"{base}.json"}


def parse_blocks(text):
    """"BMxBN" -> (BM, BN), powers of two."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"want BMxBN, for example 128x64; got {text!r}")
    bm, bn = int(m[1]), int(m[2])
    for b in (bm, bn):
        if b < 1 or b & (b - 1):
            raise argparse.ArgumentTypeError(f"block sizes must be powers of two, got {text!r}")
    return bm, bn


def _positive_ms(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"want a positive number of milliseconds, got {text!r}")
    return value


def add_arguments(parser):
    parser.add_argument("--suite", nargs="+", choices=(*SUITES, "all"), default=["all"],
                        help="paper (FlashAttention paper shapes), fp32 (ieee, against efficient), decode "
                             "(Nq in 1..128 against Nk in 8k..32k), features (GQA 8:1 and 4:1, a sliding window, "
                             "a logit softcap; SDPA and flex_attention), packed (varlen against flex_attention and "
                             "the padded dense kernel; paged decode against the padded dense kernel, with its HBM "
                             "bandwidth); default all: paper, fp32 and decode")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES),
                        help="keep only the shapes of these dtypes (default all)")
    parser.add_argument("--quick", action="store_true",
                        help=f"reduced set: paper N in {QUICK_PAPER_N}, fp32 N in {QUICK_FP32_N}, "
                             f"decode Nk in {QUICK_DECODE_NK}, features GQA N in {QUICK_GQA_N}, packed varlen "
                             f"{' '.join(QUICK_PACKED_DTYPES)} only")
    parser.add_argument("--warmup", type=_positive_ms, default=25.0, help="do_bench warmup, ms (default 25)")
    parser.add_argument("--rep", type=_positive_ms, default=100.0, help="do_bench repetition time, ms (default 100)")
    parser.add_argument("--blocks", type=parse_blocks, metavar="BMxBN",
                        help="force the kernel's BLOCK_M x BLOCK_N (default: flashcheck.kernel.fused.default_blocks)")
    parser.add_argument("--precision", choices=("ieee", "tf32x3"), default="ieee",
                        help="the kernel's fp32 products (flashcheck.kernel.fused.attention's precision=): ieee "
                             "(default) or tf32x3; fp16 and bf16 shapes ignore it")
    parser.add_argument("--sweep-blocks", action="store_true",
                        help="time the kernel with every (BLOCK_M, BLOCK_N, num_warps, num_stages) candidate "
                             "and print the best (with --blocks: sweep warps and stages only)")
    parser.add_argument("--show", type=Path, metavar="JSON",
                        help="print the table of a saved run (its bench.json) and exit; needs no GPU")
    parser.add_argument("--smoke", action="store_true",
                        help="four tiny shapes, plain, with features, varlen and paged (on the CPU through "
                             "Triton's interpreter): exercises the code path")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                        help="where bench.csv/.png/.json go (smoke.*, bench_sweep.* for the other modes)")
    parser.add_argument("--csv", type=Path, help="CSV path (default OUT_DIR/bench.csv)")
    parser.add_argument("--plot", type=Path, help="PNG path (default OUT_DIR/bench.png; needs matplotlib)")
    parser.add_argument("--json", type=Path, help="JSON sidecar path (default OUT_DIR/bench.json)")


def _progress(text):
    print(text, file=sys.stderr, flush=True)


def _row_progress(row):
    parts = [f"{c} {_fmt(row.tflops(c)) if row.cells[c].status == 'ok' else row.cells[c].status}"
             for c in CONTENDERS if c in row.cells]
    return (f"    TFLOP/s: {', '.join(parts)}; check {row.check}"
            + (f" (max|diff| {_fmt(row.max_abs_diff, '.2g')}, ref {row.ref_backend})" if row.ref_backend else ""))


def run(args):
    if args.show:
        return show(args.show)
    on_gpu = backend() == "gpu"
    if not on_gpu and not args.smoke:
        print(CPU_REFUSAL, file=sys.stderr)
        return 2
    shapes = smoke_shapes() if args.smoke else select_shapes(args.suite, args.dtypes, args.quick)
    if not shapes:
        print(f"flashcheck bench: no shape in --suite {' '.join(args.suite)} has a dtype in "
              f"--dtypes {' '.join(args.dtypes)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rt = Runtime(on_gpu, args.warmup, args.rep, args.precision)
    # Everything that can fail outside the measurements is done before them, so that a failure costs no
    # device time and finished measurements are never lost to it.
    meta = collect_meta(rt, args, date)
    paths = output_paths(args)
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)

    # lazy: `import flashcheck.cases.bench` (the CLI reading its flags) stays free of torch (tests/test_bench.py)
    from flashcheck.reference.torch_ref import no_tf32

    # tf32 off for the whole run: the fp32 peers and the fp32 reference then multiply in ieee, like the kernel.
    with no_tf32():
        if args.sweep_blocks:
            return _run_sweep(rt, args, shapes, paths, meta, started)
        # flash and cuDNN refuse fp32 at once, SDPA cannot softcap: two timings per such shape
        timings = sum(2 if "flash" in s.contenders and (s.dtype == "fp32" or s.softcap) else len(s.contenders)
                      for s in shapes)
        compiles = sum("flex" in s.contenders for s in shapes) if rt.flex else 0
        _progress(f"flashcheck bench: {len(shapes)} shapes x up to {len(contenders_of_shapes(shapes))} contenders "
                  f"on {rt.device}, {rt.timer}; about {estimate_seconds(timings, args.warmup, args.rep):.0f} s plus "
                  "compilation" + (f" (flex_attention compiles once per shape: {compiles} shapes)" if compiles else ""))
        rows = []
        for i, shape in enumerate(shapes, 1):
            _progress(f"[{i}/{len(shapes)}] {shape.label()}")
            rows.append(rt.bench_shape(shape, args.blocks))
            _progress(_row_progress(rows[-1]))
    summary = summarize(rows)
    try:
        plot_note = plot(rows, meta, paths["plot"])
    except Exception as exc:  # the plot is a convenience: never lose the measurements to it
        plot_note = f"plot failed: {describe_error(exc)}"
    meta["plot"] = str(paths["plot"]) if plot_note is None else f"skipped: {plot_note}"
    meta["wall_s"] = round(time.perf_counter() - started, 1)
    write_csv(paths["csv"], meta, csv_columns(contenders_of(rows)), [row_record(r) for r in rows])
    write_json(paths["json"], {"meta": meta, "results": [row_record(r) for r in rows], "summary": summary})
    print(format_table(rows))
    print()
    print(format_summary(summary))
    _progress(f"wrote {paths['csv']}, {paths['json']}"
              + (f", {paths['plot']}" if plot_note is None else f"; plot {meta['plot']}"))
    bad = [r for r in rows if r.check != "ok" or r.cells["kernel"].status != "ok"]
    if bad:
        _progress(f"flashcheck bench: the kernel failed, was WRONG or was not checked on {len(bad)} of "
                  f"{len(rows)} shapes (see the check column)")
        return 1
    return 0


def estimate_seconds(timings, warmup, rep):
    """Rough wall time of `timings` do_bench calls: warmup + rep each, plus about half again (do_bench's
    runtime estimate and L2 flushes, the trial call), compilation not included."""
    return timings * (warmup + rep) / 1e3 * 1.5


def _run_sweep(rt, args, shapes, paths, meta, started):
    candidates = {s: sweep_candidates(args.smoke, args.blocks, s.dtype, args.precision) for s in shapes}
    timings = sum(len(c) + 1 for c in candidates.values())
    _progress(f"flashcheck bench --sweep-blocks: {len(shapes)} shapes, {timings} configurations (the default "
              f"included) on {rt.device}, {rt.timer}; about "
              f"{estimate_seconds(timings, args.warmup, args.rep):.0f} s plus compilation")
    records = []
    for i, shape in enumerate(shapes, 1):
        _progress(f"[{i}/{len(shapes)}] {shape.label()}")
        records += rt.sweep_shape(shape, candidates[shape])
        good = [r for r in records if r.shape == shape and r.good()]
        if good:
            best = max(good, key=lambda r: r.tflops())
            _progress(f"    best {config_text(best.config)}: {_fmt(best.tflops())} TFLOP/s "
                      f"({len(good)} good candidates)")
        else:
            _progress("    no candidate ran and passed the check")
    per_shape, per_group = best_configs(records)
    meta["wall_s"] = round(time.perf_counter() - started, 1)
    write_csv(paths["csv"], meta, SWEEP_COLUMNS, [sweep_record(r) for r in records])
    write_json(paths["json"], {"meta": meta, "records": [sweep_record(r) for r in records],
                               "best_per_shape": per_shape, "best_per_group": per_group})
    print(format_sweep(per_shape, per_group))
    _progress(f"wrote {paths['csv']}, {paths['json']}")
    return 0 if all(e["best"] for e in per_shape) else 1
