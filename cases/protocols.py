"""The calling protocols beside the dense one (docs/design.md): packed sequences (varlen) and paged KV caches.

    dense   attention(q, k, v, *, causal=False, scale=None, ...)                    q (B, H, Nq, D)
    varlen  attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, ...)
            q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), int32 cumulative offsets from 0;
            out (total_q, H, Dv), lse (H, total_q)
    paged   attention_paged(q, k_cache, v_cache, block_table, cache_seqlens, *, ...)
            q (B, H, Nq, D), caches (num_pages, page_size, Hkv, D|Dv), block_table int32 (B, max_pages),
            cache_seqlens int32 (B,): key j of sequence b is slot j % page_size of page block_table[b, j // page_size];
            out (B, H, Nq, Dv), lse (B, H, Nq); or q and out (B, Nq, H, .), FlashAttention's kvcache layout
            (--paged-q bnhd, or probed: cases/verify/judging.py probe_paged_layout)

A protocol is found in the signature (cu_seqlens_q: varlen; block_table: paged) or declared (--protocol).

A varlen or paged kernel is judged on dense problems, with the dense oracle whole (reference and tolerance,
hand values, poison, guard bands, the output contract, the properties): a case is a list of sequences
(case.seqlens, or the B batches of a dense case, so the whole dense catalogue replays), and each sequence in
turn is judged as a dense case of one batch through an adapter (Packed) that places it among the case's other
sequences in the kernel's own layout, calls the kernel, checks what the dense oracle cannot see (the packed
buffers' guards, the shape and dtype of the packed output and lse) and hands back that sequence's rows.
Then the leak check: the other sequences' inputs changed to large values, the sequence's output must still
match its reference (a kernel that reads another sequence's keys shows it; one that reads them and weights
them by an exact zero does not, as it should not).

Packed buffers: q, k, v (and out) sit in NaN (sentinel) guarded buffers laid out as the case's layout says;
the paged pool holds three times the pages needed, in a shuffled order, every unused page and slot NaN, and
every block-table entry past a sequence's pages points at a NaN page.
"""
import inspect
import math
import random

import torch

from flashcheck.cases import inputs as inp
from flashcheck.cases.declarations import PAGED_Q
from flashcheck.cases.oracle.kinds import Kind
from flashcheck.cases.oracle.layers import check_returned_out
from flashcheck.cases.oracle.verdict import Capabilities, Failure, RunFailed, lse_layout_hint

DENSE, VARLEN, PAGED = "dense", "varlen", "paged"
PROTOCOLS = (DENSE, VARLEN, PAGED)
POSITIONAL = {DENSE: ("q", "k", "v"), VARLEN: ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"),
              PAGED: ("q", "k_cache", "v_cache", "block_table", "cache_seqlens")}
CALL = {DENSE: "attention(q, k, v, *, causal=False, scale=None) -> out",
        VARLEN: "attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None, "
                "causal=False, scale=None) -> out",
        PAGED: "attention_paged(q, k_cache, v_cache, block_table, cache_seqlens, *, causal=False, scale=None) -> out"}
# keywords a dense case may pass (cases/oracle/layers.py protocol_kwargs and the call's out=, return_lse=)
DENSE_KEYWORDS = ("causal", "scale", "out", "return_lse", "block_m", "block_n", "window", "softcap", "alibi_slopes")
DEFAULT_PAGE = 16          # the page size of a replayed dense case (vLLM's default block size)
LEAK_V = 500.0             # the leak check's other sequences: values about this far from 0, keys 4x larger


def of_kernel(kernel, decl=None):
    """The protocol a kernel follows: declared (--protocol), else its signature's (Capabilities.of)."""
    said = getattr(decl, "protocol", "auto") if decl is not None else "auto"
    if said != "auto":
        return said
    return Capabilities.of(kernel).protocol


def sequences(case):
    """[(Nq, Nk)] of a case: its seqlens, or its B batches of (Nq, Nk)."""
    return list(case.seqlens) if case.seqlens is not None else [(case.Nq, case.Nk)] * case.B


def sub_case(case, b):
    """Sequence b of a case as a dense case of one batch (its own seed: the sequences differ). A sequence without
    keys keeps one key in its case (a dense case has Nk >= 1): seq_values() cuts it away."""
    lq, lk = sequences(case)[b]
    return case.replace(name=f"{case.name} seq {b}", B=1, Nq=lq, Nk=max(lk, 1), seqlens=None, page_size=None,
                        max_seqlen_extra=0, seed=case.seed + 7919 * b)


