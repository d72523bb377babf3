"""The registration policy of the ATen table: overload packets, declared type promotion, and
one record per op."""

from __future__ import annotations

import pytest
import torch
from torch.ops import aten

import popxl
from poptorch.aten import TABLE, registry
from poptorch.aten.registry import Promote, lowering

from . import harness


def test_a_packet_stands_for_the_overloads_it_has():
    found = registry._overloads_of(aten.remainder, ("Tensor", "Scalar", "Tensor_Scalar"))
    assert found == [aten.remainder.Tensor, aten.remainder.Scalar]
    assert registry._overloads_of(aten.relu.default, None) == [aten.relu.default]


def test_a_packet_without_the_named_overloads_is_refused():
    with pytest.raises(ValueError, match="none of the overloads"):
        registry._overloads_of(aten.relu, ("Scalar_Tensor",))


def test_packet_records_cover_each_overload():
    for overload in ("Tensor", "Scalar", "Scalar_Tensor"):
        assert getattr(aten.remainder, overload) in TABLE
    for packet in (aten.eq, aten.lt, aten.bitwise_and):
        assert packet.Tensor in TABLE and packet.Scalar in TABLE


def test_a_second_record_for_an_op_is_refused():
    with pytest.raises(ValueError, match="has two lowering records"):
        lowering(aten.relu.default)(lambda ctx, x: x)


class _Ctx:
    """A node context for ``promotion_dtype``: the node's args' fake values and output."""

    def __init__(self, args: tuple, out: torch.Tensor) -> None:
        self.node = type("Node", (), {"args": tuple(_Val(a) for a in args)})()
        self.out_dtype = registry.popxl_dtype(out.dtype)


class _Val:
    def __init__(self, value: object) -> None:
        self.meta = {"val": value}


@pytest.mark.parametrize(
    "promote, args, out, expected",
    [
        (Promote.DEFAULT, (torch.zeros(2, dtype=torch.int32), 1.5), torch.zeros(2), popxl.float32),
        (
            Promote.DEFAULT,
            (torch.zeros(2, dtype=torch.int32), torch.zeros(2)),
            torch.zeros(2),
            popxl.float32,
        ),
        (
            Promote.DEFAULT,
            (torch.zeros(2, dtype=torch.int32), 3),
            torch.zeros(2, dtype=torch.bool),
            popxl.int32,
        ),
        (
            Promote.INT_TO_FLOAT,
            (torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)),
            torch.zeros(2),
            popxl.float32,
        ),
        (
            Promote.INT_TO_FLOAT,
            (torch.zeros(2, dtype=torch.half), torch.zeros(2, dtype=torch.half)),
            torch.zeros(2, dtype=torch.half),
            popxl.float16,
        ),
    ],
)
def test_declared_promotion_gives_torchs_computation_dtype(promote, args, out, expected):
    assert registry.promotion_dtype(_Ctx(args, out), promote, (0, 1)) == expected


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: torch.sqrt(x),  # int -> float output: computed in float
        lambda x, y: torch.atan2(x, y),
        lambda x, y: x + 0.5,  # int tensor and float scalar
        lambda x, y: torch.remainder(x, 3),
        lambda x, y: x < 2.5,
        lambda x, y: x * y.float(),
    ],
    ids=["sqrt", "atan2", "add_scalar", "remainder", "lt_float_scalar", "mul_mixed"],
)
def test_promoted_records_match_torch_on_integer_inputs(fn):
    x = torch.arange(1, 7, dtype=torch.int32).reshape(2, 3)
    y = torch.arange(2, 8, dtype=torch.int32).reshape(2, 3)
    case = harness.Case("promotion", fn, lambda: (x, y), ops=(), half=False, grad=False)
    harness.check_forward(case, torch.float32)
