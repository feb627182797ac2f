"""Judging one case of a varlen or paged kernel (cases/protocols.py): each sequence in turn by the dense judgement
(the oracle's layers, the call without out=, the properties, --repeat), through the adapter that places it among
the case's other sequences; then the leak check; one verdict for the case.

A sequence's failure is the case's, named by the sequence (its index and lengths) and its element (b is the
sequence). The case passes when no sequence failed and at least one was judged conclusively: a sequence whose
answer is 0 (it sees no key) cannot discriminate alone, but it is still judged (its rows must be 0, its lse -inf).
"""
import time

import torch

from flashcheck.cases import oracle, protocols
from flashcheck.cases.backend import device
from flashcheck.cases.oracle import Failure, Kind, backward

ENDS = ("unsupported", "out of memory", "timeout", "skip")


def judge(kernel, protocol, case, settings, judge_dense):
    """The Verdict of `case` for a `protocol` kernel; judge_dense(kernel, case, settings, kept) judges one dense case
    (cases/verify/judging.py)."""
    t0 = time.perf_counter()
    verdict = oracle.Verdict(case, settings.target)
    seqs = protocols.sequences(case)
    conclusive, inconclusive, ratio = 0, [], 0.0
    for b, (lq, lk) in enumerate(seqs):
        sub = protocols.sub_case(case, b)
        where = f"sequence {b} of {len(seqs)} (Nq = {lq}, Nk = {lk})"
        if lk == 0:            # no dense case has Nk = 0: its rows must be 0, its lse -inf, among the others
            try:
                fail = _no_keys(kernel, protocol, case, b, settings)
            except oracle.Outcome as other:
                verdict.status, verdict.note = other.status, f"{where}: {other.note}"
                break
            if fail is not None:
                verdict.fail(_named(fail, b, where))
                break
            inconclusive.append(f"{where}: sees no key (its rows are 0)")
            continue
        kept = {}
        v = judge_dense(protocols.Packed(kernel, protocol, case, b, layout=settings.decl.paged_q), sub, settings,
                          kept)
        for r in v.reduced:
            if r not in verdict.reduced:
                verdict.reduced.append(r)
        if v.peak_bytes is not None:
            verdict.peak_bytes = max(verdict.peak_bytes or 0, v.peak_bytes)
        if v.failed:
            for f in v.failures:
                verdict.fail(_named(f, b, where))
            verdict.maps = v.maps
            break
        if v.status in ENDS:
            verdict.status, verdict.note = v.status, f"{where}: {v.note}"
            break
        if v.ratio >= ratio:
            ratio, verdict.max_err, verdict.tol = v.ratio, v.max_err, v.tol
        if v.status == "inconclusive":
            inconclusive.append(f"{where}: {v.note}")
        else:
            conclusive += 1
        if len(seqs) > 1 and lq and kept.get("expect") is not None:
            fail = _leak(kernel, protocol, case, b, sub, kept, settings.decl.paged_q)
            if fail is not None:
                verdict.fail(_named(fail, b, where))
                break
    verdict.ratio = ratio
    if not verdict.failed and verdict.status not in ENDS:
        if not conclusive and inconclusive:
            verdict.status, verdict.note = "inconclusive", inconclusive[0]
        elif inconclusive:
            verdict.note = f"{len(inconclusive)} of {len(seqs)} sequences could not discriminate alone (no keys)"
    verdict.seconds = time.perf_counter() - t0
    return verdict


def _named(f, b, where):
    if f.where is not None:
        f.where = (b,) + tuple(f.where[1:])
    f.message = f"{where}: {f.message}" if f.message else where
    return f


