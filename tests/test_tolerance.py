"""The tolerance (cases/oracle/tolerance.py) against independent correct formulations and near-miss wrong
ones, over hundreds of generated cases per dtype, in every layout:

  * no correct formulation exceeds it: the four of examples/plain_attention.py (fp32 matmul-softmax-matmul,
    einsum, SDPA's math backend, and PyTorch in the input dtype, whose fp16/bf16 scores are rounded) and a
    blocked online softmax with FlashAttention's numerics (Q pre-scaled in its dtype, exp2, P rounded); the
    project's own kernels on a subset. A false alarm is a defect of the tolerance.
  * it discriminates, under the default tolerance (what every foreign kernel gets) and under --fp32-scores: the
    share of cases too wide to judge (inconclusive) stays small in every dtype, and each near-miss bug (the last
    key dropped, the softmax at the wrong temperature or over the wrong axis) fails on most cases where it lands
    far beyond every correct formulation (BEYOND, CAUGHT below).
The figures (largest err/tol per formulation and dtype; per tolerance the inconclusive share and the near misses'
applicable and caught counts) are printed (-s) and kept in the JUnit XML as properties.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from flashcheck.cases import inputs as inp
from flashcheck.cases import oracle
from flashcheck.cases.case import DTYPES as DTYPE_OF
from flashcheck.cases.case import Case
from flashcheck.cases.generate import strategies as S
from flashcheck.cases.oracle import tolerance
from flashcheck.kernel import fused
from tests.formulations import CORRECT, WRONG

EXAMPLES = {"dev": 60, "ci": 150, "thorough": 600}
# A near miss is "applicable" on a case where it lands BEYOND times farther from the float64 reference than the
# farthest correct formulation did on that case: a measure of what rounding does there that owes nothing to the
# tolerance. Each floor below is the least share of cases on which a near miss must be applicable (the test's own
# power: a generator that stopped reaching such cases would leave the check idle); CAUGHT is the least share of
# applicable cases the tolerance must fail. Measured on the CPU, dev profile (60 cases), as (applicable, caught):
#   default tolerance      fp32: last key 31 (29), temperature 12 (12), wrong axis 36 (36)
#                          fp16: 29 (28), 9 (9), 34 (34)     bf16: 14 (13), 3 (3), 27 (27)
#   --fp32-scores          fp32 as above; fp16: 29 (28), 12 (12), 36 (36); bf16: 23 (22), 18 (13), 41 (41)
# The tolerance is a bound, usually a few times the error a correct kernel makes, so a near miss 8x beyond the
# correct ones can still fall inside it on a few cases (bf16 under --fp32-scores: the temperature, 13 of 18).
APPLICABLE = {"last_key_dropped": {"fp32": 0.35, "fp16": 0.3, "bf16": 0.05},
              "natural_log_temperature": {"fp32": 0.1, "fp16": 0.08, "bf16": 0.02},
              "softmax_over_queries": {"fp32": 0.4, "fp16": 0.4, "bf16": 0.3}}
# on a GPU the cases are longer (up to 256 keys, and draws of 16k): one key or the temperature matters on fewer.
# Measured on an H200 (dev, 60 cases, default tolerance): last key fp32 29, fp16 9, bf16 4; temperature 19, 3, 0
# (bf16's rounding there is as large as the temperature's error: no floor); wrong axis 35, 22, 16
APPLICABLE_GPU = {"last_key_dropped": {"fp32": 0.15, "fp16": 0.1, "bf16": 0.04},
                  "natural_log_temperature": {"fp32": 0.1, "fp16": 0.03, "bf16": 0.0},
                  "softmax_over_queries": {"fp32": 0.2, "fp16": 0.2, "bf16": 0.15}}
CAUGHT = 0.65
# The share of cases too wide to judge (inconclusive), at most, per tolerance and dtype. Measured on the CPU (dev 60
# cases / ci 150): default fp32 0 / 0, fp16 2 / 5, bf16 7 / 30 (bf16 scores rounded to 8 bits cannot resolve the
# large-score draws: a kernel that keeps fp32 scores declares --fp32-scores); --fp32-scores 0 / 0 in every dtype.
INCONCLUSIVE = {"default": {"fp32": 0.05, "fp16": 0.05, "bf16": 0.25},
                "fp32_scores": {"fp32": 0.05, "fp16": 0.05, "bf16": 0.05}}
DTYPES = ("fp32", "fp16", "bf16")
# The shares above are rates, measured; a run sees 60 to 600 cases, whose counts scatter around them (binomially:
# over 8 seeds of the dev profile's 60 fp16 GPU-strategy cases, 0 to 5 were inconclusive, and the bf16 last key
# was applicable on 2 to 18). A count fails the test where it shows, at SIGNIFICANCE, that the rate is worse than
# its limit: a fixed share of 60 cases would fail a correct tolerance on an unlucky draw, and any edit to the
# generator redraws them. A near miss with a floor must still be applicable somewhere (a check that never runs
# is idle).
SIGNIFICANCE = 0.01


def _tail(n, p, k, upper):
    """P(X >= k) (upper) or P(X <= k) for X ~ Binomial(n, p)."""
    ks = range(k, n + 1) if upper else range(0, k + 1)
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in ks)


def _rate_at_most(count, n, rate):
    return _tail(n, rate, count, upper=True) >= SIGNIFICANCE


def _rate_at_least(count, n, rate):
    return (count >= 1 or rate == 0) and _tail(n, rate, count, upper=False) >= SIGNIFICANCE


def _examples():
    return EXAMPLES.get(S.current_profile(), EXAMPLES["dev"])


CONVENTIONS = {"default": oracle.Conventions(), "fp32_scores": oracle.Conventions(fp32_scores=True)}
BEYOND = 8.0      # a near miss is applicable where it lands this many times farther off than any correct formulation
AMPLIFIED = 10.0  # the rounding near miss: the farthest correct formulation's error, this many times over
# The least share of the rounding near miss's applicable cases the tolerance must fail: how close the tolerance
# sits to what correct kernels really do. Measured on the CPU, as caught of applicable, default / --fp32-scores,
# dev (60 cases) and ci (150): fp32 6 of 28 / 6 of 28, ci 15 of 68 / 15 of 68 (the fp32 bound is usually more than
# 10x a correct kernel's error; tf32's 1e-3, 1000x beyond, is what it must and does fail), fp16 18 of 21 / 4 of 4,
# ci 26 of 30 / 3 of 3, bf16 10 of 11 / 5 of 6, ci 32 of 37 / 11 of 15.
AMPLIFIED_CAUGHT = {"fp32": 0.1, "fp16": 0.6, "bf16": 0.6}
# On a GPU the draws are longer rows (up to 256 keys and 16k), where the bound, a sum of each rounding's worst case,
# grows with the keys while the correct formulations' real errors (fp32 accumulation on the tensor cores) partly
# cancel: the same amplified rounding lands inside the bound more often. Measured on an H200 (dev, 60 cases),
# default / --fp32-scores: fp32 10 of 26 / 10 of 26, fp16 2 of 5 / 1 of 1, bf16 7 of 7 / 3 of 3.
AMPLIFIED_CAUGHT_GPU = {"fp32": 0.1, "fp16": 0.3, "bf16": 0.6}


@pytest.mark.parametrize("dtype", DTYPES)
def test_correct_formulations_pass_and_near_misses_fail(dtype, device, backend, record_property):
    """Under each tolerance a kernel can be judged with (the default one, which every foreign kernel gets, and the
    tighter --fp32-scores one): no correct formulation fails; few cases are too wide to judge; and each near miss
    fails wherever it lands farther from the reference than BEYOND times the farthest correct formulation did on
    that case (an independent measure of what rounding does there, never the tolerance itself)."""
    if dtype not in S.limits(backend).dtypes and dtype != "bf16":
        pytest.skip(f"{dtype} is not judged on {backend}")
    worst = {name: 0.0 for name in CORRECT}
    near = (*WRONG, "rounding_amplified")
    stats = {c: {"cases": 0, "inconclusive": 0, **{f"{w}_applicable": 0 for w in near},
                 **{f"{w}_caught": 0 for w in near}} for c in CONVENTIONS}
    kernel_every = 5     # the project's kernel on every fifth case (Triton's interpreter is slow on the CPU)
    triton_ok = backend == "gpu" or dtype != "bf16"   # the interpreter reads bfloat16 wrongly
    seen = [0]
    u = tolerance.UNIT[DTYPE_OF[dtype]]

    @settings(max_examples=_examples(), derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(S.cases(dtypes=(dtype,), pin_blocks=False, backend=backend if dtype != "bf16" else "gpu"))
    def check(case):
        case = case.replace(B=min(case.B, 2), H=min(case.H, 2))
        qkv = inp.values(case)
        g = inp.make_inputs(case, device, qkv=qkv, guard_fill=0.0)
        outputs = {}
        for name, fn in {**CORRECT, **WRONG, **({"fused": fused.attention} if triton_ok and seen[0] % kernel_every == 0
                                                 else {})}.items():
            outputs[name] = fn(g.q.t, g.k.t, g.v.t, causal=case.causal, scale=case.scale).double().cpu().numpy()
        seen[0] += 1
        for cname, conventions in CONVENTIONS.items():
            e = oracle.expectation(case, qkv, device, conventions)
            correct = [n for n in outputs if n not in WRONG]
            if conventions.fp32_scores or (dtype == "fp16" and case.data == "large" and (case.magnitude or 0) > 8e3):
                # it rounds its scores to fp16/bf16: not fp32 scores; and its raw fp16 scores overflow past 65504
                # on large data of magnitude 1e4 and up (legal inputs it cannot take: the catalogue's huge_scores
                # fails it on purpose); this test is about the tolerance for rounding, not about range
                correct.remove("in_dtype")
            finite = np.isfinite(e.out)
            farthest = 0.0
            for name in correct:
                fail, (ratio, _, _) = oracle.compare(outputs[name], e.out, e.tol)
                assert fail is None, (f"false alarm: {name} ({dtype}, {cname}) {fail.line()}\n{case.source()}")
                worst[name] = max(worst.get(name, 0.0), ratio)
                if finite.any():
                    farthest = max(farthest, float(np.abs(outputs[name] - e.out)[finite].max()))
            st = stats[cname]
            st["cases"] += 1
            why = tolerance.discriminates(e)
            st["inconclusive"] += why is not None
            if why is None and finite.any():
                # what rounding does here: the farthest correct answer, or the output's own last bit if every
                # correct formulation happened to be exact
                bar = BEYOND * max(farthest, 2 * u * float(np.abs(e.out[finite]).max()))
                # and a near miss made of rounding itself: the farthest correct formulation's own error, AMPLIFIED
                # times (a tolerance many times wider than what correct kernels do lets it through)
                far = max(correct, key=lambda n: float(np.abs(outputs[n] - e.out)[finite].max()))
                wrong = {name: outputs[name] for name in WRONG}
                wrong["rounding_amplified"] = np.where(finite, e.out + AMPLIFIED * (outputs[far] - e.out), e.out)
                for name, got in wrong.items():
                    if float(np.nanmax(np.abs(got - e.out)[finite])) > bar:
                        st[f"{name}_applicable"] += 1
                        st[f"{name}_caught"] += oracle.compare(got, e.out, e.tol)[0] is not None

    check()
    line = ", ".join(f"{n} {r:.2f}" for n, r in worst.items())
    print(f"\n{dtype} on {backend}: largest err/tol {line}; {stats}")
    record_property(f"worst_err_over_tol_{dtype}", line)
    record_property(f"stats_{dtype}", str(stats))
    for cname, st in stats.items():
        assert _rate_at_most(st["inconclusive"], st["cases"], INCONCLUSIVE[cname][dtype]), \
            f"{cname}: too many cases too wide to judge: {st}"
        for name in WRONG:
            applicable, caught = st[f"{name}_applicable"], st[f"{name}_caught"]
            floor = (APPLICABLE_GPU if backend == "gpu" else APPLICABLE)[name][dtype]
            assert _rate_at_least(applicable, st["cases"], floor) and caught >= CAUGHT * applicable, \
                f"{cname}, {name}: caught {caught} of {applicable} cases where it lands {BEYOND:g}x farther off " \
                f"than any correct formulation; {st}"
        applicable, caught = st["rounding_amplified_applicable"], st["rounding_amplified_caught"]
        assert caught >= (AMPLIFIED_CAUGHT_GPU if backend == "gpu" else AMPLIFIED_CAUGHT)[dtype] * applicable, \
            f"{cname}: the tolerance let through {applicable - caught} of {applicable} outputs {AMPLIFIED:g}x as far off " \
            f"as the farthest correct formulation; {st}"


def test_a_small_gpu_case_has_its_reference_on_the_host(monkeypatch):
    """tolerance.reference_device: a small case's float64 reference is the host's (its hundreds of tiny kernels cost
    more to launch on a shared GPU than to run on the CPU), a large one stays on the device, and a host case stays
    on the host; $FLASHCHECK_HOST_REFERENCE moves the bound (0: always the device)."""
    small, big = ((1, 2, 64, 16), (1, 2, 64, 16), (1, 2, 64, 16)), ((1, 8, 2048, 128), (1, 8, 2048, 128),
                                                                      (1, 8, 2048, 128))
    assert tolerance.reference_device("cuda", *small) == "cpu"
    assert tolerance.reference_device("cuda:0", *big) == "cuda:0"
    assert tolerance.reference_device("cpu", *big) == "cpu"
    monkeypatch.setenv("FLASHCHECK_HOST_REFERENCE", "0")
    assert tolerance.reference_device("cuda", *small) == "cuda"


@pytest.mark.gpu
def test_the_host_and_the_device_references_agree(monkeypatch):
    """The same expectation computed on the GPU and on the host: float64 both, so they differ by summation order
    alone (far below any tolerance they set)."""
    case = Case("host_or_device", B=2, H=4, Hkv=2, Nq=37, Nk=70, D=24, Dv=40, dtype="bf16", causal=True,
                       window=(9, 3), softcap=20.0, seed=3)
    qkv = inp.values(case, "cuda")
    monkeypatch.setenv("FLASHCHECK_HOST_REFERENCE", "0")
    on_gpu = oracle.expectation(case, qkv, "cuda")
    monkeypatch.setenv("FLASHCHECK_HOST_REFERENCE", str(2 ** 40))
    on_host = oracle.expectation(case, qkv, "cuda")
    for name in ("out", "lse", "tol", "tol_lse"):
        a, b = getattr(on_gpu, name), getattr(on_host, name)
        assert np.allclose(a, b, rtol=1e-10, atol=1e-12, equal_nan=True), name
