"""Work on read-only state kept between runs (``runtime.lowering.hoisting``): an inference program's
weight layouts are made once per set of weights, and a new weight is used at the next run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jcore

import popxl
import popxl.ops as ops
from runtime.lowering import hoisting

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the convolution programs of the CPU"
)


def _conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``relu(conv(x, w) + b)`` (padding 1) in float64 with ``lax``."""
    with jax.enable_x64(True):
        y = lax.conv_general_dilated(
            jnp.asarray(x, jnp.float64), jnp.asarray(w, jnp.float64), (1, 1), ((1, 1), (1, 1))
        )
        return np.asarray(jnp.maximum(y + jnp.asarray(b, jnp.float64)[None, :, None, None], 0))


def _inference_session() -> tuple[popxl.Session, popxl.Tensor, popxl.HostToDeviceStream, dict]:
    rng = np.random.default_rng(3)
    data = {
        "x": rng.standard_normal((2, 16, 8, 8)).astype(np.float32),
        "w": rng.standard_normal((24, 16, 3, 3)).astype(np.float32) * 0.1,
        "b": rng.standard_normal(24).astype(np.float32),
    }
    ir = popxl.Ir()
    with ir.main_graph:
        stream = popxl.h2d_stream((2, 16, 8, 8), popxl.float32, name="x")
        w = popxl.variable(data["w"], name="w")
        b = popxl.variable(data["b"], name="b")
        y = ops.conv(ops.host_load(stream), w, padding=(1, 1, 1, 1))
        y = ops.relu(y + ops.reshape(b, (1, 24, 1, 1)))
        out = popxl.d2h_stream(y.shape, y.dtype, name="y")
        ops.host_store(out, y)
    session = popxl.Session(ir, "ipu_model")
    data["out"] = out
    return session, w, stream, data


def test_weight_layouts_are_made_once_and_values_match() -> None:
    session, _, stream, data = _inference_session()
    with session:
        runs = [session.run({stream: data["x"]})[data["out"]] for _ in range(3)]
        hoisted = session._program.step._jit
        assert isinstance(hoisted, hoisting.Hoisted)
        assert len(hoisted._kept) >= 1  # the transposed weight, at least
        made = []
        hoisted._prepare = _counting(hoisted._prepare, made)
        session.run({stream: data["x"]})
    assert made == []  # the same weights: nothing made again
    expected = _conv_reference(data["x"], data["w"], data["b"])
    for got in runs:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_written_weight_is_used_at_the_next_run() -> None:
    session, w, stream, data = _inference_session()
    new_w = -2.0 * data["w"]
    with session:
        session.run({stream: data["x"]})
        hoisted = session._program.step._jit
        made: list = []
        hoisted._prepare = _counting(hoisted._prepare, made)
        session.write_variable_data(w, new_w)
        got = session.run({stream: data["x"]})[data["out"]]
        again = session.run({stream: data["x"]})[data["out"]]
    assert len(made) == 1  # made again once for the new weight, then kept
    expected = _conv_reference(data["x"], new_w, data["b"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(again, expected, rtol=1e-5, atol=1e-5)


def test_replicas_on_one_device_keep_their_prepared_weights(monkeypatch) -> None:
    """Two replicas mapped on one device (``vmap``): the prepared weight serves both, and a
    written weight reaches both at the next run."""
    monkeypatch.setenv("POPXL_REPLICATION", "vmap")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 16, 8, 8)).astype(np.float32)
    w0 = rng.standard_normal((24, 16, 3, 3)).astype(np.float32) * 0.1
    b0 = rng.standard_normal(24).astype(np.float32)
    ir = popxl.Ir()
    ir.replication_factor = 2
    with ir.main_graph:
        stream = popxl.h2d_stream((2, 16, 8, 8), popxl.float32, name="x")
        w = popxl.variable(w0, name="w")
        b = popxl.variable(b0, name="b")
        y = ops.conv(ops.host_load(stream), w, padding=(1, 1, 1, 1))
        y = ops.relu(y + ops.reshape(b, (1, 24, 1, 1)))
        out = popxl.d2h_stream(y.shape, y.dtype, name="y")
        ops.host_store(out, y)
    with popxl.Session(ir, "ipu_model") as session:
        first = session.run({stream: x})[out]
        assert isinstance(session._program.step._jit, hoisting.Hoisted)
        session.write_variable_data(w, -w0)
        second = session.run({stream: x})[out]
    for replica in range(2):
        expected = _conv_reference(x[replica], w0, b0)
        np.testing.assert_allclose(first[replica], expected, rtol=1e-5, atol=1e-5)
        expected = _conv_reference(x[replica], -w0, b0)
        np.testing.assert_allclose(second[replica], expected, rtol=1e-5, atol=1e-5)


def test_split_takes_only_work_on_read_only_arguments() -> None:
    def step(w: jax.Array, x: jax.Array) -> jax.Array:
        kernel = w.transpose(2, 3, 1, 0) * 2.0  # read-only work: hoisted
        return (
            lax.conv_general_dilated(
                x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            + x.sum()
        )

    w = jnp.ones((4, 3, 3, 3), jnp.float32)
    x = jnp.arange(2 * 5 * 5 * 3, dtype=jnp.float32).reshape(2, 5, 5, 3)
    closed = jax.make_jaxpr(step)(w, x)
    parts = hoisting.split(closed, [0])
    assert parts is not None
    assert {e.primitive.name for e in parts.prepare.jaxpr.eqns} == {"transpose", "mul"}
    assert "transpose" not in {e.primitive.name for e in parts.main.jaxpr.eqns}
    prepared = jcore.jaxpr_as_fun(parts.prepare)(w)
    got = jcore.jaxpr_as_fun(parts.main)(w, x, *prepared)[0]
    np.testing.assert_array_equal(got, step(w, x))
    # with nothing read-only (a training step's weights), nothing is taken
    assert hoisting.split(closed, []) is None
    assert not hoisting.worth_hoisting(closed, (x, (), x), 1)


def _counting(fn, calls: list):
    def counted(*args):
        calls.append(len(args))
        return fn(*args)

    return counted


def test_scalars_read_only_are_not_worth_a_program() -> None:
    """A training step whose read-only state is an optimizer's scalars keeps one program:
    only matrices or larger, read by a lowering rule's call or reshaped alone, count."""

    @jax.custom_vjp
    def scaled(x: jax.Array, s: jax.Array) -> jax.Array:
        return x * s

    scaled.defvjp(lambda x, s: (x * s, (x, s)), lambda res, g: (g * res[1], (g * res[0]).sum()))

    def step(w: jax.Array, lr: jax.Array, x: jax.Array) -> jax.Array:
        return w - lr * scaled(x, lr * 2.0)

    w, lr, x = jnp.ones((3, 3)), jnp.float32(0.1), jnp.ones((3, 3))
    assert not hoisting.worth_hoisting(jax.make_jaxpr(step)(w, lr, x), (w, lr, x), 1)

    def weighted(w: jax.Array, v: jax.Array, x: jax.Array) -> jax.Array:
        return w + scaled(x, v)  # a read-only matrix read by the call

    assert hoisting.worth_hoisting(jax.make_jaxpr(weighted)(w, x, x), (w, x, x), 1)
