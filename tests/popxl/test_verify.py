"""``Graph.verify`` catches references that IR edits left stale, before lowering does."""

import dataclasses

import numpy as np
import pytest

import popxl
from popxl import ops
from popxl.errors import InternalError
from popxl.transforms import autodiff


def _differentiated():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 3), np.float32))
        s = popxl.variable(np.ones((3, 2), np.float32))
        fwd = ir.create_graph(lambda a, b: ops.transpose(a) * b, x, s)
        grad = autodiff(fwd).graph
        ops.call(fwd, x, s)
    mul_grad = next(op for op in grad._ops if op.type == "MulGrad")
    return fwd, grad, mul_grad


def test_an_attribute_naming_a_removed_tensor_is_reported_with_op_and_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        dead = x * 3.0
        z = ops.relu(x)
    z._producer.attrs["like"] = dead
    main = ir.main_graph
    main.verify()
    # An edit removes the dead op but leaves Relu's reference to its output.
    main._ops.remove(dead._producer)
    x._consumers.remove(dead._producer)
    del main._tensors[dead.id]
    with pytest.raises(InternalError, match=f"'like' refers to tensor {dead.id}") as info:
        main.verify()
    assert info.value.op == z._producer and info.value.graph == main.id
    assert "in the main graph" in str(info.value)


def test_a_recipe_sharing_live_forward_tensors_is_reported():
    fwd, grad, mul_grad = _differentiated()
    grad.verify()
    recipe = mul_grad.attrs["recipe"]
    forward_mul = next(op for op in fwd._ops if op.type == "Mul")
    roots = (fwd.inputs[0], fwd.inputs[1])
    mul_grad.attrs["recipe"] = dataclasses.replace(recipe, op=forward_mul, roots=roots)
    with pytest.raises(InternalError, match="refers to the live tensor") as info:
        grad.verify()
    assert info.value.op == mul_grad and info.value.graph == grad.id


def test_a_recipe_whose_forward_input_reaches_no_root_is_reported():
    _, grad, mul_grad = _differentiated()
    recipe = mul_grad.attrs["recipe"]
    transpose_grad = next(op for op in grad._ops if op.type == "TransposeGrad")
    foreign = transpose_grad.attrs["recipe"].roots[0]  # another recipe's snapshot of x
    mul_grad.attrs["recipe"] = dataclasses.replace(recipe, roots=(foreign, recipe.roots[1]))
    with pytest.raises(InternalError, match="neither a root nor a view") as info:
        grad.verify()
    assert info.value.op == mul_grad and info.value.graph == grad.id
