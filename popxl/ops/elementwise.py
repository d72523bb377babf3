"""Elementwise ops: arithmetic, math, activations, comparisons and logic.

The op kinds are generated from two tables. Binary ops broadcast like NumPy and require
equal dtypes (PopXL never promotes); the only exception is ``mul`` of a float16 tensor by a
float32 scalar. In-place variants (``add_``, ``relu_``...) write their result into the
first input and return a new handle on the same storage.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .. import dtypes
from .._op import OpDef, core_error, define, define_inplace
from ..tensor import Tensor
from ._base import broadcast_shapes, jax, jnp, lax, record, same_dtype, spec

# Inference ------------------------------------------------------------------------------


def _same_as_input(t: Any, **_: Any) -> list:
    return [t]


def _bool_like(t: Any, **_: Any) -> list:
    return [spec(t.shape, dtypes.bool)]


def _binary_infer(type_name: str, out_dtype: dtypes.dtype | None = None) -> Any:
    def infer(a: Any, b: Any, **_: Any) -> list:
        shape = broadcast_shapes(a.shape, b.shape)
        if type_name == "Mul" and _fp16_times_fp32_scalar(a, b):
            return [spec(shape, dtypes.float16)]
        dt = same_dtype(type_name, a, b)
        return [spec(shape, out_dtype or dt)]

    return infer


def _fp16_times_fp32_scalar(a: Any, b: Any) -> bool:
    """PopART's Mul exception: a float32 operand with one element (any rank) scales float16."""
    pair = {a.dtype, b.dtype}
    scalar = b if b.dtype is dtypes.float32 else a
    return pair == {dtypes.float16, dtypes.float32} and math.prod(scalar.shape) == 1


# Lowerings ------------------------------------------------------------------------------


def _div(x: Any, y: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.integer):
        # lax.div truncates toward zero, like the IPU's integer divide, but does not broadcast
        return lax.div(*jnp.broadcast_arrays(x, y))
    return x / y


