"""Tutorial 9's custom ops: the C++ examples of PopXL's and PopTorch's guides as JAX functions.

Each op is registered once, under the identity PopTorch's examples call it by
(``domain::name`` version 1), with its typed attributes and, where the C++ example had a
hand-written gradient op, the same gradient as a ``vjp``:

* ``com.acme::LeakyRelu`` (attribute ``alpha``): the op of PopXL's user guide and of
  PopTorch's listing 4.25;
* ``com.acme::Cube`` (inputs ``x, bias``; outputs ``x**3 + bias, x**3``): PopTorch's
  listing 4.24;
* ``test.poptorch::ManyAttributeOp``: one attribute of every kind of PopTorch's Table 4.1
  (listing 4.26). It adds a checksum of its attributes to ``x``, so a wrong value anywhere
  shows in the numbers.

The NumPy functions beside them are the references the scripts and tests compare with.

Run: python tutorials/9_custom_ops/acme_ops.py (lists the registered ops)
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from popxl import custom_ops

ACME = "com.acme"
TEST_DOMAIN = "test.poptorch"

# LeakyRelu ----------------------------------------------------------------------------------


def leaky_relu_impl(x: Any, *, alpha: float) -> Any:
    """``x`` where ``x >= 0``, else ``alpha * x`` (``torch.nn.functional.leaky_relu``)."""
    return jnp.where(x >= 0, x, alpha * x)


def leaky_relu_vjp(inputs: tuple, output: Any, grad: Any, *, alpha: float) -> Any:
    """The C++ example's ``LeakyReluGradOp``: the incoming gradient, times ``alpha`` where
    the input was negative."""
    (x,) = inputs
    return jnp.where(x >= 0, grad, alpha * grad)


LEAKY_RELU = custom_ops.register(
    "LeakyRelu",
    leaky_relu_impl,
    domain=ACME,
    attributes={"alpha": 0.01},
    vjp=leaky_relu_vjp,
)


def leaky_relu_reference(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x >= 0, x, np.float32(alpha) * x)


# Cube ---------------------------------------------------------------------------------------


def cube_impl(x: Any, bias: Any) -> tuple[Any, Any]:
    """``(x**3 + bias, x**3)``; ``bias`` broadcasts against ``x``."""
    cubed = x * x * x
    return cubed + bias, cubed


def cube_vjp(inputs: tuple, outputs: tuple, grads: tuple) -> tuple[Any, Any]:
    """Both outputs depend on ``x**3`` (derivative ``3 x**2``); only the first on ``bias``,
    whose gradient is summed over the dimensions it was broadcast along."""
    (x, bias), (g_sum, g_cube) = inputs, grads
    g_bias = jnp.sum(g_sum, axis=tuple(range(g_sum.ndim - bias.ndim)))
    for axis, size in enumerate(bias.shape):
        if size == 1:
            g_bias = jnp.sum(g_bias, axis=axis, keepdims=True)
    return 3 * x * x * (g_sum + g_cube), g_bias


CUBE = custom_ops.register("Cube", cube_impl, domain=ACME, vjp=cube_vjp)


def cube_reference(x: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cubed = x * x * x
    return cubed + bias, cubed


# ManyAttributeOp ----------------------------------------------------------------------------

MANY_ATTRIBUTES: dict[str, Any] = {
    "float_one": 1.0,
    "float_minus_two": -2.0,
    "int_zero": 0,
    "int_minus_five": -5,
    "floats_one_two_three": [1.0, 2.0, 3.0],
    "floats_minus_one_two_three": [-1.0, -2.0, -3.0],
    "ints_one_two_three": [1, 2, 3],
    "ints_minus_one_two_three": [-1, -2, -3],
    "a_string": "string with quotes and slash \" ' \\ end",
    "strs": ["abc", "def", "ghi"],
}
"""Listing 4.26's attributes: Float, Int, Floats, Ints, String and Strings values."""

MANY_ATTRIBUTE_KINDS = {
    "float_one": "Float",
    "float_minus_two": "Float",
    "int_zero": "Int",
    "int_minus_five": "Int",
    "floats_one_two_three": "Floats",
    "floats_minus_one_two_three": "Floats",
    "ints_one_two_three": "Ints",
    "ints_minus_one_two_three": "Ints",
    "a_string": "String",
    "strs": "Strings",
}


def attribute_checksum(attrs: dict[str, Any]) -> float:
    """A number that every attribute value changes: each float and int (or list of them)
    counts by its value, each string by the sum of its character codes / 1000."""
    total = 0.0
    for value in attrs.values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            total += sum(map(ord, item)) / 1000 if isinstance(item, str) else float(item)
    return total


def many_attribute_impl(x: Any, **attrs: Any) -> Any:
    """``x * float_one + checksum(attributes)``."""
    return x * attrs["float_one"] + attribute_checksum(attrs)


MANY_ATTRIBUTE_OP = custom_ops.register(
    "ManyAttributeOp",
    many_attribute_impl,
    domain=TEST_DOMAIN,
    attributes=MANY_ATTRIBUTE_KINDS,
)


def many_attribute_reference(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    return x * np.float32(attrs["float_one"]) + np.float32(attribute_checksum(attrs))


def main() -> None:
    for domain, name, version in custom_ops.registered():
        op = custom_ops.get(name, domain, version)
        kinds = {n: a.kind.value for n, a in op.attributes.items()}
        print(f"{domain}::{name}:{version} attributes {kinds}")


if __name__ == "__main__":
    main()