def seq_values(case, b, device):
    """Sequence b's q (1, H, Nq, D), k (1, Hkv, Nk, D), v (1, Hkv, Nk, Dv) on `device`, in the case's dtype."""
    lk = sequences(case)[b][1]
    q, k, v = (t.to(device) for t in inp.values(sub_case(case, b), device))
    return q, k[:, :, :lk], v[:, :, :lk]


def segmented(case, protocol, decl=None, fit=None):
    """A generated dense case as a packed one, for a varlen or paged kernel: 2 to 6 sequences of lengths drawn from
    its seed up to its Nq and Nk (about one in five empty; its own Nk once), sharing Nq when paged, with a page
    size of 1, 5, 16 or 64, and one varlen case in four without max_seqlen_q/k. fit(decl, n, lo) moves a length into the declarations; a case they still exclude, a
    hand-valued or a huge one stays as it is (replayed as B equal sequences)."""
    if protocol == DENSE or case.seqlens is not None or case.sample_heads or case.data == "explicit" \
            or case.expected is not None:
        return case
    rnd = random.Random(case.seed * 1000003 + 31 * case.Nq + case.Nk)
    n = rnd.randint(2, 6)

    def length(top, lo):
        m = 0 if rnd.random() < 0.2 else rnd.randint(1, max(top, 1))
        return fit(decl, m, lo) if fit is not None else m

    lo = getattr(decl, "min_seq", 0) if decl is not None else 0
    lq = [case.Nq] * n if protocol == PAGED else [length(case.Nq, lo) for _ in range(n)]
    lk = [length(case.Nk, lo) for _ in range(n)]
    lk[rnd.randrange(n)] = case.Nk
    if getattr(decl, "same_length", False) or (case.causal and getattr(decl, "causal_same_length", False)):
        lk = list(lq)
    elif getattr(decl, "nk_ge_nq", False):
        lk = [max(a, b) for a, b in zip(lq, lk)]
    packed = case.replace(seqlens=tuple(zip(lq, lk)), page_size=rnd.choice((1, 5, 16, 64)) if protocol == PAGED
                          else None)
    if protocol == VARLEN and rnd.random() < 0.25:       # one in four without max_seqlen_q/k (their default)
        packed = packed.replace(max_seqlen_extra=None)
    if decl is not None and decl.reasons(packed):
        return case
    return packed


def skip_reason(case, protocol):
    """Why a case cannot be judged through this protocol ("" when it can)."""
    packed = case.seqlens is not None or case.page_size is not None
    if protocol == DENSE:
        return ("a packed-sequence case (varlen or paged): the kernel is dense (its signature has no cu_seqlens_q "
                "or block_table; --protocol declares one)") if packed else ""
    if case.sample_heads:
        return "a huge case, judged on dense kernels only (its point is one dense tensor past 2^31 elements)"
    if protocol == PAGED and len({lq for lq, _ in sequences(case)}) > 1:
        return "sequences of different query lengths: a paged call has one Nq for every sequence"
    return ""


def _parameters(kernel):
    try:
        return inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return {}


def dense_signature(params):
    """The signature an adapter shows the dense oracle for a kernel of these parameters: q, k, v and the kernel's
    own keywords among DENSE_KEYWORDS (so the capabilities discovered are the kernel's)."""
    P = inspect.Parameter
    out = [P(n, P.POSITIONAL_OR_KEYWORD) for n in ("q", "k", "v")]
    out += [P(n, P.KEYWORD_ONLY, default=params[n].default) for n in DENSE_KEYWORDS if n in params]
    if any(p.kind is P.VAR_KEYWORD for p in params.values()):
        out.append(P("kwargs", P.VAR_KEYWORD))
    return inspect.Signature(out)


def _bad(what, expected, got):
    desc = (f"{tuple(got.shape)} {got.dtype} on {got.device}" if isinstance(got, torch.Tensor)
            else type(got).__name__)
    return RunFailed(Failure(Kind.BAD_RETURN, f"{what}: expected {expected}, got {desc}"))


