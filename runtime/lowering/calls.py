"""The handlers of ``call``, ``repeat``, ``conditional`` and grouped ops: runs of calls of one
graph lowered as one ``lax.scan``, so XLA compiles the graph once.

A model built the popxl-addons way creates a layer graph once and calls it once per layer:
``x = layer.bind(weights_i).call(x)`` for ``i`` in ``range(n)``, then the gradient graph
the same way in reverse, then often one optimizer graph per layer. Inlining every call
(``control.call_inline``) gives XLA ``n`` copies of the layer, and on the CPU backend
compile time grows with the number of kernels, so with depth. Measured first (a 4-matmul
layer of width 128, ``value_and_grad`` + SGD, compile seconds at 12 -> 48 layers): a Python
loop 1.6 -> 3.1, the layer as a nested ``jax.jit`` the same (XLA inlines called
computations before optimising), ``lax.scan`` over weights stacked inside the step
4.4 -> 11.1, ``lax.scan`` over weights *stored* stacked 1.9 -> 1.7. Here a *run*
(consecutive ``call`` ops of the same graph whose inputs line up) becomes one scan over the
calls:

* an input that is the previous call's output ``m`` (``x`` above) is a scan **carry**;
* an input that is the same tensor in every call is passed **unchanged** into the body,
  or carried when the graph modifies it (by-ref);
* any other input is **stacked** along a new leading axis (the weights): a scan ``xs``.
  By-ref stacked inputs come back as stacked final values.

Outputs used after the run are scan ``ys``. Their handles, and the main graph's
variables stored stacked (``state_layout``), are members of a *stack*: an ``Env`` view
reading row ``k`` of one stacked array. A later run whose stacked inputs are a whole
stack, in call order or reversed (the gradient calls), scans it directly: no copies, and
the optimizer's updates of stacked variables are a handful of kernels whatever the depth.

``POPXL_CALLS=inline`` (or ``set_policy("inline")``) lowers every call inline, as before.
Runs are planned in ``runs`` and stacks kept in ``stacks``; this module lowers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from popxl._op import Op
from popxl.graph import Graph
from popxl.ops.collectives import sums_every_replica
from popxl.tensor import Constant

from . import control, grouping, remote
from .core import Env, LoweringContext, _View, lower_op, schedule, special
from .replica_sums import LINEAR_ACCUMULATES, Deferred, body_traced, value_of
from .runs import Run, plan_of, policy
from .stacks import (
    Row,
    SetRow,
    StackKey,
    add_stack,
    gather_rows,
    in_scan_order,
    input_stacks,
    lower_graph_with_stacks,
    portable_value,
    progression,
    put_rows,
    row_of,
    scatter_rows,
    shared_stacks,
    stack_of,
    stack_order,
    stacked_input,
    take_rows,
    whole_stacks,
    write_stacked,
)

Array = Any


# Stacks: one array holding many tensors' values -------------------------------------------


# Lowering ----------------------------------------------------------------------------------


@special("call")
def _lower_call(ctx: LoweringContext, env: Env, op: Op) -> None:
    # Runs are planned per graph; a call lowered on its own (e.g. re-run by a gradient op
    # in a scratch environment) is inlined.
    # Placed steps lower each call on its IPU's device (``runtime.placement``).
    if policy(op.graph.ir) == "inline" or ctx.placement is not None or env.graph is not op.graph:
        control.call_inline(ctx, env, op)
        return
    runs, members = plan_of(op.graph)
    run = runs.get(op)
    if run is not None:
        lower_run(ctx, env, run)
    elif op not in members:  # later calls of a run were lowered with its first
        _inline(ctx, env, op)


def _inline(ctx: LoweringContext, env: Env, op: Op) -> None:
    """``control``'s inlined call, except that stacks cross the call: inputs that are rows
    of a stack enter the callee as rows of the same stack (written back when every one of
    them is by-ref), and outputs that are rows of a stack leave as rows of it, so runs on
    either side read and write whole stacks."""
    graph = op.attrs["graphs"][0]
    inner = Env(graph)
    shared = shared_stacks(env, op)
    for t, g_in in zip(op.inputs, graph._inputs):
        row = row_of(env, t)
        if row is not None and row[0] in shared:
            inner.views[g_in] = _View(Row(row[1]), SetRow(row[1]), (row[0],), {})  # type: ignore[arg-type]
        else:
            inner.values[g_in] = env.read_raw(t)
    for key in shared:
        inner.values[key] = env.values[key]  # type: ignore[index]
    for o in schedule(ctx, graph):
        lower_op(ctx, inner, o)
    for index in sorted(op.modified_inputs):
        row = row_of(env, op.inputs[index])
        if row is None or row[0] not in shared:
            env.write(op.inputs[index], inner.read_raw(graph._inputs[index]))
    for key, by_ref in shared.items():
        if by_ref:
            env.values[key] = inner.values[key]  # type: ignore[index]
    outer_values: dict[Any, Any] = env.values  # stack keys live beside tensors
    inner_values: dict[Any, Any] = inner.values
    for t, g_out in zip(op.outputs, graph._outputs):
        row = row_of(inner, g_out)
        if row is None:
            env.values[t] = inner.read_raw(g_out)
            continue
        key, index = row
        # A row of a stack the caller passed in (an input passed through): the output is a
        # new tensor, so it is a copy; as a view it would share the caller's storage.
        if key in shared:
            env.values[t] = inner.read_raw(g_out)
            continue
        outer_values.setdefault(key, inner_values[key])
        env.views[t] = _View(Row(index), SetRow(index), (key,), {})  # type: ignore[arg-type]


def lower_run(ctx: LoweringContext, env: Env, run: Run) -> None:
    # The stacks kept in scratch buffers (``runtime.scratch``), found by the planned run.
    scratch = {m: k for m in run.ys if (k := ctx.scratch.get((run.ops[0], m))) in ctx.fx}
    stacked = [i for i, s in enumerate(run.slots) if s.kind == "stack"]
    run = _in_stack_order(env, run, stacked)
    graph = run.graph
    calls = run.ops
    n = len(calls)
    sources = {i: stack_of(env, run.stacked(i)) for i in stacked}
    reverse = _mostly_reversed(sources.values())
    xs = [stacked_input(env, run.stacked(i), sources[i], reverse) for i in stacked]
    independent = stacked and not any(s.kind == "carry" for s in run.slots)
    if independent and _lower_as_map(ctx, env, run, stacked, sources, reverse, xs):
        return
    whole = whole_stacks(env, run)  # shared inputs that are all the rows of a stack
    in_whole = {i for _, indices, _ in whole for i in indices}
    fixed_stacks = [(indices, env.values[key]) for key, indices, ref in whole if not ref]  # type: ignore[index]
    carried_stacks = [(key, indices) for key, indices, ref in whole if ref]
    carry_in = [(i, s) for i, s in enumerate(run.slots) if s.kind == "carry" and i not in in_whole]
    init = tuple(env.read(calls[0].inputs[i]) for i, _ in carry_in)
    init_stacks = tuple(env.read(key) for key, _ in carried_stacks)  # type: ignore[arg-type]
    fixed = {
        i: env.read(calls[0].inputs[i])
        for i, s in enumerate(run.slots)
        if s.kind == "same" and i not in in_whole
    }
    stacked_modified = [i for i in run.modified if run.slots[i].kind == "stack"]
    # By-ref stacked inputs (gradient accumulators) are carried whole and updated a row per
    # call in place, rather than read as ``xs`` and rebuilt as ``ys`` (a new buffer and a
    # copy of the stack per run). Under vmap replication they stay ``xs``/``ys``, so a
    # deferred final can leave the run with its replica sum (``replica_sums.Summed``).
    in_place = [] if ctx.collective_impl == "gather" else stacked_modified
    by_xs = [(i, v) for i, v in zip(stacked, xs) if i not in in_place]
    scan_xs = tuple(v for _, v in by_xs) + ((jnp.arange(n),) if in_place or scratch else ())
    in_scratch: list[int] = []  # the ys written into their scratch buffer (found in tracing)
    init_rows = tuple(v for i, v in zip(stacked, xs) if i in in_place)

    def body(carry: tuple, x: tuple) -> tuple:
        values, stack_values, row_stacks, fx = carry
        inputs: list[Array] = [None] * len(run.slots)
        for (i, _), v in zip(carry_in, values):
            inputs[i] = v
        for i, v in fixed.items():
            inputs[i] = v
        for (i, _), v in zip(by_xs, x):
            inputs[i] = v
        for i, v in zip(in_place, row_stacks):
            inputs[i] = lax.dynamic_index_in_dim(v, x[-1], keepdims=False)
        stacks = fixed_stacks + [(ix, v) for (_, ix), v in zip(carried_stacks, stack_values)]
        ctx.fx = fx
        outs, finals, stack_finals = lower_graph_with_stacks(ctx, graph, inputs, stacks, True)
        new = tuple(value_of(outs[s.source] if s.source >= 0 else finals[i]) for i, s in carry_in)
        new_stacks = tuple(stack_finals[len(fixed_stacks) :])
        new_rows = tuple(
            lax.dynamic_update_index_in_dim(v, value_of(finals[i]).astype(v.dtype), x[-1], 0)
            for i, v in zip(in_place, row_stacks)
        )
        ys = (
            _ys_of_call(ctx, run, outs, scratch, x[-1] if scratch else None, in_scratch),
            tuple(portable_value(ctx, finals[i]) for i in stacked_modified if i not in in_place),
        )
        return (new, new_stacks, new_rows, ctx.fx), ys

    start = (init, init_stacks, init_rows, ctx.fx)
    with body_traced():
        scanned: tuple = lax.scan(body, start, scan_xs, length=n, reverse=reverse)
    (final, final_stacks, final_rows, ctx.fx), (ys, finals) = scanned
    finals = final_rows if in_place else finals
    _write_carries(env, calls, carry_in, final)
    for (key, _), value in zip(carried_stacks, final_stacks):
        env.values[key] = value  # type: ignore[index]
    kept_ys = iter(ys)
    for m in run.ys:
        value = ctx.fx[scratch[m]] if m in in_scratch else next(kept_ys)
        # Every call's output, the last call's carried one too, is a row of the stack: a
        # later in-place write to it must reach the row that other readers see.
        add_stack(env, in_scan_order([op.outputs[m] for op in calls], reverse), value)
    for i, value in zip(stacked_modified, finals):
        write_stacked(env, run.stacked(i), sources[i], reverse, value)


def _mostly_reversed(sources: Any) -> bool:
    """Whether more of a run's stacked inputs are stacks read in reverse (the gradient
    calls) than in order: the scan then runs in reverse."""
    found = [s for s in sources if s]
    return sum(1 for s in found if s[1]) > sum(1 for s in found if not s[1])


def _in_stack_order(env: Env, run: Run, stacked: list[int]) -> Run:
    """``run`` with its calls in the order of the stacks they read, where no call feeds the
    next (so the scan reads whole stacks, not gathered rows)."""
    if not stacked or any(s.kind == "carry" for s in run.slots):
        return run
    order = stack_order(env, [run.stacked(i) for i in stacked])
    return Run(tuple(run.ops[k] for k in order), run.slots, run.modified, run.ys)


def _ys_of_call(
    ctx: LoweringContext,
    run: Run,
    outs: Sequence[Any],
    scratch: dict[int, Any],
    row: Array | None,
    in_scratch: list[int],
) -> tuple:
    """One call's outputs used after the run: written into their scratch buffer at ``row``
    (the call's index; None when the run keeps no scratch buffer) where one is kept (noted
    in ``in_scratch``), else returned as the scan's ``ys``."""
    kept = []
    for m in run.ys:
        value = portable_value(ctx, outs[m])
        buffer = ctx.fx[scratch[m]] if m in scratch else None
        if buffer is not None and _fits(value, buffer):
            ctx.fx[scratch[m]] = lax.dynamic_update_index_in_dim(buffer, value, row, 0)
            in_scratch.append(m)
        else:
            kept.append(value)
    return tuple(kept)


