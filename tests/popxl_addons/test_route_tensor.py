"""``route_tensor_into_graph`` / ``is_subgraph``: IR structure and numbers through a Session."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl_addons import is_subgraph, route_tensor_into_graph
from popxl_addons.route_tensor import called_graph_paths


def _var(values, name):
    return popxl.variable(np.asarray(values, np.float32), popxl.float32, name=name)


def _values(ir, *variables):
    ir.main_graph.verify()
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
    return [session.get_tensor_data(v) for v in variables]


def test_is_subgraph():
    ir = popxl.Ir()
    g = ir.main_graph
    sg1, sg2, sg3 = (ir.create_empty_graph(f"sg{i}") for i in (1, 2, 3))
    with g:
        ops.call(sg1)
    with sg1:
        ops.call(sg2)
    with g:
        ops.call(sg3)
    assert is_subgraph(g, sg1) and is_subgraph(g, sg2) and is_subgraph(sg1, sg2)
    assert is_subgraph(g, sg3)
    assert not is_subgraph(sg1, sg3)
    assert not is_subgraph(sg3, sg2)
    assert not is_subgraph(sg2, g)
    assert is_subgraph(sg2, sg2)


def test_called_graph_paths_lists_every_chain_in_call_order():
    ir = popxl.Ir()
    sg1, sg2, sg3 = (ir.create_empty_graph(f"sg{i}") for i in (1, 2, 3))
    with ir.main_graph:
        ops.call(sg1)
    with sg1:
        ops.call(sg2)
        ops.call(sg3)
    with sg3:
        ops.call(sg2)
    main = ir.main_graph
    assert called_graph_paths(main, sg2) == [(main, sg1, sg2), (main, sg1, sg3, sg2)]
    assert called_graph_paths(sg3, sg1) == []


def test_route_into_called_graph_adds_one_input():
    ir = popxl.Ir()
    sg = ir.create_empty_graph("sg")
    with ir.main_graph:
        a = popxl.variable(1, name="a")
        ops.call(sg)
    with sg:
        sg_a = route_tensor_into_graph(a)
        again = route_tensor_into_graph(a)
        _ = sg_a + 1
    assert again is sg_a
    assert sg.inputs == (sg_a,)
    assert sg_a.id == "sg_subgraph(0)/a"
    (call,) = ir.main_graph.ops
    assert call.inputs == (a,)
    assert call in a._consumers
    assert call.modified_inputs == set()
    ir.main_graph.verify()


def test_tensor_already_in_graph_is_returned():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(1, name="a")
        assert route_tensor_into_graph(a) is a
        assert route_tensor_into_graph(a, ir.main_graph) is a


def test_many_call_sites_share_one_new_input():
    ir = popxl.Ir()
    sg = ir.create_empty_graph("sg")
    with ir.main_graph:
        a = _var([1.0, 2.0], "a")
        acc = _var([0.0, 0.0], "acc")
        ops.call(sg)
        ops.call(sg)
    with sg:
        ops.var_updates.accumulate_(
            route_tensor_into_graph(acc, modified=True), route_tensor_into_graph(a)
        )
    assert len(sg.inputs) == 2
    for op in ir.main_graph.ops:
        assert op.inputs == (acc, a)
        assert op.modified_inputs == {0}
    (acc_value,) = _values(ir, acc)
    np.testing.assert_array_equal(acc_value, [2.0, 4.0])


def test_nested_calls_numbers():
    ir = popxl.Ir()
    sg1 = ir.create_empty_graph("sg1")
    sg2 = ir.create_empty_graph("sg2")
    with ir.main_graph:
        a = _var([1.0, 2.0], "a")
        acc = _var([10.0, 20.0], "acc")
        ops.call(sg1)
    with sg1:
        ops.call(sg2)
        ops.call(sg2)
    with sg2:
        acc2 = route_tensor_into_graph(acc, modified=True)
        ops.var_updates.accumulate_(acc2, route_tensor_into_graph(a) * 3.0)
    assert [t.name for t in sg1.inputs] == ["acc", "a"]
    assert [t.name for t in sg2.inputs] == ["acc", "a"]
    acc_value, a_value = _values(ir, acc, a)
    np.testing.assert_array_equal(acc_value, [16.0, 32.0])
    np.testing.assert_array_equal(a_value, [1.0, 2.0])


def test_unmodified_route_does_not_write_back():
    ir = popxl.Ir()
    sg = ir.create_empty_graph("sg")
    with ir.main_graph:
        a = _var([1.0, 2.0], "a")
        ops.call(sg)
    with sg:
        ops.var_updates.accumulate_(
            route_tensor_into_graph(a), popxl.constant(np.ones(2, np.float32))
        )
    (a_value,) = _values(ir, a)
    np.testing.assert_array_equal(a_value, [1.0, 2.0])


def test_many_paths_numbers():
    ir = popxl.Ir()
    sg1, sg2, sg3 = (ir.create_empty_graph(f"sg{i}") for i in (1, 2, 3))
    with ir.main_graph:
        acc = _var([0.0], "acc")
        ops.call(sg1)
    with sg1:
        ops.call(sg2)
        ops.call(sg3)
    with sg3:
        ops.call(sg2)
        ops.call(sg2)
    with sg2:
        ops.var_updates.accumulate_(
            route_tensor_into_graph(acc, modified=True), popxl.constant(np.ones(1, np.float32))
        )
    assert [len(g.inputs) for g in (sg1, sg2, sg3)] == [1, 1, 1]
    assert len(ir.main_graph.variables) == 1
    (acc_value,) = _values(ir, acc)
    np.testing.assert_array_equal(acc_value, [3.0])


def test_repeat_gets_a_loop_invariant_input():
    ir = popxl.Ir()
    with ir.main_graph:
        a = _var([1.0, 2.0], "a")
        acc = _var([0.0, 0.0], "acc")
        x0 = _var([5.0, 5.0], "x0")
        body = ir.create_graph(lambda x: x + 1.0, x0)
        (y,) = ops.repeat(body, 4, x0)
        out = popxl.variable(np.zeros(2, np.float32), name="out")
        ops.var_updates.copy_var_update_(out, y)
    with body:
        ops.var_updates.accumulate_(
            route_tensor_into_graph(acc, modified=True), route_tensor_into_graph(a)
        )
    (repeat_op,) = [op for op in ir.main_graph.ops if op.opdef.key == "repeat"]
    assert repeat_op.inputs == (x0, acc, a)
    assert repeat_op.modified_inputs == {1}
    acc_value, out_value = _values(ir, acc, out)
    np.testing.assert_array_equal(acc_value, [4.0, 8.0])
    np.testing.assert_array_equal(out_value, [9.0, 9.0])


def test_loop_carried_input_is_not_reused():
    # `a` feeds the loop-carried input x, whose value changes every iteration; the routed
    # tensor must stay `a`.
    ir = popxl.Ir()
    with ir.main_graph:
        a = _var([1.0], "a")
        acc = _var([0.0], "acc")
        body = ir.create_graph(lambda x: x + 1.0, a)
        ops.repeat(body, 3, a)
    with body:
        routed = route_tensor_into_graph(a)
        ops.var_updates.accumulate_(route_tensor_into_graph(acc, modified=True), routed)
    assert routed is not body.inputs[0]
    (acc_value,) = _values(ir, acc)
    np.testing.assert_array_equal(acc_value, [3.0])


def test_repeat_inside_call_numbers():
    ir = popxl.Ir()
    outer = ir.create_empty_graph("outer")
    inner = ir.create_empty_graph("inner")
    with ir.main_graph:
        a = _var([2.0], "a")
        acc = _var([1.0], "acc")
        ops.call(outer)
    with outer:
        ops.repeat(inner, 5)
    with inner:
        acc_in = route_tensor_into_graph(acc, modified=True)
        ops.var_updates.accumulate_(acc_in, route_tensor_into_graph(a))
    (acc_value,) = _values(ir, acc)
    np.testing.assert_array_equal(acc_value, [11.0])


def test_existing_input_is_reused_for_a_single_call_site():
    ir = popxl.Ir()
    with ir.main_graph:
        a = _var([1.0], "a")
        sg = ir.create_graph(lambda x: x * 2.0, a)
        ops.call(sg, a)
    with sg:
        assert route_tensor_into_graph(a) is sg.inputs[0]
    assert len(sg.inputs) == 1


def test_routing_twice_through_many_call_sites_reuses_the_first_route():
    ir = popxl.Ir()
    sg1, sg2 = ir.create_empty_graph("sg1"), ir.create_empty_graph("sg2")
    with ir.main_graph:
        a = _var([1.0], "a")
        ops.call(sg1)
        ops.call(sg1)
    with sg1:
        ops.call(sg2)
        ops.call(sg2)
    first = route_tensor_into_graph(a, sg2)
    assert route_tensor_into_graph(a, sg2) is first
    assert route_tensor_into_graph(a, sg1) is sg1.inputs[0]
    assert [len(g.inputs) for g in (sg1, sg2)] == [1, 1]


def test_existing_inputs_are_reused_through_nested_calls():
    ir = popxl.Ir()
    with ir.main_graph:
        a = _var([1.0], "a")
        inner = ir.create_graph(lambda y: y * 2.0, a)

        def outer_fn(x):
            (y,) = ops.call(inner, x)
            return y

        outer = ir.create_graph(outer_fn, a)
        ops.call(outer, a)
        ops.call(outer, a)
    assert route_tensor_into_graph(a, inner) is inner.inputs[0]
    assert [len(g.inputs) for g in (outer, inner)] == [1, 1]


def test_existing_input_not_reused_when_call_sites_differ():
    ir = popxl.Ir()
    with ir.main_graph:
        a = _var([1.0], "a")
        b = _var([5.0], "b")
        acc = _var([0.0], "acc")
        sg = ir.create_graph(lambda x: x * 2.0, a)
        ops.call(sg, a)
        ops.call(sg, b)
    with sg:
        ops.var_updates.accumulate_(
            route_tensor_into_graph(acc, modified=True), route_tensor_into_graph(a)
        )
    assert len(sg.inputs) == 3
    (acc_value,) = _values(ir, acc)
    np.testing.assert_array_equal(acc_value, [2.0])


def test_unreachable_graph_raises():
    ir = popxl.Ir()
    sg = ir.create_empty_graph("sg1")
    with ir.main_graph:
        a = popxl.variable(1)
    with pytest.raises(ValueError) as excinfo:
        route_tensor_into_graph(a, sg)
    assert "is not in the graph" in str(excinfo.value)
    assert "is not in a known parent graph" in str(excinfo.value)


def test_call_site_in_unrelated_graph_raises_and_changes_nothing():
    ir = popxl.Ir()
    sg1, sg2, other = (ir.create_empty_graph(n) for n in ("sg1", "sg2", "other"))
    with ir.main_graph:
        ops.call(sg1)
        ops.call(other)
    with sg1:
        a = popxl.constant(1.0, name="a")
        ops.call(sg2)
    with other:
        ops.call(sg2)
    with pytest.raises(ValueError, match="also called from other"):
        route_tensor_into_graph(a, sg2)
    assert sg2.inputs == ()
    assert all(op.inputs == () for op in sg1.ops)


def test_tensor_produced_after_the_call_site_raises():
    ir = popxl.Ir()
    sg = ir.create_empty_graph("sg")
    with ir.main_graph:
        a = popxl.variable(1.0, name="a")
        ops.call(sg)
        late = a + 1.0
    with pytest.raises(ValueError, match="produced after the call site"):
        route_tensor_into_graph(late, sg)
    assert sg.inputs == ()


def test_conditional_on_the_way_is_not_implemented():
    ir = popxl.Ir()
    then_g, else_g = ir.create_empty_graph("then"), ir.create_empty_graph("else")
    with ir.main_graph:
        a = popxl.variable(1.0, name="a")
        ops.conditional(popxl.constant(True), then_g, else_g)
    with pytest.raises(NotImplementedError, match="conditional"):
        route_tensor_into_graph(a, then_g)
