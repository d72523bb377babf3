"""``ops.repeat`` / ``ops.repeat_with_info``: loop semantics, numbers through a Session, errors."""

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException


def _run(ir, *tensors, inputs=None):
    with ir.main_graph:
        streams = []
        for t in tensors:
            d = popxl.d2h_stream(t.shape, t.dtype)
            ops.host_store(d, t)
            streams.append(d)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run(inputs or {})
    return [out[d] for d in streams]


def test_repeat_graph_0_increment():
    # User guide example repeat_graph_0.py: x + value twice from ones gives 3.
    def increment_fn(x: popxl.Tensor, value: popxl.Tensor):
        return x + value

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones([2, 2], np.float32), popxl.float32)
        value = popxl.variable(np.ones(x.shape, x.dtype.as_numpy()), popxl.float32)
        graph = ir.create_graph(increment_fn, x, value)
        (y,) = ops.repeat(graph, 2, x, inputs_dict={graph.inputs[1]: value})
    np.testing.assert_array_equal(_run(ir, y)[0], np.full((2, 2), 3.0))


class Linear(popxl.Module):
    def __init__(self):
        self.W = None
        self.b = None

    def build(self, x, out_features, bias=True):
        self.W = popxl.graph_input((x.shape[-1], out_features), popxl.float32, "W")
        y = x @ self.W
        if bias:
            self.b = popxl.graph_input((out_features,), popxl.float32, "b")
            y = y + self.b
        return y


def test_repeat_graph_1_linear():
    # User guide example repeat_graph_1.py: a Linear module with ones, twice, gives 7.
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones([2, 2], np.float32), popxl.float32)
        W = popxl.variable(np.ones([2, 2], np.float32), popxl.float32)
        b = popxl.variable(np.ones([2], np.float32), popxl.float32)
        linear = Linear()
        graph = ir.create_graph(linear, x, out_features=2)
        (y,) = ops.repeat(graph, 2, x, inputs_dict={linear.W: W, linear.b: b})
    np.testing.assert_array_equal(_run(ir, y)[0], np.full((2, 2), 7.0))


@pytest.mark.parametrize("count", [0, 1, 5])
def test_repeat_add_one_counts(count):
    ir = popxl.Ir()
    with ir.main_graph:
        start = popxl.constant(0, popxl.int32)
        graph = ir.create_graph(lambda x: x + 1, start)
        (y,) = ops.repeat(graph, count, start)
    assert _run(ir, y)[0] == count


def test_repeat_zero_returns_the_initial_values():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([5.0, 6.0], np.float32))
        graph = ir.create_graph(lambda a: a * 10, x)
        (y,) = ops.repeat(graph, 0, x)
    np.testing.assert_array_equal(_run(ir, y)[0], [5.0, 6.0])


def test_non_carried_inputs_keep_their_values():
    def fn(acc, step, scale):
        return acc + step * scale

    ir = popxl.Ir()
    with ir.main_graph:
        acc = popxl.variable(np.zeros(2, np.float32))
        step = popxl.variable(np.ones(2, np.float32))
        scale = popxl.constant(np.full(2, 2.0, np.float32))
        graph = ir.create_graph(fn, acc, step, scale)
        (y,) = ops.repeat(graph, 4, acc, step, scale)
    np.testing.assert_array_equal(_run(ir, y)[0], [8.0, 8.0])


def test_multiple_carried_outputs():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.float32(1.0))
        b = popxl.variable(np.float32(1.0))
        fib = ir.create_graph(lambda x, y: (y, x + y), a, b)
        y0, y1 = ops.repeat(fib, 5, a, b)
    assert _run(ir, y0, y1) == [8.0, 13.0]


def test_by_ref_input_updates_persist_across_iterations():
    def body(x, counter: popxl.TensorByRef):
        counter += popxl.constant(1, popxl.int32)
        return x * 2

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.float32(1.0))
        counter = popxl.variable(0, popxl.int32, name="counter")
        graph = ir.create_graph(body, x, counter)
        (y,) = ops.repeat(graph, 3, x, counter)
    with ir.main_graph:
        d = popxl.d2h_stream((), popxl.float32)
        ops.host_store(d, y)
    with popxl.Session(ir, "ipu_model") as session:
        assert session.run()[d] == 8.0
        assert session.get_tensor_data(counter) == 3


