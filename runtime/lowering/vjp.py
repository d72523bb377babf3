"""Lowering of gradient ops: ``jax.vjp`` of the forward op they differentiate.

The forward op is re-run on the root values it read (views of them are rebuilt), so
in-place ops and writes through views differentiate correctly. XLA shares the re-run with
the forward pass where both are in one program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from popxl._op import Op
from popxl.errors import InternalError
from popxl.tensor import Tensor
from popxl.transforms._grad_ops import OUTPUT_GRAD_FORWARD, VjpRecipe
from popxl.transforms._storage import parents, roots, written_inputs

from .core import Env, LoweringContext, _checked, lower_op, special
from .replica_sums import WeightGrad


def _link(env: Env, h: Tensor, roots: set[Tensor]) -> None:
    """Register the views/aliases between handle ``h`` and the roots in ``env``."""
    if h in roots or h in env.views:
        return
    op, ps = h._producer, parents(h)
    if op is None or ps is None:
        message = f"the recipe's input {h.id} is neither a root nor a view of one"
        raise InternalError(message, op, h._graph)
    if op.opdef.view_inverse is not None:
        env.view(h, op.opdef, op.inputs, op.attrs)
    else:
        env.alias(h, ps[0])
    for p in ps:
        _link(env, p, roots)


def _zero_cotangent(primal: jax.Array) -> jax.Array | np.ndarray:
    if jnp.issubdtype(primal.dtype, jnp.inexact):
        return jnp.zeros_like(primal)
    return np.zeros(primal.shape, dtype=jax.dtypes.float0)


@special("vjp")
def _lower_vjp(ctx: LoweringContext, env: Env, op: Op) -> None:
    recipe = op.attrs["recipe"]
    forward_op = recipe.op
    # Roots whose values the gradient does not need are zeros (XLA folds them away).
    taken = iter(op.inputs[: len(recipe.values)])
    values = [
        env.read(next(taken)) if need else jnp.zeros(r.shape, r.dtype._np_device)
        for r, need in zip(recipe.roots, recipe.needed)
    ]
    cot_inputs = list(op.inputs[len(recipe.values) :])
    root_set = set(recipe.roots)
    results = recipe.results
    inner_ctx = LoweringContext(
        replicas=ctx.replicas, axis_name=ctx.axis_name, collective_impl=ctx.collective_impl
    )

    def forward(*root_values: jax.Array) -> tuple:
        sub = Env()
        sub.values.update(zip(recipe.roots, root_values))
        for h in forward_op.inputs:
            _link(sub, h, root_set)
        if not recipe.detached:
            lower_op(inner_ctx, sub, forward_op)
            return tuple(sub.values[r] for r in results)
        # An op without a gradient: what it writes is a constant as far as gradients go.
        for i in written_inputs(forward_op):
            h = forward_op.inputs[i]
            sub.write(h, jax.lax.stop_gradient(jnp.zeros(h.shape, h.dtype._np_device)))
        return tuple(
            sub.values[r] if r in sub.values else jnp.zeros(r.shape, r.dtype._np_device)
            for r in results
        )

    primals, pullback = jax.vjp(forward, *values)
    supplied = iter(cot_inputs)
    cotangents = tuple(
        env.read(next(supplied)).astype(p.dtype) if present else _zero_cotangent(p)
        for p, present in zip(primals, recipe.present)
    )
    grads = pullback(cotangents)
    deferred = _deferred_weight_grad(ctx, recipe, values, cotangents)
    for out, k in zip(op.outputs, recipe.grad_for):
        if deferred is not None and k == deferred[0]:
            env.values[out] = deferred[1]  # XLA drops the pullback's own product, now unused
        else:
            env.values[out] = _checked(grads[k], out)


@special("vjp_output")
def _lower_vjp_from_output(ctx: LoweringContext, env: Env, op: Op) -> None:
    """A gradient op computed from the forward op's output (``OpDef.grad_from_output``)."""
    forward = OUTPUT_GRAD_FORWARD[op.opdef.key]
    grad = forward.grad_from_output
    if grad is None:
        raise InternalError(f"{forward.type} has no gradient from its output", op)
    y, dy = (env.read(t) for t in op.inputs)
    dx = grad(y, dy.astype(y.dtype), **op.attrs)
    out = op.outputs[0]
    env.values[out] = _checked(dx.astype(out.dtype._np_device), out)


def _deferred_weight_grad(
    ctx: LoweringContext, recipe: VjpRecipe, values: list, cotangents: tuple
) -> tuple[int, WeightGrad] | None:
    """For a matmul with a 2-D right operand under replication by ``jax.vmap``: that
    operand's root index and its gradient as a ``WeightGrad`` (see there); else None."""
    forward_op = recipe.op
    if ctx.collective_impl != "gather" or forward_op.opdef.key != "matmul":
        return None
    lhs, rhs = forward_op.inputs
    out = forward_op.outputs[0]
    if (
        not recipe.present[0]
        or rhs not in recipe.roots
        or rhs in roots(lhs)  # the gradient would also flow through the left operand
        or len(rhs.shape) != 2
        or len(lhs.shape) < 2
        or out.dtype != rhs.dtype
        or not jnp.issubdtype(rhs.dtype.as_numpy(), jnp.floating)
    ):
        return None
    index = recipe.roots.index(rhs)
    if index not in recipe.grad_for:
        return None
    if not all(recipe.needed[recipe.roots.index(r)] for r in roots(lhs)):
        raise InternalError("a weight gradient without its left operand's value", forward_op)
    sub = Env()
    sub.values.update(zip(recipe.roots, values))
    _link(sub, lhs, set(recipe.roots))
    return index, WeightGrad(sub.read(lhs), cotangents[0], rhs.dtype._np_device)
