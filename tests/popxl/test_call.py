"""``ops.call``, ``ops.call_with_info`` and ``CallSiteInfo``: connections, index maps, errors."""

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException

F32 = popxl.TensorSpec((2,), popxl.float32)


def _run(ir, *tensors):
    with ir.main_graph:
        streams = []
        for t in tensors:
            d = popxl.d2h_stream(t.shape, t.dtype)
            ops.host_store(d, t)
            streams.append(d)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    return [out[d] for d in streams]


def _add3(a, b, c):
    return a + b + c


def test_call_returns_outputs_named_after_the_graph_outputs():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32))
        g = ir.create_graph(lambda a: (a + 1, a * 2), x)
        outs = ops.call(g, x)
        again = ops.call(g, x)
        none = ops.call(ir.create_graph(lambda a: None, x), x)
    assert isinstance(outs, tuple) and none == ()
    assert [t.name for t in outs] == ["add_out", "mul_out"]
    assert again[0].name.startswith("add_out__t")
    got = _run(ir, *outs)
    np.testing.assert_array_equal(got[0], [2, 3])
    np.testing.assert_array_equal(got[1], [2, 4])


def test_call_print_type():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        g = ir.create_graph(lambda a: a, x)
        ops.call(g, x)
    assert ir.main_graph.ops[0].type == "Call"


def test_positional_inputs_are_flattened_one_level():
    ir = popxl.Ir()
    with ir.main_graph:
        a, b, c = (popxl.variable(np.full(2, k, np.float32)) for k in (1, 2, 4))
        g = ir.create_graph(_add3, a, a, a)
        (nested,) = ops.call(g, a, [b, c])
        (tupled,) = ops.call(g, (a, b), c)
        scalar_g = ir.create_graph(
            lambda p, q: p + q, popxl.TensorSpec((), popxl.int32), popxl.TensorSpec((), popxl.int32)
        )
        (from_array,) = ops.call(scalar_g, np.array([3, 4]))  # arrays expand element-wise too
    got = _run(ir, nested, tupled, from_array)
    np.testing.assert_array_equal(got[0], [7, 7])
    np.testing.assert_array_equal(got[1], [7, 7])
    assert got[2] == 7


def test_inputs_dict_and_mixed_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        a, b, c = (popxl.variable(np.full(2, k, np.float32)) for k in (1, 2, 4))
        g = ir.create_graph(lambda x, y, z: x * y - z, a, a, a)
        x_in, y_in, z_in = g.inputs
        (out,) = ops.call(g, a, inputs_dict={z_in: c, y_in: b})
        info = ops.call_with_info(g, inputs_dict={x_in: a, y_in: a, z_in: a})
    assert info.inputs == (a, a, a)  # the same parent tensor may feed several inputs
    np.testing.assert_array_equal(_run(ir, out)[0], [-2, -2])


def test_python_values_become_constants_of_the_inputs_dtype():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(
            lambda x, y: (x, y),
            popxl.TensorSpec((), popxl.int32),
            popxl.TensorSpec((2,), popxl.float16),
        )
        info = ops.call_with_info(g, 1, inputs_dict={g.inputs[1]: [0.5, 1.5]})
    first, second = info.inputs
    assert isinstance(first, popxl.Constant) and first.dtype is popxl.int32
    assert second.dtype is popxl.float16 and second.graph is ir.main_graph


# Validation errors --------------------------------------------------------------------------------


def test_too_many_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        g = ir.create_graph(lambda a: a, x)
        with pytest.raises(
            ValueError,
            match=re.escape("Too many inputs have been provided to the called graph. ") + ".*2 > 1",
        ):
            ops.call(g, x, x)


def test_parent_tensor_not_in_parent_graph():
    ir = popxl.Ir()
    g = ir.create_graph(lambda a: a, F32)
    other = ir.create_graph(lambda a: a, F32)
    with ir.main_graph:
        with pytest.raises(ValueError, match="is not in parent graph"):
            ops.call(g, other.inputs[0])
        with pytest.raises(ValueError, match="is not in parent graph"):
            ops.call(g, inputs_dict={g.inputs[0]: other.inputs[0]})


def test_inputs_dict_key_not_in_called_graph():
    ir = popxl.Ir()
    g = ir.create_graph(lambda a: a, F32)
    other = ir.create_graph(lambda a: a, F32)
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        for key in (other.inputs[0], x, g.outputs[0] if g.outputs[0] not in g.inputs else x):
            with pytest.raises(ValueError, match="is not in the called graph"):
                ops.call(g, inputs_dict={key: x})


def test_input_specified_twice():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        g = ir.create_graph(lambda a: a, x)
        with pytest.raises(ValueError, match="specified twice"):
            ops.call(g, x, inputs_dict={g.inputs[0]: x})


@pytest.mark.parametrize("value", ["a", None, object()])
def test_uncoercible_values(value):
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda a: a, F32)
        with pytest.raises(TypeError, match='Input at position "0" could not be coerced'):
            ops.call(g, value)
        with pytest.raises(TypeError, match="could not be coerced"):
            ops.call(g, inputs_dict={g.inputs[0]: value})


