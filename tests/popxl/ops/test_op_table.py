"""The op table: forward values, inference vs lowering, and coverage of the registry."""

from pathlib import Path

import pytest

import popxl_addons.ops.cross_entropy_sharded_loss
import popxl_addons.ops.cross_entropy_sharded_wr_loss
import popxl_addons.ops.fp8_mse_scale
import popxl_addons.ops.grad_reduce_square_add
import popxl_addons.ops.group_quantize_decompress
import popxl_addons.ops.layer_norm_distributed
import popxl_addons.ops.linear_layout
import popxl_addons.ops.replicated_all_reduce_TP
import popxl_addons.ops.replicated_strided_collectives
import popxl_addons.ops.rotary_pos_embed
import popxl_addons.ops.static_sparse_ops  # noqa: F401  (the registry holds every custom op)
from popxl._op import REGISTRY

from .harness import (
    all_cases,
    as_float16,
    check_forward_group,
    check_gradients_group,
    check_inference,
    covered_op_keys,
    grad_inputs,
    group_id,
    groups,
)

CASES = all_cases()
# Cases checked together, one program a group (each program costs a session and a
# compilation whatever its size); a failing group is checked case by case, naming the
# failing case. Select one case with -k NAME: a group's id joins its cases' names.
GROUP = 16
# Ops whose behaviour is tested by dedicated tests rather than table cases.
COLLECTIVES_TESTS = "tests/popxl/ops/test_collectives.py"
REMOTE_TESTS = "tests/popxl/test_remote.py"
CUSTOM_OPS_TESTS = "tests/popxl_addons/test_custom_ops.py"
TESTED_ELSEWHERE = {
    **{
        key: CUSTOM_OPS_TESTS
        for key in (
            "cross_entropy_sharded",
            "cross_entropy_sharded_wr",
            "dense_sparse_matmul",
            "fp8_mse_scale",
            "grad_reduce_square_add",
            "group_quantize_decompress",
            "layer_norm_distributed",
            "linear_layout",
            "replicated_all_gather_strided",
            "replicated_all_reduce_TP",
            "replicated_all_reduce_strided",
            "replicated_reduce_scatter_strided",
            "rotary_pos_embed",
        )
    },
    "call": "tests/popxl/test_call.py",
    "repeat": "tests/popxl/test_repeat.py",
    "conditional": "tests/popxl/test_conditional.py",
    "replicated_all_reduce": COLLECTIVES_TESTS,
    "replicated_all_reduce_": COLLECTIVES_TESTS,
    "replicated_all_gather": COLLECTIVES_TESTS,
    "replicated_slice": COLLECTIVES_TESTS,
    "replicated_reduce_scatter": COLLECTIVES_TESTS,
    "replica_sharded_slice": COLLECTIVES_TESTS,
    "all_reduce": COLLECTIVES_TESTS,
    "all_reduce_identical_inputs": COLLECTIVES_TESTS,
    "all_reduce_identical_grad_inputs": COLLECTIVES_TESTS,
    "remote_load": REMOTE_TESTS,
    "remote_load_": REMOTE_TESTS,
    "remote_store": REMOTE_TESTS,
}


FORWARD_GROUPS = groups(CASES, GROUP)


@pytest.mark.parametrize("cases", FORWARD_GROUPS, ids=[group_id(g) for g in FORWARD_GROUPS])
def test_forward_matches_numpy(cases):
    check_forward_group(cases)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_inference_matches_lowering(case):
    check_inference(case)


GRAD_CASES = [c for c in CASES if grad_inputs(c)]


GRAD_GROUPS = groups(GRAD_CASES, GROUP)


@pytest.mark.parametrize("cases", GRAD_GROUPS, ids=[group_id(g) for g in GRAD_GROUPS])
def test_gradients_match_finite_differences(cases):
    check_gradients_group(cases)


FP16_GRAD_CASES = [c16 for c in GRAD_CASES if (c16 := as_float16(c)) is not None]
FP16_GROUPS = groups(FP16_GRAD_CASES, GROUP)


@pytest.mark.parametrize("cases", FP16_GROUPS, ids=[group_id(g) for g in FP16_GROUPS])
def test_float16_gradients_match_finite_differences(cases):
    check_gradients_group(cases)


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


def test_every_registered_op_has_a_case():
    covered = covered_op_keys(CASES) | set(TESTED_ELSEWHERE)
    # Op kinds with a namespace are registered at run time by front ends in the same process:
    # custom ops (``custom::``, tests/popxl/test_custom_ops.py) and PopTorch's ATen records
    # (``aten::``, ``poptorch::``, tests/poptorch/aten).
    builtin = {k for k in REGISTRY if "::" not in k}
    missing = sorted(builtin - covered)
    assert not missing, f"registered ops without an op-table case: {missing}"


def test_every_registered_op_tested_elsewhere_names_an_existing_test_file():
    root = Path(__file__).resolve().parents[3]
    absent = {k: f for k, f in TESTED_ELSEWHERE.items() if not (root / f).is_file()}
    assert not absent, f"TESTED_ELSEWHERE names missing files: {absent}"
    assert set(TESTED_ELSEWHERE) <= set(REGISTRY)
