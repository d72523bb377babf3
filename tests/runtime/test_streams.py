"""Host streams in a run: multi-transfer layouts, wrap-around, validation and replication."""

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def _repeat_io(nht, repeat_count, shape=(2,), replication=1, offset=0.0):
    """y = x + offset for each of ``repeat_count`` loads/stores inside ``ops.repeat``."""
    ir = popxl.Ir(replication=replication)
    ir.num_host_transfers = nht
    with ir.main_graph:
        x_h2d = popxl.h2d_stream(shape, popxl.float32, "x")
        y_d2h = popxl.d2h_stream(shape, popxl.float32, "y")

        def body():
            ops.host_store(y_d2h, ops.host_load(x_h2d) + offset)

        ops.repeat(ir.create_graph(body), repeat_count)
    return popxl.Session(ir), x_h2d, y_d2h


def _single_io(shape=(2,), dtype=popxl.float32, replication=1):
    """y = x + 1 for one load and one store in the main graph."""
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        x_h2d = popxl.h2d_stream(shape, dtype, "x")
        y_d2h = popxl.d2h_stream(shape, dtype, "y")
        ops.host_store(y_d2h, ops.host_load(x_h2d) + popxl.constant(1, dtype))
    return popxl.Session(ir), x_h2d, y_d2h


# Multiple transfers per run ------------------------------------------------------------------


def test_one_transfer_per_repeat_iteration(rng):
    session, x_h2d, y_d2h = _repeat_io(nht=4, repeat_count=4, shape=(2, 3), offset=1.0)
    x = rng.normal(size=(4, 2, 3)).astype(np.float32)
    with session:
        out = session.run({x_h2d: x})[y_d2h]
    assert out.shape == (4, 2, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, x + 1.0, rtol=1e-6)


def test_loop_carried_variable_sees_every_slot():
    ir = popxl.Ir()
    ir.num_host_transfers = 3
    with ir.main_graph:
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")
        x_h2d = popxl.h2d_stream((2,), popxl.float32, "x")
        y_d2h = popxl.d2h_stream((2,), popxl.float32, "y")

        def body(acc: popxl.TensorByRef):
            ops.var_updates.accumulate_(acc, ops.host_load(x_h2d))
            ops.host_store(y_d2h, acc)

        ops.repeat(ir.create_graph(body, acc), 3, acc)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    with popxl.Session(ir) as session:
        out = session.run({x_h2d: x})[y_d2h]
        np.testing.assert_array_equal(out, np.cumsum(x, axis=0))
        out = session.run({x_h2d: x})[y_d2h]
        np.testing.assert_array_equal(out, x.sum(0) + np.cumsum(x, axis=0))
        np.testing.assert_array_equal(session.get_tensor_data(acc), 2 * x.sum(0))


def test_load_outside_loop_reads_first_slot():
    ir = popxl.Ir()
    ir.num_host_transfers = 3
    with ir.main_graph:
        x_h2d = popxl.h2d_stream((2,), popxl.float32, "x")
        y_d2h = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(y_d2h, ops.host_load(x_h2d))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    with popxl.Session(ir) as session:
        outputs = session.create_host_outputs()
        outputs[y_d2h][...] = -1.0
        session.run_with_outputs({x_h2d: x}, outputs)
    np.testing.assert_array_equal(outputs[y_d2h], [[0.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]])


def test_loads_beyond_the_slots_wrap_around():
    nht = 3
    ir = popxl.Ir()
    ir.num_host_transfers = nht
    with ir.main_graph:
        x_h2d = popxl.h2d_stream((1,), popxl.float32, "x")
        y_d2h = popxl.d2h_stream((1,), popxl.float32, "y")

        def body():
            # Two loads per iteration: 2 * nht loads in all read slots 0, 1, 2, 0, 1, 2.
            a = ops.host_load(x_h2d)
            b = ops.host_load(x_h2d)
            ops.host_store(y_d2h, a * 10.0 + b)

        ops.repeat(ir.create_graph(body), nht)
    x = np.array([[1.0], [2.0], [3.0]], np.float32)
    with popxl.Session(ir) as session:
        out = session.run({x_h2d: x})[y_d2h]
    np.testing.assert_array_equal(out[:, 0], [12.0, 31.0, 23.0])


