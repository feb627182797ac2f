"""Make a case's tensors: the values (seeded), the layout (strides) and the guard bands around them.

Every tensor is a view into a flat buffer of its own with guard bands before and after it, and any
gaps of its layout between rows or heads. For q, k, v the guard and gap elements are NaN: an
out-of-bounds or wrong-stride read that reaches the output shows as NaN. For the output they hold a
sentinel, and the view itself starts poisoned with a NaN of a distinctive bit pattern: an element the
kernel never writes keeps that exact pattern, and any change outside the view is an out-of-bounds write.
"""
from dataclasses import dataclass

import torch


def guard_size(shape):
    """Elements of guard band before and after a tensor: enough for a whole tile (128 rows) of
    out-of-bounds reads to land in NaN rather than in memory we do not own."""
    return 256 + 128 * (shape[-1] + 3)


# quiet NaNs with a payload no arithmetic produces: "unwritten", told apart from a computed NaN
POISON_BITS = {torch.float32: 0x7FC5A5A5, torch.float16: 0x7E5A, torch.bfloat16: 0x7FDA}
SENTINEL = 1234.0
_INT_VIEW = {4: torch.int32, 2: torch.int16}


def int_view(t):
    """The same memory as signed integers of the element's width (bitwise comparison, NaN-proof)."""
    return t.view(_INT_VIEW[t.element_size()])


def poison_bits(dtype):
    """The poison pattern as a signed integer of the element's width (fill it through int_view)."""
    bits, width = POISON_BITS[dtype], torch.finfo(dtype).bits
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def is_poison(t):
    """Elementwise: does t still hold the poison pattern (never written)?"""
    return int_view(t) == poison_bits(t.dtype)


def prepoison(n, dtype, device):
    """Before a call without out=: fill n elements of memory the kernel's own output allocation is likely to reuse
    (the caching allocator hands back a freed block of the same size) with the poison pattern."""
    if n:
        block = torch.empty(n, dtype=dtype, device=device)
        int_view(block).fill_(poison_bits(dtype))
        del block


def prepoison_lse(n, device):
    """prepoison for a kernel's own float32 lse of n elements: a row it never writes then holds NaN, not whatever
    the block held before (on the CPU a mutant that wrote each sequence's lse to the wrong rows survived about one
    run in three: the rows it left unwritten held values that passed)."""
    prepoison(n, torch.float32, device)


def _geometry(layout, B, H, N, D):
    """(storage shape, permutation to (B, H, N, D), slices) of a layout; the view is
    storage.permute(perm)[slices]."""
    if layout == "contiguous":
        return (B, H, N, D), (0, 1, 2, 3), None
    if layout == "bthd":           # (B, N, H, D) storage: the usual transformer layout, transposed view
        return (B, N, H, D), (0, 2, 1, 3), None
    if layout == "d_major":        # (B, H, D, N) storage: unit stride along N, not along D
        return (B, H, D, N), (0, 1, 3, 2), None
    if layout == "gapped":         # gaps between rows (D + 3) and between heads (2 spare rows)
        return (B, H, N + 2, D + 3), (0, 1, 2, 3), (slice(None), slice(None), slice(0, N), slice(0, D))
    raise ValueError(layout)


# "mixed": each tensor its own layout, so that one tensor's strides used for another's are wrong
MIXED = {"q": "bthd", "k": "gapped", "v": "d_major", "out": "gapped"}


@dataclass
class Guarded:
    """A (B, H, N, D) view `t` inside the flat buffer `flat`."""
    t: torch.Tensor
    flat: torch.Tensor

    @property
    def inside(self):
        """Bool over flat: the view's elements (built on demand: it is as large as the buffer)."""
        marks = torch.zeros(self.flat.shape, dtype=torch.uint8, device=self.flat.device)
        marks.as_strided(self.t.shape, self.t.stride(), self.t.storage_offset() - self.flat.storage_offset()).fill_(1)
        return marks.bool()

    def changed(self, before):
        """Bool over flat: the elements whose bits differ from `before` (a clone of flat)."""
        return int_view(self.flat) != int_view(before)

    def outside_changed(self, before):
        """Flat indices outside the view whose bits differ from `before`."""
        return torch.nonzero(self.changed(before) & ~self.inside).flatten()


def guarded(shape, dtype, device, layout, fill):
    """A view of `shape` in `layout`, in a flat buffer filled with `fill` (guards, gaps and view)."""
    storage_shape, perm, slices = _geometry(layout, *shape)
    numel = 1
    for s in storage_shape:
        numel *= s
    g = guard_size(shape)
    flat = torch.full((g + numel + g,), fill, dtype=dtype, device=device)
    storage = flat[g:g + numel].view(storage_shape)
    view = storage.permute(perm)
    if slices is not None:
        view = view[slices]
    return Guarded(view, flat)


