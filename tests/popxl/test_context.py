"""The building context: current graph, name scopes, in_sequence, placement, op hooks."""

import inspect

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.context import get_current_context
from popxl.errors import UndefinedValue


@pytest.mark.parametrize(
    "fn,hint",
    [
        (popxl.gcg, "no graph has been selected. Hint"),
        (popxl.gmg, "no graph has been selected. Hint"),
        (popxl.gir, "no graph has been selected. Hint"),
        (lambda: popxl.constant(1), "no graph has been selected. Hint"),
        (lambda: popxl.h2d_stream((1,), popxl.float32), "no graph has been selected"),
        (lambda: popxl.graph_input((1,), popxl.float32), "no graph has been selected"),
    ],
)
def test_no_graph_selected(fn, hint):
    with pytest.raises(RuntimeError, match=hint):
        fn()


def test_gcg_gmg_gir():
    ir = popxl.Ir()
    sub = ir.create_empty_graph("sub")
    with ir.main_graph:
        assert popxl.gcg() is ir.main_graph
        assert popxl.gmg() is ir.main_graph
        assert popxl.gir() is ir
        with sub:
            assert popxl.gcg() is sub
            assert popxl.gmg() is ir.main_graph
            assert popxl.get_ir() is ir
        assert popxl.get_current_graph() is ir.main_graph


def test_main_graph_need_not_be_at_the_bottom():
    ir = popxl.Ir()
    sub = ir.create_empty_graph()
    with sub, ir.main_graph:
        assert popxl.gcg() is ir.main_graph
        assert popxl.gmg() is ir.main_graph


def test_graph_context_returns_the_graph():
    ir = popxl.Ir()
    with ir.main_graph as g:
        assert g is ir.main_graph


def test_nesting_graphs_of_different_irs():
    ir1, ir2 = popxl.Ir(), popxl.Ir()
    with ir1.main_graph:
        with pytest.raises(RuntimeError, match="previous context's Ir is different"):
            with ir2.main_graph:
                pass
        assert popxl.gcg() is ir1.main_graph
    with ir2.main_graph:  # fine once the first is closed
        assert popxl.gir() is ir2


def test_context_stack_empty_after_exception():
    ir = popxl.Ir()
    with pytest.raises(ZeroDivisionError):
        with ir.main_graph, popxl.name_scope("a"), popxl.ipu(1), popxl.in_sequence():
            1 / 0  # noqa: B018
    assert get_current_context().is_empty()


# name_scope ---------------------------------------------------------------------------


def test_name_scope_yields_scopes_and_prefixes_ids():
    ir = popxl.Ir()
    with ir.main_graph:
        with popxl.name_scope("foo") as scopes:
            assert scopes == ["foo"]
            v = popxl.variable(1, name="bar")
            with popxl.name_scope("baz") as inner:
                assert inner == ["foo", "baz"]
                c = popxl.constant(1, name="c")
                out = v + c
        after = popxl.variable(1, name="bar")
    assert v.name == v.id == "foo/bar"
    assert c.id == "foo/baz/c"
    assert out.id == "foo/baz/add_out"
    assert after.id == "bar"


def test_name_scope_in_subgraph_keeps_graph_prefix():
    ir = popxl.Ir()
    with ir.main_graph, popxl.name_scope("layer"):
        g = ir.create_graph(lambda x: x + 1, popxl.TensorSpec((2,), popxl.float32))
    x = g.inputs[0]
    graph_id = "test_name_scope_in_subgraph_keeps_graph_prefix.<lambda>_subgraph(0)"
    assert x.id == graph_id + "/layer/x"
    assert x.name == "layer/x"
    assert x.scope == graph_id
    assert g.outputs[0].name == "layer/add_out"


# in_sequence --------------------------------------------------------------------------


def test_in_sequence_context_manager_records_mode():
    ctx = get_current_context()
    with popxl.in_sequence():
        assert ctx.in_sequence_stack == [True]
        with popxl.in_sequence(False):
            assert ctx.in_sequence_stack == [True, False]
            with popxl.in_sequence("pass"):
                assert ctx.in_sequence_stack[-1] == "pass"
    assert ctx.in_sequence_stack == []


def test_in_sequence_as_decorator():
    @popxl.in_sequence()
    def build():
        return list(get_current_context().in_sequence_stack)

    assert build() == [True]
    assert build() == [True]  # reusable
    assert get_current_context().in_sequence_stack == []


def test_in_sequence_none_is_a_type_error():
    with pytest.raises(TypeError, match="None.*cannot be passed to.*in_sequence.*Try.*False"):
        with popxl.in_sequence(None):
            pass


def test_in_sequence_bad_mode():
    with pytest.raises(ValueError):
        with popxl.in_sequence("always"):
            pass


def test_in_sequence_runs_in_creation_order():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(np.zeros(2, np.float32), name="w")
        d = popxl.d2h_stream((2,), popxl.float32, "d")
        ops.var_updates.accumulate_(w, popxl.constant(np.ones(2, np.float32)))
        ops.host_store(d, w)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[d], [1.0, 1.0])