def test_stores_beyond_the_slots_wrap_around():
    ir = popxl.Ir()
    ir.num_host_transfers = 2
    with ir.main_graph:
        step = popxl.variable(np.zeros(1, np.float32), name="step")
        x_h2d = popxl.h2d_stream((1,), popxl.float32, "x")
        y_d2h = popxl.d2h_stream((1,), popxl.float32, "y")

        def body(step: popxl.TensorByRef):
            ops.var_updates.accumulate_(step, popxl.constant(np.ones(1, np.float32)))
            ops.host_store(y_d2h, ops.host_load(x_h2d) + step * 100.0)

        ops.repeat(ir.create_graph(body, step), 3, step)
    x = np.array([[1.0], [2.0]], np.float32)
    with popxl.Session(ir) as session:
        out = session.run({x_h2d: x})[y_d2h]
    # Iterations store 101, 202, 301 into slots 0, 1, 0.
    np.testing.assert_array_equal(out[:, 0], [301.0, 202.0])


def test_fewer_stores_than_transfers_keep_previous_output_contents():
    session, x_h2d, y_d2h = _repeat_io(nht=4, repeat_count=2, offset=1.0)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    with session:
        outputs = session.create_host_outputs()
        outputs[y_d2h][...] = -7.0
        session.run_with_outputs({x_h2d: x}, outputs)
        np.testing.assert_array_equal(outputs[y_d2h][:2], x[:2] + 1.0)
        np.testing.assert_array_equal(outputs[y_d2h][2:], -7.0)
        session.run_with_outputs({x_h2d: 2 * x}, outputs)
        np.testing.assert_array_equal(outputs[y_d2h][:2], 2 * x[:2] + 1.0)
        np.testing.assert_array_equal(outputs[y_d2h][2:], -7.0)


def test_no_store_executed_keeps_output_untouched():
    session, x_h2d, y_d2h = _repeat_io(nht=1, repeat_count=0)
    with session:
        target = np.full((2,), 5.0, np.float32)
        session.run_with_outputs({x_h2d: np.ones(2, np.float32)}, {y_d2h: target})
    np.testing.assert_array_equal(target, [5.0, 5.0])


def test_input_with_more_slots_than_transfers_is_accepted():
    session, x_h2d, y_d2h = _repeat_io(nht=2, repeat_count=2, offset=0.0)
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    with session:
        np.testing.assert_array_equal(session.run({x_h2d: x})[y_d2h], x[:2])
        np.testing.assert_array_equal(session.run({x_h2d: x[:2] + 1})[y_d2h], x[:2] + 1)


def test_loads_wrap_at_the_end_of_a_longer_input():
    session, x_h2d, y_d2h = _repeat_io(nht=2, repeat_count=4, shape=(1,), offset=0.0)
    x = np.array([[1.0], [2.0], [3.0]], np.float32)
    with session:
        outputs = session.create_host_outputs()
        session.run_with_outputs({x_h2d: x}, outputs)
    # Loads read input slots 0, 1, 2, 0; stores write output slots 0, 1, 0, 1.
    np.testing.assert_array_equal(outputs[y_d2h][:, 0], [3.0, 1.0])


def test_output_with_more_slots_than_transfers_is_accepted():
    session, x_h2d, y_d2h = _repeat_io(nht=2, repeat_count=2, offset=0.0)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    target = np.full((3, 2), -1.0, np.float32)
    with session:
        session.run_with_outputs({x_h2d: x}, {y_d2h: target})
    np.testing.assert_array_equal(target[:2], x)
    np.testing.assert_array_equal(target[2], [-1.0, -1.0])


def test_several_streams_keep_their_own_cursors():
    ir = popxl.Ir()
    ir.num_host_transfers = 3
    with ir.main_graph:
        a_h2d = popxl.h2d_stream((2,), popxl.float32, "a")
        b_h2d = popxl.h2d_stream((), popxl.int32, "b")
        s_d2h = popxl.d2h_stream((2,), popxl.float32, "s")
        p_d2h = popxl.d2h_stream((), popxl.int32, "p")

        def body():
            a = ops.host_load(a_h2d)
            b = ops.host_load(b_h2d)
            ops.host_store(s_d2h, a + ops.cast(b, popxl.float32))
            ops.host_store(p_d2h, b * 2)

        ops.repeat(ir.create_graph(body), 3)
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.array([10, 20, 30], np.int32)
    with popxl.Session(ir) as session:
        outputs = session.run({a_h2d: a, b_h2d: b})
    np.testing.assert_array_equal(outputs[s_d2h], a + b[:, None])
    np.testing.assert_array_equal(outputs[p_d2h], 2 * b)
    assert outputs[p_d2h].dtype == np.int32


