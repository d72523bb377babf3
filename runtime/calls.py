"""Runs of calls of one graph lowered as one ``lax.scan``, so XLA compiles the graph once.

A model built the popxl-addons way creates a layer graph once and calls it once per layer:
``x = layer.bind(weights_i).call(x)`` for ``i`` in ``range(n)``, then the gradient graph
the same way in reverse, then often one optimizer graph per layer. Inlining every call
(``control._lower_call``) gives XLA ``n`` copies of the layer, and on the CPU backend
compile time grows with the number of kernels, so with depth. Here a *run* (consecutive
``call`` ops of the same graph whose inputs line up) becomes one scan over the calls:

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
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from popxl._op import Op
from popxl.graph import Graph
from popxl.ops.collectives import sums_every_replica
from popxl.tensor import Constant, Tensor
from popxl.transforms._storage import roots

from . import control, grouping, remote
from .lowering import (
    Env,
    LoweringContext,
    _View,
    lower_op,
    schedule,
    scheduler,
    special,
)
from .replica_sums import LINEAR_ACCUMULATES, Deferred, Summed, body_traced, portable, value_of

Array = Any
POLICIES = ("scan", "inline")
_policy: str | None = None
MIN_RUN = 2  # shortest run worth a scan


def policy() -> str:
    """How repeated calls are lowered: ``"scan"`` (default) or ``"inline"``."""
    choice = _policy or os.environ.get("POPXL_CALLS", "scan")
    if choice not in POLICIES:
        raise ValueError(f"POPXL_CALLS must be one of {', '.join(POLICIES)}, got {choice!r}.")
    return choice


def set_policy(choice: str | None) -> None:
    """Force a policy for programs built from now on (``None``: back to ``POPXL_CALLS``).

    Compiled steps are cached by IR structure and policy, so switching never reuses a step
    lowered the other way.
    """
    global _policy
    if choice is not None and choice not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {choice!r}.")
    _policy = choice


# Planning: which consecutive calls form a run -------------------------------------------


@scheduler
def _schedule(ctx: LoweringContext, graph: Graph) -> Sequence[Any]:
    """Lowering order: groups brought together (``grouping``), unless calls are inlined or
    the step is placed on several devices."""
    if policy() == "inline" or ctx.placement is not None:
        return graph._ops
    return grouping.schedule(graph)


@dataclass(frozen=True)
class Slot:
    """How one input of the called graph is fed in a run.

    kind: ``"same"`` (one tensor for every call, not modified), ``"carry"`` (the previous
    call's output ``source``, or with ``source`` -1 this by-ref input's own final value)
    or ``"stack"`` (one tensor per call).
    """

    kind: str
    source: int = -1


@dataclass(frozen=True)
class Run:
    ops: tuple[Op, ...]
    slots: tuple[Slot, ...]
    modified: tuple[int, ...]
    ys: tuple[int, ...]  # outputs read after the run (every call's value is kept)

    @property
    def graph(self) -> Graph:
        return self.ops[0].attrs["graphs"][0]

    def stacked(self, index: int) -> list[Tensor]:
        return [op.inputs[index] for op in self.ops]


def _is_call(op: Op) -> bool:
    return op.opdef.special == "call"


def _same_call(a: Op, b: Op) -> bool:
    graph_a, graph_b = a.attrs["graphs"][0], b.attrs["graphs"][0] if _is_call(b) else None
    same_graph = graph_b is graph_a or (
        graph_b is not None and grouping.signature(graph_b) == grouping.signature(graph_a)
    )
    return (
        same_graph
        and b.modified_inputs == a.modified_inputs
        and len(b.inputs) == len(a.inputs)
        and b.execution_context == a.execution_context
    )


# Plans by graph, least recently used first; bounded (a plan holds its graph's ops, so a
# weak-keyed cache could never drop them).
_PLANS: OrderedDict[int, tuple[tuple[Op, ...], dict[Op, Run], set[Op]]] = OrderedDict()
PLAN_CACHE_SIZE = 64


def runs_of(graph: Graph) -> dict[Op, Run]:
    """The graph's runs, keyed by their first call."""
    return plan_of(graph)[0]


