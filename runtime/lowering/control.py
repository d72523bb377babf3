"""Plain lowerings of subgraph ops: a ``call`` inlined, a ``repeat`` as one loop, a
``conditional`` as ``lax.cond`` over its branches.

The registered handlers of these ops are in ``calls`` (runs of calls scanned, stacks
passed whole); they fall back to these where no run or stack applies.

Effect state (stream cursors, output buffers, remote buffers) lives in ``ctx.fx`` and is
threaded through loops and branches as part of their carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax import lax

from popxl._op import Op
from popxl.tensor import Tensor

from .core import Env, LoweringContext, lower_graph
from .replica_sums import body_traced

Array = Any


def call_inline(ctx: LoweringContext, env: Env, op: Op) -> None:
    graph = op.attrs["graphs"][0]
    inputs = [env.read_raw(t) for t in op.inputs]
    outs, finals, _ = lower_graph(ctx, graph, inputs, raw_outputs=True)
    placement = ctx.placement
    for index in sorted(op.modified_inputs):
        if placement is None:
            env.write(op.inputs[index], finals[index])
            continue
        # The caller's storage is rewritten where the callee left the new value.
        home = placement.home(finals[index])
        placement.localise(env, op.inputs[index : index + 1], home)
        env.write(op.inputs[index], finals[index])
        placement.mark(env, op.inputs[index : index + 1], home)
    for t, value in zip(op.outputs, outs):
        env.values[t] = value


def repeat_loop(ctx: LoweringContext, env: Env, op: Op) -> None:
    graph = op.attrs["graphs"][0]
    count = op.attrs["repeat_count"]
    initial = [env.read(t) for t in op.inputs]
    n_out = len(graph._outputs)
    by_ref = sorted(op.modified_inputs)
    placement = ctx.placement
    homes = placement.input_homes(env, op.inputs) if placement is not None else None

    def body(_step: int, carry: tuple) -> tuple:
        carried, ref_values, fx = carry
        current = list(initial)
        current[:n_out] = carried
        for index, value in zip(by_ref, ref_values):
            if index >= n_out:
                current[index] = value
        ctx.fx = fx
        if homes is not None:  # the carry keeps the homes of the loop's inputs
            current = list(placement.adopt(current, homes))
        outs, finals, _ = lower_graph(ctx, graph, current)
        finals = [finals[i] for i in by_ref]
        if homes is not None:
            outs = placement.settle(outs, homes[:n_out])
            finals = placement.settle(finals, [homes[i] for i in by_ref])
        return tuple(outs), tuple(finals), ctx.fx

    start = (tuple(initial[:n_out]), tuple(initial[i] for i in by_ref), ctx.fx)
    with body_traced():
        carried, ref_values, ctx.fx = lax.fori_loop(0, count, body, start) if count else start
    if homes is not None:
        carried = placement.adopt(carried, homes[:n_out])
        ref_values = placement.adopt(ref_values, [homes[i] for i in by_ref])
    for index, value in zip(by_ref, ref_values):
        env.write(op.inputs[index], value)
    for t, value in zip(op.outputs, carried):
        env.values[t] = value


def conditional_branches(ctx: LoweringContext, env: Env, op: Op) -> None:
    """``lax.cond`` over the two branches. Inputs a branch takes by reference are written
    back: each branch returns the value of every written input after its own write-backs
    (see ``branch_finals``), so the branch that did not run leaves them unchanged."""
    then_graph, else_graph = op.attrs["graphs"]
    then_at, else_at = op.attrs["input_offsets"]
    predicate = env.read(op.inputs[0]).reshape(())
    written = modified_parents(op)
    current = [env.read(t) for t in written]  # for the homes of the written tensors

    def branch(graph, offset):  # noqa: ANN001, ANN202
        values = [env.read(t) for t in op.inputs[offset : offset + len(graph._inputs)]]

        def run(fx):  # noqa: ANN001, ANN202
            ctx.fx = fx
            outs, finals, _ = lower_graph(ctx, graph, values)
            kept = branch_finals(env, op, offset, finals, written)
            if ctx.placement is not None:  # both branches must agree where outputs live
                outs = ctx.placement.settle(outs, [None] * len(outs))
                kept = ctx.placement.settle(kept, ctx.placement.homes_of(current))
            return tuple(outs), tuple(kept), ctx.fx

        return run

    with body_traced():
        outs, finals, ctx.fx = lax.cond(
            predicate, branch(then_graph, then_at), branch(else_graph, else_at), ctx.fx
        )
    if ctx.placement is not None:  # written inputs stay where they lived
        finals = ctx.placement.adopt(finals, ctx.placement.homes_of(current))
    for t, value in zip(written, finals):
        env.write(t, value)
    for t, value in zip(op.outputs, outs):
        env.values[t] = value


def modified_parents(op: Op) -> list[Tensor]:
    """The tensors a conditional writes (inputs of a branch taken by reference), once each."""
    return list(dict.fromkeys(op.inputs[i] for i in sorted(op.modified_input_indices())))


def branch_finals(
    env: Env,
    op: Op,
    offset: int,
    finals: Sequence[Array | None],
    written: Sequence[Tensor],
) -> list[Array]:
    """The value of each of ``written`` after the branch whose inputs start at op input
    ``offset``: its write-backs are applied to a scratch copy of ``env`` and every written
    tensor read from it, so tensors sharing storage (an in-place op's output and its input,
    views) come back consistent and write back in any order."""
    modified = op.modified_input_indices()
    scratch = Env(env.graph)
    scratch.values, scratch.views = dict(env.values), dict(env.views)
    for k, final in enumerate(finals):
        if offset + k in modified and final is not None:
            scratch.write(op.inputs[offset + k], final)
    return [scratch.read(t) for t in written]
