"""Derivatives at a kink, where finite differences (the op table's gradient check) cannot
say which one-sided value is right: ``abs`` and the L1 reduction have derivative
``sign(x)``, 0 at 0, as PopART's ``AbsGrad`` (JAX's own ``abs`` has 1 there)."""

import numpy as np
import pytest

import popxl.ops as ops

from .harness import OpCase, run_gradients

X = np.array([[0.0, -0.0, 1.5, -2.0], [0.0, 3.0, -0.5, 0.0]], np.float32)


@pytest.mark.parametrize(
    "build, reference",
    [
        (ops.abs, np.abs),
        (lambda t: ops.l1(t, [1]), lambda x: np.abs(x).sum(1)),
    ],
    ids=["abs", "l1"],
)
def test_derivative_is_the_sign_and_zero_at_zero(build, reference):
    case = OpCase("kink", build, [X], reference)
    seed = np.full(reference(X).shape, 2.0, np.float32)
    (grad,) = run_gradients(case, [0], [seed])
    np.testing.assert_array_equal(grad, 2.0 * np.sign(X))
