"""Programs in the style of the PopXL user guide, run end to end through a Session."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms


def test_simple_addition_with_run_and_run_with_outputs():
    ir = popxl.Ir()
    with ir.main_graph:
        a_stream = popxl.h2d_stream([1], popxl.float32, name="input0_stream")
        b_stream = popxl.h2d_stream([1], popxl.float32, name="input1_stream")
        a, b = ops.host_load(a_stream, "a"), ops.host_load(b_stream, "b")
        out_stream = popxl.d2h_stream([1], popxl.float32, name="output_stream")
        ops.host_store(out_stream, ops.add(a, b))
    inputs = {a_stream: np.array([1.0], np.float32), b_stream: np.array([2.0], np.float32)}
    session = popxl.Session(ir, "ipu_model")
    with session:
        assert session.run(inputs)[out_stream] == pytest.approx([3.0])
    outputs = {out_stream: np.empty([1], np.float32)}
    with session:
        session.run_with_outputs(inputs, outputs)
    assert outputs[out_stream] == pytest.approx([3.0])


def test_tensor_addition_of_a_variable_and_a_constant():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(3, dtype=popxl.int8, name="variable_a")
        b = popxl.constant(1, dtype=popxl.int8, name="constant_b")
        out = popxl.d2h_stream(a.shape, a.dtype)
        ops.host_store(out, a + b)
    ir.num_host_transfers = 1
    with popxl.Session(ir, "ipu_model") as session:
        assert session.run()[out] == 4
        assert session.get_tensor_data(b) == 1


def test_basic_graph_and_graphs_from_one_function():
    def increment(x, value):
        return x + value

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 2), np.float32), name="x")
        v = popxl.variable(np.ones(2, np.float32), name="v")
        g_matrix = ir.create_graph(increment, x, x)
        g_vector = ir.create_graph(increment, v, v)
        (y,) = ops.call(g_matrix, x, x)
        (z,) = ops.call(g_vector, v, popxl.constant(np.full(2, 2.0, np.float32)))
        outs = [popxl.d2h_stream(t.shape, t.dtype) for t in (y, z)]
        for s, t in zip(outs, (y, z)):
            ops.host_store(s, t)
    assert g_matrix.inputs[0].shape == (2, 2) and g_vector.inputs[0].shape == (2,)
    with popxl.Session(ir) as session:
        result = session.run()
    np.testing.assert_array_equal(result[outs[0]], np.full((2, 2), 2.0))
    np.testing.assert_array_equal(result[outs[1]], np.full(2, 3.0))


class Linear(popxl.Module):
    def __init__(self):
        self.W = None
        self.b = None

    def build(self, x, out_features: int, bias: bool = True):
        self.W = popxl.graph_input((x.shape[-1], out_features), popxl.float32, "W")
        y = x @ self.W
        if bias:
            self.b = popxl.graph_input((out_features,), popxl.float32, "b")
            y = y + self.b
        return y


def test_graph_inputs_in_build_and_inputs_dict_for_two_call_sites():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((1, 4), np.float32), name="x")
        w1 = popxl.variable(np.full((4, 4), 1.0, np.float32), name="w1")
        b1 = popxl.variable(np.zeros(4, np.float32), name="b1")
        w2 = popxl.variable(np.full((4, 4), 2.0, np.float32), name="w2")
        b2 = popxl.variable(np.ones(4, np.float32), name="b2")
        linear = Linear()
        graph = ir.create_graph(linear, x, out_features=4)
        (y,) = ops.call(graph, x, inputs_dict={linear.W: w1, linear.b: b1})
        (z,) = ops.call(graph, y, inputs_dict={linear.W: w2, linear.b: b2})
        out = popxl.d2h_stream(z.shape, z.dtype)
        ops.host_store(out, z)
    with popxl.Session(ir) as session:
        np.testing.assert_array_equal(session.run()[out], np.full((1, 4), 4 * 4 * 2 + 1.0))


def test_call_with_info_and_set_parent_input_modified():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(1, popxl.int32, name="x")

        def add_in_place(t: popxl.Tensor, value: popxl.Tensor):
            ops.var_updates.copy_var_update_(t, t + value)

        graph = ir.create_graph(add_in_place, x, x)
        ops.call(graph, x, 1)  # by value: x unchanged
        info = ops.call_with_info(graph, x, 1)
        info.set_parent_input_modified(x)
        out = popxl.d2h_stream(x.shape, x.dtype)
        ops.host_store(out, x)
    with popxl.Session(ir) as session:
        assert session.run()[out] == 2
    assert session.get_tensor_data(x) == 2


def test_repeat_with_loop_carried_value_and_constant_input():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(1, popxl.int32, name="x")
        value = popxl.constant(1, popxl.int32, name="value")
        graph = ir.create_graph(lambda x, value: x + value, x, value)
        (y,) = ops.repeat(graph, 2, x, value)
        out = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(out, y)
    with popxl.Session(ir) as session:
        assert session.run()[out] == 3


def test_repeat_of_a_module_with_inputs_dict():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 2), np.float32), name="x")
        w = popxl.variable(np.ones((2, 2), np.float32), name="W")
        b = popxl.variable(np.ones(2, np.float32), name="b")
        linear = Linear()
        graph = ir.create_graph(linear, x, out_features=2)
        (y,) = ops.repeat(graph, 2, x, inputs_dict={linear.W: w, linear.b: b})
        out = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(out, y)
    with popxl.Session(ir) as session:
        np.testing.assert_array_equal(session.run()[out], np.full((2, 2), 7.0))


def test_host_io_inside_a_repeated_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        in_stream = popxl.h2d_stream((2, 2), popxl.float32, "in")
        out_stream = popxl.d2h_stream((2, 2), popxl.float32, "out")
        w = popxl.variable(np.full((2, 2), 2.0, np.float32), name="w")

        def body(weight):
            x = ops.host_load(in_stream, "x")
            ops.host_store(out_stream, x * weight)

        graph = ir.create_graph(body, w)
        ops.repeat(graph, 8, w)
    ir.num_host_transfers = 8
    data = np.arange(32, dtype=np.float32).reshape(8, 2, 2)
    with popxl.Session(ir) as session:
        result = session.run({in_stream: data})[out_stream]
    np.testing.assert_array_equal(result, data * 2)


def test_in_sequence_orders_an_update_before_a_store():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(1, popxl.int32, name="x")
        ops.var_updates.copy_var_update_(x, popxl.constant(5, popxl.int32))
        out = popxl.d2h_stream(x.shape, x.dtype)
        ops.host_store(out, x)
    with popxl.Session(ir) as session:
        assert session.run()[out] == 5


def test_variables_read_and_written_through_the_session():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.array([1.0, 2.0], np.float32), name="a")
        ops.var_updates.accumulate_(a, popxl.constant(np.array([1.0, 1.0], np.float32)))
    session = popxl.Session(ir, "ipu_model")
    np.testing.assert_array_equal(session.get_tensor_data(a), [1.0, 2.0])
    session.write_variable_data(a, np.array([10.0, 20.0], np.float32))  # detached: host only
    with session:
        session.run()
        np.testing.assert_array_equal(session.get_tensor_data(a), [11.0, 21.0])
        session.write_variable_data(a, np.array([0.0, 0.0], np.float32))  # attached: device too
        session.run()
    np.testing.assert_array_equal(session.get_tensor_data(a), [1.0, 1.0])


def test_nested_session_contexts_transfer_only_at_the_outermost():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros(1, np.float32), name="a")
        ops.var_updates.accumulate_(a, popxl.constant(np.ones(1, np.float32)))
    session = popxl.Session(ir)
    with session:
        assert session.is_attached
        with session:
            session.run()
        assert session.is_attached
        session.run()
    assert not session.is_attached
    np.testing.assert_array_equal(session.get_tensor_data(a), [2.0])


def test_autodiff_of_a_linear_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 2), np.float32), name="x")
        w = popxl.variable(np.full((2, 2), 2.0, np.float32), name="W")
        b = popxl.variable(np.zeros(2, np.float32), name="b")
        linear = Linear()
        graph = ir.create_graph(linear, x, out_features=2)
        fwd = ops.call_with_info(graph, x, inputs_dict={linear.W: w, linear.b: b})
        grad = transforms.autodiff(graph)
        seed = popxl.constant(np.ones((2, 2), np.float32))
        dx, dw, db = ops.call(grad.graph, seed, inputs_dict=grad.inputs_dict(fwd))
        streams = [popxl.d2h_stream(t.shape, t.dtype) for t in (dx, dw, db)]
        for s, t in zip(streams, (dx, dw, db)):
            ops.host_store(s, t)
    with popxl.Session(ir) as session:
        result = session.run()
    np.testing.assert_array_equal(result[streams[0]], np.ones((2, 2)) @ np.full((2, 2), 2.0).T)
    np.testing.assert_array_equal(result[streams[1]], np.ones((2, 2)).T @ np.ones((2, 2)))
    np.testing.assert_array_equal(result[streams[2]], [2.0, 2.0])


def test_conditional_on_a_streamed_boolean():
    ir = popxl.Ir()
    with ir.main_graph:
        cond_stream = popxl.h2d_stream((1,), popxl.bool, "cond")
        cond = ops.host_load(cond_stream)
        x = popxl.variable(np.float32(3.0), name="x")
        double = ir.create_graph(lambda t: t * 2.0, x)
        negate = ir.create_graph(lambda t: -t, x)
        (y,) = ops.conditional(cond, double, negate, then_inputs=[x], else_inputs=[x])
        out = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(out, y)
    with popxl.Session(ir) as session:
        assert session.run({cond_stream: np.array(True)})[out] == 6.0
        assert session.run({cond_stream: np.array([False])})[out] == -3.0
