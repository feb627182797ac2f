"""Judging one case for verify, where the kernel lives (in the runner's child, or in-process):

  1. the oracle's layers (reference with its per-element tolerance, hand values, poison, guard bands);
  2. the properties every correct kernel has (cases/generate/properties.py, with parameters fixed by the
     case's seed): rows independent, keys permutable, linear in V, scale-equivariant, duplicated keys
     harmless, the output inside the convex hull of V, hidden keys ignored;
  3. with --repeat N, the same inputs N times: every output bit (and the log-sum-exp) must be the same;
  4. for a failing case, the error maps of the HTML report (cases/oracle/diagnose.py).
"""
from dataclasses import dataclass

import torch

from flashcheck.cases import inputs as inp
from flashcheck.cases import oracle
from flashcheck.cases.declarations import Declarations
from flashcheck.cases.oracle import Failure, Kind


@dataclass(frozen=True)
class Settings:
    """What verify asks of each case (sent to the worker with every case)."""
    target: str = "kernel"
    decl: Declarations = Declarations()
    properties: bool = True      # the metamorphic properties after the oracle's layers
    repeat: int = 1              # calls on the same inputs that must agree bitwise
    maps: bool = False           # error maps of failing cases (the HTML report)
    plain: bool = False          # also one call on plain, exact-size tensors (--sanitize: memcheck sees it)


def judge_case(kernel, case, settings):
    """The Verdict of one case; nothing raised here escapes (a kernel can surprise the oracle)."""
    try:
        return _judge(kernel, case, settings)
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        verdict = oracle.Verdict(case, settings.target)
        kind, text = oracle.classify_exception(exc)
        verdict.fail(Failure(kind, f"escaped the oracle: {text.splitlines()[0][:500]}",
                             location=oracle.where_raised(exc)))
        return verdict


def _judge(kernel, case, settings):
    from flashcheck.cases.backend import backend

    conventions = oracle.Conventions.of(settings.decl)
    caps = oracle.Capabilities.of(kernel)
    verdict = oracle.judge(kernel, case, target=settings.target, caps=caps, conventions=conventions,
                           measure=backend() == "gpu")
    if verdict.status in ("pass", "inconclusive"):
        if settings.properties and case.data != "nan_input":
            _properties(kernel, case, settings, conventions, verdict)
        if not verdict.failed and settings.repeat > 1:
            _repeat(kernel, case, caps, settings.repeat, verdict)
        if not verdict.failed and settings.plain:
            _plain_call(kernel, case, caps)
    if verdict.failed and settings.maps:
        from flashcheck.cases.oracle import diagnose

        verdict.maps = diagnose.error_maps(kernel, case, caps, conventions)
    return verdict


def _properties(kernel, case, settings, conventions, verdict):
    from flashcheck.cases.generate import properties

    if case.sample_heads:
        return       # a huge case: the relations would each need another tens of GB
    found = properties.check_fixed(kernel, case, target=settings.target, conventions=conventions)
    if found is not None:
        f = found.failure
        f.message = f"property {found.prop}: {f.message}" + (f" ({found.detail})" if found.detail else "")
        verdict.fail(f)


def _repeat(kernel, case, caps, times, verdict):
    """The same inputs `times` times: outputs (and lse) must be bitwise identical; a race shows like this."""
    from flashcheck.cases.backend import device

    qkv = inp.values(case, device())
    first = None
    for i in range(times):
        try:
            call = oracle.call_kernel(kernel, case, caps, qkv, device())
        except (oracle.RunFailed, oracle.Outcome) as stop:
            verdict.fail(getattr(stop, "failure", None) or Failure(Kind.NONDETERMINISTIC, f"call {i + 1} of "
                                                                   f"{times} ended differently: {stop}"))
            return
        bits = inp.int_view(call.result).cpu().clone()
        lse = None if call.lse is None else call.lse.detach().cpu().view(torch.int32).clone()
        if first is None:
            first = (bits, lse, call.result.detach().cpu().double())
            continue
        differs = bits != first[0]
        if bool(differs.any()):
            w = tuple(int(x) for x in torch.nonzero(differs)[0])
            got = call.result.detach().cpu().double()
            verdict.fail(Failure(Kind.NONDETERMINISTIC, f"call {i + 1} of {times} on the same inputs differs from "
                                                        f"call 1 in {int(differs.sum())} output element(s) "
                                                        "(a race, or an order that depends on scheduling)",
                                 where=w, got=float(got[w]), expected=float(first[2][w])))
            return
        if lse is not None and first[1] is not None and not torch.equal(lse, first[1]):
            verdict.fail(Failure(Kind.NONDETERMINISTIC, f"call {i + 1} of {times} on the same inputs gives another "
                                                        "log-sum-exp than call 1"))
            return


def _plain_call(kernel, case, caps):
    """One call on plain, exact-size tensors (no guard bands around them): under compute-sanitizer memcheck
    a read or write past an allocation is reported even when its value never reaches the output."""
    from flashcheck.cases.backend import device

    q, k, v = (t.to(device()).contiguous() for t in inp.values(case, device()))
    kwargs = {"causal": case.causal} if (case.causal or caps.causal) else {}
    if case.scale is not None:
        kwargs["scale"] = case.scale
    try:
        kernel(q, k, v, **kwargs)
        if q.is_cuda:
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001  (the guarded run already judged the kernel; memcheck says the rest)
        pass