# Input validation -----------------------------------------------------------------------------


def test_missing_input_stream():
    session, x_h2d, _ = _single_io()
    with session:
        with pytest.raises(
            ValueError, match=r"Unexpected/Missing \.\n  Unexpected: set\(\)\n  Missing: .*x"
        ):
            session.run({})
        with pytest.raises(ValueError, match=r"Unexpected/Missing \."):
            session.run()


def test_unexpected_input_stream():
    ir = popxl.Ir()
    with ir.main_graph:
        x_h2d = popxl.h2d_stream((2,), popxl.float32, "x")
        unused = popxl.h2d_stream((2,), popxl.float32, "unused")
        y_d2h = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(y_d2h, ops.host_load(x_h2d))
    session = popxl.Session(ir)
    assert session.expected_inputs() == {x_h2d}
    x = np.ones(2, np.float32)
    with session:
        with pytest.raises(
            ValueError,
            match=r"Unexpected/Missing input\.\n  Unexpected: .*unused.*\n  Missing: set\(\)",
        ):
            session.run({x_h2d: x, unused: x})
        with pytest.raises(
            ValueError,
            match=r"Unexpected/Missing input\.\n  Unexpected: .*unused.*\n  Missing: .*Tensor\[x",
        ):
            session.run({unused: x})
        with pytest.raises(
            ValueError, match=r"Unexpected/Missing input\.\n  Unexpected: .*DeviceToHostStream"
        ):
            session.run({x_h2d: x, y_d2h: x})


def test_first_dim_smaller_than_num_host_transfers():
    session, x_h2d, _ = _repeat_io(nht=3, repeat_count=3)
    with session:
        with pytest.raises(
            ValueError,
            match=r"Dimension 0 \(2\) .* input stream x is not large enough\.\nIt should be at least of size num_host_transfers = 3",
        ):
            session.run({x_h2d: np.ones((2, 2), np.float32)})
        with pytest.raises(ValueError, match="num_host_transfers = 3"):
            session.run({x_h2d: np.ones(2, np.float32)})
        with pytest.raises(ValueError, match="num_host_transfers = 3"):
            session.run({x_h2d: np.float32(1.0)})


def test_nht_dim_is_mandatory():
    session, x_h2d, _ = _repeat_io(nht=2, repeat_count=2, shape=(2, 2))
    with session:
        with pytest.raises(
            ValueError,
            match=r"Shape mismatch for input stream x:\nStream shape = \(2, 2\), therefore expected full global batch shape \(2, 2, 2\)\. Got array shape = \(2, 2\)",
        ):
            session.run({x_h2d: np.ones((2, 2), np.float32)})


@pytest.mark.parametrize(
    "nht, shape, dim, size",
    [(1, (3, 2), 0, 3), (1, (1, 2), 0, 1), (2, (2, 3, 2), 1, 3), (2, (2, 1, 2), 1, 1)],
)
def test_wrong_replica_dim(nht, shape, dim, size):
    session, x_h2d, _ = _repeat_io(nht=nht, repeat_count=nht, replication=2)
    with session:
        with pytest.raises(
            ValueError,
            match=rf"Dimension {dim} \({size}\) .* is the wrong size\.\nIt should be of size replication_factor = 2",
        ):
            session.run({x_h2d: np.ones(shape, np.float32)})


@pytest.mark.parametrize("shape", [(3,), (2, 3), (1, 2, 2), (2, 1), (), (1,)])
def test_shape_mismatch(shape):
    session, x_h2d, _ = _single_io(shape=(2,))
    with session:
        message = (
            "Shape mismatch for input stream x:\nStream shape = (2,), therefore expected full "
            f"global batch shape (2,). Got array shape = {shape}"
        )
        with pytest.raises(ValueError, match=re.escape(message)):
            session.run({x_h2d: np.ones(shape, np.float32)})


