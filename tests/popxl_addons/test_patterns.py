"""apply_pre_alias_patterns: each level rewrites the IR as documented, keeps every value
(numbers before and after) and leaves a verifiable schedule."""

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl.errors import PopXLException
from popxl_addons.patterns import apply_pre_alias_patterns

F32 = popxl.float32
X = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
S = np.array([2.0, -3.0, 0.5], np.float32)


def _types(graph):
    return [op.type for op in graph._ops]


def _run(ir, streams):
    for g in ir._graphs.values():
        g.verify()
    with popxl.Session(ir, "ipu_hw") as session:
        out = session.run()
    return [out[s] for s in streams]


def _noops_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(X, name="x")
        a = ops.reshape(x, (2, 3))
        b = ops.cast(a, F32)
        c = ops.transpose(ops.reshape(b, (2, 1, 3)), (1, 0, 2))  # moves a size-1 axis only
        d = ops.concat([c], 0) * 1.0
        e = d / 1.0
        f = e * -1.0
        g = ops.transpose(f, (0, 1, 2))
        streams = [addons.host_store(g)]
    return ir, streams


def test_default_level_removes_noops_and_keeps_the_value():
    before_ir, before_streams = _noops_ir()
    (before,) = _run(before_ir, before_streams)
    ir, streams = _noops_ir()
    counts = apply_pre_alias_patterns(ir)
    assert counts["OpToIdentity"] == 6  # reshape, cast, concat, *1, /1, identity transpose
    assert counts["TransposeToIdentityOrReshape"] == 1
    assert counts["NegativeOneScale"] == 1
    assert counts["PreUniRepl"] == 6
    assert _types(ir.main_graph) == ["Reshape", "Reshape", "Neg", "HostStore"]
    (after,) = _run(ir, streams)
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(after, -X.reshape(1, 2, 3))


def test_no_patterns_changes_nothing():
    ir, streams = _noops_ir()
    schedule = ir.main_graph.print_schedule()
    counts = apply_pre_alias_patterns(ir, "no_patterns")
    assert set(counts.values()) == {0}
    assert ir.main_graph.print_schedule() == schedule


def test_minimal_level_keeps_noops():
    ir, _ = _noops_ir()
    counts = apply_pre_alias_patterns(ir, "minimal")
    assert set(counts.values()) == {0}
    assert "Identity" not in _types(ir.main_graph) and "Cast" in _types(ir.main_graph)


def test_all_level_runs_the_default_patterns():
    ir, streams = _noops_ir()
    assert apply_pre_alias_patterns(ir, "all")["PreUniRepl"] == 6
    np.testing.assert_array_equal(_run(ir, streams)[0], -X.reshape(1, 2, 3))


def test_unknown_level_is_rejected():
    with pytest.raises(
        ValueError,
        match=r"level must be one of \['no_patterns', 'minimal', 'default', 'all'\], got 'max'",
    ):
        apply_pre_alias_patterns(popxl.Ir(), "max")


# Identity removal is only done when the copy cannot be observed ----------------------------


def _identity_then_inplace(write_output: bool):
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        x = popxl.variable(X, name="x")
        y = ops.identity(x)
        ops.var_updates.accumulate_(y if write_output else x, popxl.constant(np.ones_like(X)))
        streams = [addons.host_store(x * 1.5), addons.host_store(y * 1.5)]
    return ir, streams


@pytest.mark.parametrize("write_output", [True, False])
def test_identity_is_kept_when_either_side_is_written_in_place(write_output):
    ir, streams = _identity_then_inplace(write_output)
    counts = apply_pre_alias_patterns(ir)
    assert counts["PreUniRepl"] == 0 and "Identity" in _types(ir.main_graph)
    x_out, y_out = _run(ir, streams)
    np.testing.assert_array_equal(x_out, 1.5 * (X + (0 if write_output else 1)))
    np.testing.assert_array_equal(y_out, 1.5 * (X + (1 if write_output else 0)))


def test_identity_that_is_a_graph_output_is_kept():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda t: ops.identity(t), popxl.TensorSpec((2, 3), F32))
    apply_pre_alias_patterns(ir)
    assert _types(g) == ["Identity"]


# Minimal patterns: gradient ops become forward ops -----------------------------------------


