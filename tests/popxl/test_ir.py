"""``Ir``: identity, settings, graph naming and ``create_graph``."""

from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops

F32 = popxl.TensorSpec((2,), popxl.float32)


def test_ir_identity_repr_and_equality():
    a, b = popxl.Ir(), popxl.Ir()
    assert a.id != b.id
    assert repr(a) == f"Ir[id={a.id}]"
    assert a == a and a != b
    assert hash(a) == hash(a.id)
    with pytest.raises(TypeError):
        _ = a == 1


def test_main_graph():
    ir = popxl.Ir()
    main = ir.main_graph
    assert main is ir.main_graph
    assert main.id == "" and main.name == ""
    assert main.ir is ir
    assert main.main_graph is main


def test_settings_defaults_and_validation():
    ir = popxl.Ir()
    assert ir.num_host_transfers == 1
    assert ir.replication_factor == 1 == ir.instance_replication_factor
    ir.num_host_transfers = 8
    assert ir.num_host_transfers == 8
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            ir.num_host_transfers = bad
    ir4 = popxl.Ir(replication=4)
    assert ir4.replication_factor == 4 == ir4.instance_replication_factor
    ir4.replication_factor = 2
    assert ir4.replication_factor == 2
    with pytest.raises(ValueError):
        popxl.Ir(replication=0)


def test_replication_factor_fixed_once_a_session_exists():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(1)
        d = popxl.d2h_stream((), popxl.int32)
        ops.host_store(d, v + 1)
    _session = popxl.Session(ir, "ipu_model")
    with pytest.raises(RuntimeError, match="replication factor"):
        ir.replication_factor = 2


def test_graph_ids_share_an_ir_wide_counter():
    ir = popxl.Ir()

    def linear(x):
        return x + 1

    with ir.main_graph:
        g0 = ir.create_graph(linear, F32)
        g1 = ir.create_empty_graph()
        g2 = ir.create_empty_graph("body")
        g3 = ir.create_graph(linear, F32)
    assert g0.id == "test_graph_ids_share_an_ir_wide_counter.linear_subgraph(0)"
    assert g1.id == "graph_subgraph(1)"
    assert g2.id == "body_subgraph(2)"
    assert g3.id.endswith("linear_subgraph(3)")
    assert g0 != g3  # every create_graph makes a new graph
    other = popxl.Ir()
    assert other.create_empty_graph().id == "graph_subgraph(0)"


def test_graph_id_from_module_and_methods():
    class Linear(popxl.Module):
        def build(self, x):
            return x

    class Holder:
        def method(self, x):
            return x

    ir = popxl.Ir()
    assert (
        ir.create_graph(Linear(), F32).id
        == "test_graph_id_from_module_and_methods.Linear_subgraph(0)"
    )
    assert ir.create_graph(Holder().method, F32).id == (
        "test_graph_id_from_module_and_methods.Holder.method_subgraph(1)"
    )


def test_create_graph_needs_no_enclosing_context():
    ir = popxl.Ir()
    g = ir.create_graph(lambda x: x * 2, F32)
    assert len(g.inputs) == 1 and len(g.outputs) == 1


def test_create_graph_bad_callable():
    ir = popxl.Ir()
    with pytest.raises(
        TypeError, match="must be either a function or a class that extends popxl.Module"
    ):
        ir.create_graph(3)


def test_module_base_build_is_abstract():
    with pytest.raises(NotImplementedError):
        popxl.Module().build()

    class Twice(popxl.Module):
        def build(self, x):
            return x * 2

    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        out = Twice()(v)  # __call__ runs build inline
    assert out.graph is ir.main_graph


# Parameters -> inputs -------------------------------------------------------------------


def test_tensor_and_spec_params_become_named_inputs():
    ir = popxl.Ir()
    seen = {}

    def fn(x, w, scale=3):
        seen["args"] = (x, w, scale)
        return x @ w

    with ir.main_graph:
        w = popxl.variable(np.ones((4, 5), np.float16), name="weights")
        g = ir.create_graph(fn, popxl.TensorSpec((2, 4), popxl.float16), w)
    x_in, w_in = g.inputs
    assert [t.name for t in g.inputs] == ["x", "w"]
    assert (x_in.shape, x_in.dtype, w_in.shape) == ((2, 4), popxl.float16, (4, 5))
    assert seen["args"] == (x_in, w_in, 3)
    assert g.outputs[0].shape == (2, 5)
    assert w.graph is ir.main_graph  # the template is untouched