def plan_of(graph: Graph) -> tuple[dict[Op, Run], set[Op]]:
    """(runs keyed by their first call, the other calls of every run); cached while the
    graph is unchanged."""
    cached = _PLANS.get(id(graph))
    if cached is not None and cached[0] == tuple(graph._ops):
        _PLANS.move_to_end(id(graph))
        return cached[1], cached[2]
    ops = graph._ops if policy() == "inline" else grouping.schedule(graph)
    runs: dict[Op, Run] = {}
    i = 0
    while i < len(ops):
        j = i + 1
        if _is_call(ops[i]):
            while j < len(ops) and _same_call(ops[i], ops[j]):
                j += 1
            if j - i >= MIN_RUN:
                run = plan_run(tuple(ops[i:j]), ops[j:], graph._outputs)
                if run is not None:
                    runs[ops[i]] = run
        i = j
    members = {op for run in runs.values() for op in run.ops[1:]}
    _PLANS[id(graph)] = (tuple(graph._ops), runs, members)
    while len(_PLANS) > PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return runs, members


def stacked_feeds(graph: Graph, _memo: dict[int, list] | None = None) -> list:
    """For every stacked input of every run and op group in ``graph``, and of those in the
    graphs it calls (``call``, ``repeat``, ``conditional``: their inputs traced back to
    ``graph``'s tensors), the tensors of ``graph`` fed to the rows, in call order; these are
    the variables worth storing stacked (``state_layout``). Inputs of chained runs (the
    layers) come first, so the weights are stacked as the layers scan them."""
    feeds = _feeds(graph, {} if _memo is None else _memo)
    return [rows for chained, rows in sorted(feeds, key=lambda f: not f[0])]


def _feeds(graph: Graph, memo: dict[int, list]) -> list[tuple[bool, list[Tensor]]]:
    if id(graph) in memo:
        return memo[id(graph)]
    feeds = [
        (any(s.kind == "carry" for s in run.slots), run.stacked(j))
        for run in runs_of(graph).values()
        for j in _stacked_slots(run)
    ]
    if policy() != "inline":
        for group in grouping.schedule(graph):
            if isinstance(group, grouping.OpGroup):
                first = group.ops[0]
                feeds += [
                    (False, [op.inputs[j] for op in group.ops])
                    for j in range(len(first.inputs))
                    if any(op.inputs[j] is not first.inputs[j] for op in group.ops)
                ]
    known = {tuple(map(id, rows)) for _, rows in feeds}
    for op in graph._ops:
        if op.opdef.special not in ("call", "repeat", "conditional"):
            continue
        offsets = op.attrs.get("input_offsets", (0,) * len(op.attrs["graphs"]))
        for sub, offset in zip(op.attrs["graphs"], offsets):
            outer = dict(zip(sub._inputs, op.inputs[offset : offset + len(sub._inputs)]))
            for chained, rows in _feeds(sub, memo):
                mapped = [outer.get(t) for t in rows]
                if all(t is not None for t in mapped) and tuple(map(id, mapped)) not in known:
                    known.add(tuple(map(id, mapped)))
                    feeds.append((chained, mapped))  # type: ignore[arg-type]
    memo[id(graph)] = feeds
    return feeds


def _stacked_slots(run: Run) -> list[int]:
    return [j for j, slot in enumerate(run.slots) if slot.kind == "stack"]


def _carry_source(calls: Sequence[Op], index: int) -> int | None:
    """The output index ``m`` with ``calls[k].inputs[index] is calls[k-1].outputs[m]``."""
    first = calls[1].inputs[index]
    if first not in calls[0].outputs:
        return None
    m = calls[0].outputs.index(first)
    ok = all(calls[k].inputs[index] is calls[k - 1].outputs[m] for k in range(1, len(calls)))
    return m if ok else None


