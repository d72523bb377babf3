"""var_updates: argument errors, op types and names, and persistence of in-place updates."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException
from popxl.ops import var_updates as vu


@pytest.fixture
def g():
    ir = popxl.Ir()
    with ir.main_graph:
        yield {
            "t": popxl.variable(np.zeros((2, 3), np.float32), name="t"),
            "x": popxl.variable(np.ones((2, 3), np.float32), name="x"),
            "v": popxl.variable(np.ones((2, 3), np.float32), name="v"),
            "step": popxl.variable(0.0, popxl.float32, name="step"),
            "s": popxl.variable(np.ones(2, np.float32), name="s"),
        }


def test_shape_mismatch_is_a_core_error(g):
    y = popxl.constant(np.ones((3,), np.float32))
    for fn in (vu.accumulate_, vu.accumulate_square_, vu.copy_var_update_):
        with pytest.raises(PopXLException, match="does not broadcast"):
            fn(g["t"], y)
    with pytest.raises(PopXLException, match="does not broadcast"):
        vu.adam_var_update(g["t"], y, g["step"], g["step"], 0.1, 1.0)


def test_non_scalar_factor_raises(g):
    with pytest.raises(ValueError, match="scalar factors"):
        vu.accumulate_(g["t"], g["x"], g["s"])
    with pytest.raises(ValueError, match="scalar factors"):
        vu.accumulator_scale_(g["t"], g["s"])
    with pytest.raises(ValueError, match="scalar factors"):
        vu.adam_var_update(g["t"], g["x"], g["s"], g["step"], 0.1, 1.0)


@pytest.mark.parametrize("fn", [vu.adam_updater, vu.lamb_updater])
def test_time_step_needs_both_betas(g, fn):
    with pytest.raises(ValueError, match="beta1 and beta2"):
        fn(g["x"], g["v"], time_step=g["step"], beta1=0.9)
    with pytest.raises(ValueError, match="beta1 and beta2"):
        fn(g["x"], g["v"], time_step=g["step"], beta2=0.9)


@pytest.mark.parametrize("fn", [vu.adam_updater, vu.lamb_updater])
def test_weight_decay_needs_weight(g, fn):
    with pytest.raises(ValueError, match="needs the weight"):
        fn(g["x"], g["v"], weight_decay=0.1)
    with pytest.raises(ValueError, match="needs the weight"):
        fn(g["x"], g["v"], weight_decay=g["step"])
    fn(g["x"], g["v"], weight_decay=0.0)  # zero decay needs no weight


def test_adamax_needs_time_step(g):
    with pytest.raises(ValueError, match="time_step is required"):
        vu.adamax_updater(g["x"], g["v"])
    with pytest.raises(ValueError, match="needs beta1"):
        vu.adamax_updater(g["x"], g["v"], time_step=g["step"], beta1=None)


def test_updater_shape_checks(g):
    with pytest.raises(PopXLException, match="same shape"):
        vu.adam_updater(g["x"], g["s"])
    with pytest.raises(PopXLException, match="weight's shape"):
        vu.adam_updater(g["x"], g["v"], weight=g["s"], weight_decay=0.1)
    with pytest.raises(ValueError, match="scalar factors"):
        vu.adam_updater(g["x"], g["v"], time_step=g["s"], beta1=0.9, beta2=0.9)


@pytest.mark.parametrize("missing", ["learning_rate", "max_weight_norm"])
def test_adam_var_update_needs_lr_and_max_weight_norm(g, missing):
    kwargs = {"learning_rate": 0.1, "max_weight_norm": 1.0, missing: None}
    with pytest.raises(ValueError, match=f"{missing} is None"):
        vu.adam_var_update(g["t"], g["x"], g["step"], g["step"], **kwargs)


def test_sparse_accumulate_checks(g):
    idx = popxl.constant(np.array([0, 1, 1, 0], np.int32))
    with pytest.raises(PopXLException, match="expected"):
        vu.sparse_accumulate_(g["t"], g["x"], idx)
    with pytest.raises(PopXLException, match="indices must be integers"):
        vu.sparse_accumulate_(g["t"], g["x"], popxl.constant(np.zeros(2, np.float32)))
    with pytest.raises(ValueError, match="out of range"):
        vu.sparse_accumulate_(g["t"], g["x"], idx, axis=2)


def test_inputs_must_be_tensors_of_the_graph():
    other = popxl.Ir()
    with other.main_graph:
        foreign = popxl.variable(np.ones((2, 3), np.float32))
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.ones((2, 3), np.float32))
        with pytest.raises(TypeError, match="not a Tensor"):
            vu.accumulate_(np.zeros((2, 3)), t)
        with pytest.raises(ValueError, match="not in the current Graph"):
            vu.accumulate_(t, foreign)
        with pytest.raises(ValueError, match="not in the current Graph"):
            vu.adam_var_update(t, t, t[0, 0], t[0, 1], foreign, 1.0)


def test_types_and_names(g):
    t, x = g["t"], g["x"]
    outs = [
        vu.accumulate_(t, x),
        vu.accumulate_square_(t, x),
        vu.accumulate_mean_(t, x, 1.0),
        vu.accumulate_moving_average_(t, x, 0.9),
        vu.accumulate_moving_average_square_(t, x, 0.9),
        vu.accumulator_scale_(t, 2.0),
        vu.accumulator_zero_(t),
        vu.copy_var_update_(t, x),
        vu.sparse_accumulate_(t, x, popxl.constant(np.array([0, 1], np.int32))),
        vu.adam_updater(x, g["v"], time_step=g["step"], beta1=0.9, beta2=0.99),
        vu.lamb_updater(x, g["v"]),
        vu.adamax_updater(x, g["v"], time_step=g["step"]),
        vu.adam_var_update(t, x, g["step"], g["step"], 0.1, 1.0),
    ]
    # Repeated base names get a "__t<k>" suffix; the first use of each is exact.
    exact = {
        0: "accumulate__t",
        1: "accumulate_square__t",
        2: "accumulate_mean__t",
        3: "accumulate_moving_avg__t",
        4: "accumulate_moving_avg_square__t",
        5: "accumulator_scale__t",
        7: "updated__t",
        8: "sparse_accumulate__t",
        9: "Updater",
        12: "adam_var_update_out",
    }
    assert {i: outs[i].name for i in exact} == exact
    assert outs[6].name.startswith("accumulator_scale__t__t")
    assert outs[10].name.startswith("Updater__t") and outs[11].name.startswith("Updater__t")
    assert [o._producer.type for o in outs] == (
        ["Accumulate"] * 5
        + ["AccumulatorScale"] * 2
        + [
            "CopyVarUpdate",
            "SparseAccumulate",
            "AdamUpdater",
            "AdamUpdater",
            "AdamUpdater",
            "AdamVarUpdate",
        ]
    )


def test_updates_persist_in_variables_across_runs():
    ir = popxl.Ir()
    with ir.main_graph:
        acc = popxl.variable(np.zeros(3, np.float32), name="acc")
        step = popxl.variable(0.0, popxl.float32, name="step")
        m = popxl.variable(np.full(3, 0.5, np.float32), name="m")
        v = popxl.variable(np.full(3, 0.25, np.float32), name="v")
        stream = popxl.h2d_stream((3,), popxl.float32, "x")
        vu.accumulate_(acc, ops.host_load(stream, "x"), 2.0)
        upd = vu.adam_updater(m, v, time_step=step, beta1=0.5, beta2=0.5, epsilon=0.0)
        out = popxl.d2h_stream(upd.shape, upd.dtype, "upd")
        ops.host_store(out, upd)
    with popxl.Session(ir, "ipu_model") as session:
        first = session.run({stream: np.ones(3, np.float32)})[out]
        second = session.run({stream: np.ones(3, np.float32)})[out]
        np.testing.assert_allclose(session.get_tensor_data(acc), np.full(3, 4.0))
        assert session.get_tensor_data(step) == 2.0
    # t=1: (0.5/0.5) / sqrt(0.25/0.5); t=2: (0.5/0.75) / sqrt(0.25/0.75)
    np.testing.assert_allclose(first, np.full(3, 1 / np.sqrt(0.5)), rtol=1e-6)
    np.testing.assert_allclose(second, np.full(3, (0.5 / 0.75) / np.sqrt(0.25 / 0.75)), rtol=1e-6)


def test_float_factors_and_mixed_precision_follow_the_ipu():
    """A float32 X entering a float16 accumulator is rounded to float16 first, and float
    factors are float32 values: ``1 - f`` is ``1 - float32(f)``, not the Python double; a
    float16 moving average also rounds that factor to float16 (PopART ran it in float16)."""
    ir = popxl.Ir()
    with ir.main_graph:
        m = popxl.variable(np.zeros(3, np.float16), name="m")
        v = popxl.variable(np.zeros(3, np.float32), name="v")
        x = popxl.constant(np.full(3, 0.1, np.float32), name="x")
        vu.accumulate_moving_average_(m, x, f=0.9)
        vu.accumulate_moving_average_square_(v, x, f=0.999)
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
    f32, f16 = np.float32, np.float16
    x16 = f32(f16(f32(0.1)))  # 0.0999755859375
    want_m = f16(x16 * f32(f16(f32(1) - f32(0.9))))
    want_v = (f32(1) - f32(0.999)) * f32(0.1) * f32(0.1)
    np.testing.assert_array_equal(session.get_tensor_data(m), np.full(3, want_m))
    np.testing.assert_allclose(session.get_tensor_data(v), np.full(3, want_v), rtol=1e-7)
    # The float64 computation would have given other values, so the test tells them apart.
    assert f16(0.1 * 0.1) != want_m
    assert abs((1 - 0.999) * 0.01 - want_v) / want_v > 1e-6


def test_float16_moving_average_rounds_after_every_operation():
    """``m = f16(f16(f16(f) * m) + f16(f16(1 - f) * f16(x)))``, PopART's float16 kernel; a
    float32 accumulator from the same values stays in float32."""
    f32, f16 = np.float32, np.float16
    rng = np.random.default_rng(0)
    m0, x = rng.normal(size=(2, 256)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        m16 = popxl.variable(m0.astype(f16), name="m16")
        m32 = popxl.variable(m0, name="m32")
        xs = popxl.constant(x, name="x")
        vu.accumulate_moving_average_(m16, xs, f=0.9)
        vu.accumulate_moving_average_(m32, xs, f=0.9)
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
    a, b = f16(f32(0.9)), f16(f32(1) - f32(0.9))
    want16 = (a * m0.astype(f16)) + (b * x.astype(f16))  # float16 arithmetic in NumPy
    np.testing.assert_array_equal(session.get_tensor_data(m16), want16)
    want32 = f32(0.9) * m0 + (f32(1) - f32(0.9)) * x
    np.testing.assert_allclose(session.get_tensor_data(m32), want32, rtol=3e-7)
    once = (f32(0.9) * m0 + (f32(1) - f32(0.9)) * x.astype(f16).astype(f32)).astype(f16)
    assert np.count_nonzero(want16 != once) > 10  # the rounding rule is observable here