def test_meta_shape_is_taken_from_the_template():
    ir = popxl.Ir()
    g = ir.create_graph(lambda x: x, popxl.TensorSpec((2,), popxl.float32, (4,)))
    assert g.inputs[0].meta_shape == (4,)


def test_var_args_and_kwargs():
    ir = popxl.Ir()

    def fn(a, *args, k=None, **kwargs):
        assert isinstance(args, tuple)
        return [a, *args, k, *kwargs.values()]

    g = ir.create_graph(fn, F32, F32, F32, k=F32, extra=F32, other=F32)
    assert [t.name for t in g.inputs] == ["a", "args_0", "args_1", "k", "extra", "other"]
    assert len(g.outputs) == 6


def test_list_param_receives_a_list_of_inputs():
    ir = popxl.Ir()
    received = {}

    def fn(xs, ys):
        received["xs"], received["ys"] = xs, ys
        return xs[0] + xs[1]

    g = ir.create_graph(fn, [F32, F32], (F32,))
    assert [t.name for t in g.inputs] == ["xs_0", "xs_1", "ys_0"]
    assert isinstance(received["xs"], list) and isinstance(received["ys"], list)
    assert received["xs"] == list(g.inputs[:2])


def test_non_tensor_values_pass_through():
    ir = popxl.Ir()
    received = {}
    sub = ir.create_empty_graph()

    def fn(x, n, flag, graph, table, items):
        received.update(n=n, flag=flag, graph=graph, table=table, items=items)
        return x

    g = ir.create_graph(fn, F32, 3, True, sub, {"a": F32}, [1, 2])
    assert len(g.inputs) == 1
    assert received == {"n": 3, "flag": True, "graph": sub, "table": {"a": F32}, "items": [1, 2]}


@pytest.mark.parametrize(
    "fn,args,kind",
    [
        (lambda xs: None, ([F32, 1],), "list"),
        (lambda xs: None, ((F32, "a"),), "tuple"),
        (lambda *args: None, (F32, 1), "tuple"),
        (lambda **kw: None, None, "dict"),
    ],
)
def test_mixed_containers_are_type_errors(fn, args, kind):
    ir = popxl.Ir()
    with pytest.raises(TypeError, match=f"A {kind} argument can't contain a mixture of Tensors"):
        if args is None:
            ir.create_graph(fn, a=F32, b=2)
        else:
            ir.create_graph(fn, *args)


@pytest.mark.parametrize("args,kwargs", [((), {}), ((F32, F32), {}), ((F32,), {"y": F32})])
def test_arity_mismatch_is_a_value_error(args, kwargs):
    ir = popxl.Ir()
    with pytest.raises(ValueError, match="do not match the signature of the function"):
        ir.create_graph(lambda x: x, *args, **kwargs)


def test_graph_input_inside_fn_comes_after_params():
    ir = popxl.Ir()

    def fn(x, y):
        w = popxl.graph_input((2,), popxl.float32, "w")
        b = popxl.graph_input((2,), popxl.float32, "b", by_ref=True)
        return x + y + w + b

    g = ir.create_graph(fn, F32, F32)
    assert [t.name for t in g.inputs] == ["x", "y", "w", "b"]
    assert g._by_ref_inputs == {g.inputs[3]}


def test_module_instance_graph_inputs_stay_on_the_module():
    class Linear(popxl.Module):
        def build(self, x):
            self.W = popxl.graph_input((x.shape[-1], 3), x.dtype, "W")
            return x @ self.W

    ir = popxl.Ir()
    linear = Linear()
    g1 = ir.create_graph(linear, popxl.TensorSpec((2, 4), popxl.float32))
    assert linear.W is g1.inputs[1] and linear.W.name == "W"
    g2 = ir.create_graph(linear, popxl.TensorSpec((2, 4), popxl.float32))
    assert linear.W is g2.inputs[1]  # rebuilding overwrites the attribute


# Outputs --------------------------------------------------------------------------------


def test_outputs_none_tensor_or_iterable():
    ir = popxl.Ir()
    assert ir.create_graph(lambda x: None, F32).outputs == ()
    g = ir.create_graph(lambda x: x, F32)  # identity graph
    assert g.outputs == g.inputs
    g = ir.create_graph(lambda x: (x, x + 1), F32)
    assert len(g.outputs) == 2
    g = ir.create_graph(lambda x: (t for t in [x]), F32)
    assert g.outputs == g.inputs


@pytest.mark.parametrize("result", [1, "x", [1], {"a": 1}, np.ones(2)])
def test_bad_outputs_are_value_errors(result):
    ir = popxl.Ir()
    with pytest.raises(
        ValueError, match="Output of subgraph must be None, a Tensor or an iterable of Tensors"
    ):
        ir.create_graph(lambda x: result, F32)