def plan_run(
    calls: tuple[Op, ...], later: Sequence[Op], graph_outputs: Sequence[Tensor]
) -> Run | None:
    """How to scan ``calls``, or None when they cannot be one scan."""
    graph = calls[0].attrs["graphs"][0]
    produced = {t for op in calls for t in op.outputs}
    modified = tuple(sorted(calls[0].modified_inputs))
    slots: list[Slot] = []
    for index in range(len(calls[0].inputs)):
        tensors = [op.inputs[index] for op in calls]
        if all(t is tensors[0] for t in tensors):
            slots.append(Slot("carry") if index in modified else Slot("same"))
            if tensors[0] in produced:
                return None
            continue
        m = _carry_source(calls, index)
        if m is not None:
            g_in, g_out = graph._inputs[index], graph._outputs[m]
            if index in modified or (g_in.shape, g_in.dtype) != (g_out.shape, g_out.dtype):
                return None
            if tensors[0] in produced:
                return None
            slots.append(Slot("carry", m))
            continue
        if any(t in produced for t in tensors):
            return None
        slots.append(Slot("stack"))
    if not _writes_are_private(calls, slots, modified):
        return None
    carried = {s.source for s in slots if s.kind == "carry" and s.source >= 0}
    read_later = {t for op in later for t in op.inputs} | set(graph_outputs)
    ys = []
    for m in range(len(graph._outputs)):
        outs = [op.outputs[m] for op in calls]
        if m in carried:
            outs = outs[:-1]  # the last one is the final carry
        if any(t in read_later for t in outs):
            ys.append(m)
    return Run(calls, tuple(slots), modified, tuple(ys))


def _writes_are_private(
    calls: Sequence[Op], slots: Sequence[Slot], modified: Sequence[int]
) -> bool:
    """Storage a call writes (its by-ref inputs) is read by no other input of the run."""
    owner: dict[Tensor, tuple[int, int]] = {}  # written root -> (input, call) writing it
    for k, index in enumerate(modified):
        tensors = (
            [calls[0].inputs[index]]
            if slots[index].kind == "carry"
            else [op.inputs[index] for op in calls]
        )
        for n, t in enumerate(tensors):
            for r in roots(t):
                if owner.setdefault(r, (k, n)) != (k, n):
                    return False
    for index, slot in enumerate(slots):
        if index in modified:
            continue
        for op in calls[:1] if slot.kind != "stack" else calls:
            if any(r in owner for r in roots(op.inputs[index])):
                return False
    return True


# Stacks: one array holding many tensors' values -------------------------------------------


class StackKey:
    """The ``Env`` key of a stacked array (members are views of it)."""

    __slots__ = ("size", "__weakref__")

    def __init__(self, size: int):
        self.size = size

    def __repr__(self) -> str:
        return f"StackKey(size={self.size})"


@dataclass(frozen=True)
class _Row:
    index: int

    def __call__(self, stack: Array) -> Array:
        return stack[self.index]

    def of_deferred(self, stack: Deferred) -> Deferred | None:
        """This row of a stack kept with its replica sums (``Env.read_raw``)."""
        return _index(stack, self.index) if isinstance(stack, Summed) else None


@dataclass(frozen=True)
class _SetRow:
    index: int

    def __call__(self, old: Sequence[Array], new: Array) -> tuple[Array]:
        return (old[0].at[self.index].set(new.astype(old[0].dtype)),)


def add_stack(env: Env, members: Sequence[Tensor], value: Array) -> StackKey:
    """Store ``value`` (leading axis: one row per member) and make each member a view of
    its row; writes to a member update the row."""
    key = StackKey(len(members))
    env.values[key] = value  # type: ignore[index]
    for index, t in enumerate(members):
        env.views[t] = _View(_Row(index), _SetRow(index), (key,), {})  # type: ignore[arg-type]
        env.values.pop(t, None)
    return key