def _sign(x: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.where(jnp.isnan(x), jnp.zeros_like(x), jnp.sign(x))
    return jnp.sign(x)


@functools.cache
def _abs_with_sign_derivative() -> Any:
    # Built on first use: popxl imports JAX lazily.
    @jax.custom_jvp
    def abs_(x: Any) -> Any:
        return jnp.abs(x)

    @abs_.defjvp
    def _jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
        (x,), (dx,) = primals, tangents
        return jnp.abs(x), jnp.sign(x) * dx

    return abs_


def jax_abs(x: Any) -> Any:
    """``jnp.abs`` with derivative ``sign(x)``: 0 at 0, as PopART's AbsGrad and torch's
    (JAX's own abs has 1 there). The ATen lowerings of torch use it too."""
    return _abs_with_sign_derivative()(x)


def _gelu_tanh(x: Any) -> Any:
    """GELU's tanh form as ``x * (tanh((x + x³·0.044715) · √(2/π)) + 1) * 0.5``.

    The value is jax.nn.gelu's up to rounding; this order of operations is the one whose
    gradient XLA:CPU rounds the same way in every program tried, so a model and its
    batch-serialised copy agree to the last bit (jax.nn.gelu's order did not, a few ulps).
    """
    c0, c1 = jnp.asarray(0.044715, x.dtype), jnp.asarray(np.sqrt(2 / np.pi), x.dtype)
    return x * (jnp.tanh((x + x * x * x * c0) * c1) + 1) * jnp.asarray(0.5, x.dtype)


def _mul(x: Any, y: Any) -> Any:
    if x.dtype != y.dtype:
        return (x.astype(jnp.float32) * y.astype(jnp.float32)).astype(jnp.float16)
    return x * y


# name: (type, lowering, in-place type or None)
UNARY: dict[str, tuple[str, Any, str | None]] = {
    "exp": ("Exp", lambda x: jnp.exp(x), "ExpInplace"),
    "log": ("Log", lambda x: jnp.log(x), None),
    "sqrt": ("Sqrt", lambda x: jnp.sqrt(x), None),
    "sin": ("Sin", lambda x: jnp.sin(x), None),
    "cos": ("Cos", lambda x: jnp.cos(x), None),
    "tanh": ("Tanh", lambda x: jnp.tanh(x), None),
    "floor": ("Floor", lambda x: jnp.floor(x), None),
    "ceil": ("Ceil", lambda x: jnp.ceil(x), None),
    "sign": ("Sign", _sign, None),
    "negate": ("Neg", lambda x: -x, None),
    "abs": ("Abs", jax_abs, None),
    # where (not maximum): the gradient at exactly 0 is 0, as PopART's and torch's are.
    "relu": ("Relu", lambda x: jnp.where(x > 0, x, jnp.zeros_like(x)), "ReluInplace"),
    "gelu": ("Gelu", _gelu_tanh, "GeluInplace"),
    "geluerf": ("GeluErf", lambda x: jax.nn.gelu(x, approximate=False), "GeluErfInplace"),
    "swish": ("Swish", lambda x: x * jax.nn.sigmoid(x), "SwishInplace"),
    "sigmoid": ("Sigmoid", lambda x: jax.nn.sigmoid(x), "SigmoidInplace"),
}

# name: (type, lowering, output dtype (None: same as inputs), in-place type or None)
BINARY: dict[str, tuple[str, Any, dtypes.dtype | None, str | None]] = {
    "add": ("Add", lambda x, y: x + y, None, "AddLhsInplace"),
    "sub": ("Sub", lambda x, y: x - y, None, None),
    "mul": ("Mul", _mul, None, None),
    "div": ("Div", _div, None, None),
    "fmod": ("Fmod", lambda x, y: jnp.fmod(x, y), None, None),
    "pow": ("Pow", lambda x, y: jnp.power(x, y), None, None),
    "equal": ("Equal", lambda x, y: x == y, dtypes.bool, None),
    "greater": ("Greater", lambda x, y: x > y, dtypes.bool, None),
    "logical_and": ("And", lambda x, y: jnp.logical_and(x, y), dtypes.bool, None),
    "logical_or": ("Or", lambda x, y: jnp.logical_or(x, y), dtypes.bool, None),
}

OPS: dict[str, OpDef] = {}
LINEAR = {"add", "sub", "negate", "identity"}  # gradients need no forward values
# Gradients from the output and its cotangent (see ``OpDef.grad_from_output``).
FROM_OUTPUT = {
    "relu": lambda y, dy: jnp.where(y > 0, dy, jnp.zeros_like(dy)),
    "exp": lambda y, dy: y * dy,
    "tanh": lambda y, dy: (1 - y * y) * dy,
    "sigmoid": lambda y, dy: y * (1 - y) * dy,
}
for _name, (_type, _lower, _inplace) in UNARY.items():
    _needs = "none" if _name in LINEAR else "inputs"
    OPS[_name] = define(
        _name,
        _type,
        _same_as_input,
        _lower,
        grad_needs=_needs,
        grad_from_output=FROM_OUTPUT.get(_name),
    )
    if _inplace:
        OPS[_name + "_"] = define_inplace(OPS[_name], _name + "_", _inplace)
PRODUCTS = {"mul"}  # each operand's gradient needs only the other's value
for _name, (_type, _lower, _out, _inplace) in BINARY.items():
    _needs = "none" if _name in LINEAR else "others" if _name in PRODUCTS else "inputs"
    OPS[_name] = define(_name, _type, _binary_infer(_type, _out), _lower, grad_needs=_needs)
    if _inplace:
        OPS[_name + "_"] = define_inplace(OPS[_name], _name + "_", _inplace)

OPS["logical_not"] = define("logical_not", "Not", _bool_like, lambda x: jnp.logical_not(x))
OPS["isnan"] = define("isnan", "IsNaN", _bool_like, lambda x: jnp.isnan(x), grad="none")
OPS["isinf"] = define("isinf", "IsInf", _bool_like, lambda x: jnp.isinf(x), grad="none")
OPS["identity"] = define("identity", "Identity", _same_as_input, lambda x: x, grad_needs="none")
OPS["detach"] = define("detach", "Detach", _same_as_input, lambda x: x, grad="none")
OPS["detach_"] = define_inplace(OPS["detach"], "detach_", "DetachInplace")


def _maximum_infer(*specs: Any) -> list:
    shape = broadcast_shapes(*(s.shape for s in specs))
    return [spec(shape, same_dtype("Max", *specs))]


def _maximum(*xs: Any) -> Any:
    out = xs[0]
    for x in xs[1:]:
        out = jnp.maximum(out, x)
    return out


OPS["maximum"] = define("maximum", "Max", _maximum_infer, _maximum)


def _clip(x: Any, *, min: float, max: float) -> Any:  # noqa: A002 (attribute names)
    return jnp.clip(x, jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype))