@pytest.mark.parametrize(
    "nht, replication, array",
    [
        (1, 1, np.array(4.0, np.float32)),
        (1, 1, np.array([[4.0]], np.float32)),
        (1, 1, 4.0),
        (3, 1, np.full((3,), 4.0, np.float32)),
        (3, 1, np.full((3, 1, 1), 4.0, np.float32)),
        (1, 2, np.full((2,), 4.0, np.float32)),
        (1, 2, np.full((2, 1), 4.0, np.float32)),
        (3, 2, np.full((3, 2), 4.0, np.float32)),
    ],
)
def test_all_ones_escape_hatch(nht, replication, array):
    session, x_h2d, y_d2h = _repeat_io(nht, nht, shape=(1,), replication=replication, offset=1.0)
    with session:
        out = session.run({x_h2d: array})[y_d2h]
    expected_shape = (
        ((nht,) if nht > 1 else ()) + ((replication,) if replication > 1 else ()) + (1,)
    )
    assert out.shape == expected_shape
    np.testing.assert_array_equal(out, 5.0)


def test_escape_hatch_for_a_bool_stream():
    session, x_h2d, y_d2h = _single_io(shape=(1,), dtype=popxl.bool)
    with session:
        out = session.run({x_h2d: np.array(True)})[y_d2h]
    np.testing.assert_array_equal(out, [True])


@pytest.mark.parametrize(
    "nht, replication, shape", [(1, 1, ()), (2, 1, (2,)), (2, 2, (2, 2)), (1, 2, (2, 1))]
)
def test_escape_hatch_is_only_for_one_element_streams(nht, replication, shape):
    session, x_h2d, _ = _repeat_io(nht, nht, shape=(2,), replication=replication)
    with session:
        with pytest.raises(ValueError, match="Shape mismatch for input stream x"):
            session.run({x_h2d: np.ones(shape, np.float32)})


def test_escape_hatch_does_not_accept_a_short_nht_dim():
    session, x_h2d, _ = _repeat_io(nht=3, repeat_count=3, shape=(1,))
    with session:
        with pytest.raises(ValueError, match="not large enough"):
            session.run({x_h2d: np.array([[1.0]], np.float32)})


# Input dtypes ------------------------------------------------------------------------------------


def test_float64_input_is_downcast():
    session, x_h2d, y_d2h = _single_io()
    x = np.array([0.5, 1.5])
    with session:
        out = session.run({x_h2d: x})[y_d2h]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.5, 2.5])


def test_int64_input_is_downcast_for_an_int32_stream():
    session, x_h2d, y_d2h = _single_io(dtype=popxl.int32)
    with session:
        out = session.run({x_h2d: np.array([3, 4], np.int64)})[y_d2h]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [4, 5])


def test_float64_input_without_downcast_is_rejected():
    session, x_h2d, y_d2h = _single_io()
    with session:
        with pytest.raises(
            TypeError, match=r"input stream x has dtype float64, but the stream carries float32"
        ):
            session.run({x_h2d: np.array([0.5, 1.5])}, downcast_inputs=False)
        np.testing.assert_array_equal(
            session.run({x_h2d: np.array([0.5, 1.5], np.float32)}, downcast_inputs=False)[y_d2h],
            [1.5, 2.5],
        )


@pytest.mark.parametrize(
    "array",
    [
        np.array([1, 2], np.int32),
        np.array([1, 2], np.int64),
        np.array([1, 2], np.float16),
        np.array([True, False]),
    ],
)
def test_wrong_input_dtype_is_rejected(array):
    session, x_h2d, _ = _single_io()
    with session:
        with pytest.raises(TypeError, match="but the stream carries float32"):
            session.run({x_h2d: array})


@pytest.mark.parametrize(
    "value, expected", [([1, 2], [2.0, 3.0]), ((0.5, 1.5), [1.5, 2.5]), ([True, False], [2.0, 1.0])]
)
def test_python_lists_are_converted(value, expected):
    session, x_h2d, y_d2h = _single_io()
    with session:
        out = session.run({x_h2d: value})[y_d2h]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("value", [2, 2.0, np.float64(2.0)])
def test_python_scalars_are_converted(value):
    session, x_h2d, y_d2h = _single_io(shape=())
    with session:
        out = session.run({x_h2d: value})[y_d2h]
    assert out.shape == () and out.dtype == np.float32
    assert out == 3.0