def _write_carries(env: Env, calls: Sequence[Op], carry_in: list, final: Sequence[Array]) -> None:
    """A run's final carries: the last call's outputs, or the by-ref inputs they update."""
    for (i, slot), value in zip(carry_in, final):
        if slot.source >= 0:
            env.values[calls[-1].outputs[slot.source]] = value
        else:
            env.write(calls[0].inputs[i], value)


def _fits(value: Any, buffer: Array) -> bool:
    """Whether ``value`` can be a row of the scratch ``buffer`` (a plain array of its row's
    shape and dtype, not a deferred replica sum)."""
    return (
        isinstance(value, jax.Array | np.ndarray)
        and tuple(value.shape) == tuple(buffer.shape[1:])
        and value.dtype == buffer.dtype
    )


class _HasEffects(Exception):
    """The called graph reads or writes effect state (streams, remote buffers)."""


def _lower_as_map(
    ctx: LoweringContext,
    env: Env,
    run: Run,
    stacked: list[int],
    sources: dict[int, tuple[StackKey, bool] | None],
    reverse: bool,
    xs: list[Array],
) -> bool:
    """Lower a run without carries (every call independent: a per-layer optimizer step)
    as one ``jax.vmap`` over the stacked inputs, so each op of the graph is one kernel over
    the whole stack, updated in place, instead of a loop of per-row slices and updates.
    Returns False (lowering nothing) when the graph touches effect state, whose order
    across calls a map would lose."""
    calls = run.ops
    fixed = {i: env.read(calls[0].inputs[i]) for i, s in enumerate(run.slots) if s.kind == "same"}
    stacked_modified = [i for i in run.modified if run.slots[i].kind == "stack"]
    outer_fx = ctx.fx

    def body(x: tuple) -> tuple:
        inputs: list[Array] = [None] * len(run.slots)
        for i, v in fixed.items():
            inputs[i] = v
        for i, v in zip(stacked, x):
            inputs[i] = v
        ctx.fx = dict(outer_fx)
        outs, finals, _ = lower_graph_with_stacks(ctx, run.graph, inputs, [], True)
        if ctx.fx.keys() != outer_fx.keys() or any(ctx.fx[k] is not v for k, v in outer_fx.items()):
            raise _HasEffects
        return (
            tuple(portable_value(ctx, outs[m]) for m in run.ys),
            tuple(portable_value(ctx, finals[i]) for i in stacked_modified),
        )

    try:
        with body_traced():
            ys, finals = jax.vmap(body)(tuple(xs))
    except _HasEffects:
        return False
    finally:
        ctx.fx = outer_fx
    for m, value in zip(run.ys, ys):
        add_stack(env, in_scan_order([op.outputs[m] for op in calls], reverse), value)
    for i, value in zip(stacked_modified, finals):
        write_stacked(env, run.stacked(i), sources[i], reverse, value)
    return True