def _leak(kernel, protocol, case, b, sub, kept, layout):
    """The leak check: sequence b again, every other sequence's keys and values changed to large values; its output
    must still match its reference. Returns a Failure or None."""
    leaky = protocols.Packed(kernel, protocol, case, b, leak=True, layout=layout)
    caps = oracle.Capabilities.of(leaky)
    try:
        call = oracle.call_kernel(leaky, sub, caps, kept["qkv"], device())
    except oracle.RunFailed as stop:
        stop.failure.message = f"leak check (the other sequences changed): {stop.failure.message}"
        return stop.failure
    except oracle.Outcome:
        return None
    got = call.result.detach().to("cpu").double().numpy()
    e = kept["expect"]
    fail, _ = oracle.compare(got, e.out, e.tol)
    if fail is not None:
        fail.kind = Kind.LEAK
        fail.message = (f"the output changed when the other sequences' keys and values did (to values near "
                        f"{protocols.LEAK_V:g}): it reads outside its own sequence")
    return fail if isinstance(fail, Failure) else None


def _no_keys(kernel, protocol, case, b, settings):
    """Sequence b has no keys: called among the others (through the oracle's call, so a decline is "unsupported" and
    an exception, a bad return or a written input fails as anywhere), each of its rows must be exactly 0 and its lse
    -inf (or the declared +inf). Returns a Failure or None; raises oracle.Outcome for a decline."""
    qkv = protocols.seq_values(case, b, device())
    adapter = protocols.Packed(kernel, protocol, case, b, layout=settings.decl.paged_q)
    try:
        call = oracle.call_kernel(adapter, protocols.sub_case(case, b), oracle.Capabilities.of(adapter), qkv,
                                  device())
    except oracle.RunFailed as stop:
        return stop.failure
    out, lse = call.result, call.lse
    bad = ~(out == 0)
    if bool(bad.any()):
        w = tuple(int(x) for x in torch.nonzero(bad)[0])
        return Failure(Kind.NAN if not bool(torch.isfinite(out[w])) else Kind.MISMATCH,
                       "a sequence without keys: every row must be 0", where=w, got=float(out[w]), expected=0.0)
    if lse is not None:
        want = float("inf") if settings.decl.empty_lse == "+inf" else float("-inf")
        off = lse != want
        if bool(off.any()):
            w = tuple(int(x) for x in torch.nonzero(off)[0])
            return Failure(Kind.LSE, f"a sequence without keys: its lse must be {want} (--empty-lse)",
                           where=w + (0,), got=float(lse[w]), expected=want)
    if settings.backward and qkv[0].numel():
        return _no_keys_backward(adapter, protocols.sub_case(case, b), qkv)
    return None


def _no_keys_backward(adapter, sub, qkv):
    """The backward of a sequence without keys: its output is 0 whatever its queries, so their gradient must be
    exactly 0 (a backward that skips such a sequence leaves its dq rows as the allocation held them). Returns a
    Failure or None (None too when this call's output carries no graph: the case's other sequences judge that)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in qkv)
    dout = backward.output_gradient(sub, device())
    try:
        result = adapter(q, k, v, **oracle.protocol_kwargs(sub, oracle.Capabilities.of(adapter), device()))
        result = result[0] if isinstance(result, (tuple, list)) else result
        if not backward.differentiable(result):
            return None
        dq = torch.autograd.grad(result, (q,), dout, allow_unused=True)[0]
    except Exception as exc:  # noqa: BLE001  (a kernel's backward can raise anything)
        kind, text = oracle.classify_exception(exc)
        return Failure(Kind.GRADIENT if kind == Kind.EXCEPTION else kind,
                       f"a sequence without keys: backward raised: {text.splitlines()[0][:300]}")
    if dq is None:
        return None
    bad = ~(dq == 0)
    if bool(bad.any()):
        w = tuple(int(x) for x in torch.nonzero(bad)[0])
        return Failure(Kind.GRADIENT, f"backward: dq: {int(bad.sum())} element(s) wrong; a sequence without keys: its "
                                      "queries' gradient must be 0", where=w, got=float(dq[w]), expected=0.0)
    return None
