"""Hypothesis strategies over the legal case space of the active backend, and the test profiles.

Every strategy produces flashcheck.cases.case.Case objects, the catalogue's own syntax, so a shrunk failing example
prints as a ready catalogue entry (Case.source()).

The space, per backend (flashcheck.cases.backend.backend()):
  cpu  Triton's interpreter: fp32 and fp16 only (its bfloat16 is silently wrong), block pins down to 4,
       lengths up to 80, and a cost cap on the tiles the interpreter walks through (it runs one program at
       a time in NumPy: about 2.5 ms per (query block, key block) step of the fused kernel);
  gpu  compiled: fp32, fp16, bf16, block pins >= 16 (tl.dot's minimum), tiles that fit shared memory,
       lengths up to 256, or 1024 under the `thorough` profile.
One draw in 16 is a few queries against hundreds of key blocks (2,048 keys on the CPU, up to 16k on the GPU),
where a running state kept in half precision drifts. Lengths gather at block boundaries (multiples of 4..64,
or 16..128 on the GPU, and their neighbours) and at the small end (0 queries, 1 key), where the masks live;
head dims gather at 1, 2, 3, 15..17, 24, 31..33, 40, 59, 63..65, 80, 96, 111, 127..129, 255, 256. Shrinking
goes toward the kernel's own blocks, contiguous fp32, B = H = 1, randn data and the default scale, so a minimal
example only pins what the bug needs.

Profiles (cases/generate/profiles.py): dev (quick, the default), ci (derandomized, bounded; the default when $CI is
set), thorough (many examples, larger shapes on the GPU). Chosen by pytest's --hypothesis-profile or by
$FLASHCHECK_HYPOTHESIS_PROFILE.
"""
import math
import random
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import seed as seeded
from hypothesis import strategies as st

from flashcheck.cases.backend import backend as active
from flashcheck.cases.case import Case
# the profiles and seed_alone live in a module of their own, which imports neither torch nor Triton (conftest
# loads them in every pytest process); here for the callers that find them beside the strategies
from flashcheck.cases.generate.profiles import (PROFILE_ENV, PROFILES, default_profile,  # noqa: F401
                                               load_default_profile, register_profiles, seed_alone)

CASE_NAME = "hypothesis_example"
# Generated data that never makes the float64 reference NaN; "nan_input" is asked for explicitly.
FINITE_DATA = ("randn", "large", "very_negative", "equal_scores", "large_sums")
LAYOUT_ORDER = ("contiguous", "bthd", "gapped", "d_major", "mixed")
# ... and at the head dims of real models that pad to the next power of two with 16-byte rows in half precision
# (24, 40, 80, 96): a kernel loading through tensor descriptors (TMA) meets its padded columns there
HEAD_DIMS = (1, 2, 3, 15, 16, 17, 24, 31, 32, 33, 40, 59, 63, 64, 65, 80, 96, 111, 127, 128, 129, 255, 256)
# (B, H) pairs, simplest first; B != H catches swapped batch/head offsets
BATCH_HEADS = ((1, 1), (1, 2), (2, 1), (2, 3), (3, 2), (1, 3), (3, 1), (2, 2))
# scales besides the default 1/sqrt(D): 0 (every score equal), negative (a flipped softmax), and large
# ones that push randn scores toward exp's overflow, the magnitude regime between randn and data="large"
SCALES = (1.0, 0.0, -0.7, 0.125, 3.0, 8.0)
# data="large": the typical raw score |q . k|, from the default (1e3 in fp16/bf16, 1e4 in fp32) up to the largest
# the dtype's inputs hold (magnitude_cap): exp overflows, and one-hot rows leave no slack in the row max
MAGNITUDES = (None, 1e6, 1e9, 1e18, 1e36)
REPRESENTATIVE_DIMS = (64, 128, 32, 96, 16, 256)


def magnitude_cap(dtype, D):
    """The largest typical |q . k| whose inputs (about magnitude_cap / sqrt(D)) ** 0.5 * randn, 6 sigma out,
    stay finite in the dtype: fp16 inputs end at 65504; fp32 and bf16 scores end near 3e38, so 1e36 leaves room
    for the sum over D."""
    return 1.1e8 * D ** 0.5 if dtype == "fp16" else 1e36