class _OwnRows(torch.autograd.Function):
    """whole[rows] (the judged sequence's rows of a packed output), as a plain index gives them; in the backward
    the other sequences' rows get a gradient of their own (seeded, of order 1) where a plain index gives them 0.
    The judged sequence's gradients do not depend on it; a backward that mixes sequences (dK and dV summed over
    rows of another sequence, a loop bounded by the wrong offsets) moves them. With zeros there, the other rows'
    contributions vanish and such a leak is unseen."""

    @staticmethod
    def forward(ctx, whole, rows, seed):
        ctx.rows, ctx.seed, ctx.shape = rows, seed, whole.shape
        return whole[rows].clone()

    @staticmethod
    def backward(ctx, grad):
        g = torch.Generator(device="cpu").manual_seed(ctx.seed)
        full = torch.randn(ctx.shape, generator=g, dtype=torch.float32).to(grad.device, grad.dtype)
        full[ctx.rows] = grad
        return full, None, None


class Packed:
    """Sequence b of `case`, called as a dense kernel: its q (1, H, Nq, D), k, v come from the oracle; the other
    sequences are the case's own (or, leak=True, large values); the kernel gets them all in its protocol's layout."""

    def __init__(self, kernel, protocol, case, b, leak=False, layout="bhnd"):
        """layout: a paged kernel's q and output, bhnd (B, H, Nq, D) or bnhd (B, Nq, H, D) (--paged-q)."""
        self.kernel, self.protocol, self.case, self.b, self.leak = kernel, protocol, case, b, leak
        self.layout = layout
        self._params = _parameters(kernel)
        self.__signature__ = dense_signature(self._params)
        self._others = {}

    def _other(self, i, nq, device, dtype):
        """Sequence i's (q, k, v), (1, H, nq, D) etc. (nq: the query length, which a paged call shares)."""
        key = (i, nq, str(device))
        if key not in self._others:
            sub = sub_case(self.case, i)
            q, k, v = seq_values(self.case, i, device)
            if self.protocol == PAGED and q.shape[2] != nq:   # a paged call shares Nq (a property may change b's)
                q = inp.values(sub.replace(Nq=nq), device)[0].to(device)
            if self.leak:
                g = torch.Generator(device="cpu").manual_seed(sub.seed + 1)
                k = (4 * torch.randn(k.shape, generator=g)).to(device, dtype)
                v = (LEAK_V + LEAK_V / 4 * torch.randn(v.shape, generator=g)).to(device, dtype)
            self._others[key] = (q, k, v)
        return self._others[key]

    def _all(self, q, k, v):
        """[(q, k, v)] of every sequence, sequence b's the given tensors."""
        seqs = sequences(self.case)
        return [(q, k, v) if i == self.b else self._other(i, q.shape[2], q.device, q.dtype) for i in range(len(seqs))]

    def _buffer(self, name, shape, dtype, device, fill):
        """A guarded view of `shape` laid out as the case's layout says for tensor `name` (a 3-D shape is laid out
        as (1, *shape), so a packed (total, H, D) tensor gets the dense layouts' strides and gaps)."""
        lead = 4 - len(shape)
        g = inp.guarded((1,) * lead + tuple(shape), dtype, device, inp.tensor_layout(self.case.layout, name), fill)
        return inp.Guarded(g.t[0] if lead else g.t, g.flat)

    def __call__(self, q, k, v, **kw):
        seqs = self._all(q, k, v)
        device, dt = q.device, q.dtype
        H, D, Hkv, Dv = q.shape[1], q.shape[3], k.shape[1], v.shape[3]
        out = kw.pop("out", None)
        if "alibi_slopes" in kw and kw["alibi_slopes"] is not None and kw["alibi_slopes"].dim() == 2:
            kw["alibi_slopes"] = self._slopes(kw["alibi_slopes"], len(seqs))
        if self.protocol == VARLEN:
            return self._varlen(seqs, out, kw, device, dt, H, D, Hkv, Dv)
        return self._paged(seqs, out, kw, device, dt, H, D, Hkv, Dv)

    def _slopes(self, row, n):
        """(n, H) per-sequence ALiBi slopes: the judged sequence's own row at b, every other sequence its own
        multiple of it (1.5, 2, 2.5, ... times), so that a kernel reading another sequence's row (row 0, or the
        wrong index) shows on the judged sequence."""
        f = [1.0 if i == self.b else 1.0 + 0.5 * ((i - self.b) % n) for i in range(n)]
        return (row[:1] * torch.tensor(f, dtype=row.dtype, device=row.device)[:, None]).contiguous()

    # ---- varlen ----

    def _varlen(self, seqs, out, kw, device, dt, H, D, Hkv, Dv):
        lq = [s[0].shape[2] for s in seqs]
        lk = [s[1].shape[2] for s in seqs]
        cq = [0] + [sum(lq[:i + 1]) for i in range(len(lq))]
        ck = [0] + [sum(lk[:i + 1]) for i in range(len(lk))]
        nan = float("nan")
        gq = self._buffer("q", (cq[-1], H, D), dt, device, nan)
        gk = self._buffer("k", (ck[-1], Hkv, D), dt, device, nan)
        gv = self._buffer("v", (ck[-1], Hkv, Dv), dt, device, nan)
        # an empty sequence's rows are not copied: with autograd, an empty slice of a leaf that requires grad copied
        # into a buffer left that buffer so that the next sequence's copy raised ("a leaf Variable that requires grad
        # is being used in an in-place operation"), failing a correct kernel's backward
        for i, (qi, ki, vi) in enumerate(seqs):
            if lq[i]:
                gq.t[cq[i]:cq[i + 1]] = qi[0].transpose(0, 1)
            if lk[i]:
                gk.t[ck[i]:ck[i + 1]] = ki[0].transpose(0, 1)
                gv.t[ck[i]:ck[i + 1]] = vi[0].transpose(0, 1)
        cu_q = torch.tensor(cq, dtype=torch.int32, device=device)
        cu_k = torch.tensor(ck, dtype=torch.int32, device=device)
        extra = self.case.max_seqlen_extra
        for name, lengths in (("max_seqlen_q", lq), ("max_seqlen_k", lk)):
            param = self._params.get(name)
            if param is None or (extra is None and param.default is not inspect.Parameter.empty):
                continue     # not passed: the protocol's default (None), the kernel finds its lengths in the offsets
            kw[name] = max(lengths) + (extra or 0)
        gout = None
        if out is not None:
            gout = self._buffer("out", (cq[-1], H, Dv), dt, device, inp.SENTINEL)
            inp.int_view(gout.t).fill_(inp.poison_bits(dt))
            kw["out"] = gout.t
        else:
            inp.prepoison(cq[-1] * H * Dv, dt, device)
        if kw.get("return_lse"):
            inp.prepoison_lse(H * cq[-1], device)
        result, lse = self._call((gq.t, gk.t, gv.t, cu_q, cu_k), kw, (gq, gk, gv), gout,
                                 (cq[-1], H, Dv), (H, cq[-1]), dt, device)
        rows = slice(cq[self.b], cq[self.b + 1])
        got = self._own(result, rows).permute(1, 0, 2).unsqueeze(0)
        got_lse = None if lse is None else lse[:, rows].unsqueeze(0)
        return self._back(got, got_lse, out)

    # ---- paged ----

    def _paged(self, seqs, out, kw, device, dt, H, D, Hkv, Dv):
        nq = seqs[0][0].shape[2]
        lk = [s[1].shape[2] for s in seqs]
        B = len(seqs)
        ps = self.case.page_size or DEFAULT_PAGE
        need = [math.ceil(n / ps) for n in lk]
        pool = 3 * sum(need) + 2
        g = torch.Generator(device="cpu").manual_seed(self.case.seed + 31)
        order = torch.randperm(pool, generator=g).tolist()
        width = max(need) + 1                              # one entry more than any sequence needs: a NaN page
        table = torch.empty(B, width, dtype=torch.int32)
        used = iter(order)
        for b in range(B):
            for j in range(need[b]):
                table[b, j] = next(used)
        spare = list(used)                                 # pages no sequence uses: NaN throughout
        for b in range(B):
            for j in range(need[b], width):
                table[b, j] = spare[(b + j) % len(spare)]
        nan = float("nan")
        # q and out as (B, H, Nq, .), or (B, Nq, H, .) under --paged-q bnhd (FlashAttention's kvcache layout); the
        # lse is (B, H, Nq) either way
        bnhd = self.layout == "bnhd"
        q_shape, out_shape = ((B, nq, H, D), (B, nq, H, Dv)) if bnhd else ((B, H, nq, D), (B, H, nq, Dv))
        gq = self._buffer("q", q_shape, dt, device, nan)
        gk = self._buffer("k", (pool, ps, Hkv, D), dt, device, nan)
        gv = self._buffer("v", (pool, ps, Hkv, Dv), dt, device, nan)
        for b, (qi, ki, vi) in enumerate(seqs):
            if nq:                                         # (no empty copies: see _varlen)
                gq.t[b] = qi[0].transpose(0, 1) if bnhd else qi[0]
            if not lk[b]:
                continue
            j = torch.arange(lk[b])                        # key j: slot j % ps of page table[b, j // ps]
            pages, slots = table[b, j // ps].long().to(device), (j % ps).to(device)
            gk.t[pages, slots] = ki[0].transpose(0, 1)
            gv.t[pages, slots] = vi[0].transpose(0, 1)
        gout = None
        if out is not None:
            gout = self._buffer("out", out_shape, dt, device, inp.SENTINEL)
            inp.int_view(gout.t).fill_(inp.poison_bits(dt))
            kw["out"] = gout.t
        else:
            inp.prepoison(B * H * nq * Dv, dt, device)
        if kw.get("return_lse"):
            inp.prepoison_lse(B * H * nq, device)
        seqlens = torch.tensor(lk, dtype=torch.int32, device=device)
        result, lse = self._call((gq.t, gk.t, gv.t, table.to(device), seqlens), kw, (gq, gk, gv), gout,
                                 out_shape, (B, H, nq), dt, device)
        got = self._own(result, slice(self.b, self.b + 1))
        if bnhd:
            got = got.transpose(1, 2)
        got_lse = None if lse is None else lse[self.b:self.b + 1]
        return self._back(got, got_lse, out)

    # ---- shared ----

    def _own(self, result, rows):
        """result[rows], the judged sequence's part of the packed output; with autograd, through _OwnRows, so that
        the other sequences' rows get an output gradient too."""
        if not result.requires_grad:
            return result[rows]
        return _OwnRows.apply(result, rows, self.case.seed + 7 * self.b + 1)

    def _call(self, args, kw, inputs, gout, out_shape, lse_shape, dt, device):
        before = [g.flat.clone() for g in inputs]
        out_before = None if gout is None else gout.flat.clone()
        result = self.kernel(*args, **kw)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        lse = None
        if kw.get("return_lse"):
            if not (isinstance(result, (tuple, list)) and len(result) == 2):
                raise _bad("return_lse=True", "(out, lse)", result)
            result, lse = result
        if result is None and gout is not None:
            result = gout.t         # given out=, a kernel may answer in it alone
        if not isinstance(result, torch.Tensor) or tuple(result.shape) != out_shape or result.dtype != dt \
                or result.device.type != torch.device(device).type:
            raise _bad(f"the {self.protocol} output", f"{out_shape} {dt} on {device}", result)
        if lse is not None and (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != lse_shape
                                or lse.dtype != torch.float32 or lse.device.type != torch.device(device).type):
            fail = _bad(f"the {self.protocol} lse", f"{lse_shape} torch.float32 on {device}", lse)
            if isinstance(lse, torch.Tensor):
                fail.failure.message += lse_layout_hint(lse.shape, lse_shape)
            raise fail
        for name, g, snap in zip(("q", "k (the cache)" if self.protocol == PAGED else "k",
                                  "v (the cache)" if self.protocol == PAGED else "v"), inputs, before):
            changed = g.changed(snap)
            if bool(changed.any()):
                raise RunFailed(Failure(Kind.INPUT_WRITTEN, f"the kernel wrote into its packed {name}: "
                                                            f"{int(changed.sum())} element(s) changed"))
        if gout is not None:
            outside = gout.outside_changed(out_before)
            if outside.numel():
                raise RunFailed(Failure(Kind.OOB_WRITE, f"{outside.numel()} element(s) around the packed output "
                                                        f"changed (the first {int(outside[0])} elements into its "
                                                        "buffer): a write outside every sequence's rows"))
            check_returned_out(result, gout.t, f"the returned {self.protocol} output")
        return result, lse

    @staticmethod
    def _back(got, got_lse, out):
        if out is not None:
            out.copy_(got)
            got = out
        else:
            got = got.clone()      # a copy of the kernel's own rows, poison bits and all
        return got if got_lse is None else (got, got_lse.clone())

