"""``ops.conditional`` / ``ops.conditional_with_info`` and ``ConditionalSiteInfo``."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException

F32 = popxl.TensorSpec((2,), popxl.float32)


def _build_add_or_mul(cond_shape=(1,)):
    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.h2d_stream(cond_shape, popxl.bool, "cond")
        cond = ops.host_load(h)
        a = popxl.variable(np.array([2.0, 3.0], np.float32), name="a")
        b = popxl.variable(np.array([4.0, 5.0], np.float32), name="b")
        then_g = ir.create_graph(lambda x, y: x + y, a, b)
        else_g = ir.create_graph(lambda x, y: x * y - x, a, b)
        info = ops.conditional_with_info(
            cond,
            then_g,
            else_g,
            then_inputs_dict={then_g.inputs[0]: a, then_g.inputs[1]: b},
            else_inputs=[b],
            else_inputs_dict={else_g.inputs[1]: a},
        )
        d = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(d, info.outputs[0])
    return ir, h, d, info, (then_g, else_g, a, b, cond)


@pytest.mark.parametrize("flag,expected", [(True, [6.0, 8.0]), (False, [4.0, 10.0])])
def test_conditional_picks_a_branch_at_run_time(flag, expected):
    ir, h, d, _, _ = _build_add_or_mul()
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run({h: np.array([flag])})[d], expected)


def test_both_branches_in_one_session():
    ir, h, d, _, _ = _build_add_or_mul(())
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run({h: np.array(True)})[d], [6.0, 8.0])
        np.testing.assert_array_equal(session.run({h: np.array(False)})[d], [4.0, 10.0])


def test_scalar_variable_condition_and_same_graph_for_both_branches():
    ir = popxl.Ir()
    with ir.main_graph:
        flag = popxl.variable(False, popxl.bool, name="flag")
        x = popxl.variable(np.float32(3.0))
        y = popxl.variable(np.float32(7.0))
        double = ir.create_graph(lambda t: t * 2, x)
        (out,) = ops.conditional(flag, double, double, [x], [y])
        d = popxl.d2h_stream((), popxl.float32)
        ops.host_store(d, out)
    with popxl.Session(ir, "ipu_model") as session:
        assert session.run()[d] == 14.0
        session.write_variable_data(flag, np.array(True))
        assert session.run()[d] == 6.0


def test_branches_without_inputs_or_outputs():
    ir = popxl.Ir()
    with ir.main_graph:
        flag = popxl.variable(True, popxl.bool)
        empty = ir.create_empty_graph()
        assert ops.conditional(flag, empty, empty) == ()
        c = popxl.constant(np.float32(1.0))
        one = ir.create_graph(lambda: popxl.constant(np.float32(1.0)))
        two = ir.create_graph(lambda: popxl.constant(np.float32(2.0)))
        (out,) = ops.conditional(flag, one, two)
        out = out + c
        d = popxl.d2h_stream((), popxl.float32)
        ops.host_store(d, out)
    with popxl.Session(ir, "ipu_model") as session:
        assert session.run()[d] == 2.0


def test_output_names_and_op_type():
    ir, _, _, info, (then_g, else_g, *_) = _build_add_or_mul()
    assert info.outputs[0].name == "add_out_or_sub_out"
    assert info._op.type == "If"


# ConditionalSiteInfo ------------------------------------------------------------------------------


def test_conditional_site_info_index_maps():
    _, _, _, info, (then_g, else_g, a, b, cond) = _build_add_or_mul()
    assert info.called_graph == (then_g, else_g)
    assert info.inputs == (cond, a, b, b, a)
    assert [info.graph_to_parent_input_index(i) for i in range(2)] == [1, 2]
    assert [info.graph_to_parent_input_index(i, then_branch=False) for i in range(2)] == [3, 4]
    assert [info.parent_to_graph_input_index(i) for i in range(1, 5)] == [0, 1, 0, 1]
    assert [info.is_parent_index_in_then_branch(i) for i in range(5)] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert info.graph_to_parent_output_index(0) == 0 == info.graph_to_parent_output_index(0, False)
    assert info.parent_to_graph_output_index(0) == 0 == info.parent_to_graph_output_index(0, False)
    for bad in (
        lambda: info.graph_to_parent_input_index(2),
        lambda: info.graph_to_parent_input_index(-1, then_branch=False),
        lambda: info.parent_to_graph_input_index(0),
        lambda: info.parent_to_graph_input_index(5),
        lambda: info.graph_to_parent_output_index(1),
        lambda: info.parent_to_graph_output_index(1, then_branch=False),
    ):
        with pytest.raises(IndexError):
            bad()


def test_conditional_site_info_tensor_maps():
    _, _, _, info, (then_g, else_g, a, b, cond) = _build_add_or_mul()
    assert info.graph_to_parent(then_g.inputs[1]) is b
    assert info.graph_to_parent(else_g.inputs[0]) is b
    assert info.graph_to_parent(else_g.outputs[0]) is info.outputs[0]
    assert info.parent_to_graph(a) is then_g.inputs[0]  # then branch first
    assert info.parent_to_graph(b) is then_g.inputs[1]
    with pytest.raises(ValueError):
        info.parent_to_graph(cond)
    with pytest.raises(ValueError):
        info.graph_to_parent(cond)
    info.set_parent_input_modified(a)
    assert info._op.modified_inputs == {1, 4}  # a feeds both branches
    with pytest.raises(ValueError, match="not a parent graph input"):
        info.set_parent_input_modified(cond)


# Errors ------------------------------------------------------------------------------------------


def test_branches_must_have_the_same_number_of_outputs():
    ir = popxl.Ir()
    with ir.main_graph:
        flag = popxl.variable(True, popxl.bool)
        x = popxl.variable(np.ones(2, np.float32))
        one = ir.create_graph(lambda t: t, x)
        two = ir.create_graph(lambda t: (t, t), x)
        with pytest.raises(ValueError, match="must have the same number of outputs: 1 != 2"):
            ops.conditional(flag, one, two, [x], [x])


def test_branch_outputs_must_agree():
    ir = popxl.Ir()
    with ir.main_graph:
        flag = popxl.variable(True, popxl.bool)
        x = popxl.variable(np.ones(2, np.float32))
        same = ir.create_graph(lambda t: t, x)
        halved = ir.create_graph(lambda t: ops.cast(t, popxl.float16), x)
        sliced = ir.create_graph(lambda t: t[0], x)
        for other in (halved, sliced):
            with pytest.raises(PopXLException):
                ops.conditional(flag, same, other, [x], [x])


@pytest.mark.parametrize("flag", [True, False])
def test_by_ref_branch_inputs_are_written_back_from_the_branch_that_ran(flag):
    """A branch taking an input by reference writes it (an extension: PopXL left this
    unimplemented); the other branch leaves it as it was."""

    def bump(t: popxl.TensorByRef, k: popxl.Tensor):
        ops.var_updates.accumulate_(t, k)
        return t * 2.0

    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.h2d_stream((), popxl.bool, "flag")
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")
        y = popxl.variable(np.array([5.0, 7.0], np.float32), name="y")
        k = popxl.constant(np.array([10.0, 20.0], np.float32))
        then_g = ir.create_graph(bump, x, k)
        else_g = ir.create_graph(lambda t: t + 0.5, y)
        (out,) = ops.conditional(ops.host_load(h), then_g, else_g, [x, k], [x])
        d = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(d, out)
        y_after = y + 0.0  # y was never passed by reference: untouched
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run({h: np.array(flag)})
        final_x = session.get_tensor_data(x)
    if flag:
        np.testing.assert_allclose(result[d], [22.0, 44.0])
        np.testing.assert_allclose(final_x, [11.0, 22.0])
    else:
        np.testing.assert_allclose(result[d], [1.5, 2.5])
        np.testing.assert_allclose(final_x, [1.0, 2.0])
    del y_after


@pytest.mark.parametrize("policy", ["scan", "inline"])
def test_by_ref_rows_of_a_stack_inside_a_loop(policy):
    """Per-layer weights bound to one layer graph and updated in a branch inside a loop
    (a pipeline stage's shape): with the scan policy the rows enter and leave the branch as
    one stacked array; both policies give NumPy's results."""
    from runtime.lowering import runs as run_plans

    layers, steps = 4, 3
    w0 = [np.full((2, 2), 0.1 * (i + 1), np.float32) for i in range(layers)]
    x0 = np.array([[1.0, -1.0]], np.float32)
    w2 = popxl.TensorSpec((2, 2), popxl.float32)
    run_plans.set_policy(policy)
    try:
        ir = popxl.Ir()
        with ir.main_graph:
            ws = [popxl.variable(w, name=f"w{i}") for i, w in enumerate(w0)]
            x = popxl.variable(x0, name="x")

            def layer(w: popxl.TensorByRef, x: popxl.Tensor):
                y = ops.tanh(x @ w)
                ops.var_updates.accumulate_(w, ops.transpose(x) @ y * 0.1)
                return y

            layer_g = ir.create_graph(layer, w2, x)
            stage = ir.create_empty_graph("stage")
            with stage:
                h = popxl.graph_input((1, 2), popxl.float32, "x")
                refs = [
                    popxl.graph_input((2, 2), popxl.float32, f"w{i}", by_ref=True)
                    for i in range(layers)
                ]
                for w in refs:
                    (h,) = ops.call(layer_g, w, h)
                popxl.graph_output(h)
            skip = ir.create_graph(lambda t: t * 1.0, x)
            cycle = ir.create_empty_graph("cycle")
            with cycle:
                c = popxl.graph_input((), popxl.int32, "c")
                h = popxl.graph_input((1, 2), popxl.float32, "x")
                refs = [
                    popxl.graph_input((2, 2), popxl.float32, f"w{i}", by_ref=True)
                    for i in range(layers)
                ]
                odd = ops.equal(
                    ops.fmod(c, popxl.constant(2, popxl.int32)), popxl.constant(1, popxl.int32)
                )
                (h,) = ops.conditional(odd, stage, skip, [h, *refs], [h])
                popxl.graph_output(c + popxl.constant(1, popxl.int32))
                popxl.graph_output(h)
            _, out = ops.repeat(cycle, steps, popxl.constant(0, popxl.int32), x, *ws)
            d = popxl.d2h_stream((1, 2), popxl.float32, "out")
            ops.host_store(d, out)
        with popxl.Session(ir, "ipu_model") as session:
            got = session.run()[d]
            got_w = [session.get_tensor_data(w) for w in ws]
    finally:
        run_plans.set_policy(None)
    want_w, h = [w.copy() for w in w0], x0.copy()
    for c in range(steps):
        if c % 2 == 1:
            for w in want_w:
                y = np.tanh(h @ w)
                w += h.T @ y * 0.1
                h = y
        else:
            h = h * 1.0
    np.testing.assert_allclose(got, h, rtol=1e-6)
    for g, w in zip(got_w, want_w):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_condition_checks():
    ir = popxl.Ir()
    g = ir.create_graph(lambda t: t, F32)
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        with pytest.raises(ValueError, match="single-element bool"):
            ops.conditional(popxl.variable(1), g, g, [x], [x])
        with pytest.raises(ValueError, match="single-element bool"):
            ops.conditional(popxl.variable(np.array([True, False])), g, g, [x], [x])
        with pytest.raises(ValueError, match="not in the current Graph"):
            ops.conditional(g.inputs[0], g, g, [x], [x])
        with pytest.raises(TypeError):
            ops.conditional(True, g, g, [x], [x])


def test_branch_inputs_are_validated_per_branch():
    ir = popxl.Ir()
    with ir.main_graph:
        flag = popxl.variable(True, popxl.bool)
        x = popxl.variable(np.ones(2, np.float32))
        g = ir.create_graph(lambda t: t, x)
        with pytest.raises(ValueError, match=r"called graph \(then_branch\)"):
            ops.conditional(flag, g, g, [], [x])
        with pytest.raises(ValueError, match=r"called graph \(else_branch\)"):
            ops.conditional(flag, g, g, [x], [])
        with pytest.raises(ValueError, match="Too many inputs"):
            ops.conditional(flag, g, g, [x, x], [x])


@pytest.mark.parametrize("flag", [True, False])
def test_by_ref_inputs_sharing_storage_write_back_consistently(flag):
    """The branches take an in-place op's output and its input (one storage) by reference:
    the write-back of the branch that ran is not undone by the other's unchanged value
    (differential campaign, seed 702008181)."""

    def double(t: popxl.TensorByRef):
        ops.var_updates.accumulate_(t, t)
        return t + 0.0

    def halve(t: popxl.TensorByRef):
        ops.var_updates.accumulate_(t, t * -0.5)
        return t + 0.0

    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.h2d_stream((), popxl.bool, "flag")
        x = popxl.variable(np.array([1.0, 2.0], np.float32), name="x")
        alias = ops.relu_(x)
        then_g, else_g = ir.create_graph(double, alias), ir.create_graph(halve, x)
        ops.conditional(ops.host_load(h), then_g, else_g, [alias], [x])
    with popxl.Session(ir, "ipu_model") as session:
        session.run({h: np.array(flag)})
        final = session.get_tensor_data(x)
    np.testing.assert_allclose(final, [2.0, 4.0] if flag else [0.5, 1.0])
