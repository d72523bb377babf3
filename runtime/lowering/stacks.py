"""Stacks: tensors held as rows of one stacked array (the ``ys`` of a run's scan, the main
graph's variables stored stacked by ``state_layout``).

A stack's members are ``Env`` views reading row ``k`` of the array kept under a
``StackKey``; a later run whose stacked inputs are a whole stack, in call order or reversed,
scans the array directly, and rows are gathered or scattered only where a run takes a
subset of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from popxl._op import Op
from popxl.graph import Graph
from popxl.tensor import Tensor

from .core import Env, LoweringContext, _View, lower_op, schedule
from .replica_sums import Deferred, Summed, portable, value_of
from .runs import Run

Array = Any


class StackKey:
    """The ``Env`` key of a stacked array (members are views of it)."""

    __slots__ = ("size", "__weakref__")

    def __init__(self, size: int):
        self.size = size

    def __repr__(self) -> str:
        return f"StackKey(size={self.size})"


@dataclass(frozen=True)
class Row:
    index: int

    def __call__(self, stack: Array) -> Array:
        return stack[self.index]

    def of_deferred(self, stack: Deferred) -> Deferred | None:
        """This row of a stack kept with its replica sums (``Env.read_raw``)."""
        return _index(stack, self.index) if isinstance(stack, Summed) else None


@dataclass(frozen=True)
class SetRow:
    index: int

    def __call__(self, old: Sequence[Array], new: Array) -> tuple[Array]:
        return (old[0].at[self.index].set(new.astype(old[0].dtype)),)


def add_stack(env: Env, members: Sequence[Tensor], value: Array) -> StackKey:
    """Store ``value`` (leading axis: one row per member) and make each member a view of
    its row; writes to a member update the row."""
    key = StackKey(len(members))
    env.values[key] = value  # type: ignore[index]
    for index, t in enumerate(members):
        env.views[t] = _View(Row(index), SetRow(index), (key,), {})  # type: ignore[arg-type]
        env.values.pop(t, None)
    return key


def stack_of(env: Env, tensors: Sequence[Tensor]) -> tuple[StackKey, bool] | None:
    """(key, reversed) when ``tensors`` are exactly the rows of one stack, in order or in
    reverse order; else None."""
    rows = []
    for t in tensors:
        view = env.views.get(t)
        if view is None or not isinstance(view.forward, Row) or t in env.values:
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


def shared_stacks(env: Env, op: Op) -> dict[StackKey, bool]:
    """Stacks whose rows ``op`` passes, each with whether it passes them all by-ref (a
    stack passed partly by-ref is passed row by row)."""
    kinds: dict[StackKey, set[bool]] = {}
    for index, t in enumerate(op.inputs):
        row = row_of(env, t)
        if row is not None:
            kinds.setdefault(row[0], set()).add(index in op.modified_inputs)
    return {key: next(iter(k)) for key, k in kinds.items() if len(k) == 1}


def row_of(env: Env, t: Tensor) -> tuple[StackKey, int] | None:
    """(stack, row) when ``t`` is a row of a stack in ``env``."""
    view = env.views.get(t)
    if view is None or not isinstance(view.forward, Row) or t in env.values:
        return None
    key = view.parents[0]
    return (key, view.forward.index) if isinstance(key, StackKey) else None


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
        if view is None or not isinstance(view.forward, Row) or t in env.values:
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


def whole_stacks(env: Env, run: Run) -> list[tuple[StackKey, list[int], bool]]:
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
        if view is None or not isinstance(view.forward, Row) or t in env.values:
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


def portable_value(ctx: LoweringContext, value: Any) -> Any:
    """A value leaving a scan or map: deferred values keep their replica sums."""
    axis = ctx.axis_name if ctx.collective_impl == "gather" else None
    return portable(value, axis, ctx.replicas)


def _index(value: Any, index: int) -> Any:
    """Row ``index`` of a stacked array or ``Summed``."""
    return jax.tree_util.tree_map(lambda a: a[index], value)


def _reversed(value: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a[::-1], value)


def in_scan_order(items: list, reverse: bool) -> list:
    return items[::-1] if reverse else items


def stacked_input(
    env: Env, tensors: list[Tensor], source: tuple[StackKey, bool] | None, reverse: bool
) -> Array:
    """The ``xs`` array of one stacked input, rows in the scan's order."""
    if source is not None:
        key, is_reversed = source
        value = env.values[key]  # type: ignore[index]
        return value if is_reversed == reverse else _reversed(value)
    return gather_rows(env, in_scan_order(tensors, reverse))


def write_stacked(
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
    scatter_rows(env, in_scan_order(tensors, reverse), value)


def _pieces(env: Env, tensors: Sequence[Tensor]) -> dict[Any, tuple[list[int], list[int]]]:
    """``tensors`` by where they live: stack key -> (their positions, their rows); a tensor
    that is no stack's row is its own piece (keyed by its position)."""
    pieces: dict[Any, tuple[list[int], list[int]]] = {}
    for position, t in enumerate(tensors):
        row = row_of(env, t)
        key, index = row if row is not None else (("own", position), -1)
        positions, rows = pieces.setdefault(key, ([], []))
        positions.append(position)
        rows.append(index)
    return pieces


def progression(rows: list[int]) -> tuple[int, int] | None:
    """(first, step) when ``rows`` step evenly (a step of 0 never: rows are distinct)."""
    if len(rows) == 1:
        return rows[0], 1
    step = rows[1] - rows[0]
    ok = step != 0 and all(b - a == step for a, b in zip(rows, rows[1:]))
    return (rows[0], step) if ok else None


def take_rows(value: Any, rows: list[int]) -> Any:
    """Rows of a stacked value: itself, a (strided, reversed) slice, or a gather: a few ops
    whatever the number of rows."""
    n = jax.tree_util.tree_leaves(value)[0].shape[0]
    if rows == list(range(n)):
        return value
    even = progression(rows)
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


def put_rows(stack: Array, rows: list[int], block: Array) -> Array:
    """``stack`` with ``rows`` replaced by ``block``'s rows."""
    if rows == list(range(stack.shape[0])):
        return block
    even = progression(rows)
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
        if isinstance(key, StackKey) and progression(rows) is None:
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
            return take_rows(env.values[key], rows)  # type: ignore[index]
    blocks, order = [], []
    for key, (positions, rows) in pieces.items():
        if isinstance(key, StackKey):
            blocks.append(take_rows(env.read(key), rows))  # type: ignore[arg-type]
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
        block = take_rows(value, positions)
        if not isinstance(key, StackKey):
            env.write(tensors[positions[0]], _index(block, 0))
            continue
        stack = env.read(key)  # type: ignore[arg-type]
        env.values[key] = put_rows(stack, rows, value_of(block).astype(stack.dtype))  # type: ignore[index]