OPS["clip"] = define("clip", "Clip", _same_as_input, _clip)


def _increment_mod(x: Any, *, increment: float, modulus: float) -> Any:
    return jnp.fmod(x + jnp.asarray(increment, x.dtype), jnp.asarray(modulus, x.dtype))


OPS["increment_mod"] = define("increment_mod", "IncrementMod", _same_as_input, _increment_mod)
OPS["increment_mod_"] = define_inplace(
    OPS["increment_mod"], "increment_mod_", "IncrementModInplace"
)


def _scaled_add_infer(x: Any, y: Any, *scales: Any, **_: Any) -> list:
    if x.shape != y.shape:
        raise core_error(
            f"scaled_add does not broadcast: X has shape {x.shape} and Y has shape {y.shape}."
        )
    for s in scales:
        if s.shape not in ((), (1,)):
            raise ValueError(
                f"scaled_add factors must be scalars, got a tensor of shape {s.shape}."
            )
    return [x]


def _scaled_add(x: Any, y: Any, *scales: Any, a: float | None, b: float | None) -> Any:
    factors = list(scales)
    fa = factors.pop(0).reshape(()) if a is None else a
    fb = factors.pop(0).reshape(()) if b is None else b
    compute = jnp.promote_types(x.dtype, y.dtype)
    return (fa * x.astype(compute) + fb * y.astype(compute)).astype(x.dtype)


OPS["scaled_add"] = define("scaled_add", "ScaledAdd", _scaled_add_infer, _scaled_add)
OPS["scaled_add_"] = define_inplace(OPS["scaled_add"], "scaled_add_", "ScaledAddLhsInplace")


# Public functions ------------------------------------------------------------------------


def _unary(name: str, t: Tensor, out: str | None = None) -> Tensor:
    return record(OPS[name], {"t": t}, names=[out or f"{name}_out"])[0]


def _binary(
    name: str, lhs: Tensor, rhs: Tensor, out: str, names: tuple[str, str] = ("lhs", "rhs")
) -> Tensor:
    return record(OPS[name], {names[0]: lhs, names[1]: rhs}, names=[out])[0]


def exp(t: Tensor) -> Tensor:
    """Elementwise e^t."""
    return _unary("exp", t)


def exp_(t: Tensor) -> Tensor:
    """In-place ``exp``: writes into ``t`` and returns a handle on the same storage."""
    return _unary("exp_", t, "exp_inplace_out")


def log(t: Tensor) -> Tensor:
    """Elementwise natural logarithm."""
    return _unary("log", t)


def log2(t: Tensor) -> Tensor:
    """Elementwise base-2 logarithm, computed as ``log(t) / log(2)``."""
    return div(log(t), log(t._ensure_tensor(2)))


def sqrt(t: Tensor) -> Tensor:
    """Elementwise square root (NaN for negative inputs)."""
    return _unary("sqrt", t)


def sin(t: Tensor) -> Tensor:
    """Elementwise sine."""
    return _unary("sin", t)


def cos(t: Tensor) -> Tensor:
    """Elementwise cosine."""
    return _unary("cos", t)


def tanh(t: Tensor) -> Tensor:
    """Elementwise hyperbolic tangent."""
    return _unary("tanh", t)


def floor(t: Tensor) -> Tensor:
    """Elementwise floor (NaN propagates)."""
    return _unary("floor", t)


def ceil(t: Tensor) -> Tensor:
    """Elementwise ceiling (NaN propagates)."""
    return _unary("ceil", t)


def sign(t: Tensor) -> Tensor:
    """Elementwise sign: -1, 0 or 1; NaN gives 0."""
    return _unary("sign", t)


def negate(t: Tensor) -> Tensor:
    """Elementwise ``-t``."""
    return _unary("negate", t)


def abs(t: Tensor) -> Tensor:  # noqa: A001 (public API name)
    """Elementwise absolute value."""
    return _unary("abs", t)


def relu(t: Tensor) -> Tensor:
    """Elementwise ``max(t, 0)``."""
    return _unary("relu", t)


def relu_(t: Tensor) -> Tensor:
    """In-place ``relu``."""
    return _unary("relu_", t, "relu_inplace_out")


def gelu(t: Tensor) -> Tensor:
    """GELU with the tanh approximation (as PopLibs' GELU).

    See also: ``geluerf`` for the exact erf form; ``jax.nn.gelu(approximate=True)``.
    """
    return _unary("gelu", t)