@dataclass(frozen=True)
class Limits:
    """The part of the case space one backend (and profile) can run in reasonable time."""
    dtypes: tuple
    blocks: tuple            # block pins besides None (the kernel's own choice)
    default_block: int       # what the kernel picks when unpinned (for the cost estimate)
    max_len: int
    boundary_blocks: tuple   # block sizes whose multiples (and neighbours) lengths gather at
    max_ms: float = None     # interpreter cost cap of one case's kernel runs (estimate, see cost_ms)
    max_macs: int = None     # cap on B*H*Nq*Nk*D: the float64 NumPy reference runs on the host
    smem_bytes: int = None   # cap on a tile's shared-memory estimate (GPU)
    many_blocks: tuple = ()  # key-block counts of the many-blocks draws (few queries, Nk = count * BLOCK_N)
    many_pins: tuple = ()    # their BLOCK_N pins
    many_ms: float = None    # the interpreter cost cap of those draws


# One draw in MANY_ODDS is a many-blocks case: a few queries against hundreds of key blocks, where a running
# state (l, acc) kept in fp16/bf16 drifts out of tolerance: measured on fp16 in the interpreter, 64 blocks do
# not show it, 128 to 256 do (l in fp16 needs Nk near 2048, where its ulp reaches 1). On the CPU, 256 blocks
# of 8 keys: about 0.3 s per fused run. Those draws are fp16/bf16 where the caller allows it (fp32 does not
# drift), unless the data is "large" (fp32 only). Up to 32 queries, past a split-KV kernel's decode threshold
# (16 queries in kernel/fused.py): a split walks a fraction of the keys, so 16 queries, split, do not drift (the
# properties' power lost mutant acc_in_input_dtype that way); a causal decode is a representative case of its own.
MANY_ODDS = 16
MANY_QUERIES = 32
CPU = Limits(dtypes=("fp32", "fp16"), blocks=(4, 8, 16, 32, 64), default_block=64, max_len=80,
             boundary_blocks=(4, 8, 16, 32, 64), max_ms=150.0, many_blocks=(256,), many_pins=(8,),
             many_ms=2000.0)
GPU = Limits(dtypes=("fp32", "fp16", "bf16"), blocks=(16, 32, 64, 128), default_block=64, max_len=256,
             boundary_blocks=(16, 32, 64, 128), max_macs=1 << 24, smem_bytes=160 * 1024,
             many_blocks=(128, 256, 512), many_pins=(16, 32))
GPU_THOROUGH = Limits(dtypes=GPU.dtypes, blocks=GPU.blocks, default_block=64, max_len=1024,
                      boundary_blocks=GPU.boundary_blocks, max_macs=1 << 27, smem_bytes=GPU.smem_bytes,
                      many_blocks=GPU.many_blocks, many_pins=GPU.many_pins)


def current_profile():
    """The name of the loaded hypothesis profile."""
    getter = getattr(settings, "get_current_profile_name", None)
    # get_current_profile_name() is recent; older hypothesis keeps the name in a class attribute
    return getter() if getter else getattr(settings, "_current_profile", "default")


def limits(backend=None, profile=None):
    """The Limits of a backend ("cpu" | "gpu", default the active one) under a profile (default the loaded
    one)."""
    if backend is None:

        backend = active()
    if backend != "gpu":
        return CPU
    return GPU_THOROUGH if (profile or current_profile()) == "thorough" else GPU


