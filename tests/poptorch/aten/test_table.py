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


def test_every_record_has_a_case():
    covered = {op for c in CASES for op in c.ops}
    missing = sorted(str(op) for op in set(TABLE) - covered)
    assert not missing, f"ATen records without a numeric case: {missing}"


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_forward_float32(case):
    harness.check_forward(case, torch.float32)


@pytest.mark.parametrize("case", HALF, ids=repr)
def test_forward_float16(case):
    harness.check_forward(case, torch.float16)


@pytest.mark.parametrize("case", GRAD, ids=repr)
def test_gradients(case):
    harness.check_gradients(case)