def gelu_(t: Tensor) -> Tensor:
    """In-place ``gelu``."""
    return _unary("gelu_", t, "gelu_inplace_out")


def geluerf(t: Tensor) -> Tensor:
    """Exact GELU: ``t * Phi(t)`` with the normal CDF computed through erf."""
    return _unary("geluerf", t)


def geluerf_(t: Tensor) -> Tensor:
    """In-place ``geluerf``."""
    return _unary("geluerf_", t, "geluerf_inplace_out")


def swish(t: Tensor) -> Tensor:
    """Swish (SiLU): ``t * sigmoid(t)``."""
    return _unary("swish", t)


def swish_(t: Tensor) -> Tensor:
    """In-place ``swish``."""
    return _unary("swish_", t, "swish_inplace_out")


def sigmoid(t: Tensor) -> Tensor:
    """Logistic sigmoid ``1 / (1 + exp(-t))`` (an addition: the original had none)."""
    return _unary("sigmoid", t)


def sigmoid_(t: Tensor) -> Tensor:
    """In-place ``sigmoid``."""
    return _unary("sigmoid_", t, "sigmoid_inplace_out")


def isnan(t: Tensor) -> Tensor:
    """Elementwise NaN test (bool output)."""
    return _unary("isnan", t)


def isinf(t: Tensor) -> Tensor:
    """Elementwise infinity test (bool output)."""
    return _unary("isinf", t)


def isfinite(t: Tensor) -> Tensor:
    """Elementwise ``not (isnan or isinf)`` (bool output)."""
    return identity(logical_not(logical_or(isnan(t), isinf(t))), "isfinite_out")


def identity(t: Tensor, output_name: str | None = None) -> Tensor:
    """A copy of ``t`` named ``output_name`` (default ``identity_<t.name>``)."""
    return _unary("identity", t, output_name or f"identity_{t.name}")


rename = identity


def detach(t: Tensor) -> Tensor:
    """A copy of ``t`` through which no gradient flows."""
    return _unary("detach", t)


def detach_(t: Tensor) -> Tensor:
    """In-place ``detach``: no copy; from here on ``t`` carries no gradient.

    The returned handle shares ``t``'s storage. Uses of ``t`` (or of the handle) after this
    op pass no gradient back to what ``t`` was computed from; uses before it still do.
    See also ``torch.Tensor.detach_``.
    """
    return _unary("detach_", t, "detach_out")


def add(lhs: Tensor, rhs: Tensor) -> Tensor:
    """``lhs + rhs`` with NumPy broadcasting; dtypes must match."""
    return _binary("add", lhs, rhs, "add_out")


def add_(lhs: Tensor, rhs: Tensor) -> Tensor:
    """In-place ``lhs += rhs``; the broadcast shape must be ``lhs.shape``."""
    if broadcast_shapes(lhs.shape, rhs.shape) != lhs.shape:
        raise core_error(
            f"add_ writes into lhs of shape {lhs.shape}, but broadcasting with rhs "
            f"{rhs.shape} gives {broadcast_shapes(lhs.shape, rhs.shape)}."
        )
    return _binary("add_", lhs, rhs, "add_lhs_inplace_out")


def sub(lhs: Tensor, rhs: Tensor) -> Tensor:
    """``lhs - rhs`` with broadcasting."""
    return _binary("sub", lhs, rhs, "sub_out")


def mul(lhs: Tensor, rhs: Tensor) -> Tensor:
    """``lhs * rhs`` with broadcasting (a float16 tensor may be scaled by a float32 scalar)."""
    return _binary("mul", lhs, rhs, "mul_out")


def div(lhs: Tensor, rhs: Tensor) -> Tensor:
    """``lhs / rhs``; the output keeps the input dtype (integer division truncates)."""
    return _binary("div", lhs, rhs, "div_out")


def fmod(lhs: Tensor, rhs: Tensor) -> Tensor:
    """C-style remainder: the result has the sign of ``lhs`` (``np.fmod``)."""
    return _binary("fmod", lhs, rhs, "fmod_out")


def pow(t: Tensor, e: Any) -> Tensor:  # noqa: A001 (public API name)
    """``t ** e``.

    Deliberate difference: a Python number ``e`` becomes a constant of ``t``'s dtype (the
    original inferred int32 for ints, so ``float_tensor ** 2`` failed).
    """
    return _binary("pow", t, t._ensure_tensor(e), "pow_out", ("t", "e"))


