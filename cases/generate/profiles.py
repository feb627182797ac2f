"""The suite's hypothesis profiles, and draws from the seed alone: hypothesis only, neither torch nor Triton, so that
every pytest process loads them at once (conftest), the pytest-xdist controller included, which imports no torch.

Profiles: dev (quick, the default), ci (derandomized, bounded; the default when $CI is set), thorough (many
examples, larger shapes on the GPU). Chosen by pytest's --hypothesis-profile or by $FLASHCHECK_HYPOTHESIS_PROFILE.
"""
import contextlib
import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "FLASHCHECK_HYPOTHESIS_PROFILE"
PROFILES = ("dev", "ci", "thorough")


@contextlib.contextmanager
def seed_alone():
    """Within the block, hypothesis draws from its seed alone. Since 6.1xx it draws, one choice in twenty, among the
    literal constants of the project's modules that happen to be imported (hypothesis' _get_local_constants), so a
    derandomized search gave other cases after an unrelated import or an edited literal: CI failed a statistic of
    tests/test_tolerance.py that the same test passes alone, because the tests before it in its worker had imported
    other modules (7 inconclusive cases of 150 instead of 3). A hypothesis without that internal is left as it is."""
    try:
        from hypothesis.internal.conjecture import providers
        get, empty, cache = providers._get_local_constants, type(providers._local_constants)(), \
            providers.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError, TypeError):
        yield
        return
    cache.clear()            # the allowed constants, cached per kind of draw, include the local ones found so far
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = get
        cache.clear()


def register_profiles():
    """Register dev, ci and thorough. deadline=None throughout: the first call of a kernel compiles (GPU)
    or builds the interpreter's program (CPU), and one example runs a kernel several times."""
    # parent: hypothesis's own defaults, not whatever is loaded (with $CI set hypothesis loads its "ci" profile,
    # whose derandomize would leak into dev)
    common = dict(parent=settings.get_profile("default"), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("dev", max_examples=10, **common)
    # derandomized: every CI run tries the same examples; no database: nothing carries over between runs
    settings.register_profile("ci", max_examples=50, derandomize=True, database=None, print_blob=True,
                              **common)
    settings.register_profile("thorough", max_examples=200, print_blob=True, **common)


def default_profile():
    """$FLASHCHECK_HYPOTHESIS_PROFILE, else ci when $CI is set, else dev."""
    name = os.environ.get(PROFILE_ENV) or ("ci" if os.environ.get("CI") else "dev")
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={name!r}: expected one of {', '.join(PROFILES)}")
    return name


def load_default_profile():
    register_profiles()
    settings.load_profile(default_profile())
