"""Backend choice before Triton is imported, and per-worker GPU pinning.

FLASHCHECK_BACKEND=cpu|gpu forces a backend; otherwise CUDA when a GPU is visible, else Triton's
interpreter on the CPU (TRITON_INTERPRET=1). Under pytest-xdist, worker n uses GPU n mod count.
"""
from cases.backend import select_backend

BACKEND = select_backend()

import pytest  # noqa: E402


def pytest_report_header(config):
    from cases.backend import describe

    return f"flashcheck backend: {describe()}"


@pytest.fixture(scope="session")
def backend():
    return BACKEND


@pytest.fixture(scope="session")
def device():
    return "cuda" if BACKEND == "gpu" else "cpu"


def pytest_collection_modifyitems(config, items):
    if BACKEND == "gpu":
        return
    skip = pytest.mark.skip(reason="GPU only: needs the compiled backend (running on Triton's CPU interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

