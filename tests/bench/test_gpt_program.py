"""bench/_gpt_program.py: every pattern computes what its hand-written JAX reference does.

On a tiny configuration (2 layers, hidden 16, sequence 8): the micro-batch losses of two
steps and every weight after them, float32 and float16 (float32 master weights).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench import _gpt_program as gpt  # noqa: E402

STEPS = 2
TINY = {"layers": 2, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32, "lr": 1e-2}
# float16 rounds activations to 11 bits; Adam's normalised update turns gradients that
# differ in their last bits into weight differences of up to lr per step.
TOLERANCE = {"float32": (2e-5, 2e-5), "float16": (5e-3, 2 * STEPS * TINY["lr"])}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("pattern", gpt.PATTERNS)
def test_pattern_matches_its_reference(pattern, dtype):
    cfg = gpt.config(pattern, **TINY, dtype=dtype)
    tokens, labels = gpt.make_batches(cfg)
    program, reference = gpt.Program(cfg), gpt.Reference(cfg)
    with program.session() as session:
        got = [program.run(session, tokens, labels) for _ in range(STEPS)]
        weights = program.weights(session)
    want = [reference.run(tokens, labels) for _ in range(STEPS)]
    loss_tol, weight_tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got, want, rtol=loss_tol, atol=loss_tol)
    expected = reference.weights()
    assert set(weights) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(weights[key], value, atol=weight_tol, err_msg=key)
    initial = gpt.initial_weights(cfg)
    assert max(np.abs(weights[k] - initial[k]).max() for k in expected) > cfg.lr / 2
