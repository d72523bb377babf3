"""Op-table cases: elementwise arithmetic, math, activations, logic."""

import math

import numpy as np

import popxl
import popxl.ops as ops

from .harness import OpCase, f32, i32

_erf = np.vectorize(math.erf)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


X = f32(3, 4, seed=1)
POS = f32(3, 4, seed=2, low=0.1, high=3.0)
Y = f32(4, seed=3)
ROW = f32(3, 1, seed=4)

UNARY = [
    ("exp", ops.exp, np.exp, X),
    ("log", ops.log, np.log, POS),
    ("log2", ops.log2, np.log2, POS),
    ("sqrt", ops.sqrt, np.sqrt, POS),
    ("sin", ops.sin, np.sin, X),
    ("cos", ops.cos, np.cos, X),
    ("tanh", ops.tanh, np.tanh, X),
    ("negate", ops.negate, np.negative, X),
    ("abs", ops.abs, np.abs, X),
    ("relu", ops.relu, lambda x: np.maximum(x, 0), X),
    ("gelu", ops.gelu, _gelu_tanh, X),
    ("geluerf", ops.geluerf, lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), X),
    ("swish", ops.swish, lambda x: x * _sigmoid(x), X),
    ("sigmoid", ops.sigmoid, _sigmoid, X),
]
INPLACE_UNARY = [
    ("exp_", ops.exp_, np.exp),
    ("relu_", ops.relu_, lambda x: np.maximum(x, 0)),
    ("gelu_", ops.gelu_, _gelu_tanh),
    ("geluerf_", ops.geluerf_, lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    ("swish_", ops.swish_, lambda x: x * _sigmoid(x)),
    ("sigmoid_", ops.sigmoid_, _sigmoid),
]


def _cast_ref(dtype):
    return lambda *xs: tuple(np.asarray(v).astype(dtype) for v in xs)


def _inplace_case(name, fn, ref):
    # The in-place result must be visible through both the input and the returned handle.
    def build(x):
        out = fn(x)
        return out, x

    return OpCase(name, build, [X], lambda x: (ref(x).astype(np.float32),) * 2, atol=1e-5)


CASES = [
    *[
        OpCase(n, fn, [x], lambda a, r=ref: r(a).astype(np.float32), atol=1e-5)
        for n, fn, ref, x in UNARY
    ],
    *[_inplace_case(n, fn, ref) for n, fn, ref in INPLACE_UNARY],
    OpCase("floor", ops.floor, [X], np.floor, grad=False),
    OpCase("ceil", ops.ceil, [X], np.ceil, grad=False),
    OpCase(
        "sign",
        ops.sign,
        [np.array([-2.0, 0.0, 3.0, np.nan], np.float32)],
        lambda x: np.nan_to_num(np.sign(x)),
        grad=False,
    ),
    OpCase("add_broadcast", ops.add, [X, Y], np.add),
    OpCase("sub_broadcast", ops.sub, [X, ROW], np.subtract),
    OpCase("mul_broadcast", ops.mul, [X, Y], np.multiply),
    OpCase(
        "mul_fp16_by_fp32_scalar",
        ops.mul,
        [X.astype(np.float16), np.array(0.5, np.float32)],
        lambda a, b: (a * np.float16(b)).astype(np.float16),
        rtol=1e-3,
        grad=False,
    ),
    # PopART's exception covers a float32 with one element of any rank.
    OpCase(
        "mul_fp32_one_element_by_fp16",
        ops.mul,
        [np.array([[2.5]], np.float32), X.astype(np.float16)],
        lambda a, b: (np.float16(a) * b).astype(np.float16),
        rtol=1e-3,
        grad=False,
    ),
    OpCase("div", ops.div, [X, POS], np.divide),
    OpCase(
        "div_int_truncates",
        ops.div,
        [np.array([7, -7, 5], np.int32), np.array([2, 2, -3], np.int32)],
        lambda a, b: np.trunc(a / b).astype(np.int32),
        grad=False,
    ),
    OpCase(  # found by tests/differential: integer division of broadcast operands
        "div_int_broadcasts",
        ops.div,
        [np.array([[7, -7, 5], [9, 3, -4]], np.int32), np.array([2, 2, -3], np.int32)],
        lambda a, b: np.trunc(a / b).astype(np.int32),
        grad=False,
    ),
    OpCase("fmod", ops.fmod, [X * 3, POS], np.fmod, grad=False),
    OpCase("pow", ops.pow, [POS, X], np.power),
    OpCase("pow_scalar_exponent", lambda t: t**2, [X], lambda a: a**2),
    OpCase("add_inplace", lambda a, b: (ops.add_(a, b), a), [X, Y], lambda a, b: (a + b, a + b)),
    OpCase("iadd_returns_same_tensor", lambda a, b: _iadd(a, b), [X, Y], lambda a, b: a + b),
    OpCase(
        "scalar_dunders",
        lambda a: (a + 1, 2 - a, a * 3, a / 4, -a),
        [X],
        lambda a: (a + 1, 2 - a, a * 3, a / 4, -a),
    ),
    OpCase("equal", ops.equal, [i32(6, seed=1), i32(6, seed=2)], np.equal, grad=False),
    OpCase("greater", ops.greater, [X, Y], np.greater, grad=False),
    OpCase(
        "logical_and_casts",
        ops.logical_and,
        [i32(6, seed=1), np.array([True, False] * 3)],
        lambda a, b: np.logical_and(a != 0, b),
        grad=False,
    ),
    OpCase(
        "logical_or",
        ops.logical_or,
        [np.array([True, False, False]), np.array([True, True, False])],
        np.logical_or,
        grad=False,
    ),
    OpCase("logical_not", ops.logical_not, [np.array([True, False])], np.logical_not, grad=False),
    OpCase(
        "tensor_bitwise_dunders",
        lambda a, b: (a & b, a | b, ~a),
        [np.array([True, False, True]), np.array([False, False, True])],
        lambda a, b: (a & b, a | b, ~a),
        grad=False,
    ),
    OpCase("where", ops.where, [np.array([[True], [False], [True]]), X, Y], np.where, grad=[1, 2]),
    OpCase("isnan", ops.isnan, [np.array([1.0, np.nan, np.inf], np.float32)], np.isnan, grad=False),
    OpCase(
        "isinf", ops.isinf, [np.array([1.0, np.nan, -np.inf], np.float32)], np.isinf, grad=False
    ),
    OpCase(
        "isfinite",
        ops.isfinite,
        [np.array([1.0, np.nan, -np.inf], np.float32)],
        np.isfinite,
        grad=False,
    ),
    OpCase("identity", ops.identity, [X], lambda a: a),
    OpCase("detach", ops.detach, [X], lambda a: a, grad=False),
    OpCase("detach_", lambda a: (ops.detach_(a), a), [X], lambda a: (a, a), grad=False),
    OpCase(
        "maximum",
        lambda a, b, c: ops.maximum(a, b, c),
        [X, Y, ROW],
        lambda a, b, c: np.maximum(np.maximum(a, b), c),
    ),
    OpCase("clip", lambda a: ops.clip(a, -0.5, 1.0), [X], lambda a: np.clip(a, -0.5, 1.0)),
    OpCase("clip_one_sided", lambda a: ops.clip(a, min=0.0), [X], lambda a: np.maximum(a, 0)),
    OpCase(
        "increment_mod",
        lambda a: ops.increment_mod(a, 1.5, 2.0),
        [POS],
        lambda a: np.fmod(a + 1.5, 2.0),
        grad=False,
    ),
    OpCase(
        "increment_mod_",
        lambda a: (ops.increment_mod_(a, 3, 4), a),
        [i32(5, low=0, high=8)],
        lambda a: (np.fmod(a + 3, 4),) * 2,
        grad=False,
    ),
    OpCase(
        "scaled_add",
        lambda a, b: ops.scaled_add(a, b, 0.5, -2.0),
        [X, X * 2],
        lambda a, b: 0.5 * a - 2 * b,
    ),
    OpCase(
        "scaled_add_tensor_factors",
        lambda a, b, s: ops.scaled_add(a, b, s, s),
        [X, X * 2, np.array(0.3, np.float32)],
        lambda a, b, s: s * a + s * b,
        grad=[0, 1],
    ),
    OpCase(
        "scaled_add_mixed_precision",
        lambda a, b: ops.scaled_add(a, b, b=0.1),
        [X, X.astype(np.float16)],
        lambda a, b: a + np.float32(0.1) * b.astype(np.float32),
        rtol=1e-3,
        grad=False,
    ),
    OpCase(
        "scaled_add_",
        lambda a, b: (ops.scaled_add_(a, b, b=-0.1), a),
        [X, Y.reshape(1, 4).repeat(3, 0)],
        lambda a, b: (a - 0.1 * b,) * 2,
    ),
]


def _iadd(a, b):
    before = a
    a += b
    assert a is before
    return a


del popxl
