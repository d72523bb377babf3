"""BoundGraph and GraphWithNamedArgs (reference 1.5, 6.5, 6.6)."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.graph import BoundGraph, GraphWithNamedArgs
from popxl_addons.named_tensors import NamedTensors

F32 = popxl.float32


class Affine(addons.Module):
    """y = x * a + b with variables a = [2, 3] and b = [10, 20]."""

    def build(self, x):
        a = self.add_variable_input("a", lambda: np.array([2.0, 3.0], np.float32))
        b = self.add_variable_input("b", lambda: np.array([10.0, 20.0], np.float32))
        return x * a + b


def _stores(*tensors):
    streams = []
    for t in tensors:
        s = popxl.d2h_stream(t.shape, t.dtype)
        ops.host_store(s, t)
        streams.append(s)
    return streams


def _run(ir, streams):
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    return [out[s] for s in streams]


def _setup():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Affine().create_graph(popxl.TensorSpec((2,), F32))
        variables = facts.init()
    return ir, facts, graph, variables


# BoundGraph --------------------------------------------------------------------------------


def test_bound_graph_call_returns_a_tuple_and_computes():
    ir, _, graph, variables = _setup()
    with ir.main_graph:
        bound = graph.bind(variables)
        assert isinstance(bound, BoundGraph)
        assert bound.args == {graph.args.a: variables.a, graph.args.b: variables.b}
        out = bound.call(popxl.variable(np.array([1.0, 2.0], np.float32)))
        assert isinstance(out, tuple) and len(out) == 1
        streams = _stores(*out)
    np.testing.assert_allclose(_run(ir, streams)[0], [12.0, 26.0])


def test_python_numbers_become_constants():
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_graph(lambda x: x + 1.0, popxl.TensorSpec((), popxl.int32))
        out = BoundGraph(graph).call(4)
        streams = _stores(*out)
    assert _run(ir, streams)[0] == 5


def test_call_time_args_override_bound_args():
    ir, _, graph, variables = _setup()
    with ir.main_graph:
        other_b = popxl.variable(np.array([-1.0, -1.0], np.float32), name="other_b")
        bound = graph.bind(variables)
        x = popxl.variable(np.array([1.0, 1.0], np.float32))
        (y1,) = bound.call(x, args={graph.args.b: other_b})
        (y2,) = bound.call(x)
        streams = _stores(y1, y2)
    y1, y2 = _run(ir, streams)
    np.testing.assert_allclose(y1, [1.0, 2.0])
    np.testing.assert_allclose(y2, [12.0, 23.0])  # the bound args are unchanged


def test_bind_merges_and_new_bindings_win():
    ir, _, graph, variables = _setup()
    with ir.main_graph:
        other_b = popxl.variable(np.array([0.0, 0.0], np.float32), name="other_b")
        first = graph.bind(variables)
        second = first.bind({graph.args.b: other_b})
        assert second is not first and second.graph is first.graph
        assert first.args[graph.args.b] is variables.b
        assert second.args == {graph.args.a: variables.a, graph.args.b: other_b}
        streams = _stores(*second.call(popxl.variable(np.array([1.0, 1.0], np.float32))))
    np.testing.assert_allclose(_run(ir, streams)[0], [2.0, 3.0])


def test_call_with_info_gives_the_call_site():
    ir, _, graph, variables = _setup()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")
        info = graph.bind(variables).call_with_info(x)
        assert info.called_graph is graph.graph
        assert info.graph_to_parent(graph.graph.inputs[0]) is x
        assert info.graph_to_parent(graph.args.a) is variables.a
        assert info.graph_to_parent(graph.graph.outputs[0]) is info.outputs[0]
        streams = _stores(*info.outputs)
    np.testing.assert_allclose(_run(ir, streams)[0], [12.0, 26.0])


def test_subgraph_io_map_maps_inputs_args_and_outputs():
    ir, _, graph, variables = _setup()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")
        bound = graph.bind(variables)
        outs = bound.call(x)
        io = bound.subgraph_io_map(x, outs=outs)
    g = graph.graph
    assert io == {
        g.inputs[0]: x,
        graph.args.a: variables.a,
        graph.args.b: variables.b,
        g.outputs[0]: outs[0],
    }
    assert bound.subgraph_io_map(x) == {
        g.inputs[0]: x,
        graph.args.a: variables.a,
        graph.args.b: variables.b,
    }


def test_bound_graph_requires_every_input_to_be_connected():
    ir, _, graph, variables = _setup()
    with ir.main_graph:
        with pytest.raises(ValueError):
            graph.bind(variables.filter_keys(["a"])).call(popxl.variable(np.zeros(2, np.float32)))


# GraphWithNamedArgs --------------------------------------------------------------------------


def test_bind_ignores_unknown_keys():
    ir, _, graph, variables = _setup()
    with ir.main_graph:
        extra = NamedTensors.from_dict(
            {
                **variables.to_dict(),
                "unused": popxl.variable(np.zeros(1, np.float32), name="unused"),
            }
        )
        bound = graph.bind(extra)
        assert set(bound.args) == {graph.args.a, graph.args.b}
        assert graph.bind().args == {} and graph.bind(None).args == {}
        streams = _stores(*bound.call(popxl.variable(np.array([0.0, 1.0], np.float32))))
    np.testing.assert_allclose(_run(ir, streams)[0], [10.0, 23.0])


def test_call_without_bound_args_takes_them_from_args_keyword():
    ir, _, graph, variables = _setup()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 1.0], np.float32))
        (y,) = graph.call(x, args=graph.args.to_mapping(variables))
        info = graph.call_with_info(x, args=graph.args.to_mapping(variables))
        streams = _stores(y, *info.outputs)
    y, y2 = _run(ir, streams)
    np.testing.assert_allclose(y, [12.0, 23.0])
    np.testing.assert_allclose(y2, y)


def test_defaults_and_grad_graph_info_property():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x: x * 2.0, popxl.TensorSpec((2,), F32))
    gwna = GraphWithNamedArgs(g)
    assert isinstance(gwna.args, NamedTensors) and gwna.args.to_dict() == {}
    assert gwna.called_graphs_grad_info == {} and not gwna.autodiff_applied
    with pytest.raises(AttributeError, match="Not a gradient graph."):
        _ = gwna.grad_graph_info
    grad = addons.autodiff(gwna)
    gwna.grad_graph_info = grad.grad_graph_info
    assert gwna.grad_graph_info is grad.grad_graph_info
    wrapped = GraphWithNamedArgs.from_grad_graph(grad.grad_graph_info, NamedTensors())
    assert wrapped.graph is grad.grad_graph_info.graph
    assert wrapped.grad_graph_info is grad.grad_graph_info


def test_autodiff_twice_raises_unless_forced():
    ir, _, graph, _ = _setup()
    with ir.main_graph:
        first = graph.autodiff()
        assert graph.autodiff_applied
        with pytest.raises(RuntimeError, match="force=True"):
            graph.autodiff()
        second = graph.autodiff(force=True)
    assert second.graph is not first.graph


def test_the_free_autodiff_has_no_twice_guard():
    ir, _, graph, _ = _setup()
    with ir.main_graph:
        a = addons.autodiff(graph)
        b = addons.autodiff(graph)
    assert a.graph is not b.graph and not graph.autodiff_applied


def test_autodiff_method_is_validated():
    ir, _, graph, _ = _setup()
    with ir.main_graph, pytest.raises(ValueError, match="method"):
        graph.autodiff(method="numeric")
    assert not graph.autodiff_applied


def test_autodiff_method_gives_grads_of_all_inputs_in_input_order():
    ir, _, graph, variables = _setup()
    x_data = np.array([1.0, 2.0], np.float32)
    dy = np.array([1.0, -1.0], np.float32)
    with ir.main_graph:
        info = graph.bind(variables).call_with_info(popxl.variable(x_data))
        grad = graph.autodiff(method="autodiff")
        assert grad.grad_graph_info.outputs == graph.graph.inputs
        grads = grad.call(popxl.constant(dy), args=grad.grad_graph_info.inputs_dict(info))
        streams = _stores(*grads)
    dx, da, db = _run(ir, streams)
    np.testing.assert_allclose(dx, dy * [2.0, 3.0])
    np.testing.assert_allclose(da, dy * x_data)
    np.testing.assert_allclose(db, dy)


def test_copy_is_shallow_and_drops_module_info():
    ir, _, graph, _ = _setup()
    with ir.main_graph:
        grad = graph.autodiff()
    c = grad.copy()
    assert c.graph is grad.graph and c.grad_graph_info is grad.grad_graph_info
    assert c.args is not grad.args
    fwd_copy = graph.copy()
    assert fwd_copy.from_module is None and fwd_copy.called_graphs_grad_info == {}
    assert fwd_copy.args.to_dict() == graph.args.to_dict() and fwd_copy.args is not graph.args


def test_print_schedule_names_args_by_key():
    ir, _, graph, _ = _setup()
    expected = (
        "Graph : Affine_subgraph(0)\n"
        "  (%1, a=%2, b=%3) -> (%5) {\n"
        "    Mul.100 (%1 [(2,) float32], %2 [(2,) float32]) -> (%4 [(2,) float32])\n"
        "    Add.101 (%4 [(2,) float32], %3 [(2,) float32]) -> (%5 [(2,) float32])\n"
        "  }"
    )
    assert graph.print_schedule() == expected


def test_print_schedule_of_a_graph_without_outputs_and_with_calls():
    ir = popxl.Ir()
    with ir.main_graph:
        inner = ir.create_graph(lambda x: x + 1.0, popxl.TensorSpec((), F32))

        def outer(x):
            ops.call(inner, x)

        g = ir.create_graph(outer, popxl.TensorSpec((), F32))
    text = GraphWithNamedArgs(g).print_schedule()
    lines = text.splitlines()
    assert lines[0] == f"Graph : {g.name}"
    assert lines[1] == "  (%1) -> () {"
    assert lines[2] == f"    Call.101({inner.name}) (%1 [() float32]) -> (%2 [() float32])"
    assert lines[3] == "  }"
