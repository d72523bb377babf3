"""bench/transformer_step.py computes what its hand-written JAX reference computes.

On the tiny configuration (3 layers, hidden 16, GA 2): the micro-batch losses of three
Adam steps and the layer weights after them, float32 and float16 with float32 master
weights, with the scanned lowering of the repeated calls and with every call inlined.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench import transformer_step as ts  # noqa: E402
from runtime.lowering import runs as run_plans  # noqa: E402

STEPS = 3
# float16 rounds activations to 11 bits; Adam turns small gradient differences into
# differences of up to lr per step in a few weights.
TOLERANCE = {"float32": (1e-5, 1e-5), "float16": (5e-3, 2 * STEPS * ts.SIZES["tiny"].lr)}


def run_both(cfg: ts.Config):
    tokens, labels = ts.make_batches(cfg)
    project, reference = ts.ProjectStep(cfg), ts.ReferenceStep(cfg)
    with project:
        p_losses = [project.step(tokens, labels) for _ in range(STEPS)]
        p_weights = project.layer_weights()
    r_losses = [reference.step(tokens, labels) for _ in range(STEPS)]
    return p_losses, r_losses, p_weights, reference.layer_weights()


@pytest.mark.parametrize(("dtype", "policy"), [("float32", "scan"), ("float16", "scan")])
def test_project_step_matches_hand_written_jax(dtype, policy, monkeypatch):
    monkeypatch.setattr(run_plans, "_policy", policy)
    cfg = replace(ts.SIZES["tiny"], dtype=dtype)
    p_losses, r_losses, p_weights, r_weights = run_both(cfg)
    loss_tol, weight_tol = TOLERANCE[dtype]
    assert np.asarray(p_losses).shape == (STEPS, cfg.ga)
    np.testing.assert_allclose(p_losses, r_losses, rtol=loss_tol, atol=loss_tol)
    assert set(p_weights) == set(r_weights)
    for key, value in r_weights.items():
        np.testing.assert_allclose(p_weights[key], value, atol=weight_tol, err_msg=key)
    # The steps trained: the loss went down and the weights moved.
    assert p_losses[-1].mean() < p_losses[0].mean()
    initial = ts.initial_weights(cfg)
    assert max(np.abs(p_weights[k] - initial[k]).max() for k in r_weights) > cfg.lr