def stack_of(env: Env, tensors: Sequence[Tensor]) -> tuple[StackKey, bool] | None:
    """(key, reversed) when ``tensors`` are exactly the rows of one stack, in order or in
    reverse order; else None."""
    rows = []
    for t in tensors:
        view = env.views.get(t)
        if view is None or not isinstance(view.forward, _Row) or t in env.values:
            return None
        rows.append((view.parents[0], view.forward.index))
    key = rows[0][0]
    if not isinstance(key, StackKey) or key.size != len(tensors):
        return None
    if any(k is not key for k, _ in rows):
        return None
    indices = [i for _, i in rows]
    n = len(indices)
    if indices == list(range(n)):
        return key, False
    if indices == list(range(n - 1, -1, -1)):
        return key, True
    return None


# Lowering ----------------------------------------------------------------------------------


@special("call")
def _lower_call(ctx: LoweringContext, env: Env, op: Op) -> None:
    # Runs are planned per graph; a call lowered on its own (e.g. re-run by a gradient op
    # in a scratch environment) is inlined.
    # Placed steps lower each call on its IPU's device (``runtime.placement``).
    if policy() == "inline" or ctx.placement is not None or env.graph is not op.graph:
        control._lower_call(ctx, env, op)
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
    shared = _shared_stacks(env, op)
    for t, g_in in zip(op.inputs, graph._inputs):
        row = _row_of(env, t)
        if row is not None and row[0] in shared:
            inner.views[g_in] = _View(_Row(row[1]), _SetRow(row[1]), (row[0],), {})  # type: ignore[arg-type]
        else:
            inner.values[g_in] = env.read_raw(t)
    for key in shared:
        inner.values[key] = env.values[key]  # type: ignore[index]
    for o in schedule(ctx, graph):
        lower_op(ctx, inner, o)
    for index in sorted(op.modified_inputs):
        row = _row_of(env, op.inputs[index])
        if row is None or row[0] not in shared:
            env.write(op.inputs[index], inner.read_raw(graph._inputs[index]))
    for key, by_ref in shared.items():
        if by_ref:
            env.values[key] = inner.values[key]  # type: ignore[index]
    outer_values: dict[Any, Any] = env.values  # stack keys live beside tensors
    inner_values: dict[Any, Any] = inner.values
    for t, g_out in zip(op.outputs, graph._outputs):
        row = _row_of(inner, g_out)
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
        env.views[t] = _View(_Row(index), _SetRow(index), (key,), {})  # type: ignore[arg-type]


def _shared_stacks(env: Env, op: Op) -> dict[StackKey, bool]:
    """Stacks whose rows ``op`` passes, each with whether it passes them all by-ref (a
    stack passed partly by-ref is passed row by row)."""
    kinds: dict[StackKey, set[bool]] = {}
    for index, t in enumerate(op.inputs):
        row = _row_of(env, t)
        if row is not None:
            kinds.setdefault(row[0], set()).add(index in op.modified_inputs)
    return {key: next(iter(k)) for key, k in kinds.items() if len(k) == 1}


def _row_of(env: Env, t: Tensor) -> tuple[StackKey, int] | None:
    """(stack, row) when ``t`` is a row of a stack in ``env``."""
    view = env.views.get(t)
    if view is None or not isinstance(view.forward, _Row) or t in env.values:
        return None
    key = view.parents[0]
    return (key, view.forward.index) if isinstance(key, StackKey) else None


