"""The oracle: judge one run (one case given to one kernel) and name what went wrong.

    layers.py      the layers (reference, hand values, poison, guards) and the verdict of one run
    tolerance.py   the reference answer and the per-element tolerance a correct kernel is held to
    kinds.py       the failure vocabulary (Kind) and the one classifier of exceptions and process deaths
    verdict.py     Verdict, Failure, Capabilities and the outcomes besides pass and fail

Everything a caller needs is importable from here: `from flashcheck.cases import oracle; oracle.judge(...)`.
"""
from flashcheck.cases import inputs as inp  # noqa: F401  (tests reach the case's values through here)
from flashcheck.cases.oracle.kinds import (  # noqa: F401
    Kind, Unsupported, classify_death, classify_escaped, classify_exception, is_out_of_memory)
from flashcheck.cases.oracle.layers import (  # noqa: F401
                                           Call,
                                           Conventions,
                                           call_kernel,
                                           compare,
                                           expectation,
                                           judge,
                                           lse_failure,
                                           protocol_kwargs,
                                           where_raised,
)
from flashcheck.cases.oracle.verdict import (Capabilities, Failure, Outcome, RunFailed, Verdict, as_declared,  # noqa: F401
                                              showing_keywords)
