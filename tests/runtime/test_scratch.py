"""Stash buffers kept from one step to the next (runtime/lowering/scratch.py).

The stacks a forward run of layer calls keeps for the backward run are donated step
arguments: each step overwrites every row, so a step must compute what a step with fresh
buffers computes, whatever the previous step left in them (the inputs change every step
below), and the buffers passed in must be reused, not copied.
"""

from __future__ import annotations

from collections import OrderedDict

import jax
import numpy as np
import pytest

import popxl
from runtime.lowering import runs as run_plans
from runtime.lowering import scratch
from runtime.session import program

from .test_calls import LAYERS, STEPS, B, H, train, train_looped, training_program


@pytest.fixture(autouse=True)
def private_step_cache(monkeypatch):
    """These programs are test_calls' own: compiled here, they would be found in the step
    cache there, and test_calls' spies on tracing would see nothing."""
    monkeypatch.setattr(program, "_STEP_CACHE", OrderedDict())


def test_the_stash_of_a_training_step_is_planned_from_the_ir(monkeypatch):
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir, *_ = training_program(1)
    buffers = scratch.plan(ir)
    # The forward run keeps what the gradient graph reads of every layer: (LAYERS, B, H)
    # activations, one buffer per kept output of the layer graph.
    assert buffers and all(b.shape == (LAYERS, B, H) for b in buffers)
    assert all(b.dtype == np.float32 for b in buffers)
    monkeypatch.setattr(run_plans, "_policy", "inline")
    assert scratch.plan(ir) == ()  # inlined calls keep no stacks


def test_training_with_scratch_buffers_matches_inlined_calls(monkeypatch):
    outs_scan, vars_scan, program = train("scan", 1, monkeypatch)
    assert program.scratch
    outs_inline, vars_inline, inlined = train("inline", 1, monkeypatch)
    assert not inlined.scratch
    for a, b in zip(outs_scan + vars_scan, outs_inline + vars_inline):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_runs_inside_a_loop_body_use_scratch_buffers(monkeypatch):
    outs_scan, vars_scan, program = train_looped("repeat", "scan", monkeypatch)
    assert program.scratch
    outs_inline, vars_inline, _ = train_looped("repeat", "inline", monkeypatch)
    for a, b in zip(outs_scan + vars_scan, outs_inline + vars_inline):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_the_buffers_are_donated_to_each_step_and_dropped_on_detach(monkeypatch):
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir, stream, out, _, _ = training_program(1)
    session = popxl.Session(ir, "ipu_model")
    x = np.ones((B, H), np.float32)
    with session:
        session.run({stream: x})
        first = session._scratch
        assert first is not None and len(first) == len(session._program.scratch)
        session.run({stream: x})
        second = session._scratch
        assert second is not None
        # The step wrote into the arrays it was given: they are consumed, not kept.
        assert all(a.is_deleted() for a in first)
        assert not any(a.is_deleted() for a in second)
    assert session._scratch is None


def test_making_the_buffers_compiles_nothing(monkeypatch):
    """The buffers are zeros put from the host: the session compiles its step when it is
    made, and its first run compiles nothing (``jnp.zeros`` compiled a program per buffer
    shape: 2 s of ConvNeXt-T's first training call)."""
    monkeypatch.setattr(run_plans, "_policy", "scan")
    ir, stream, _, _, _ = training_program(1)
    jax.clear_caches()  # zeros of these shapes made by earlier tests would be cached
    session = popxl.Session(ir, "ipu_model")
    with session:
        session._compiled()  # the step (made already unless an identical program was)
    compiles: list[float] = []

    def listener(event: str, duration: float, **kwargs: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        with session:
            session.run({stream: np.ones((B, H), np.float32)})
            assert session._scratch is not None
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert len(session._program.scratch) > 1
    assert compiles == []


@pytest.mark.parametrize("mapping", ["vmap", "shard_map"])
def test_mapped_replicas_keep_a_buffer_each(mapping, monkeypatch):
    """Replicas on one device (``vmap``) or one device each (``shard_map``) have their own
    rows; the numbers are the inlined calls'."""
    monkeypatch.setenv("POPXL_REPLICATION", mapping)
    outs_scan, vars_scan, program = train("scan", 2, monkeypatch)
    assert program.scratch
    assert all(shape[:2] == (2, LAYERS) for shape, _ in program.scratch_specs())
    outs_inline, vars_inline, _ = train("inline", 2, monkeypatch)
    assert len(outs_scan) == STEPS
    for a, b in zip(outs_scan + vars_scan, outs_inline + vars_inline):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