def _constant_offsets(ops: Sequence[Op], distinct: bool = False) -> list[int] | None:
    """The constant offsets of remote loads or stores (``distinct``: all different), or
    None."""
    found = []
    for op in ops:
        t = op.inputs[1]
        if not isinstance(t, Constant):
            return None
        found.append(int(np.asarray(t._data).reshape(())))
    return found if not distinct or len(set(found)) == len(found) else None


def _group_remote_load(ctx: LoweringContext, env: Env, ops: Sequence[Op]) -> bool:
    """Loads of constant slots of one buffer, the results stacks. Runs of slots that step
    evenly (a phase loading every layer in order, the next phase in reverse) are each the
    buffer itself or a slice of it, which the layers' loop reads without a copy; other
    slots are one gather. (Lowered as one gather of every slot, the phased GPT step of
    ``bench/transformer_step.py`` accessed 127 MB per step, its reference 88; as slices, 106.)"""
    offsets = _constant_offsets(ops)
    if offsets is None:
        return False
    buffer = ctx.fx[remote.buffer_key(ops[0].attrs["buffer_id"])]
    rows = [min(max(k, 0), buffer.shape[0] - 1) for k in offsets]
    outputs = [op.outputs[0] for op in ops]
    runs = _even_runs(rows)
    if len(runs) > max(1, len(rows) // 2):  # mostly scattered slots: one gather
        runs = [(0, len(rows))]
    for start, end in runs:
        add_stack(env, outputs[start:end], take_rows(buffer, rows[start:end]))
    return True


def _even_runs(rows: list[int]) -> list[tuple[int, int]]:
    """``rows`` cut into consecutive ``(start, end)`` pieces that each step evenly."""
    runs: list[tuple[int, int]] = []
    start = 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or progression(rows[start : end + 1]) is None:
            runs.append((start, end))
            start = end
    return runs


def _group_remote_store(ctx: LoweringContext, env: Env, ops: Sequence[Op]) -> bool:
    """Stores to distinct slots of one buffer: one scatter of the stacked values."""
    offsets = _constant_offsets(ops, distinct=True)
    if offsets is None:
        return False
    key = remote.buffer_key(ops[0].attrs["buffer_id"])
    buffer = ctx.fx[key]
    rows = [min(max(k, 0), buffer.shape[0] - 1) for k in offsets]
    values = value_of(gather_rows(env, [op.inputs[0] for op in ops])).astype(buffer.dtype)
    ctx.fx[key] = put_rows(buffer, rows, values)
    return True


def _group_all_reduce(ctx: LoweringContext, env: Env, ops: Sequence[Op]) -> bool:
    """All-reduces of one kind act on every element alike: one all-reduce of the stacked
    inputs (which keep their replica sums, ``replica_sums``)."""
    first = ops[0]
    value = gather_rows(env, [op.inputs[0] for op in ops])
    impl = ctx.collective_impl
    if isinstance(value, Deferred) and impl == "gather" and sums_every_replica(first):
        value, impl = value.replica_sum(str(ctx.axis_name), ctx.replicas), "summed"
    result = first.opdef.lower(value_of(value), **first.attrs, impl=impl)  # type: ignore[misc]
    result = result[0] if isinstance(result, tuple) else result
    add_stack(env, [op.outputs[0] for op in ops], result)
    return True


_GROUPED_EFFECTS = {
    "remote_load": _group_remote_load,
    "remote_store": _group_remote_store,
    "replicated_all_reduce": _group_all_reduce,
}


@special("repeat")
def _lower_repeat(ctx: LoweringContext, env: Env, op: Op) -> None:
    """``control``'s loop, except that inputs which are all the rows of a stack (a GA loop
    over a micro-batch graph receiving every layer's weights) enter the body as the one
    stacked array, so runs of calls inside the body scan it without stacking rows."""
    graph = op.attrs["graphs"][0]
    n_out = len(graph._outputs)
    by_ref = sorted(op.modified_inputs)
    groups = []
    if policy(op.graph.ir) != "inline" and ctx.placement is None:
        groups = input_stacks(env, op.inputs, range(n_out, len(op.inputs)), set(by_ref))
    if not groups:
        control.repeat_loop(ctx, env, op)
        return
    grouped = {i for _, indices, _ in groups for i in indices}
    initial = [None if i in grouped else env.read(t) for i, t in enumerate(op.inputs)]
    fixed_stacks = [(ix, env.values[key]) for key, ix, ref in groups if not ref]  # type: ignore[index]
    carried = [(key, ix) for key, ix, ref in groups if ref]
    ref_plain = [i for i in by_ref if i not in grouped]

    def body(_step: int, carry: tuple) -> tuple:
        outs_in, ref_values, stack_values, fx = carry
        current = list(initial)
        current[:n_out] = outs_in
        for index, value in zip(ref_plain, ref_values):
            if index >= n_out:
                current[index] = value
        stacks = fixed_stacks + [(ix, v) for (_, ix), v in zip(carried, stack_values)]
        ctx.fx = fx
        outs, finals, stack_finals = lower_graph_with_stacks(ctx, graph, current, stacks)
        new_stacks = tuple(stack_finals[len(fixed_stacks) :])
        return tuple(outs), tuple(finals[i] for i in ref_plain), new_stacks, ctx.fx

    start = (
        tuple(initial[:n_out]),
        tuple(initial[i] for i in ref_plain),
        tuple(env.read(key) for key, _ in carried),  # type: ignore[arg-type]
        ctx.fx,
    )
    count = op.attrs["repeat_count"]
    with body_traced():
        outs, ref_values, stack_values, ctx.fx = (
            lax.fori_loop(0, count, body, start) if count else start
        )
    for index, value in zip(ref_plain, ref_values):
        env.write(op.inputs[index], value)
    for (key, _), value in zip(carried, stack_values):
        env.values[key] = value  # type: ignore[index]
    for t, value in zip(op.outputs, outs):
        env.values[t] = value


@special("conditional")
def _lower_conditional(ctx: LoweringContext, env: Env, op: Op) -> None:
    """``control``'s branches, except that inputs of a branch which are all the rows of a
    stack enter it as the one stacked array (see ``_lower_repeat``); a stack the branch
    takes by reference leaves it as the one stacked array too."""
    graphs = op.attrs["graphs"]
    offsets = op.attrs["input_offsets"]
    spans = [range(at, at + len(g._inputs)) for g, at in zip(graphs, offsets)]
    modified = op.modified_input_indices()
    groups = []
    if policy(op.graph.ir) != "inline" and ctx.placement is None:
        groups = [input_stacks(env, op.inputs, span, modified) for span in spans]
    if not any(groups):
        control.conditional_branches(ctx, env, op)
        return
    grouped_all = {i for stacks in groups for _, indices, _ in stacks for i in indices}
    in_stacks = {op.inputs[i] for i in grouped_all}
    loose = {op.inputs[i] for span in spans for i in span if i not in grouped_all}
    written = [t for t in control.modified_parents(op) if t not in in_stacks]
    if any(t in loose for t in control.modified_parents(op) if t in in_stacks):
        control.conditional_branches(ctx, env, op)  # written both as a row and on its own
        return
    predicate = env.read(op.inputs[0]).reshape(())
    stack_keys = list(dict.fromkeys(key for stacks in groups for key, _, ref in stacks if ref))
    stack_now = [env.values[key] for key in stack_keys]  # type: ignore[index]

    def branch(graph: Graph, span: range, stacks: list) -> Any:
        grouped = {i for _, indices, _ in stacks for i in indices}
        values = [None if i in grouped else env.read(op.inputs[i]) for i in span]
        stacked = [([i - span.start for i in ix], env.values[key]) for key, ix, _ in stacks]

        def run(fx: Any) -> tuple:
            ctx.fx = fx
            outs, finals, stack_finals = lower_graph_with_stacks(ctx, graph, values, stacked)
            kept = control.branch_finals(env, op, span.start, finals, written)
            new_stacks = {key: f for (key, _, ref), f in zip(stacks, stack_finals) if ref}
            stacks_out = [new_stacks.get(key, now) for key, now in zip(stack_keys, stack_now)]
            return tuple(outs), tuple(kept), tuple(stacks_out), ctx.fx

        return run

    then_branch, else_branch = (branch(g, s, k) for g, s, k in zip(graphs, spans, groups))
    with body_traced():
        outs, finals, stack_finals, ctx.fx = lax.cond(predicate, then_branch, else_branch, ctx.fx)
    for t, value in zip(written, finals):
        env.write(t, value)
    for key, value in zip(stack_keys, stack_finals):
        env.values[key] = value  # type: ignore[index]
    for t, value in zip(op.outputs, outs):
        env.values[t] = value


# Groups of identical ops ---------------------------------------------------------------------


@special("op_group")
def _lower_op_group(ctx: LoweringContext, env: Env, group: grouping.OpGroup) -> None:
    """Independent ops of one kind (``grouping``: inline variable updates) as one ``vmap`` of
    the op's lowering over their stacked inputs; outputs become a stack."""
    ops = group.ops
    first = ops[0]
    opdef = first.opdef
    lower_effects = _GROUPED_EFFECTS.get(opdef.key)
    if lower_effects is not None:
        if not lower_effects(ctx, env, ops):
            for op in ops:
                lower_op(ctx, env, op)
        return
    slots = range(len(first.inputs))
    stacked = [j for j in slots if any(op.inputs[j] is not first.inputs[j] for op in ops)]
    deferred = opdef.key in LINEAR_ACCUMULATES and ctx.collective_impl == "gather"
    if not stacked or deferred:  # the accumulations keep their replica sums one by one
        for op in ops:
            lower_op(ctx, env, op)
        return
    # The vmap runs over rows already stored as stacks. An array held on its own (a
    # variable the program also reads alone, a gradient) would be copied into a stack
    # (XLA does not fuse that concatenate) and a new value sliced back out: its op goes
    # alone, where XLA updates it in place and reads rows of stacks without copying them.
    # Scalars (learning rates, constants) are cheap to gather.
    alone = [
        op
        for op in ops
        if any(row_of(env, op.inputs[j]) is None and op.inputs[j].nelms > 1 for j in stacked)
    ]
    for op in alone:
        lower_op(ctx, env, op)
    ops = tuple(op for op in ops if op not in alone)
    if len(ops) < 2:
        for op in ops:
            lower_op(ctx, env, op)
        return
    ops = tuple(ops[k] for k in stack_order(env, [[op.inputs[j] for op in ops] for j in stacked]))
    fixed = {j: env.read(first.inputs[j]) for j in slots if j not in stacked}
    xs = [value_of(gather_rows(env, [op.inputs[j] for op in ops])) for j in stacked]

    def one(*rows: Array) -> tuple:
        args = [fixed.get(j) for j in slots]
        for j, row in zip(stacked, rows):
            args[j] = row
        results = opdef.lower(*args, **first.attrs)  # type: ignore[misc]
        return results if isinstance(results, tuple) else (results,)

    results = jax.vmap(one)(*xs)
    for in_index, result_index in opdef.modifies:
        targets = [op.inputs[in_index] for op in ops]
        scatter_rows(env, targets, results[result_index].astype(targets[0].dtype._np_device))
    aliased = dict(opdef.alias_outputs)
    for k in range(len(first.outputs)):
        if k in aliased:
            for op in ops:
                env.alias(op.outputs[k], op.inputs[aliased[k]])
        else:
            value = results[k].astype(first.outputs[k].dtype._np_device)
            add_stack(env, [op.outputs[k] for op in ops], value)