def _cdiv(a, b):
    return -(-a // b)


def cost_ms(case, kernels=("fused",), lim=CPU):
    """Estimated interpreter time (ms) of one run of each kernel on this case, summed. Measured on the
    interpreter: the fused kernel pays ~2.5 ms per (query block, key block) step; the unfused one ~5 ms per
    step over its two tiled kernels and ~1.6 ms per query row for its row-wise softmax."""
    bm = case.block_m or lim.default_block
    bn = case.block_n or lim.default_block
    bh = case.B * case.H
    steps = bh * _cdiv(case.Nq, bm) * _cdiv(case.Nk, bn)
    total = 0.0
    if "fused" in kernels:
        total += 3.0 + 2.5 * steps
    if "unfused" in kernels:
        total += 5.0 + 5.0 * steps + 1.6 * bh * case.Nq
    return total


def _tile_fits(lim, block, D, dtype):
    """GPU: a K/V tile pipelined over 3 stages plus the Q tile must fit shared memory (estimate)."""
    if lim.smem_bytes is None or block is None:
        return True
    block_d = max(1 << (D - 1).bit_length(), 16)
    elt = 4 if dtype == "fp32" else 2
    return elt * block_d * block * 7 <= lim.smem_bytes


def _length(lim, lo, hi):
    """A sequence length in [lo, hi], gathered at the small end and at block boundaries +-1."""
    hi = max(hi, lo)
    near_boundary = st.builds(
        lambda blk, m, delta: min(max(blk * m + delta, lo), hi),
        st.sampled_from(lim.boundary_blocks), st.integers(1, max(1, hi // min(lim.boundary_blocks))),
        st.sampled_from((1, -1, 0)))
    return st.one_of(st.integers(lo, min(hi, 8)), near_boundary, st.integers(lo, hi))


def _head_dim(ok=None):
    """A head dim in 1..256, mostly small; ok (a kernel's declared support) picks from the allowed ones
    directly rather than filtering, which a narrow support (e.g. 64 and 128 only) would starve."""
    if ok is None:
        return st.one_of(st.integers(1, 16), st.sampled_from(HEAD_DIMS), st.integers(1, 256))
    allowed = tuple(d for d in range(1, 257) if ok(d))
    if not allowed:
        raise ValueError("head_dim_ok admits no head dim in 1..256")
    marked = tuple(d for d in HEAD_DIMS if d in allowed) or allowed
    return st.one_of(st.sampled_from(allowed[:16]), st.sampled_from(marked), st.sampled_from(allowed))


def _scale():
    """None (1/sqrt(D)) first."""
    return st.one_of(st.none(), st.sampled_from(SCALES),
                     st.floats(-4.0, 4.0, allow_nan=False).map(lambda x: round(x, 3)))


@st.composite
def cases(draw, *, causal=None, dtypes=None, layouts=None, data=None, kernels=("fused",), min_nq=0,
          max_len=None, head_dim_ok=None, backend=None, profile=None, pin_blocks=True, decl=None, scale=True,
          features=frozenset(), any_dtype=False):
    """Cases of the legal space of the backend.

    causal: None draws it, True/False fixes it. dtypes, layouts, data: the allowed values (default: all
    the backend can judge, all layouts, FINITE_DATA). kernels: which of ("fused", "unfused") will run the
    case, for the cost cap. min_nq: the smallest query length (properties about rows need 1).
    max_len: a caller's cap on Nq and Nk. head_dim_ok: a predicate on D (a kernel's declared support).
    pin_blocks=False leaves the block sizes to the kernel. decl: a kernel's Declarations (cases/declarations.py):
    its lengths (minimum, multiple, maximum, Nq == Nk) are kept, the rest comes through the arguments above.
    scale=False: always the default scale (a kernel without a scale= argument).
    features: the optional features the kernel has (cases/features.py names): each is drawn in about half the
    cases, after every other draw, so that a kernel without them gets the same cases as before they existed.
    any_dtype=True: dtypes are drawn as given, past the backend's own (a kernel that is not Triton's: its bf16 runs
    right on the CPU).
    """
    lim = limits(backend, profile)
    pool = tuple(dtypes) if any_dtype and dtypes else lim.dtypes
    dtype = draw(st.sampled_from(tuple(d for d in pool if dtypes is None or d in dtypes)))
    is_causal = draw(st.booleans()) if causal is None else causal
    layout = draw(st.sampled_from(tuple(x for x in LAYOUT_ORDER if layouts is None or x in layouts)))
    kind = draw(st.sampled_from(tuple(data or FINITE_DATA)))
    # drawn whatever the data, so that shrinking the data kind leaves the draws after it in place. Only
    # randn-like data keeps it: with data="large" or "very_negative" a large scale takes the fp16 baseline
    # of the oracle to inf, where no tolerance can be derived
    drawn_scale = draw(_scale())
    if kind not in ("randn", "equal_scores") or not scale:
        drawn_scale = None
    top = min(lim.max_len, max_len or lim.max_len)
    if decl is not None and decl.seq_multiple > top:
        top = decl.seq_multiple if max_len is None else min(decl.seq_multiple, max_len)   # one block at least
    D = draw(_head_dim(head_dim_ok))
    if lim.max_macs:
        # the float64 reference is B*H*Nq*Nk*D multiply-adds on the host: keep the lengths within it
        top = max(2, min(top, math.isqrt(lim.max_macs // D)))
    # data="nan_input" puts its NaN in query row Nq // 2, so it needs a row
    lo_q = max(min_nq, kind == "nan_input")
    Nq = draw(_length(lim, lo_q, top))
    Nk = draw(_length(lim, 1, top))
    # many key blocks, one draw in MANY_ODDS: BLOCK_N one of many_pins (the kernel's own block when blocks
    # are not pinned), Nk a count of them +-1, Nq cut to a few rows, a half-precision dtype. The same draws
    # are made either way, so shrinking the flag to 0 falls back on the usual lengths above
    many = draw(st.integers(0, MANY_ODDS - 1)) == MANY_ODDS - 1 and bool(lim.many_blocks)
    # a few queries against many keys cannot be drawn where the lengths must be equal (it would make Nq ~ 8k)
    many = many and not (decl is not None and (decl.same_length or (decl.causal_same_length and is_causal)))
    many_bn = draw(st.sampled_from(lim.many_pins or (1,))) if pin_blocks else lim.default_block
    count = draw(st.sampled_from(lim.many_blocks or (1,)))
    delta = draw(st.sampled_from((0, 1, -1)))
    halves = tuple(d for d in pool if d != "fp32" and (dtypes is None or d in dtypes))
    half = draw(st.sampled_from(halves or (dtype,)))
    if many:
        dtype = half
        Nk = count * many_bn + delta
        if max_len:
            Nk = min(Nk, max_len)
        q_top = min(top, MANY_QUERIES)
        if lim.max_macs:
            q_top = min(q_top, lim.max_macs // (Nk * D))
        Nq = min(Nq, max(lo_q, q_top))
    if decl is not None:
        Nq, Nk = _fit(decl, Nq, lo_q, "Nq"), _fit(decl, Nk, 1)
        if decl.same_length or (decl.causal_same_length and is_causal):
            Nq = Nk = _fit(decl, max(Nq, Nk), 1, "Nq")
        elif decl.nk_ge_nq and Nq > Nk:
            Nk = _fit(decl, Nq, 1)
    shape = Case(CASE_NAME, Nq=Nq, Nk=Nk, D=D, dtype=dtype, block_n=many_bn if many and pin_blocks else None)
    max_ms = lim.many_ms if many else lim.max_ms

    def within(case):
        if max_ms is not None and cost_ms(case, kernels, lim) > max_ms:
            return False
        return not lim.max_macs or case.B * case.H * case.Nq * case.Nk * case.D <= lim.max_macs

    # (B, H) judged with the kernel's own blocks, then the block pins that keep the case within the cap
    pairs = tuple(p for p in BATCH_HEADS if within(shape.replace(B=p[0], H=p[1]))) or BATCH_HEADS[:1]
    B, H = draw(st.sampled_from(pairs))
    shape = shape.replace(B=B, H=H)
    block_m = block_n = None
    if pin_blocks:
        # None (the kernel's own blocks) stays an option even when the shape alone exceeds the cap
        pins = tuple(b for b in lim.blocks if _tile_fits(lim, b, D, dtype))
        block_m = draw(st.sampled_from((None,) + tuple(b for b in pins if within(shape.replace(block_m=b)))))
        block_n = draw(st.sampled_from((None,) + tuple(
            b for b in pins if within(shape.replace(block_m=block_m, block_n=b)))))
        block_n = many_bn if many else block_n
    seed = draw(st.integers(0, 2 ** 16))
    # large data: a magnitude up to the dtype's largest, and either sign of the default scale (a negative one
    # makes the row max the scaled MIN of the raw scores). Drawn last, so that the draws above keep their place
    magnitude = draw(st.sampled_from(MAGNITUDES))
    flip = draw(st.booleans())
    if kind == "large":
        magnitude = None if magnitude is None else min(magnitude, magnitude_cap(dtype, D))
        drawn_scale = -1.0 / math.sqrt(D) if flip and scale else None
    else:
        magnitude = None
    drawn = Case(CASE_NAME, B=B, H=H, Nq=Nq, Nk=Nk, D=D, dtype=dtype, causal=is_causal, scale=drawn_scale,
                 layout=layout, block_m=block_m, block_n=block_n, seed=seed, data=kind, magnitude=magnitude)
    return draw(_with_features(drawn, features, head_dim_ok, within)) if features else drawn


GROUPS = (4, 6, 8)        # query heads of the GQA draws past the (B, H) pairs: groups of 2, 3, 4 and MQA


@st.composite
def _with_features(draw, case, have, head_dim_ok, within):
    """case with the optional features the kernel has, each in about half the draws: grouped heads (MQA on the
    drawn H, or H of 4, 6, 8 over fewer kv heads), a value head dim of its own, a window (either side None or a
    few to many keys: rows that see nothing, windows wider than the sequence), a softcap (1 pushes randn scores
    into tanh's flat region), ALiBi slopes per head or per batch and head."""
    change = {}
    heads = tuple(h for h in GROUPS if within(case.replace(H=h))) or ((case.H,) if case.H > 1 else ())
    if "gqa" in have and heads and draw(st.booleans()):
        H = draw(st.sampled_from(heads))     # every H here is > 1, so has a kv head count below it
        change["H"] = H
        change["Hkv"] = draw(st.sampled_from(tuple(d for d in range(1, H) if H % d == 0)))
    if "dv" in have and draw(st.booleans()):
        dims = tuple(d for d in (1, 8, 16, 24, 40, 64, 96, 128, 200, 256) if d != case.D
                     and (head_dim_ok is None or head_dim_ok(d)))
        if dims:
            change["Dv"] = draw(st.sampled_from(dims))
    if "window" in have and draw(st.booleans()):
        n = max(case.Nq, case.Nk)
        side = st.one_of(st.none(), st.integers(0, 3), st.integers(0, n + 2))
        change["window"] = (draw(side), draw(side))
    if "softcap" in have and draw(st.booleans()):
        change["softcap"] = draw(st.sampled_from((1.0, 5.0, 30.0)))
    if "alibi" in have and draw(st.booleans()):
        change["alibi"] = draw(st.sampled_from(("heads", "batch_heads")))
    return case.replace(**change) if change else case


def representative(decl, dtypes, backend, caps):
    """The cases judged before any drawn one (by verify's generated cases and by properties.search), each
    within the declarations: two common shapes (B != H, D = 64 or the nearest declared, a few dozen keys; the
    second causal with Nq != Nk in the bthd layout, and BLOCK_M > BLOCK_N) in the first dtype, then the shapes
    of three bug classes: a causal decode (16 queries, 769 keys: a split-KV kernel's last split holds one key,
    which 15 rows cannot see), a few queries against hundreds of key blocks in half precision (a running state
    kept in the input dtype drifts), the largest scores the dtype holds under a negative scale over whole key
    blocks (a row max taken with the wrong sign, or with any slack, overflows exp), then the common shapes in
    the second dtype. A shape the declarations cannot hold (decode under same_length) is left out."""
    lim = limits(backend)
    D = next((d for d in REPRESENTATIVE_DIMS if decl.head_dim_ok(d)), None)
    if D is None:
        D = next(d for lo, hi in decl.head_dims for d in (lo, hi) if decl.head_dim_ok(d))
    n = _fit(decl, min(lim.max_len, 128 if backend == "gpu" else 48), 1)
    nq = _fit(decl, n, 1, "Nq")          # the queries of a decode kernel (--max-seq-q) may be fewer
    if decl.same_length:
        n = nq
    m = _fit(decl, max(1, n - 17), 1, "Nq") if not decl.same_length else n
    causal_ok = bool(decl.causal and caps.causal)
    pins = caps.blocks
    rng = random.Random(0)

    def case(**fields):
        c = Case(CASE_NAME, seed=rng.randrange(1 << 16), **fields)
        if decl.nk_ge_nq and c.Nq > c.Nk:
            c = c.replace(Nk=c.Nq)
        if decl.causal_only:
            c = c.replace(causal=True, **({"Nq": c.Nk} if decl.causal_same_length else {}))
        elif decl.causal_same_length and c.causal and c.Nq != c.Nk:
            c = c.replace(causal=False)
        return c

    # the causal shape with BLOCK_M > BLOCK_N, as the GPU's default tiles (128 x 64) have; the interpreter's
    # are square, so the CPU pins that ratio where the kernel takes block pins
    tall = dict(block_m=32, block_n=16) if pins and backend != "gpu" else {}

    def common(dtype):
        return [case(B=2, H=3, Nq=nq, Nk=n, D=D, dtype=dtype),
                case(B=1, H=2, Nq=m, Nk=n, D=D, dtype=dtype, causal=causal_ok,
                     layout="bthd" if "bthd" in decl.layouts() else "contiguous", **tall)]

    out = common(dtypes[0])
    half = next((d for d in dtypes if d != "fp32"), dtypes[0])
    few = not (decl.same_length or decl.causal_same_length)      # (under --causal-only too, every case is causal)
    decode_q, decode_k = _fit(decl, 16, 1, "Nq"), _fit(decl, 769, 1)
    if few and decode_k >= 256 and decode_q < decode_k:
        out.append(case(H=2, Nq=decode_q, Nk=decode_k, D=_fit_dim(decl, 32), dtype=half, causal=causal_ok))
    # as many keys as the many-blocks draws' most: 256 blocks of 8 on the CPU, 512 of 16 on the GPU
    many_bn = lim.many_pins[0] if lim.many_pins else lim.default_block
    many_nk = _fit(decl, lim.many_blocks[-1] * many_bn + 1, 1) if lim.many_blocks else 0
    if few and many_nk > 1024:
        out.append(case(Nq=_fit(decl, MANY_QUERIES, 1, "Nq"), Nk=many_nk, D=_fit_dim(decl, 16), dtype=half,
                        block_n=many_bn if pins else None))
    big = dtypes[0]
    Dl = _fit_dim(decl, 32)
    lq, lk = (_fit(decl, 130, 1, "Nq"),) * 2 if decl.same_length else (_fit(decl, 20, 1, "Nq"), _fit(decl, 130, 1))
    out.append(case(H=2, Nq=lq, Nk=lk, D=Dl, dtype=big, data="large", magnitude=magnitude_cap(big, Dl),
                    scale=-1.0 / math.sqrt(Dl) if caps.scale else None,
                    block_m=32 if pins else None, block_n=32 if pins else None))
    if len(dtypes) > 1:
        out += common(dtypes[1])
    return out


def reseeded(make, seed, rounds=4):
    """Rounds of the same hypothesis test, for a caller whose budget of distinct cases may not be spent after
    one (derandomized generation soon repeats itself): yields a function that runs the next round, so that
    the caller can stop first. make(derandomize) builds the test when its round runs; round 0 is derandomized
    unless a seed is given, each later round (and every round under a seed) runs under seed + round."""
    def run(r):
        test = make(seed is None and r == 0)
        with seed_alone():
            (test if seed is None and r == 0 else seeded((seed or 0) + r)(test))()

    for r in range(rounds):
        yield lambda r=r: run(r)


def _fit_dim(decl, d):
    """d, or the declared head dim nearest to it."""
    if decl.head_dim_ok(d):
        return d
    return min((x for x in range(1, 257) if decl.head_dim_ok(x)), key=lambda x: (abs(x - d), x))


def _fit(decl, n, lo, axis="Nk"):
    """The declared length of axis Nq or Nk nearest above max(n, lo) (a zero length stays zero where the
    declarations allow it and lo does)."""
    if n == 0 and lo == 0 and decl.min_seq == 0:
        return 0
    return decl.fit_length(max(n, lo, 1), axis)


# ---- parameters of the metamorphic relations (cases/generate/properties.py), small and printable ----

def key_permutations(Nk):
    """A permutation of the keys as a short description: ("swap", i, j), ("reverse",), ("rotate", r) or
    ("shuffle", seed). Swaps come first: they shrink to the two keys a bug confuses."""
    last = max(Nk - 1, 0)
    return st.one_of(
        st.tuples(st.just("swap"), st.integers(0, last), st.integers(0, last)),
        st.just(("reverse",)),
        st.tuples(st.just("rotate"), st.integers(1, max(Nk - 1, 1))),
        st.tuples(st.just("shuffle"), st.integers(0, 2 ** 16)))


def v_factors():
    """Factors a for V -> a V: powers of two are exact in floating point, the others round."""
    return st.one_of(st.sampled_from((2.0, -1.0, 0.5, -4.0, 3.0, 0.1)),
                     st.floats(-16.0, 16.0, allow_nan=False).map(lambda x: round(x, 3)))


def q_factors():
    """Factors c for Q -> c Q (with scale -> scale / c): powers of two and their negatives, exact in floating
    point."""
    return st.sampled_from((2.0, 0.5, -1.0, 4.0, 0.25, -2.0))


def v_shifts():
    """(magnitude, seed) of a vector c = magnitude * randn(D) added to every value row."""
    return st.tuples(st.sampled_from((1.0, -3.0, 0.5, 10.0)), st.integers(0, 2 ** 16))


def query_changes(case):
    """(b, h, row, seed): which query row gets new values."""
    return st.tuples(st.integers(0, case.B - 1), st.integers(0, case.H - 1), st.integers(0, case.Nq - 1),
                     st.integers(0, 2 ** 16))


def hidden_key_rows(case):
    """(row, seed): rows 0..row must ignore the keys row cannot see (j > row + Nk - Nq), which get new
    values. Only rows below Nq - 1 have hidden keys."""
    return st.tuples(st.integers(0, case.Nq - 2), st.integers(0, 2 ** 16))