def test_not_enough_inputs_message():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32), name="x")
        g = ir.create_graph(_add3, x, x, x)
        with pytest.raises(ValueError) as info:
            ops.call(g, x, inputs_dict={g.inputs[2]: x})
    message = str(info.value)
    header = (
        f"Not enough inputs have been provided for the called graph ({g.id}).\n\nMissing inputs:\n"
    )
    assert message.startswith(header)
    missing, connected = message[len(header) :].split("\n\nConnected inputs:\n")
    assert missing.splitlines()[0].split(" | ") == [
        "Index",
        "Graph Tensor".ljust(len(repr(g.inputs[1]))),
    ]
    assert missing.splitlines()[2].startswith("1 ") and repr(g.inputs[1]) in missing
    assert connected.splitlines()[0].startswith("Index | Graph Tensor")
    assert "Parent Graph Tensor" in connected
    assert len(connected.splitlines()) == 4  # header, rule, inputs 0 and 2


def test_shape_and_dtype_mismatch_are_core_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda a: a, F32)
        with pytest.raises(PopXLException, match="does not match"):
            ops.call(g, popxl.variable(np.ones(3, np.float32)))
        with pytest.raises(PopXLException, match="does not match"):
            ops.call(g, popxl.variable(np.ones(2, np.float16)))


def test_graphs_that_cannot_be_called():
    ir = popxl.Ir()
    other_ir = popxl.Ir()
    foreign = other_ir.create_graph(lambda a: a, F32)
    g = ir.create_empty_graph()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        with pytest.raises(TypeError, match="must be a popxl.Graph"):
            ops.call(lambda a: a, x)
        with pytest.raises(ValueError, match="within their own Ir"):
            ops.call(foreign, x)
        with pytest.raises(ValueError, match="main graph cannot be called"):
            ops.call(ir.main_graph)
    with g:
        with pytest.raises(ValueError, match="would recurse"):
            ops.call(g)
    inner = ir.create_empty_graph()
    with inner:
        ops.call(g)
    with g:
        with pytest.raises(ValueError, match="would recurse"):
            ops.call(inner)


# CallSiteInfo ----------------------------------------------------------------------------------------


def test_call_site_info_maps():
    ir = popxl.Ir()
    with ir.main_graph:
        a, b = (
            popxl.variable(np.ones(2, np.float32), name="a"),
            popxl.variable(np.ones(2, np.float32), name="b"),
        )
        g = ir.create_graph(lambda x, y: (x + y, x * y), a, b)
        info = ops.call_with_info(g, a, b)
        unrelated = popxl.variable(1)
    x_in, y_in = g.inputs
    assert info.called_graph is g
    for i in range(2):
        assert info.graph_to_parent_input_index(i) == i == info.parent_to_graph_input_index(i)
        assert info.graph_to_parent_output_index(i) == i == info.parent_to_graph_output_index(i)
    assert info.inputs == (a, b) and len(info.outputs) == 2
    assert info.parent_input(1) is b and info.parent_output(0) is info.outputs[0]
    assert info.graph_to_parent(x_in) is a and info.graph_to_parent(g.outputs[1]) is info.outputs[1]
    assert info.parent_to_graph(b) is y_in
    with pytest.raises(ValueError, match="is not an input or output of the called graph"):
        info.graph_to_parent(unrelated)
    with pytest.raises(ValueError, match="is not a parent graph input of the call site"):
        info.parent_to_graph(unrelated)
    with pytest.raises(IndexError):
        info.parent_input(2)
    with pytest.raises(IndexError):
        info.parent_output(2)


def test_parent_to_graph_finds_the_first_occurrence():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32))
        g = ir.create_graph(lambda x, y: x + y, a, a)
        info = ops.call_with_info(g, a, a)
    assert info.parent_to_graph(a) is g.inputs[0]


def _increment(x):
    ops.var_updates.accumulate_(x, popxl.constant(np.ones(2, np.float32)))


def test_set_parent_input_modified_makes_in_place_writes_visible():
    ir = popxl.Ir()
    with ir.main_graph:
        by_value = popxl.variable(np.ones(2, np.float32), name="by_value")
        by_ref = popxl.variable(np.ones(2, np.float32), name="by_ref")
        g = ir.create_graph(_increment, by_value)
        ops.call(g, by_value)
        info = ops.call_with_info(g, by_ref)
        info.set_parent_input_modified(by_ref)
        with pytest.raises(ValueError):
            info.set_parent_input_modified(by_value)
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
        np.testing.assert_array_equal(session.get_tensor_data(by_value), [1, 1])
        np.testing.assert_array_equal(session.get_tensor_data(by_ref), [2, 2])


def test_copy_var_update_through_call_with_info():
    # The user guide's call_with_info example: x = x + value by reference gives 2.
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(1, popxl.int32, name="x")
        value = popxl.constant(1, popxl.int32)
        g = ir.create_graph(lambda t, v: ops.var_updates.copy_var_update_(t, t + v), x, value)
        info = ops.call_with_info(g, x, value)
        info.set_parent_input_modified(x)
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
        assert session.get_tensor_data(x) == 2


def test_nested_calls_run():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32))
        inner = ir.create_graph(lambda a: a * 3, x)
        outer = ir.create_graph(lambda a: ops.call(inner, a + 1)[0], x)
        (out,) = ops.call(outer, x)
    np.testing.assert_array_equal(_run(ir, out)[0], [6, 9])
