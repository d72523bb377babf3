"""Test environment: several fake CPU devices, warnings as errors, clean context stack."""

import os

# Must happen before JAX initialises its backends (replication tests use a device mesh).
# The tests' programs are small and compiled once each, so XLA's code generation (LLVM at
# its default level 2) was much of the suite's time: at level 1 the same HLO compiles about
# a fifth faster (the ATen table 11%, the GPT patterns and execution strategies 19%; CPU
# time, 2026-11-29) into code computing the same numbers (neither level may reorder
# floating-point arithmetic). Programs run by users and benchmarks keep XLA's default.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=1"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from popxl.context import get_current_context  # noqa: E402


@pytest.fixture(autouse=True)
def _context_stack_is_left_empty():
    """Fail a test that leaves a graph, name scope or other context block open."""
    assert get_current_context().is_empty(), "context stack not empty before the test"
    yield
    ctx = get_current_context()
    if not ctx.is_empty():
        leftover = (ctx.graphs, ctx.name_scopes, ctx.ipu_stack, ctx.in_sequence_stack)
        ctx.__init__()
        pytest.fail(f"test left the context stack non-empty: {leftover}")


@pytest.fixture
def rng():
    """A seeded NumPy generator."""
    return np.random.default_rng(0)