def tensor_layout(layout, which):
    return MIXED[which] if layout == "mixed" else layout


def shapes(case):
    """{"q": (B, H, Nq, D), "k": (B, Hkv, Nk, D), "v": (B, Hkv, Nk, Dv), "out": (B, H, Nq, Dv)} of a case."""
    B, H, Hkv = case.B, case.H, case.kv_heads
    return {"q": (B, H, case.Nq, case.D), "k": (B, Hkv, case.Nk, case.D), "v": (B, Hkv, case.Nk, case.v_dim),
            "out": (B, H, case.Nq, case.v_dim)}


def strides(case):
    """{"q": strides, "k": ..., "v": ..., "out": ...}: the strides (in elements) each tensor of the case has."""
    out = {}
    for name, shape in shapes(case).items():
        storage_shape, perm, slices = _geometry(tensor_layout(case.layout, name), *shape)
        view = torch.empty(storage_shape, device="meta").permute(perm)
        out[name] = (view[slices] if slices is not None else view).stride()
    return out


def values(case, device="cpu"):
    """The case's q (B, H, Nq, D), k (B, Hkv, Nk, D) and v (B, Hkv, Nk, Dv) in the case's dtype: drawn in float32
    on the CPU (the same values on every backend), except for huge cases (sample_heads > 0), drawn on `device` to
    keep them affordable."""
    gen_device = device if case.sample_heads else "cpu"
    g = torch.Generator(device=gen_device).manual_seed(case.seed)
    B, H, Nq, Nk, D = case.B, case.H, case.Nq, case.Nk, case.D
    Hkv, Dv = case.kv_heads, case.v_dim

    def randn(*shape):
        t = torch.randn(*shape, generator=g, device=gen_device)
        return t.to(case.torch_dtype) if case.sample_heads else t   # huge: no float32 copy kept

    if case.data == "explicit":
        def tile(x, heads, n, d):
            t = torch.tensor(x, dtype=torch.float32)
            if tuple(t.shape) != (n, d):
                raise ValueError(f"case {case.name}: explicit tensor shape {tuple(t.shape)} != {(n, d)}")
            return t.expand(B, heads, n, d).clone()
        q, k, v = tile(case.q, H, Nq, D), tile(case.k, Hkv, Nk, D), tile(case.v, Hkv, Nk, Dv)
    else:
        q, k, v = randn(B, H, Nq, D), randn(B, Hkv, Nk, D), randn(B, Hkv, Nk, Dv)
        half = case.torch_dtype != torch.float32
        if case.data == "large":
            # raw scores q.k of about +-1e4 (+-1e3 in fp16/bf16: fp16 scores overflow past 65504 and bf16's 8
            # bits cannot resolve larger ones): exp overflows unless the running max is subtracted
            # (case.magnitude: another typical |q . k|, up to what the dtype's inputs and fp32 scores hold)
            amp = ((case.magnitude or (1e3 if half else 1e4)) / D ** 0.5) ** 0.5
            q, k = q * amp, k * amp
        elif case.data == "very_negative":
            # every raw score about -1e4 (in fp16/bf16, every scaled score about -150: far enough below
            # exp's underflow at -104, and within what half-precision scores resolve): exp underflows to 0
            # and 0/0 unless the max is subtracted
            big = (150.0 * D ** 0.5) ** 0.5 if half else 100.0
            q[..., 0], k[..., 0] = big, -big
        elif case.data == "negative_first_keys":
            # the first half of the keys score about -magnitude with every query, the rest as randn does: a
            # row's running max starts hugely negative and ends ordinary (the largest shift in magnitude comes
            # first, not last)
            big = (case.magnitude or 1e9) ** 0.5
            q[..., 0] = big
            k[..., : (Nk + 1) // 2, 0], k[..., (Nk + 1) // 2:, 0] = -big, 0.0
        elif case.data == "large_sums":
            # the large-accumulator regime: the keys score alike (within about +-1: q small but for its first
            # column, so a key's score follows its first column) and the values sit far from 0, so the unnormalised
            # sums reach l ~ 0.4 Nk and acc ~ 0.4 Nk c (past fp16's 65504 from the default c on) while the output
            # stays about c. V's first column follows the keys' first, by a quarter of c, so the softmax moves the
            # output there far past its rounding (a uniform average would not pass: the case discriminates)
            c = case.magnitude or min(max(2.0 ** 18 / max(Nk, 1), 4.0), 2048.0)
            q = q * 0.1
            q[..., 0] = D ** 0.5 / 4
            v = v + c
            v[..., 0] = c * (1 + k[..., 0] / 4)
        elif case.data == "gradient_sums":
            # every gradient a sum of terms of one sign (no cancellation), so that a sum a kernel keeps in the
            # input dtype across blocks drifts by its roundings while a correct one (fp32 sums) stays within a few
            # roundings of the total: q > 0; x_j standard normal and every column of value j x_j (1 + 0.1 r), so of
            # x_j's sign, and every column of key j gamma x_j (gamma = 0.5 / sqrt(D): scaled scores about 0.6 x_j,
            # weights e^4 apart, so the forward discriminates). With dO_i = c_i (1, ..., 1), c_i > 0
            # (backward.output_gradient): dP_ij = c_i y_j, y_j = sum_d v_jd of x_j's sign, and dS_ij = P_ij c_i
            # (y_j - ybar_i); dV_j = sum_i P_ij c_i > 0; dK_j = scale sum_i dS_ij q_i, whose terms share y_j - ybar_i's
            # sign (ybar_i barely moves with i); dQ_i = scale gamma c_i sum_j P_ij (y_j - ybar_i) x_j, whose terms are
            # >= 0 but for keys with x_j between 0 and ybar_i's sign (a few). The bound's magnitudes are then the sums
            # themselves (a drawn v's columns cancel inside dP: with them the floor came to 7 times |dQ|)
            q = 1.0 + 0.25 * q.abs()
            x = v[..., :1].clone()
            v = x * (1.0 + 0.1 * v)
            k = (0.5 / D ** 0.5) * x.expand(B, Hkv, Nk, D).clone()
        elif case.data == "below_finite_masks":
            # every score far below the finite values kernels mask with in place of -inf (-1e4, -65504, -1e9): the
            # first column makes it -top^2 (1 - r j / (Nk - 1)) for key j, the others add about +-sqrt(D). At
            # D = 16 that is -1.06e9 to -1.02e9 scaled in fp16 (top = 65000, r = 0.03: what fp16 inputs hold) and
            # -4.3e9 to -2.1e9 in bf16 and fp32 (top = 2^17, r = 0.5). The scores rise along the keys by steps far
            # past their rounding, so each row's answer is the value of its last visible key; a masked key (or a
            # padded one past Nk) given a finite score outscores every visible one
            top, r = (65000.0, 0.03) if case.torch_dtype == torch.float16 else (2.0 ** 17, 0.5)
            q[..., 0] = top
            k[..., 0] = -top * (1 - r * torch.arange(Nk, dtype=torch.float32, device=k.device) / max(Nk - 1, 1))
        elif case.data == "equal_scores":
            k = k[:, :, :1, :].expand(B, Hkv, Nk, D).clone()   # one key repeated: every score of a row equal
        elif case.data == "nan_input":
            q[..., Nq // 2, 0] = float("nan")                   # one NaN query element: its row is NaN
    out = tuple(t.to(case.torch_dtype) for t in (q, k, v))
    if case.magnitude and not all(bool(torch.isfinite(t).all()) for t in out):
        raise ValueError(f"case {case.name}: magnitude {case.magnitude:g} gives inputs beyond {case.dtype}'s range")
    return out


@dataclass
class Inputs:
    q: Guarded
    k: Guarded
    v: Guarded
    out: Guarded


def make_inputs(case, device, qkv=None, guard_fill=float("nan")):
    """Place the case's values (or the given q, k, v) into guarded buffers on `device`; the output view is
    poisoned, its surroundings hold the sentinel."""
    q, k, v = qkv if qkv is not None else values(case)
    dt = case.torch_dtype
    made = {}
    for name, src in (("q", q), ("k", k), ("v", v)):
        gt = guarded(tuple(src.shape), dt, device, tensor_layout(case.layout, name), guard_fill)
        gt.t.copy_(src.to(dt))
        made[name] = gt
    out = guarded(tuple(q.shape[:3]) + (v.shape[3],), dt, device, tensor_layout(case.layout, "out"), SENTINEL)
    int_view(out.t).fill_(poison_bits(dt))
    return Inputs(made["q"], made["k"], made["v"], out)


def _storage_elements(layout, shape):
    storage_shape, _, _ = _geometry(layout, *shape)
    n = 1
    for s in storage_shape:
        n *= s
    return n + 2 * guard_size(shape)


def footprint(case):
    """(device bytes, host bytes) judging this case takes: the guarded q, k, v and output with the snapshots
    of their bits the guard checks compare against, the kernel's own output, and on the host the float64
    reference of the judged heads (a few (Nq, Nk) arrays per head). What a case needs, before it starts."""
    elt = torch.finfo(case.torch_dtype).bits // 8
    guarded = sum(_storage_elements(tensor_layout(case.layout, n), s) for n, s in shapes(case).items())
    plain = sum(a * b * c * d for a, b, c, d in shapes(case).values())
    device = elt * (2 * guarded + plain)
    heads = case.sample_heads or case.B * case.H
    host = 8 * heads * (10 * case.Nq * case.Nk + 6 * (case.Nq + case.Nk) * case.D)
    return device, host