def test_returning_a_foreign_tensor_is_a_value_error():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        with pytest.raises(ValueError, match="not in the current graph"):
            ir.create_graph(lambda x: v, F32)


# What a subgraph may not do ----------------------------------------------------------------


def test_variables_inside_subgraphs_are_value_errors():
    ir = popxl.Ir()
    with pytest.raises(ValueError, match="cannot initialise a variable tensor within a graph"):
        ir.create_graph(lambda x: popxl.variable(1), F32)
    g = ir.create_empty_graph()
    with g, pytest.raises(ValueError, match="only be initialised within the main graph"):
        popxl.variable(1)


def test_constants_inside_subgraphs_belong_to_the_subgraph():
    ir = popxl.Ir()
    g = ir.create_graph(lambda x: x + popxl.constant(np.ones(2, np.float32), name="one"), F32)
    (const,) = g.constants
    assert const.id == g.id + "/one"


def test_parent_tensor_in_subgraph_op_is_a_value_error():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        with pytest.raises(ValueError, match="The input tensor `rhs` is not in the current Graph"):
            ir.create_graph(lambda x: x + v, F32)
        with pytest.raises(ValueError, match="The input tensor `lhs` is not in the current Graph"):
            ir.create_graph(lambda x: ops.add(v, x), F32)


# TensorByRef --------------------------------------------------------------------------------


def _by_ref_flags(g):
    return [t in g._by_ref_inputs for t in g.inputs]


def test_tensor_by_ref_annotations():
    # With `from __future__ import annotations` (this module) annotations are strings.
    def fn(a: popxl.TensorByRef, b: popxl.Tensor, c):
        return None

    def fn_list(xs: list[popxl.TensorByRef], ys: list):
        return None

    def fn_args(*args: popxl.TensorByRef, **kwargs: popxl.TensorByRef):
        return None

    ir = popxl.Ir()
    assert _by_ref_flags(ir.create_graph(fn, F32, F32, F32)) == [True, False, False]
    assert _by_ref_flags(ir.create_graph(fn_list, [F32, F32], [F32])) == [True, True, False]
    assert _by_ref_flags(ir.create_graph(fn_args, F32, k=F32)) == [True, True]


def test_tensor_by_ref_object_annotations():

    def fn(a, b, xs, ys):
        return None

    fn.__annotations__ = {
        "a": popxl.TensorByRef,
        "xs": list[popxl.TensorByRef],
        "ys": tuple[popxl.TensorByRef],
    }
    ir = popxl.Ir()
    assert _by_ref_flags(ir.create_graph(fn, F32, F32, [F32], [F32])) == [True, False, True, True]


def test_by_ref_inputs_write_back_through_call():
    def inc(x: popxl.TensorByRef):
        x += 1

    def inc_by_value(x):
        x += 1

    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros(2, np.float32), name="a")
        b = popxl.variable(np.zeros(2, np.float32), name="b")
        ops.call(ir.create_graph(inc, a), a)
        ops.call(ir.create_graph(inc_by_value, b), b)
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
        np.testing.assert_array_equal(session.get_tensor_data(a), [1, 1])
        np.testing.assert_array_equal(session.get_tensor_data(b), [0, 0])


# Streams -----------------------------------------------------------------------------------


def test_get_all_streams_lists_used_streams_only():
    ir = popxl.Ir()
    with ir.main_graph:
        h_used = popxl.h2d_stream((2,), popxl.float32, "in")
        popxl.h2d_stream((2,), popxl.float32, "unused_in")
        d_used = popxl.d2h_stream((2,), popxl.float32, "out")
        popxl.d2h_stream((2,), popxl.float32, "unused_out")
        ops.host_store(d_used, ops.host_load(h_used))
    assert ir.get_all_h2d_streams() == {h_used}
    assert ir.get_all_d2h_streams() == {d_used}


def test_dot_checkpoint_writes_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv("POPART_DOT_CHECKS", raising=False)
    ir = popxl.Ir()
    with ir.main_graph:
        _ = popxl.variable(np.ones(2, np.float32)) + 1
    ir.dot_checkpoint("check", tmp_path)
    text = (tmp_path / "check.dot").read_text()
    assert text.startswith("digraph") and '"op:100" [shape=box, label="Add.100"]' in text
    assert ir._pb_ir.getSessionOptions().dotChecks == {"ALL"}  # turned on by the first call
    ir._pb_ir.getSessionOptions().dotChecks = {"other"}
    ir.dot_checkpoint("skipped")
    assert not (tmp_path / "skipped.dot").exists()