def lower_run(ctx: LoweringContext, env: Env, run: Run) -> None:
    # The stacks kept in scratch buffers (``runtime.scratch``), found by the planned run.
    scratch = {m: k for m in run.ys if (k := ctx.scratch.get((run.ops[0], m))) in ctx.fx}
    stacked = [i for i, s in enumerate(run.slots) if s.kind == "stack"]
    if stacked and not any(s.kind == "carry" for s in run.slots):
        order = stack_order(env, [run.stacked(i) for i in stacked])
        run = Run(tuple(run.ops[k] for k in order), run.slots, run.modified, run.ys)
    graph = run.graph
    calls = run.ops
    n = len(calls)
    sources = {i: stack_of(env, run.stacked(i)) for i in stacked}
    reverse = sum(1 for s in sources.values() if s and s[1]) > sum(
        1 for s in sources.values() if s and not s[1]
    )
    xs = [_stacked_input(env, run.stacked(i), sources[i], reverse) for i in stacked]
    independent = stacked and not any(s.kind == "carry" for s in run.slots)
    if independent and _lower_as_map(ctx, env, run, stacked, sources, reverse, xs):
        return
    whole = _whole_stacks(env, run)  # shared inputs that are all the rows of a stack
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
        kept = []
        for m in run.ys:
            value = _portable(ctx, outs[m])
            buffer = ctx.fx[scratch[m]] if m in scratch else None
            if buffer is not None and _fits(value, buffer):
                ctx.fx[scratch[m]] = lax.dynamic_update_index_in_dim(buffer, value, x[-1], 0)
                in_scratch.append(m)
            else:
                kept.append(value)
        ys = (
            tuple(kept),
            tuple(_portable(ctx, finals[i]) for i in stacked_modified if i not in in_place),
        )
        return (new, new_stacks, new_rows, ctx.fx), ys

    start = (init, init_stacks, init_rows, ctx.fx)
    with body_traced():
        scanned: tuple = lax.scan(body, start, scan_xs, length=n, reverse=reverse)
    (final, final_stacks, final_rows, ctx.fx), (ys, finals) = scanned
    finals = final_rows if in_place else finals
    for (i, slot), value in zip(carry_in, final):
        if slot.source >= 0:
            env.values[calls[-1].outputs[slot.source]] = value
        else:
            env.write(calls[0].inputs[i], value)
    for (key, _), value in zip(carried_stacks, final_stacks):
        env.values[key] = value  # type: ignore[index]
    kept_ys = iter(ys)
    for m in run.ys:
        value = ctx.fx[scratch[m]] if m in in_scratch else next(kept_ys)
        # Every call's output, the last call's carried one too, is a row of the stack: a
        # later in-place write to it must reach the row that other readers see.
        add_stack(env, _in_scan_order([op.outputs[m] for op in calls], reverse), value)
    for i, value in zip(stacked_modified, finals):
        _write_stacked(env, run.stacked(i), sources[i], reverse, value)


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
            tuple(_portable(ctx, outs[m]) for m in run.ys),
            tuple(_portable(ctx, finals[i]) for i in stacked_modified),
        )

    try:
        with body_traced():
            ys, finals = jax.vmap(body)(tuple(xs))
    except _HasEffects:
        return False
    finally:
        ctx.fx = outer_fx
    for m, value in zip(run.ys, ys):
        add_stack(env, _in_scan_order([op.outputs[m] for op in calls], reverse), value)
    for i, value in zip(stacked_modified, finals):
        _write_stacked(env, run.stacked(i), sources[i], reverse, value)
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
    slots are one gather."""
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
        add_stack(env, outputs[start:end], _take(buffer, rows[start:end]))
    return True


def _even_runs(rows: list[int]) -> list[tuple[int, int]]:
    """``rows`` cut into consecutive ``(start, end)`` pieces that each step evenly."""
    runs: list[tuple[int, int]] = []
    start = 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or _progression(rows[start : end + 1]) is None:
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
    ctx.fx[key] = _put(buffer, rows, values)
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


def input_stacks(
    env: Env, tensors: Sequence[Tensor], eligible: Sequence[int], modified: set[int]
) -> list[tuple[StackKey, list[int], bool]]:
    """Among ``tensors`` at the ``eligible`` indices, groups that are all the rows of one
    stack, each row once: (key, their indices in row order, whether they are modified).
    A group whose members are partly modified is left out."""
    rows: dict[StackKey, dict[int, int]] = {}
    kinds: dict[StackKey, set[bool]] = {}
    repeated: set[StackKey] = set()
    for i in eligible:
        t = tensors[i]
        view = env.views.get(t)
        if view is None or not isinstance(view.forward, _Row) or t in env.values:
            continue
        key = view.parents[0]
        if not isinstance(key, StackKey):
            continue
        by_row = rows.setdefault(key, {})
        if view.forward.index in by_row:
            repeated.add(key)
        by_row[view.forward.index] = i
        kinds.setdefault(key, set()).add(i in modified)
    return [
        (key, [by_row[r] for r in range(key.size)], kinds[key].pop())
        for key, by_row in rows.items()
        if key not in repeated and sorted(by_row) == list(range(key.size)) and len(kinds[key]) == 1
    ]


@special("repeat")
def _lower_repeat(ctx: LoweringContext, env: Env, op: Op) -> None:
    """``control``'s loop, except that inputs which are all the rows of a stack (a GA loop
    over a micro-batch graph receiving every layer's weights) enter the body as the one
    stacked array, so runs of calls inside the body scan it without stacking rows."""
    graph = op.attrs["graphs"][0]
    n_out = len(graph._outputs)
    by_ref = sorted(op.modified_inputs)
    groups = []
    if policy() != "inline" and ctx.placement is None:
        groups = input_stacks(env, op.inputs, range(n_out, len(op.inputs)), set(by_ref))
    if not groups:
        control._lower_repeat(ctx, env, op)
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
    if policy() != "inline" and ctx.placement is None:
        groups = [input_stacks(env, op.inputs, span, modified) for span in spans]
    if not any(groups):
        control._lower_conditional(ctx, env, op)
        return
    grouped_all = {i for stacks in groups for _, indices, _ in stacks for i in indices}
    in_stacks = {op.inputs[i] for i in grouped_all}
    loose = {op.inputs[i] for span in spans for i in span if i not in grouped_all}
    written = [t for t in control.modified_parents(op) if t not in in_stacks]
    if any(t in loose for t in control.modified_parents(op) if t in in_stacks):
        control._lower_conditional(ctx, env, op)  # written both as a row and on its own
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


def _whole_stacks(env: Env, run: Run) -> list[tuple[StackKey, list[int], bool]]:
    """Inputs shared by every call of the run (``same``, or by-ref and carried) that are
    together all the rows of one stack: (key, their input indices in row order, by-ref).
    They enter the called graph as one stacked array, so runs inside it scan it directly."""
    rows: dict[StackKey, dict[int, int]] = {}
    kinds: dict[StackKey, set[bool]] = {}
    for i, slot in enumerate(run.slots):
        by_ref = slot.kind == "carry" and slot.source < 0
        if slot.kind != "same" and not by_ref:
            continue
        t = run.ops[0].inputs[i]
        view = env.views.get(t)
        if view is None or not isinstance(view.forward, _Row) or t in env.values:
            continue
        key = view.parents[0]
        if not isinstance(key, StackKey):
            continue
        rows.setdefault(key, {})[view.forward.index] = i
        kinds.setdefault(key, set()).add(by_ref)
    return [
        (key, [by_row[r] for r in range(key.size)], kinds[key].pop())
        for key, by_row in rows.items()
        if sorted(by_row) == list(range(key.size)) and len(kinds[key]) == 1
    ]


def lower_graph_with_stacks(
    ctx: LoweringContext,
    graph: Graph,
    inputs: Sequence[Array],
    stacks: Sequence[tuple[list[int], Array]],
    raw: bool = False,
) -> tuple[list[Array], list[Array], list[Array]]:
    """``lower_graph`` where the inputs at each stack's indices are the rows of one stacked
    value. Returns (outputs, final values of the other inputs, final stacked values);
    with ``raw`` outputs and final inputs may be deferred (``replica_sums``)."""
    env = Env(graph)
    for t, value in zip(graph._inputs, inputs):
        if value is not None:
            env.values[t] = value
    keys = [add_stack(env, [graph._inputs[i] for i in indices], v) for indices, v in stacks]
    for op in schedule(ctx, graph):
        lower_op(ctx, env, op)
    read = env.read_raw if raw else env.read
    outs = [read(t) for t in graph._outputs]
    finals = [read(t) if v is not None else None for t, v in zip(graph._inputs, inputs)]
    return outs, finals, [env.read(k) for k in keys]  # type: ignore[arg-type]


def _portable(ctx: LoweringContext, value: Any) -> Any:
    """A value leaving a scan or map: deferred values keep their replica sums."""
    axis = ctx.axis_name if ctx.collective_impl == "gather" else None
    return portable(value, axis, ctx.replicas)


def _index(value: Any, index: int) -> Any:
    """Row ``index`` of a stacked array or ``Summed``."""
    return jax.tree_util.tree_map(lambda a: a[index], value)


def _reversed(value: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a[::-1], value)


def _in_scan_order(items: list, reverse: bool) -> list:
    return items[::-1] if reverse else items


def _stacked_input(
    env: Env, tensors: list[Tensor], source: tuple[StackKey, bool] | None, reverse: bool
) -> Array:
    """The ``xs`` array of one stacked input, rows in the scan's order."""
    if source is not None:
        key, is_reversed = source
        value = env.values[key]  # type: ignore[index]
        return value if is_reversed == reverse else _reversed(value)
    return gather_rows(env, _in_scan_order(tensors, reverse))


