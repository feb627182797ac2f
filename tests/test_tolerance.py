"""The tolerance (cases/oracle/tolerance.py) against independent correct formulations and near-miss wrong
ones, over hundreds of generated cases per dtype, in every layout:

  * no correct formulation exceeds it: the four of examples/plain_attention.py (fp32 matmul-softmax-matmul,
    einsum, SDPA's math backend, and PyTorch in the input dtype, whose fp16/bf16 scores are rounded) and a
    blocked online softmax with FlashAttention's numerics (Q pre-scaled in its dtype, exp2, P rounded); the
    project's own kernels on a subset. A false alarm is a defect of the tolerance.
  * it discriminates: the share of cases too wide to judge (inconclusive) stays small in every dtype, and
    each near-miss bug (the last key dropped, the softmax at the wrong temperature or over the wrong axis)
    fails on every case where it changes the answer beyond rounding.
The figures (largest err/tol per formulation and dtype, the inconclusive share) are printed (-s) and kept in
the JUnit XML as properties.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from flashcheck.cases import inputs as inp
from flashcheck.cases import oracle
from flashcheck.cases.generate import strategies as S
from flashcheck.cases.oracle import tolerance
from flashcheck.kernel import fused
from tests.formulations import CORRECT, WRONG

EXAMPLES = {"dev": 60, "ci": 150, "thorough": 600}
# The share of generated cases on which each near-miss moves the answer beyond 4x the largest tolerance, measured
# on the CPU (60 cases): last key dropped 77 % (fp32), 67 % (fp16), 23 % (bf16: eight bits leave wide
# tolerances); wrong temperature 45 %, 32 %, 22 %. A tolerance grown loose would lower them; the floors keep a
# margin under those figures.
# On a GPU the cases are longer (up to 256 keys, and draws of 16k), so one dropped key matters on fewer of them:
# measured on an H200 (60 cases), last key dropped 40 % (fp32), 13 % (bf16); wrong temperature 27 % (fp32).
# The softmax over the wrong axis (the queries), on the CPU (150 cases, ci profile): 75 % (fp32), 74 % (fp16),
# 57 % (bf16), every one caught; its GPU floors are set below the CPU's, not yet measured on a GPU.
# Re-measured on the CPU with the generator as it is now (its draws reach long decode rows and the dtypes'
# largest scores, where one key or the temperature often stays within rounding), every applicable case caught:
#   dev (60 cases, the README's plain `pytest`): last key 43 % (fp32), 43 % (fp16), 20 % (bf16); temperature
#   25 %, 17 %, 27 %; wrong axis 77 %, 72 %, 53 %.  ci (150): last key 57 %, 51 %, 37 %; temperature 39 %, 35 %,
#   23 %; wrong axis 75 %, 73 %, 58 %.
# The floors keep a margin under the lower of the two (the 0.5 and 0.2 of before failed the dev profile).
APPLICABLE = {"last_key_dropped": {"fp32": 0.35, "fp16": 0.35, "bf16": 0.15},
              "natural_log_temperature": {"fp32": 0.2, "fp16": 0.12, "bf16": 0.12},
              "softmax_over_queries": {"fp32": 0.5, "fp16": 0.5, "bf16": 0.35}}
APPLICABLE_GPU = {"last_key_dropped": {"fp32": 0.3, "fp16": 0.25, "bf16": 0.1},
                  "natural_log_temperature": {"fp32": 0.2, "fp16": 0.15, "bf16": 0.12},
                  "softmax_over_queries": {"fp32": 0.3, "fp16": 0.3, "bf16": 0.2}}
DTYPES = ("fp32", "fp16", "bf16")


def _examples():
    return EXAMPLES.get(S.current_profile(), EXAMPLES["dev"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_correct_formulations_pass_and_near_misses_fail(dtype, device, backend, record_property):
    if dtype not in S.limits(backend).dtypes and dtype != "bf16":
        pytest.skip(f"{dtype} is not judged on {backend}")
    worst = {name: 0.0 for name in CORRECT}
    stats = {"cases": 0, "inconclusive": 0, **{f"{w}_applicable": 0 for w in WRONG}, **{f"{w}_caught": 0 for w in WRONG}}
    kernel_every = 5     # the project's kernel on every fifth case (Triton's interpreter is slow on the CPU)
    triton_ok = backend == "gpu" or dtype != "bf16"   # the interpreter reads bfloat16 wrongly

    @settings(max_examples=_examples(), derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(S.cases(dtypes=(dtype,), pin_blocks=False, backend=backend if dtype != "bf16" else "gpu"))
    def check(case):
        case = case.replace(B=min(case.B, 2), H=min(case.H, 2))
        qkv = inp.values(case)
        g = inp.make_inputs(case, device, qkv=qkv, guard_fill=0.0)
        for conventions in (oracle.Conventions(), oracle.Conventions(fp32_scores=True)):
            e = oracle.expectation(case, qkv, device, conventions)
            candidates = dict(CORRECT)
            if conventions.fp32_scores or (dtype == "fp16" and case.data == "large" and (case.magnitude or 0) > 8e3):
                # it rounds its scores to fp16/bf16: not fp32 scores; and its raw fp16 scores overflow past 65504
                # on large data of magnitude 1e4 and up (legal inputs it cannot take: the catalogue's huge_scores
                # fails it on purpose); this test is about the tolerance for rounding, not about range
                candidates.pop("in_dtype")
            if triton_ok and stats["cases"] % kernel_every == 0:
                candidates["fused"] = fused.attention
            for name, fn in candidates.items():
                got = fn(g.q.t, g.k.t, g.v.t, causal=case.causal, scale=case.scale).double().cpu().numpy()
                fail, (ratio, _, _) = oracle.compare(got, e.out, e.tol)
                assert fail is None, (f"false alarm: {name} ({dtype}, {conventions}) {fail.line()}\n"
                                      f"{case.source()}")
                worst[name] = max(worst.get(name, 0.0), ratio)
        stats["cases"] += 1
        why = tolerance.discriminates(e)
        stats["inconclusive"] += why is not None
        if why is None and e.out.size:
            for name, fn in WRONG.items():
                got = fn(g.q.t, g.k.t, g.v.t, causal=case.causal, scale=case.scale).double().cpu().numpy()
                # does the mistake move the answer beyond what the dtype's roundings could? (else no bug shows)
                if np.nanmax(np.abs(got - e.out)) > 4 * np.nanmax(e.tol):
                    stats[f"{name}_applicable"] += 1
                    stats[f"{name}_caught"] += oracle.compare(got, e.out, e.tol)[0] is not None

    check()
    line = ", ".join(f"{n} {r:.2f}" for n, r in worst.items())
    print(f"\n{dtype} on {backend}: largest err/tol {line}; {stats}")
    record_property(f"worst_err_over_tol_{dtype}", line)
    record_property(f"stats_{dtype}", str(stats))
    assert stats["inconclusive"] <= 0.15 * stats["cases"], f"too many cases too wide to judge: {stats}"
    for name in WRONG:
        applicable, caught = stats[f"{name}_applicable"], stats[f"{name}_caught"]
        floor = (APPLICABLE_GPU if backend == "gpu" else APPLICABLE)[name][dtype]
        assert applicable >= floor * stats["cases"] and caught == applicable, \
            f"{name}: caught {caught} of {applicable} cases where it moves the answer; {stats}"