def test_host_io_inside_repeat_runs_once_per_iteration():
    ir = popxl.Ir()
    ir.num_host_transfers = 4
    with ir.main_graph:
        h = popxl.h2d_stream((2,), popxl.float32, "x")
        d = popxl.d2h_stream((2,), popxl.float32, "y")
        total = popxl.variable(np.zeros(2, np.float32), name="total")

        def body(acc):
            x = ops.host_load(h)
            ops.host_store(d, x * 2)
            return acc + x

        graph = ir.create_graph(body, total)
        (out,) = ops.repeat(graph, 4, total)
        sum_stream = popxl.d2h_stream((2,), popxl.float32, "sum")
        ops.host_store(sum_stream, out)
    data = np.arange(8, dtype=np.float32).reshape(4, 2)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run({h: data})
    np.testing.assert_array_equal(result[d], data * 2)
    np.testing.assert_array_equal(result[sum_stream][0], data.sum(0))  # stored once: slot 0


def test_empty_graph_can_be_repeated():
    ir = popxl.Ir()
    empty = ir.create_empty_graph("empty")
    with ir.main_graph:
        assert ops.repeat(empty, 3) == ()
        v = popxl.variable(1)
        out = v + 1
    assert _run(ir, out)[0] == 2


# Structure and errors -------------------------------------------------------------------------------


def test_output_names_are_always_suffixed():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        graph = ir.create_graph(lambda a: a + 1, x)
        (y,) = ops.repeat(graph, 2, x)
        (z,) = ops.repeat(graph, 2, x)
    assert y.name.startswith("add_out__t") and z.name.startswith("add_out__t") and y.name != z.name
    assert ir.main_graph.ops[0].type == "Loop"


def test_negative_repeat_count():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        graph = ir.create_graph(lambda a: a + 1, x)
        expected = f"Repeat count must be >= 0. Repeat count: -1. Graph: {graph.id}"
        with pytest.raises(ValueError, match=re.escape(expected)):
            ops.repeat(graph, -1, x)


def test_more_outputs_than_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        graph = ir.create_graph(lambda a: (a, a + 1), x)
        with pytest.raises(
            ValueError,
            match=r"number of inputs must be greater than or equal to the number of outputs. 1 < 2",
        ):
            ops.repeat(graph, 2, x)


def test_carried_output_must_match_its_input():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        graph = ir.create_graph(lambda a: ops.cast(a, popxl.float16), x)
        with pytest.raises(PopXLException):
            ops.repeat(graph, 2, x)
        graph = ir.create_graph(lambda a: a.reshape((1, 2)), x)
        with pytest.raises(PopXLException):
            ops.repeat(graph, 2, x)


def test_repeat_validates_inputs_like_call():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        graph = ir.create_graph(lambda a, b: a + b, x, x)
        with pytest.raises(ValueError, match="Too many inputs"):
            ops.repeat(graph, 2, x, x, x)
        with pytest.raises(ValueError, match="Not enough inputs"):
            ops.repeat(graph, 2, x)
        with pytest.raises(TypeError, match="could not be coerced"):
            ops.repeat(graph, 2, x, "b")


def test_repeat_with_info_refers_to_the_repeated_graph():
    # Deliberate simplification: no internal loop-wrapper graph with shifted indices.
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        w = popxl.variable(np.ones(2, np.float32))
        graph = ir.create_graph(lambda a, b: a * b, x, w)
        info = ops.repeat_with_info(graph, 3, x, w)
    assert info.called_graph is graph
    assert info.inputs == (x, w)
    assert info.graph_to_parent(graph.inputs[1]) is w
    assert info.graph_to_parent(graph.outputs[0]) is info.outputs[0]
    assert info.parent_to_graph(x) is graph.inputs[0]