# ipu / io_tiles placement -------------------------------------------------------------


def test_ipu_context_yields_and_places_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        with popxl.ipu(1) as n:
            assert n == 1
            y = v + 1
        z = v * 2
    assert y.ipu == 1
    assert z.ipu == 0
    assert y.tile_set == "compute"
    assert ir.main_graph.ops[-2].ipu == 1


def test_fresh_variable_placement_is_undefined():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(1)
        c = popxl.constant(1)
        for t in (v, c):
            with pytest.raises(UndefinedValue):
                _ = t.ipu
            with pytest.raises(UndefinedValue):
                _ = t.tile_set
        _ = v + 0
    assert v.ipu == 0  # inferred from its consumer
    assert v.tile_set == "compute"


def test_io_tiles_places_ops_on_io_tiles():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        with popxl.io_tiles():
            y = v + 1
        z = v + 2
    assert y.tile_set == "io"
    assert z.tile_set == "compute"


def test_io_tile_copy_output_on_the_ops_tile_set():
    # The copy's output lives on the tile set of the op, its input on the other one.
    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.h2d_stream((2,), popxl.float32)
        with popxl.io_tiles():
            x = ops.host_load(h)
            x_io = ops.io_tile_copy(popxl.variable(np.ones(2, np.float32), name="w"))
        x_compute = ops.io_tile_copy(x)
    assert x.tile_set == "io"
    assert x_compute.tile_set == "compute"
    assert x_io.tile_set == "io"
    w = ir.main_graph.get_tensor("w")
    assert w.tile_set == "compute"  # the input of a copy to the IO tiles


def test_ipu_copy_placement():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32), name="v")
        y = v.copy_to_ipu(1, 0)
        assert y.id == "v_c1"
    assert y.ipu == 1
    assert v.ipu == 0  # the copy's source


def test_graph_input_placement_from_call_site():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        g = ir.create_graph(lambda x: x * 2, v)
        with popxl.ipu(1):
            y = v + 1
        ops.call(g, y)
    assert g.inputs[0].ipu == 1


def test_ops_on_different_ipus_are_rejected():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        with popxl.ipu(0):
            a = v + 1
        with popxl.ipu(1):
            b = v + 2
        with pytest.raises(ValueError, match="different IPUs"):
            _ = a + b


# op-created hooks -----------------------------------------------------------------------


def test_op_created_hooks():
    ir = popxl.Ir()
    main = ir.main_graph
    seen = []
    with main:
        v = popxl.variable(np.ones(2, np.float32))
        handle = main.register_op_created_hook(seen.append)
        other = main.register_op_created_hook(lambda op: None)
        assert handle != other
        y = v + 1
        z = ops.relu(y)
        main.remove_op_created_hook(handle)
        _ = z * 2
    assert [op.type for op in seen] == ["Add", "Relu"]
    assert seen[0].outputs == (y,)
    with pytest.raises(ValueError):
        main.remove_op_created_hook(handle)


def test_hooks_are_per_graph():
    ir = popxl.Ir()
    seen = []
    sub = ir.create_empty_graph()
    sub.register_op_created_hook(seen.append)
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        _ = v + 1
    with sub:
        x = popxl.graph_input((2,), popxl.float32)
        _ = x + 1
    assert len(seen) == 1 and seen[0].graph is sub


def test_ops_on_different_tile_sets_are_rejected():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        with popxl.io_tiles():
            a = v + 1
        b = v + 2
        with pytest.raises(ValueError, match="different tile sets"):
            _ = a + b


def test_op_inputs_must_be_tensors_of_the_current_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(TypeError, match="is not a Tensor"):
            ops.relu(np.ones(2, np.float32))
    g = ir.create_graph(lambda x: x, popxl.TensorSpec((2,), popxl.float32))
    with ir.main_graph:
        with pytest.raises(ValueError, match="The input tensor `t` is not in the current Graph"):
            ops.relu(g.inputs[0])


def test_ops_record_the_users_source_location():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        line = inspect.currentframe().f_lineno + 1
        y = ops.relu(v)
    assert y._producer.location == (__file__, line)
    assert y._producer.scope == ()


def test_source_location_helpers():
    from popxl.context import debug_context_frame_offset, get_source_location, op_debug_context

    def where():
        return get_source_location()

    def caller_of_where():
        with debug_context_frame_offset(1):
            return where()

    # The location of the frame that called get_source_location, one frame further out
    # per debug_context_frame_offset.
    assert where() == (__file__, inspect.getsourcelines(where)[1] + 1)
    assert caller_of_where() == (__file__, inspect.getsourcelines(caller_of_where)[1] + 2)

    @op_debug_context
    def double(x):
        return 2 * x

    @op_debug_context("named")
    def triple(x):
        return 3 * x

    assert (double(2), triple(2), double.__name__) == (4, 6, "double")