def _grad_ir(fn):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(X, name="x")
        s = popxl.variable(S, name="s")
        fwd = ir.create_graph(fn, x, s)
        grad = addons.autodiff(fwd)
        info = ops.call_with_info(fwd, x, s)
        dy = popxl.constant(np.ones((2, 3), np.float32))
        grads = ops.call(grad.graph, dy, inputs_dict=grad.grad_graph_info.inputs_dict(info))
        streams = [addons.host_store(t) for t in (*info.outputs[:1], *grads)]
    return ir, grad.graph, streams


GRAD_CASES = [
    (lambda x, s: x * s, [X * S, np.broadcast_to(S, X.shape), X.sum(0)], "MulArgGradOp"),
    (lambda x, s: x - s, [X - S, np.ones_like(X), -2 * np.ones(3)], "SubtractArg1GradOp"),
    (lambda x, s: x + s, [X + S, np.ones_like(X), 2 * np.ones(3)], "AddArgGradOp"),
    (lambda x, s: -x * s, [-X * S, -np.broadcast_to(S, X.shape), -X.sum(0)], "NegGradOp"),
]


@pytest.mark.parametrize("fn, expected, pattern", GRAD_CASES)
def test_gradient_ops_become_forward_ops_with_the_same_values(fn, expected, pattern):
    ir, grad, streams = _grad_ir(fn)
    assert any(t.endswith("Grad") for t in _types(grad))
    before = _run(ir, streams)
    counts = apply_pre_alias_patterns(ir, "minimal")
    assert counts[pattern] == 1
    assert not any(t.endswith("Grad") for t in _types(grad)), _types(grad)
    after = _run(ir, streams)
    for b, a, e in zip(before, after, expected):
        np.testing.assert_allclose(a, b, rtol=1e-6)
        np.testing.assert_allclose(a, e, rtol=1e-6)


def test_mul_gradient_schedule_uses_mul_and_a_reduction_for_the_broadcast_input():
    ir, grad, _ = _grad_ir(lambda x, s: x * s)
    apply_pre_alias_patterns(ir)
    assert _types(grad) == ["Mul", "Mul", "ReduceSum", "Reshape"]
    dx_mul, ds_mul = grad._ops[0], grad._ops[1]
    assert dx_mul.inputs == (grad.inputs[0], grad.inputs[2])  # dy * s
    assert ds_mul.inputs == (grad.inputs[0], grad.inputs[1])  # dy * x
    assert grad.outputs == (dx_mul.outputs[0], grad._ops[3].outputs[0])


def test_differentiated_forward_ops_are_rewritten_and_their_gradients_keep_values():
    ir, grad, streams = _grad_ir(lambda x, s: ops.reshape(x, (2, 3)) * s)
    fwd = grad.ir._graphs[next(k for k in grad.ir._graphs if k.endswith("_subgraph(0)"))]
    apply_pre_alias_patterns(ir)
    # ReshapeGrad differentiates its own snapshot of the reshape, so the forward one may go;
    # the Mul gradient reads the reshaped input, which the gradient graph reshapes again
    # rather than taking it from the forward graph.
    assert _types(fwd) == ["Mul"]
    assert "ReshapeGrad" in _types(grad) and "Reshape" in _types(grad)
    _, dx, ds = _run(ir, streams)
    np.testing.assert_allclose(dx, np.broadcast_to(S, X.shape))
    np.testing.assert_allclose(ds, X.sum(0))


def test_matmul_gradient_becomes_matmuls_with_transposes():
    rng = np.random.default_rng(1)
    xv = rng.normal(size=(2, 4, 3)).astype(np.float32)
    wv = rng.normal(size=(3, 5)).astype(np.float32)
    dyv = rng.normal(size=(2, 4, 5)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(xv, name="x")
        w = popxl.variable(wv, name="w")
        fwd = ir.create_graph(lambda a, b: a @ b, x, w)
        grad = addons.autodiff(fwd)
        info = ops.call_with_info(fwd, x, w)
        grads = ops.call(
            grad.graph, popxl.constant(dyv), inputs_dict=grad.grad_graph_info.inputs_dict(info)
        )
        streams = [addons.host_store(t) for t in grads]
    before = _run(ir, streams)
    assert apply_pre_alias_patterns(ir, "minimal")["MatMulGradOp"] == 1
    assert _types(grad.graph) == [
        "Transpose", "MatMul", "Reshape", "Transpose", "Reshape", "MatMul",
    ]  # fmt: skip
    dx, dw = _run(ir, streams)
    np.testing.assert_allclose(dx, dyv @ wv.T, rtol=1e-5)
    np.testing.assert_allclose(dw, xv.reshape(8, 3).T @ dyv.reshape(8, 5), rtol=1e-5)
    np.testing.assert_allclose(dx, before[0], rtol=1e-5)
    np.testing.assert_allclose(dw, before[1], rtol=1e-5)


def test_matmul_gradient_with_a_batched_rhs_is_left_to_jax():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 4, 3), np.float32))
        w = popxl.variable(np.ones((2, 3, 5), np.float32))
        fwd = ir.create_graph(lambda a, b: a @ b, x, w)
        grad = addons.autodiff(fwd)
    assert apply_pre_alias_patterns(ir, "minimal")["MatMulGradOp"] == 0
    assert _types(grad.graph) == ["MatMulGrad"]