def equal(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise ``lhs == rhs`` (bool output)."""
    return _binary("equal", lhs, rhs, "equal_out")


def greater(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002 (public API name)
    """Elementwise ``input > other`` (bool output)."""
    return _binary("greater", input, other, "greater_out", ("input", "other"))


def _as_bool(t: Tensor) -> Tensor:
    from .shape import cast  # noqa: PLC0415 (shape imports elementwise)

    return t if t.dtype is dtypes.bool else cast(t, dtypes.bool)


def logical_and(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise AND; inputs are cast to bool first."""
    return _binary("logical_and", _as_bool(lhs), _as_bool(rhs), "and_out")


def logical_or(lhs: Tensor, rhs: Tensor) -> Tensor:
    """Elementwise OR; inputs are cast to bool first."""
    return _binary("logical_or", _as_bool(lhs), _as_bool(rhs), "or_out")


def logical_not(t: Tensor) -> Tensor:
    """Elementwise NOT; the input is cast to bool first."""
    return record(OPS["logical_not"], {"t": _as_bool(t)}, names=["not_out"])[0]


def maximum(*ts: Tensor) -> Tensor:
    """Elementwise maximum of any number of tensors (broadcasting)."""
    return record(OPS["maximum"], {f"t{i}": t for i, t in enumerate(ts)}, names=["maximum_out"])[0]


def clip(t: Tensor, min: float = float("-inf"), max: float = float("inf")) -> Tensor:  # noqa: A002
    """Clamp ``t`` to ``[min, max]``; NaN propagates."""
    return record(OPS["clip"], {"t": t}, {"min": float(min), "max": float(max)}, ["clip_out"])[0]


clamp = clip


def increment_mod(t: Tensor, increment: float, modulus: float) -> Tensor:
    """``(t + increment) % modulus``."""
    attrs = {"increment": float(increment), "modulus": float(modulus)}
    return record(OPS["increment_mod"], {"t": t}, attrs, ["increment_mod_out"])[0]


def increment_mod_(t: Tensor, increment: float, modulus: float) -> Tensor:
    """In-place ``increment_mod``."""
    attrs = {"increment": float(increment), "modulus": float(modulus)}
    return record(OPS["increment_mod_"], {"t": t}, attrs, ["increment_mod_inplace_out"])[0]


def _scaled_add_inputs(X: Tensor, Y: Tensor, a: Any, b: Any) -> tuple[dict, dict]:
    inputs = {"X": X, "Y": Y}
    attrs: dict[str, Any] = {"a": None, "b": None}
    for key, value in (("a", a), ("b", b)):
        if isinstance(value, Tensor):
            inputs[key] = value
        else:
            attrs[key] = float(value)
    return inputs, attrs


def scaled_add(X: Tensor, Y: Tensor, a: float | Tensor = 1.0, b: float | Tensor = 1.0) -> Tensor:  # noqa: N803
    """``a * X + b * Y`` without broadcasting; X and Y may differ in dtype (output: X's)."""
    inputs, attrs = _scaled_add_inputs(X, Y, a, b)
    return record(OPS["scaled_add"], inputs, attrs, ["scaled_add_out"])[0]


def scaled_add_(X: Tensor, Y: Tensor, a: float | Tensor = 1.0, b: float | Tensor = 1.0) -> Tensor:  # noqa: N803
    """In-place ``X = a * X + b * Y``."""
    inputs, attrs = _scaled_add_inputs(X, Y, a, b)
    return record(OPS["scaled_add_"], inputs, attrs, [f"scaled_add__{X.name}"])[0]


def _where_infer(c: Any, a: Any, b: Any) -> list:
    shape = broadcast_shapes(c.shape, a.shape, b.shape)
    return [spec(shape, same_dtype("Where", a, b))]


OPS["where"] = define(
    "where", "Where", _where_infer, lambda c, x, y: jnp.where(c, x, y), nondiff_inputs=(0,)
)


def where(condition: Tensor, lhs: Tensor, rhs: Tensor) -> Tensor:
    """``lhs`` where ``condition`` is true, else ``rhs`` (three-way broadcasting).

    The condition is cast to bool if needed; ``lhs`` and ``rhs`` must share a dtype.
    """
    inputs = {"condition": _as_bool(condition), "lhs": lhs, "rhs": rhs}
    return record(OPS["where"], inputs, names=["where_out"])[0]
