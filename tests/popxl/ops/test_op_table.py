"""The op table: forward values, inference vs lowering, and coverage of the registry."""

import pytest

from popxl._op import REGISTRY

from .harness import all_cases, check_forward, check_gradients, check_inference, covered_op_keys, grad_inputs

CASES = all_cases()
# Ops whose behaviour is tested by dedicated tests rather than table cases.
TESTED_ELSEWHERE = {
    "call": "tests/popxl/test_control_flow.py",
    "repeat": "tests/popxl/test_control_flow.py",
    "conditional": "tests/popxl/test_control_flow.py",
}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_forward_matches_numpy(case):
    check_forward(case)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_inference_matches_lowering(case):
    check_inference(case)


GRAD_CASES = [c for c in CASES if grad_inputs(c)]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_gradients_match_finite_differences(case):
    check_gradients(case)


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


def test_every_registered_op_has_a_case():
    covered = covered_op_keys(CASES) | set(TESTED_ELSEWHERE)
    missing = sorted(set(REGISTRY) - covered)
    assert not missing, f"registered ops without an op-table case: {missing}"