def _write_stacked(
    env: Env,
    tensors: list[Tensor],
    source: tuple[StackKey, bool] | None,
    reverse: bool,
    value: Array,
) -> None:
    """Write a by-ref stacked input's final rows (in the scan's order) back."""
    if source is not None:
        key, is_reversed = source
        env.values[key] = value if is_reversed == reverse else _reversed(value)  # type: ignore[index]
        return
    scatter_rows(env, _in_scan_order(tensors, reverse), value)


def _pieces(env: Env, tensors: Sequence[Tensor]) -> dict[Any, tuple[list[int], list[int]]]:
    """``tensors`` by where they live: stack key -> (their positions, their rows); a tensor
    that is no stack's row is its own piece (keyed by its position)."""
    pieces: dict[Any, tuple[list[int], list[int]]] = {}
    for position, t in enumerate(tensors):
        row = _row_of(env, t)
        key, index = row if row is not None else (("own", position), -1)
        positions, rows = pieces.setdefault(key, ([], []))
        positions.append(position)
        rows.append(index)
    return pieces


def _progression(rows: list[int]) -> tuple[int, int] | None:
    """(first, step) when ``rows`` step evenly (a step of 0 never: rows are distinct)."""
    if len(rows) == 1:
        return rows[0], 1
    step = rows[1] - rows[0]
    ok = step != 0 and all(b - a == step for a, b in zip(rows, rows[1:]))
    return (rows[0], step) if ok else None


