"""bench/_gpt_program.py: every pattern computes what its hand-written JAX reference does.

On a tiny configuration (2 layers, hidden 16, sequence 8): the micro-batch losses of two
steps and every weight after them, float32, and float16 (float32 master weights) where a
pattern keeps float16 values of its own.
"""

from __future__ import annotations

import dataclasses
import functools
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


# float16 where the pattern keeps float16 values of its own between ops (accumulators,
# stashes, remote buffers, replica sums); the other patterns' float16 path is their layer
# graph, which these already run.
HALF_PATTERNS = ("grad-accum", "pipelined", "phased", "replicated")
CASES = [(p, "float32") for p in gpt.PATTERNS] + [(p, "float16") for p in HALF_PATTERNS]


@pytest.mark.parametrize(("pattern", "dtype"), CASES)
def test_pattern_matches_its_reference(pattern, dtype):
    _check_against_reference(gpt.config(pattern, **TINY, dtype=dtype))


def test_pipelined_on_one_device_matches_its_reference(monkeypatch):
    """With its 2 IPUs on one device (as ``bench/build_compile.py`` runs it), the pipeline
    runs each micro-batch through the stages in turn: the same numbers, and the program
    compiles each layer graph once, as the unpipelined gradient accumulation does (two
    layers per stage, so that runs form)."""
    monkeypatch.setenv("POPXL_PLACEMENT", "off")
    session = _check_against_reference(
        gpt.config("pipelined", **{**TINY, "layers": 4}, dtype="float32")
    )
    lowered = session._lowered().as_text()
    # The micro-batch loop, one scan of the layers' forward and one of their backward.
    assert lowered.count("stablehlo.while") == 3


@functools.cache
def _reference_run(key: tuple) -> tuple[list, dict]:
    """The reference's losses and weights after ``STEPS`` steps of the configuration whose
    fields are ``key`` (patterns sharing a reference compile it once per test process)."""
    fields = dict(key)
    cfg = gpt.config(fields.pop("pattern"), **fields)
    tokens, labels = gpt.make_batches(cfg)
    reference = gpt.Reference(cfg)
    return [reference.run(tokens, labels) for _ in range(STEPS)], reference.weights()


def _reference_key(cfg: gpt.Config) -> tuple:
    """``cfg``'s fields, its pattern replaced by the plain one its reference is (the
    reference reads only its optimiser and whether it recomputes from the pattern)."""
    plain = "recompute" if cfg.recompute else f"inline-{cfg.optimizer}"
    return tuple(sorted({**dataclasses.asdict(cfg), "pattern": plain}.items()))


def _check_against_reference(cfg: gpt.Config):  # -> the session, closed
    tokens, labels = gpt.make_batches(cfg)
    program = gpt.Program(cfg)
    with program.session() as session:
        got = [program.run(session, tokens, labels) for _ in range(STEPS)]
        weights = program.weights(session)
    want, expected = _reference_run(_reference_key(cfg))
    loss_tol, weight_tol = TOLERANCE[cfg.dtype]
    np.testing.assert_allclose(got, want, rtol=loss_tol, atol=loss_tol)
    assert set(weights) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(weights[key], value, atol=weight_tol, err_msg=key)
    initial = gpt.initial_weights(cfg)
    assert max(np.abs(weights[k] - initial[k]).max() for k in expected) > cfg.lr / 2
    return session