def test_int_scalar_for_int_stream():
    session, x_h2d, y_d2h = _single_io(shape=(), dtype=popxl.int32)
    with session:
        assert session.run({x_h2d: 41})[y_d2h] == 42


# Outputs -------------------------------------------------------------------------------------------


def test_run_with_outputs_fills_arrays_in_place():
    session, x_h2d, y_d2h = _repeat_io(nht=2, repeat_count=2, offset=1.0)
    outputs = session.create_host_outputs()
    target = outputs[y_d2h]
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    with session:
        assert session.run_with_outputs({x_h2d: x}, outputs) is None
    assert outputs[y_d2h] is target
    np.testing.assert_array_equal(target, x + 1.0)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda y: {y: np.zeros((2, 3), np.float32)},
            ValueError,
            r"Shape mismatch for output stream y",
        ),
        (
            lambda y: {y: np.zeros((1, 2), np.float32)},
            ValueError,
            r"Dimension 0 \(1\) .* output stream y is not large enough",
        ),
        (
            lambda y: {y: np.zeros((2, 2), np.float64)},
            TypeError,
            r"output stream y has dtype float64",
        ),
        (lambda y: {y: np.zeros((2, 2), np.int32)}, TypeError, r"output stream y has dtype int32"),
        (lambda y: {y: [[0.0, 0.0], [0.0, 0.0]]}, TypeError, r"must be a NumPy array"),
        (lambda y: {}, ValueError, r"Unexpected/Missing \.\n  Unexpected: set\(\)\n  Missing: .*y"),
        (lambda y: None, ValueError, r"Unexpected/Missing \."),
    ],
)
def test_run_with_outputs_validation(make, error, match):
    session, x_h2d, y_d2h = _repeat_io(nht=2, repeat_count=2)
    with session:
        with pytest.raises(error, match=match):
            session.run_with_outputs({x_h2d: np.ones((2, 2), np.float32)}, make(y_d2h))


def test_run_with_outputs_rejects_unexpected_output_stream():
    ir = popxl.Ir()
    with ir.main_graph:
        y_d2h = popxl.d2h_stream((), popxl.float32, "y")
        unused = popxl.d2h_stream((), popxl.float32, "unused")
        ops.host_store(y_d2h, popxl.constant(1.0))
    session = popxl.Session(ir)
    assert set(session.create_host_outputs()) == {y_d2h}
    with session:
        outputs = {y_d2h: np.zeros((), np.float32), unused: np.zeros((), np.float32)}
        with pytest.raises(
            ValueError,
            match=r"Unexpected/Missing output\.\n  Unexpected: .*unused.*\n  Missing: set\(\)",
        ):
            session.run_with_outputs(outputs=outputs)


def test_run_with_outputs_rejects_read_only_array():
    session, x_h2d, y_d2h = _single_io()
    target = np.zeros(2, np.float32)
    target.flags.writeable = False
    with session:
        with pytest.raises(ValueError, match="read-only"):
            session.run_with_outputs({x_h2d: np.ones(2, np.float32)}, {y_d2h: target})


def test_run_with_outputs_escape_hatch():
    session, x_h2d, y_d2h = _repeat_io(nht=3, repeat_count=3, shape=(1,), offset=1.0)
    target = np.zeros(3, np.float32)
    with session:
        session.run_with_outputs({x_h2d: np.arange(3, dtype=np.float32)}, {y_d2h: target})
    np.testing.assert_array_equal(target, [1.0, 2.0, 3.0])


# Replication ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("replication", [2, 4])
def test_each_replica_reads_its_own_slice(replication, rng):
    session, x_h2d, y_d2h = _single_io(shape=(3,), replication=replication)
    x = rng.normal(size=(replication, 3)).astype(np.float32)
    with session:
        out = session.run({x_h2d: x})[y_d2h]
    assert out.shape == (replication, 3)
    np.testing.assert_allclose(out, x + 1.0, rtol=1e-6)


