"""IR edits after autodiff (patterns, replace_uses, op removal) keep gradients right.

Gradient ops differentiate a snapshot of their forward op, so rewiring or deleting forward
ops later changes neither what they compute nor whether the IR verifies.
"""

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl.errors import InternalError
from popxl_addons._ir_edit import insert_before, remove_op, replace_uses
from popxl_addons.ops.replicated_all_reduce_TP import replicated_all_reduce_identical_inputs
from popxl_addons.patterns import apply_pre_alias_patterns

F32 = popxl.float32


class _TensorParallelLayer(addons.Module):
    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("w", lambda: np.full((4, 4), 0.1, np.float32))
        a, b = ops.split(x, 2, axis=0)
        c = ops.concat([a * 2.0, b * 3.0], axis=0)
        y = replicated_all_reduce_identical_inputs(c)
        return y.transpose((1, 0)) @ w


def _verify(ir):
    for graph in ir._graphs.values():
        graph.verify()


def test_tensor_parallel_layer_gradient_after_patterns_matches_numpy():
    xv = np.arange(32, dtype=np.float32).reshape(2, 4, 4)  # one (4, 4) input per replica
    dyv = np.arange(16, dtype=np.float32).reshape(4, 4) / 10
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x_h2d = popxl.h2d_stream((4, 4), F32, "x")
        x = ops.host_load(x_h2d)
        facts, fwd = _TensorParallelLayer().create_graph(x)
        variables = facts.init()
        grad = addons.autodiff(fwd)
        info = fwd.bind(variables).call_with_info(x)
        dx, dw = grad.call(popxl.constant(dyv), args=grad.grad_graph_info.inputs_dict(info))
        streams = addons.host_store(dx), addons.host_store(dw)
    counts = apply_pre_alias_patterns(ir)
    assert counts["OpToIdentity"] >= 1 and counts["PreUniRepl"] >= 1
    assert "ReplicatedAllReduceTP" not in [op.type for op in fwd.graph._ops]
    _verify(ir)
    with popxl.Session(ir, "ipu_hw") as session:
        out = session.run({x_h2d: xv})
    scale = np.array([2, 2, 3, 3], np.float32)[:, None]
    w = np.full((4, 4), 0.1, np.float32)
    for r in range(2):
        c = xv[r] * scale  # the all-reduce of identical inputs is an identity forward
        np.testing.assert_allclose(out[streams[1]][r], c @ dyv, rtol=1e-6)
        dc = 2 * (w @ dyv.T)  # its gradient sums both replicas' cotangents
        np.testing.assert_allclose(out[streams[0]][r], dc * scale, rtol=1e-6)


def _duplicate_scale_ir():
    """``(2x) @ w1 + (2x) @ w2`` with the product computed twice, differentiated."""
    rng = np.random.default_rng(0)
    xv, w1v, w2v = (rng.normal(size=(3, 3)).astype(np.float32) for _ in range(3))
    ir = popxl.Ir()
    with ir.main_graph:
        x, w1, w2 = (popxl.variable(v) for v in (xv, w1v, w2v))
        fwd = ir.create_graph(lambda a, b, c: (a * 2.0) @ b + (a * 2.0) @ c, x, w1, w2)
        grad = addons.autodiff(fwd)
        info = ops.call_with_info(fwd, x, w1, w2)
        dyv = np.ones((3, 3), np.float32)
        grads = ops.call(
            grad.graph, popxl.constant(dyv), inputs_dict=grad.grad_graph_info.inputs_dict(info)
        )
        streams = [addons.host_store(t) for t in grads]
    expected = [2 * dyv @ (w1v + w2v).T, (2 * xv).T @ dyv, (2 * xv).T @ dyv]
    return ir, fwd, streams, expected


def _merge_duplicate_scales(fwd):
    """Common-subexpression elimination: the second ``a * 2.0`` reads as the first."""
    first, second = (op for op in fwd._ops if op.type == "Mul")
    replace_uses(fwd, second.outputs[0], first.outputs[0])
    return second


def _run(ir, streams):
    _verify(ir)
    with popxl.Session(ir, "ipu_hw") as session:
        out = session.run()
    return [out[s] for s in streams]


def test_replace_uses_in_the_forward_graph_after_autodiff_keeps_gradients():
    ir, fwd, streams, expected = _duplicate_scale_ir()
    _merge_duplicate_scales(fwd)
    for got, want in zip(_run(ir, streams), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_replacing_a_view_with_a_new_tensor_after_autodiff_keeps_gradients():
    rng = np.random.default_rng(1)
    xv, sv = rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=(3, 2)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        x, s = popxl.variable(xv), popxl.variable(sv)
        fwd = ir.create_graph(lambda a, b: ops.transpose(a) * b, x, s)
        grad = addons.autodiff(fwd)
        info = ops.call_with_info(fwd, x, s)
        grads = ops.call(
            grad.graph,
            popxl.constant(np.ones((3, 2), np.float32)),
            inputs_dict=grad.grad_graph_info.inputs_dict(info),
        )
        streams = [addons.host_store(t) for t in grads]
    transpose, mul = fwd._ops
    with insert_before(mul):  # a copy that owns its storage replaces the view the Mul read
        copy = ops.identity(ops.transpose(fwd.inputs[0]))
    replace_uses(fwd, transpose.outputs[0], copy)
    dx, ds = _run(ir, streams)
    np.testing.assert_allclose(dx, sv.T, rtol=1e-6)
    np.testing.assert_allclose(ds, xv.T, rtol=1e-6)


def test_removing_differentiated_forward_ops_after_autodiff_keeps_gradients():
    ir, fwd, streams, expected = _duplicate_scale_ir()
    second = _merge_duplicate_scales(fwd)
    remove_op(fwd, second)  # the Mul a MulGrad differentiates
    assert [op.type for op in fwd._ops].count("Mul") == 1
    for got, want in zip(_run(ir, streams), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_removing_an_op_whose_output_is_still_read_is_refused():
    ir, fwd, _, _ = _duplicate_scale_ir()
    first = next(op for op in fwd._ops if op.type == "Mul")
    with pytest.raises(InternalError, match="still read") as info:
        remove_op(fwd, first)
    assert info.value.graph == fwd.id and first in fwd._ops