def _take(value: Any, rows: list[int]) -> Any:
    """Rows of a stacked value: itself, a (strided, reversed) slice, or a gather: a few ops
    whatever the number of rows."""
    n = jax.tree_util.tree_leaves(value)[0].shape[0]
    if rows == list(range(n)):
        return value
    even = _progression(rows)
    if even is not None:
        first, step = even
        low = min(first, rows[-1])
        sliced = jax.tree_util.tree_map(
            lambda a: lax.slice_in_dim(a, low, low + abs(step) * (len(rows) - 1) + 1, abs(step)),
            value,
        )
        return sliced if step > 0 else _reversed(sliced)
    index = jnp.asarray(rows, jnp.int32)
    return jax.tree_util.tree_map(lambda a: jnp.take(a, index, axis=0), value)


def _put(stack: Array, rows: list[int], block: Array) -> Array:
    """``stack`` with ``rows`` replaced by ``block``'s rows."""
    if rows == list(range(stack.shape[0])):
        return block
    even = _progression(rows)
    if even is not None and abs(even[1]) == 1:
        low = min(rows[0], rows[-1])
        block = block if even[1] > 0 else block[::-1]
        return lax.dynamic_update_slice_in_dim(stack, block, low, 0)
    return stack.at[jnp.asarray(rows, jnp.int32)].set(block)