@pytest.mark.parametrize("replication", [2, 4])
def test_replicated_multi_transfer_layout(replication, rng):
    session, x_h2d, y_d2h = _repeat_io(
        nht=3, repeat_count=3, shape=(2,), replication=replication, offset=2.0
    )
    x = rng.normal(size=(3, replication, 2)).astype(np.float32)
    with session:
        outputs = session.create_host_outputs()
        assert outputs[y_d2h].shape == (3, replication, 2)
        session.run_with_outputs({x_h2d: x}, outputs)
    np.testing.assert_allclose(outputs[y_d2h], x + 2.0, rtol=1e-6)


@pytest.mark.parametrize("replication", [2, 4])
def test_replicated_program_without_variables_or_inputs(replication):
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        y_d2h = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(y_d2h, popxl.constant(np.array([1.0, 2.0], np.float32)))
    with popxl.Session(ir) as session:
        out = session.run()[y_d2h]
    np.testing.assert_array_equal(out, np.tile([1.0, 2.0], (replication, 1)))


def _replicated_accumulator(replication, grouping=None, data=None, retrieval_mode=None):
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        group = ir.replica_grouping(group_size=grouping) if grouping else None
        w = popxl.variable(
            data, popxl.float32, name="w", replica_grouping=group, retrieval_mode=retrieval_mode
        )
        x_h2d = popxl.h2d_stream(w.shape, popxl.float32, "x")
        w_d2h = popxl.d2h_stream(w.shape, popxl.float32, "w_out")
        ops.host_store(w_d2h, w)
        ops.var_updates.accumulate_(w, ops.host_load(x_h2d))
    return popxl.Session(ir), w, x_h2d, w_d2h


@pytest.mark.parametrize("replication", [2, 4])
def test_ungrouped_variables_are_identical_on_every_replica(replication):
    data = np.array([1.0, 2.0], np.float32)
    session, w, x_h2d, w_d2h = _replicated_accumulator(replication, data=data)
    x = np.ones((replication, 2), np.float32)
    with session:
        out = session.run({x_h2d: x})[w_d2h]
        np.testing.assert_array_equal(out, np.tile(data, (replication, 1)))
        out = session.run({x_h2d: x})[w_d2h]
        np.testing.assert_array_equal(out, np.tile(data + 1, (replication, 1)))
        assert session.get_tensor_data(w).shape == (2,)
    np.testing.assert_array_equal(session.get_tensor_data(w), data + 2)


@pytest.mark.parametrize("replication, group_size", [(2, 1), (4, 1), (4, 2)])
def test_grouped_variables_hold_one_value_per_group(replication, group_size):
    groups = replication // group_size
    data = np.arange(groups * 2, dtype=np.float32).reshape(groups, 2)
    session, w, x_h2d, w_d2h = _replicated_accumulator(replication, group_size, data)
    assignment = w.replica_grouping.assignment
    # Every replica of a group adds the same amount, so the group's replicas stay equal.
    x = np.stack([np.full(2, 10.0 * (g + 1), np.float32) for g in assignment])
    assert session.get_tensor_data(w).shape == (groups, 2)
    with session:
        out = session.run({x_h2d: x})[w_d2h]
        np.testing.assert_array_equal(out, data[assignment])
        np.testing.assert_array_equal(
            session.get_tensor_data(w), data + 10.0 * (np.arange(groups)[:, None] + 1)
        )
        session.write_variable_data(w, np.zeros((groups, 2), np.float32))
        out = session.run({x_h2d: x})[w_d2h]
        np.testing.assert_array_equal(out, 0.0)
    with pytest.raises(ValueError, match="must match the shape"):
        session.write_variable_data(w, np.zeros(2, np.float32))


@pytest.mark.parametrize("replication, group_size", [(2, None), (4, 2)])
def test_all_replicas_retrieval_reads_every_replica(replication, group_size):
    groups = replication // (group_size or replication)
    data = np.arange(groups * 2, dtype=np.float32).reshape(groups, 2)
    session, w, x_h2d, w_d2h = _replicated_accumulator(
        replication, group_size, data if groups > 1 else data[0], retrieval_mode="all_replicas"
    )
    per_replica = data[w.replica_grouping.assignment]
    np.testing.assert_array_equal(session.get_tensor_data(w), per_replica)
    # Replicas of one group diverge: each adds its own input.
    x = np.arange(replication * 2, dtype=np.float32).reshape(replication, 2) * 10.0
    with session:
        session.run({x_h2d: x})
        np.testing.assert_array_equal(session.get_tensor_data(w), per_replica + x)
        with pytest.raises(NotImplementedError, match="all_replicas"):
            session.write_variable_data(w, data if groups > 1 else data[0])
    np.testing.assert_array_equal(session.get_tensor_data(w), per_replica + x)
    with session:
        np.testing.assert_array_equal(session.run({x_h2d: x})[w_d2h], per_replica + x)


