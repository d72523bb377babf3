"""Float8 casts and matmul_pow2scaled: argument errors, output names and op types."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException


def _fp8(shape, dtype=popxl.float8_143, name="x"):
    return popxl.variable(np.ones(shape, np.float32), dtype, name=name)


def _scale(value=0, dtype=popxl.int32, shape=()):
    return popxl.variable(np.full(shape, value), dtype, name="log2_scale")


@pytest.mark.parametrize("data_type", [popxl.float16, popxl.float32, popxl.int8])
def test_cast_to_fp8_needs_a_float8_data_type(data_type):
    with popxl.Ir().main_graph:
        x = popxl.variable(np.ones(3, np.float32))
        with pytest.raises(TypeError, match="data_type must be popxl.float8_143 or"):
            ops.pow2scale_cast_to_fp8(x, _scale(), data_type)


def test_cast_to_fp8_input_must_be_float16_or_float32():
    with popxl.Ir().main_graph:
        with pytest.raises(TypeError, match="input must be float16 or float32, got float8_152"):
            ops.pow2scale_cast_to_fp8(_fp8(3, popxl.float8_152), _scale(), popxl.float8_143)


@pytest.mark.parametrize(
    "fn, make_input, data_type",
    [
        (
            ops.pow2scale_cast_to_fp8,
            lambda: popxl.variable(np.ones(3, np.float32)),
            popxl.float8_143,
        ),
        (ops.pow2scale_cast_from_fp8, lambda: _fp8(3), popxl.float16),
    ],
)
def test_log2_scale_must_be_an_int32_scalar(fn, make_input, data_type):
    with popxl.Ir().main_graph:
        x = make_input()
        with pytest.raises(
            ValueError,
            match=r"^Log2 scale argument must be a scalar tensor: .* got log2_scale of shape \(1,\)",
        ):
            fn(x, _scale(shape=(1,)), data_type)
        with pytest.raises(
            TypeError, match="^Log2 scale tensor must be of type popxl.int32: .* of dtype int8"
        ):
            fn(x, _scale(dtype=popxl.int8), data_type)
        with pytest.raises(TypeError, match="`log2_scale` is not a Tensor"):
            fn(x, 2, data_type)


@pytest.mark.parametrize("data_type", [popxl.float8_143, popxl.int32, popxl.float64])
def test_cast_from_fp8_targets_float16_or_float32(data_type):
    with popxl.Ir().main_graph:
        with pytest.raises(TypeError, match="data_type must be popxl.float16 or popxl.float32"):
            ops.pow2scale_cast_from_fp8(_fp8(3), _scale(), data_type)


def test_cast_from_fp8_input_must_be_float8():
    with popxl.Ir().main_graph:
        x = popxl.variable(np.ones(3, np.float16))
        with pytest.raises(TypeError, match="the input must have a float8 dtype.*float16"):
            ops.pow2scale_cast_from_fp8(x, _scale(), popxl.float32)


def test_cast_names_and_types():
    with popxl.Ir().main_graph:
        x = popxl.variable(np.ones(3, np.float16), name="w")
        f8 = ops.pow2scale_cast_to_fp8(x, _scale(), popxl.float8_152)
        back = ops.pow2scale_cast_from_fp8(f8, _scale(), popxl.float32)
        assert (f8.name, f8.dtype, f8.shape) == ("w_float8_152", popxl.float8_152, (3,))
        assert (back.name, back.dtype) == ("w_float8_152_float32", popxl.float32)
        assert f8._producer.type == "Pow2ScaleThenCast"
        assert back._producer.type == "CastThenPow2Scale"


@pytest.mark.parametrize(
    "lhs_dtype, rhs_dtype, bad",
    [
        (popxl.float16, popxl.float8_143, "lhs"),
        (popxl.float8_152, popxl.float32, "rhs"),
    ],
)
def test_matmul_pow2scaled_operands_must_be_float8(lhs_dtype, rhs_dtype, bad):
    with popxl.Ir().main_graph:
        lhs = popxl.variable(np.ones((2, 3), np.float32), lhs_dtype)
        rhs = popxl.variable(np.ones((3, 4), np.float32), rhs_dtype)
        with pytest.raises(TypeError, match=f"{bad} must have a float8 dtype"):
            ops.matmul_pow2scaled(lhs, rhs, _scale())


def test_matmul_pow2scaled_log2_scale_checks():
    with popxl.Ir().main_graph:
        lhs, rhs = _fp8((2, 3)), _fp8((3, 4))
        with pytest.raises(ValueError, match="^Log2 scale argument must be a scalar tensor: "):
            ops.matmul_pow2scaled(lhs, rhs, _scale(shape=(2,)))
        with pytest.raises(
            TypeError, match="^Log2 scale tensor must be of type popxl.int32: .* of dtype float32"
        ):
            ops.matmul_pow2scaled(lhs, rhs, _scale(dtype=popxl.float32))


def test_matmul_pow2scaled_inner_dimensions_must_match():
    with popxl.Ir().main_graph:
        with pytest.raises(PopXLException, match="inner dimensions"):
            ops.matmul_pow2scaled(_fp8((2, 3)), _fp8((4, 4)), _scale())


def test_matmul_pow2scaled_name_type_and_dtype():
    with popxl.Ir().main_graph:
        out = ops.matmul_pow2scaled(
            _fp8((2, 3)), _fp8((3, 4), popxl.float8_152), _scale(), available_memory_proportion=0.3
        )
        assert (out.name, out.dtype, out.shape) == ("matmul_pow2scaled_out", popxl.float16, (2, 4))
        assert out._producer.type == "MatMul" and out._producer.opdef.key == "matmul_pow2scaled"