def test_linear_module_gradient_after_default_patterns_matches_numpy():
    from popxl_addons.layers import Linear

    rng = np.random.default_rng(2)
    xv = rng.normal(size=(4, 3)).astype(np.float32)
    dyv = rng.normal(size=(4, 2)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(xv, name="x")
        facts, fwd = Linear(2).create_graph(x)
        variables = facts.init()
        grad = addons.autodiff(fwd)
        info = fwd.bind(variables).call_with_info(x)
        grads = grad.call(popxl.constant(dyv), args=grad.grad_graph_info.inputs_dict(info))
        streams = [addons.host_store(t) for t in grads]
    apply_pre_alias_patterns(ir)
    assert not any(t.endswith("Grad") for t in _types(grad.graph)), _types(grad.graph)
    with popxl.Session(ir, "ipu_hw") as session:
        out = session.run()
        w = session.get_tensor_data(variables.weight)
    dx, dw, db = (out[s] for s in streams)
    np.testing.assert_allclose(dx, dyv @ w.T, rtol=1e-5)
    np.testing.assert_allclose(dw, xv.T @ dyv, rtol=1e-5)
    np.testing.assert_allclose(db, dyv.sum(0), rtol=1e-5)


def test_tensor_parallel_identity_all_reduces_become_identities_and_keep_values():
    from popxl_addons.ops.replicated_all_reduce_TP import (
        replicated_all_reduce_identical_grad_inputs,
        replicated_all_reduce_identical_inputs,
    )

    def build():
        ir = popxl.Ir(4)
        with ir.main_graph:
            x_h2d = popxl.h2d_stream((2,), F32, "x")
            x = ops.host_load(x_h2d)
            fwd = ir.create_graph(
                lambda t: replicated_all_reduce_identical_grad_inputs(
                    replicated_all_reduce_identical_inputs(t) * 2.0
                ),
                x,
            )
            grad = addons.autodiff(fwd)
            info = ops.call_with_info(fwd, x)
            inputs = grad.grad_graph_info.inputs_dict(info)
            (dx,) = ops.call(grad.graph, x, inputs_dict=inputs)
            streams = [addons.host_store(info.outputs[0]), addons.host_store(dx)]
        return ir, fwd, grad.graph, x_h2d, streams

    data = np.arange(8, dtype=np.float32).reshape(4, 2)

    def run(ir, x_h2d, streams):
        with popxl.Session(ir, "ipu_hw") as session:
            out = session.run({x_h2d: data})
        return [out[s] for s in streams]

    ir, _, _, x_h2d, streams = build()
    with pytest.raises(PopXLException, match="You need to run the `OpToIdentityPattern`"):
        run(ir, x_h2d, streams)  # as the original: the identity forms must be rewritten
    ir, fwd, grad, x_h2d, streams = build()
    counts = apply_pre_alias_patterns(ir)
    assert counts["OpToIdentity"] == 2  # f's forward, g's gradient
    # The Mul by a constant keeps no activation (its gradient reads only the constant), so
    # f's identity form goes entirely.
    assert _types(fwd) == ["Mul", "ReplicatedAllReduceTP"]
    assert "Identity" not in _types(grad) and _types(grad).count("ReplicatedAllReduceTP") == 1
    y, dx = run(ir, x_h2d, streams)
    np.testing.assert_allclose(y, np.broadcast_to(2 * data.sum(0), (4, 2)))
    np.testing.assert_allclose(dx, np.broadcast_to(2 * data.sum(0), (4, 2)))