# Validation without running (Session._validate_run_inputs / _validate_run_outputs) ------------


@pytest.mark.parametrize(
    "nht, replication, shape, good",
    [
        (2, 1, (2, 4), True),
        (2, 2, (2, 2, 4), True),
        (2, 2, (2, 4), False),
        (32, 4, (32, 4, 4), True),
        (32, 4, (31, 4, 4), False),
    ],
)
def test_validate_run_io_needs_no_attach(nht, replication, shape, good):
    session, x_h2d, y_d2h = _repeat_io(
        nht=nht, repeat_count=nht, shape=(4,), replication=replication
    )
    inputs = {x_h2d: np.zeros(shape, np.float32)}
    outputs = {y_d2h: np.zeros(shape, np.float32)}
    assert not session.is_attached
    if good:
        assert session._validate_run_inputs(inputs) is None
        assert session._validate_run_outputs(outputs) is None
    else:
        with pytest.raises(ValueError, match="input stream x"):
            session._validate_run_inputs(inputs)
        with pytest.raises(ValueError, match="output stream y"):
            session._validate_run_outputs(outputs)
    assert not session.is_attached


def test_validate_run_io_checks_the_stream_sets_and_dtypes():
    session, x_h2d, y_d2h = _single_io()
    with pytest.raises(ValueError, match=r"Unexpected/Missing \."):
        session._validate_run_inputs({})
    with pytest.raises(ValueError, match=r"Unexpected/Missing \."):
        session._validate_run_outputs({})
    with pytest.raises(TypeError, match="has dtype int32, but the stream carries float32"):
        session._validate_run_inputs({x_h2d: np.zeros(2, np.int32)})
    with pytest.raises(TypeError, match="has dtype int32, but the stream carries float32"):
        session._validate_run_outputs({y_d2h: np.zeros(2, np.int32)})


# Synthetic data ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["Zeros", "RandomNormal", "RandomUniform"])
def test_synthetic_data_loads_device_data_and_stores_nothing(mode):
    """``syntheticDataMode``: loads ignore the host's data (zeros, or one fixed set of
    draws, the same every load and run) and stores leave the host buffers at zero."""
    ir = popxl.Ir()
    ir._pb_ir.getSessionOptions().syntheticDataMode = mode
    with ir.main_graph:
        x_h2d = popxl.h2d_stream((4, 50), popxl.float32, "x")
        y_d2h = popxl.d2h_stream((4, 50), popxl.float32, "y")
        seen = popxl.variable(np.zeros((4, 50), np.float32), name="seen")
        x = ops.host_load(x_h2d)
        ops.var_updates.copy_var_update_(seen, x)
        ops.host_store(y_d2h, x + 1.0)
    session = popxl.Session(ir)
    with session:
        out = session.run({x_h2d: np.full((4, 50), 7.0, np.float32)})[y_d2h]
        first = session.get_tensor_data(seen).copy()
        session.run({x_h2d: np.full((4, 50), 9.0, np.float32)})
        second = session.get_tensor_data(seen)
    np.testing.assert_array_equal(out, np.zeros((4, 50), np.float32))
    np.testing.assert_array_equal(first, second)
    if mode == "Zeros":
        np.testing.assert_array_equal(first, 0.0)
    elif mode == "RandomNormal":
        assert abs(first.mean()) < 0.2 and 0.8 < first.std() < 1.2
    else:
        assert first.min() >= -1.0 and first.max() < 1.0 and first.std() > 0.4


def test_synthetic_data_mode_takes_popart_names_and_values_only():
    opts = popxl.Ir()._pb_ir.getSessionOptions()
    opts.syntheticDataMode = 2
    assert opts.syntheticDataMode.name == "RandomNormal"
    with pytest.raises(ValueError, match="expected a SyntheticDataMode"):
        opts.syntheticDataMode = "Random"