def stack_order(env: Env, inputs: Sequence[Sequence[Tensor]]) -> list[int]:
    """An order for independent calls (or ops) whose stacked inputs are ``inputs`` (one
    list per input, one tensor per call), so that their stacks are read and written as a
    few slices rather than gathers and scatters (which XLA turns into one copy per row).
    Candidates: program order, and each input's order (by stack, then by row); the one
    whose gathers over all inputs move the fewest elements wins (a gather of scalars is
    cheaper than one of weight rows), program order on a tie."""
    n = len(inputs[0])
    candidates = [list(range(n))]
    for ts in inputs:
        by_stack = [p for ps, rows in _pieces(env, ts).values() for _, p in sorted(zip(rows, ps))]
        if by_stack not in candidates:
            candidates.append(by_stack)
    if len(candidates) == 1:
        return candidates[0]

    def gathers(order: list[int]) -> int:
        return sum(_gathers(env, [ts[k] for k in order]) for ts in inputs)

    return min(candidates, key=gathers)


def _gathers(env: Env, tensors: Sequence[Tensor]) -> int:
    """The elements ``gather_rows`` gathers to read ``tensors`` in this order: those of
    each stack whose rows do not step evenly, and all of them when the stacks interleave."""
    size = max(1, tensors[0].nelms)
    moved, order = 0, []
    for key, (positions, rows) in _pieces(env, tensors).items():
        if isinstance(key, StackKey) and _progression(rows) is None:
            moved += size * len(rows)
        order += positions
    return moved + (size * len(order) if order != sorted(order) else 0)


def gather_rows(env: Env, tensors: Sequence[Tensor]) -> Array:
    """One array whose row ``k`` is ``tensors[k]``'s value: whole stacks, slices or
    gathers of the stacks they are rows of (a few ops whatever the number of rows), the
    others stacked."""
    pieces = _pieces(env, tensors)
    if len(pieces) == 1:
        key, (_, rows) = next(iter(pieces.items()))
        if isinstance(key, StackKey):
            return _take(env.values[key], rows)  # type: ignore[index]
    blocks, order = [], []
    for key, (positions, rows) in pieces.items():
        if isinstance(key, StackKey):
            blocks.append(_take(env.read(key), rows))  # type: ignore[arg-type]
        else:
            blocks.append(env.read(tensors[positions[0]])[None])
        order += positions
    value = jnp.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    if order != list(range(len(order))):
        value = jnp.take(value, jnp.asarray(np.argsort(order), jnp.int32), axis=0)
    return value


def scatter_rows(env: Env, tensors: Sequence[Tensor], value: Array) -> None:
    """Write row ``k`` of ``value`` to ``tensors[k]``: one update per stack they are rows of."""
    for key, (positions, rows) in _pieces(env, tensors).items():
        block = _take(value, positions)
        if not isinstance(key, StackKey):
            env.write(tensors[positions[0]], _index(block, 0))
            continue
        stack = env.read(key)  # type: ignore[arg-type]
        env.values[key] = _put(stack, rows, value_of(block).astype(stack.dtype))  # type: ignore[index]


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


__all__ = [
    "policy",
    "set_policy",
    "runs_of",
    "stacked_feeds",
    "plan_run",
    "lower_run",
    "add_stack",
    "stack_of",
]
