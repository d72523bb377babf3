"""Every record of the ATen table has a numeric case, and every case passes."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch

from poptorch.aten import TABLE
from poptorch.ops import lowerings as _poptorch_lowerings  # noqa: F401 (PopTorch's own records)

from . import harness

CASE_MODULES = [
    importlib.import_module(f"{__package__}.{m.name}")
    for m in pkgutil.iter_modules(importlib.import_module(__package__).__path__)
    if m.name.startswith("cases_")
]
CASES = [c for m in CASE_MODULES for c in m.CASES]
HALF = [c for c in CASES if c.half]
GRAD = [c for c in CASES if c.grad]
# Cases checked together, one model a group (harness: a capture costs about half a second
# whatever its size, and each compilation has its own fixed cost); a failing group is checked
# case by case, naming the failing case. Groups of 32 rather than 8 took the float32 forward
# and gradient checks from 330 to 230 CPU seconds (2026-11-29, 2 workers).
# Select one case with -k NAME: a group's id joins its cases' names.
GROUP = 32


def _ids(group: tuple) -> str:
    return "+".join(c.name for c in group)


def test_every_record_has_a_case():
    covered = {op for c in CASES for op in c.ops}
    missing = sorted(str(op) for op in set(TABLE) - covered)
    assert not missing, f"ATen records without a numeric case: {missing}"


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("cases", harness.groups(CASES, GROUP), ids=_ids)
def test_forward_float32(cases):
    harness.check_forward_group(cases, torch.float32)


@pytest.mark.parametrize("cases", harness.groups(HALF, GROUP), ids=_ids)
def test_forward_float16(cases):
    harness.check_forward_group(cases, torch.float16)


@pytest.mark.parametrize("cases", harness.groups(GRAD, GROUP), ids=_ids)
def test_gradients(cases):
    harness.check_gradients_group(cases)
