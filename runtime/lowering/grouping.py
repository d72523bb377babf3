"""A lowering order that brings calls of one graph, and identical variable updates, together.

Programs written the popxl-addons way call one graph many times, but not always in a row: a
per-variable optimizer graph cached by shape is called for every variable in variable
order, between calls of the graphs of other shapes; gradients of an input shared by every
layer are summed between the layers' gradient calls; inline updates (``ops.scaled_add_``,
``ops.var_updates``) repeat the same op for every variable. Lowered in program order, each
of those is traced and compiled once per layer.

``schedule(graph)`` reorders the graph's ops so that such *groups* are consecutive, where
that keeps every dependency: an op that reads what a member produced, or touches storage a
member reads or writes (by roots, so views and in-place writes count), stays after the
group; an op that does not moves before it; two ops with effects (host IO, remote buffers,
collectives, prints, run-time checks, or calls of graphs that have them) keep their order.
``runtime.calls`` then lowers a group of calls as one ``lax.scan`` or ``vmap`` and a group of
ops (``OpGroup``) as one ``vmap`` of the op's lowering.

A group of calls may chain (a call reads the previous one's outputs: the layers); a group
of ops never does (its members are independent). Ops are grouped only when they read a
main-graph variable or only feed ops that do (the updates of a program's state): grouping
the activations' ops inside a layer would only add copies.

Lowered one row at a time, per-variable Adam updates of stacked weights each copied the
whole stack (XLA's simplifier reads other rows of the original after a
``dynamic-update-slice``): 1,081 kernels per step against the hand-written reference's 731
and 125 copies against 48 (``bench/transformer_step.py``, 4 layers x 256, 2026-11-23);
grouped, 682. The same program's compiled step went from 2,635 kernels at 12 layers and
10,339 at 48 (185 s in ``popxl.Session``) to 353 at both (``bench/build_compile.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from popxl._op import Op, OpDef
from popxl.graph import Graph
from popxl.tensor import Constant, Tensor, Variable
from popxl.transforms._storage import roots, written_inputs

MIN_GROUP = 2
# Contractions are left alone: a batched product may sum in another order than the plain one.
_UNGROUPED_KEYS = ("matmul", "conv")
_EFFECT_SPECIALS = ("host_load", "host_store", "remote_load", "remote_store", "collective",
                    "log2_scale_checked")  # fmt: skip


@dataclass(eq=False)
class OpGroup:
    """Identical, independent ops lowered together (``runtime.calls``); it stands in the
    schedule where its members would be."""

    ops: tuple[Op, ...]
    opdef: OpDef = field(init=False)

    def __post_init__(self) -> None:
        self.opdef = GROUP_OPDEF

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return tuple(t for op in self.ops for t in op.inputs)

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(t for op in self.ops for t in op.outputs)

    @property
    def modified_inputs(self) -> set[int]:
        return set()

    @property
    def execution_context(self) -> str:
        return self.ops[0].execution_context

    @property
    def attrs(self) -> dict[str, Any]:
        return {}


GROUP_OPDEF = OpDef(key="op_group", type="OpGroup", infer=None, special="op_group")  # type: ignore[arg-type]


# The schedule ------------------------------------------------------------------------------


def schedule(graph: Graph) -> tuple[Any, ...]:
    """``graph``'s ops in a lowering order with groups together (op groups as ``OpGroup``);
    cached while the graph is unchanged."""
    cached = graph._lowering_memo.get("schedule")
    ops = tuple(graph._ops)
    if cached is not None and cached[0] == ops:
        return cached[1]
    result: list[Any] = []
    for unit in _Reorder(ops).units():
        is_calls = unit[0].opdef.special == "call"  # planned as runs by ``runtime.calls``
        result.extend(unit if len(unit) == 1 or is_calls else [OpGroup(unit)])
    graph._lowering_memo["schedule"] = (ops, tuple(result))
    return tuple(result)


def has_effects(graph: Graph, _seen: dict[Graph, bool] | None = None) -> bool:
    """Whether running ``graph`` does IO, collectives, prints or checks (in itself or in the
    graphs it calls)."""
    seen = {} if _seen is None else _seen
    if graph not in seen:
        seen[graph] = False  # recursion guard
        seen[graph] = any(_op_effect(op, seen) for op in graph._ops)
    return seen[graph]


def _op_effect(op: Op, seen: dict[Graph, bool]) -> bool:
    if op.opdef.effect or op.opdef.special in _EFFECT_SPECIALS:
        return True
    return any(has_effects(g, seen) for g in op.referenced_graphs)


# Effects as storage the op reads or writes: ops on different streams or remote slots, or
# loads of one slot, commute; every effectful op reads ``_ORDER`` and one whose effect is not
# modelled (a print, a check) writes it. Collectives write nothing: the step is one SPMD
# program, every replica runs the same (reordered) sequence of them, and each is a function
# of its inputs on all replicas, so their order is not observable; their data dependencies
# and their order against prints and checks are kept.
_ORDER = ("effects in program order",)
_GROUPED_EFFECTS = ("remote_load", "remote_store", "replicated_all_reduce")


def _effect_tokens(op: Op, memo: dict[Graph, tuple[frozenset, frozenset]]) -> tuple[set, set]:
    """(tokens read, tokens written) standing for ``op``'s effects."""
    key, attrs = op.opdef.key, op.attrs
    if op.referenced_graphs:
        return _union(_graph_tokens(g, memo) for g in op.referenced_graphs)
    if not (op.opdef.effect or op.opdef.special in _EFFECT_SPECIALS):
        return set(), set()
    if key in ("host_load", "host_store"):
        return {_ORDER}, {("stream", attrs.get("stream_id"))}
    if key.startswith("remote_load") or key == "remote_store":
        return _remote_tokens(op)
    if op.opdef.special == "collective" or key.startswith("replica"):
        return {_ORDER}, set()  # see the note on collectives above
    return {_ORDER}, {_ORDER}


def _union(pairs: Iterable[tuple[AbstractSet, AbstractSet]]) -> tuple[set, set]:
    """The (read, written) token sets of several ops or graphs together."""
    read: set = set()
    written: set = set()
    for r, w in pairs:
        read |= r
        written |= w
    return read, written


def _remote_tokens(op: Op) -> tuple[set, set]:
    """Remote IO at a constant slot conflicts only with IO at that slot or at a slot known
    only at run time (``"any"``); stores at constant slots also write ``"some"``, which IO
    at run-time slots reads."""
    buffer, offset = op.attrs["buffer_id"], op.inputs[1]
    slot = int(offset._data.reshape(())) if isinstance(offset, Constant) else None
    load = op.opdef.key != "remote_store"
    if slot is None:
        read = {_ORDER, (buffer, "some")} | ({(buffer, "any")} if load else set())
        return read, set() if load else {(buffer, "any")}
    read = {_ORDER, (buffer, "any")} | ({(buffer, slot)} if load else set())
    return read, set() if load else {(buffer, slot), (buffer, "some")}


def _graph_tokens(graph: Graph, memo: dict) -> tuple[frozenset, frozenset]:
    if graph not in memo:
        memo[graph] = (frozenset(), frozenset())  # recursion guard
        read, written = _union(_effect_tokens(op, memo) for op in graph._ops)
        memo[graph] = (frozenset(read), frozenset(written))
    return memo[graph]


def signature(graph: Graph) -> Hashable:
    """What ``graph`` computes, up to the identity of its tensors: graphs with equal
    signatures (the stash graphs a pipeline makes per activation, one per layer) lower to
    the same function, so their calls are grouped like calls of one graph."""
    cached = graph._lowering_memo.get("signature")
    if cached is not None and cached[0] == len(graph._ops):
        return cached[1]
    numbering: dict[Tensor, int] = {}

    def num(t: Tensor) -> Hashable:
        if isinstance(t, Constant) and t not in numbering:
            data = np.ascontiguousarray(t._data)
            return ("const", t.shape, t.dtype.name, data.tobytes())
        return numbering.setdefault(t, len(numbering))

    items: list[Hashable] = [tuple((num(t), t.shape, t.dtype.name) for t in graph._inputs)]
    for op in graph._ops:
        attrs = tuple(sorted((k, _attr_signature(v)) for k, v in op.attrs.items()))
        items.append((
            op.opdef.key, attrs, tuple(num(t) for t in op.inputs),
            tuple(sorted(op.modified_inputs)),
            tuple((num(t), t.shape, t.dtype.name) for t in op.outputs),
            op.execution_context, op.ipu, op.tile_set,
        ))  # fmt: skip
    items.append(tuple(num(t) for t in graph._outputs))
    found = tuple(items)
    try:
        hash(found)
    except TypeError:
        found = ("graph", id(graph))  # an attribute we cannot compare: only itself
    graph._lowering_memo["signature"] = (len(graph._ops), found)
    return found


def _attr_signature(value: Any) -> Hashable:
    if isinstance(value, Graph):
        return ("graph", signature(value))
    if isinstance(value, (tuple, list)):
        return tuple(_attr_signature(v) for v in value)
    if isinstance(value, np.ndarray):
        return ("ndarray", value.shape, value.dtype.str, value.tobytes())
    if hasattr(value, "structural_key"):  # a gradient op's recipe: the forward op it snapshots
        return ("structure", value.structural_key(_attr_signature))
    if callable(value) and not hasattr(value, "name"):
        return ("callable", id(value))
    return value


@dataclass
class _Access:
    """What a unit of the schedule produces, reads and writes (storage roots, and tokens
    standing for its effects)."""

    produced: set[Tensor] = field(default_factory=set)
    read: set[Tensor] = field(default_factory=set)
    written: set[Tensor] = field(default_factory=set)
    inputs: set[Tensor] = field(default_factory=set)

    def add(self, other: _Access) -> None:
        self.produced |= other.produced
        self.read |= other.read
        self.written |= other.written
        self.inputs |= other.inputs

    def after(self, earlier: _Access) -> bool:
        """Whether this must stay after ``earlier``."""
        return bool(
            (self.inputs & earlier.produced)
            or (self.read & earlier.written)
            or (self.written & earlier.read)
            or (self.written & earlier.written)
        )


def _data_only(a: _Access) -> _Access:
    """``a`` without its effect tokens."""
    return _Access(
        a.produced,
        {t for t in a.read if isinstance(t, Tensor)},
        {t for t in a.written if isinstance(t, Tensor)},
        a.inputs,
    )


class _Reorder:
    def __init__(self, ops: Sequence[Op]):
        self.ops = ops
        self._roots: dict[Tensor, tuple[Tensor, ...]] = {}
        self._tokens: dict[Graph, tuple[frozenset, frozenset]] = {}
        self.access = {op: self._access(op) for op in ops}
        self.updates = self._update_ops()
        self.keys = {op: self._key(op) for op in ops}

    def _update_ops(self) -> set[Op]:
        """Ops that read a main-graph variable, or whose outputs only feed such ops (a
        gradient's scaling before the update that reads the variable)."""
        consumers: dict[Tensor, list[Op]] = {}
        for op in self.ops:
            for t in op.inputs:
                consumers.setdefault(t, []).append(op)
        found: set[Op] = set()
        for op in reversed(self.ops):
            if any(isinstance(r, Variable) for t in op.inputs for r in self._rooted(t)):
                found.add(op)
                continue
            users = [u for t in op.outputs for u in consumers.get(t, [])]
            if users and all(u in found for u in users):
                found.add(op)
        return found

    def _rooted(self, t: Tensor) -> tuple[Tensor, ...]:
        found = self._roots.get(t)
        if found is None:
            found = self._roots[t] = roots(t)
        return found

    def _access(self, op: Op) -> _Access:
        read, written = _effect_tokens(op, self._tokens)
        a = _Access(set(op.outputs), read, written, set(op.inputs))
        for t in op.inputs:
            a.read.update(self._rooted(t))
        for i in written_inputs(op):
            a.written.update(self._rooted(op.inputs[i]))
        return a

    def _key(self, op: Op) -> Hashable | None:
        """Ops with equal keys may form a group; None: never grouped."""
        # Not the virtual IPU: groups are lowered only when every IPU shares one device
        # (a placed step keeps program order), so calls on several IPUs (a pipeline's
        # stages run in turn on one device) group like any others.
        where = (op.execution_context, op.tile_set)
        if op.opdef.special == "call":
            graph = op.attrs["graphs"][0]
            return ("call", signature(graph), frozenset(op.modified_inputs), len(op.inputs), where)
        opdef = op.opdef
        if opdef.key not in _GROUPED_EFFECTS:
            if opdef.special is not None or opdef.lower is None or opdef.view_inverse is not None:
                return None
            if opdef.effect or any(k in opdef.key for k in _UNGROUPED_KEYS):
                return None
            if op not in self.updates:
                return None
        try:
            attrs = tuple(sorted(op.attrs.items()))
            hash(attrs)
        except TypeError:
            return None
        specs = tuple((t.shape, t.dtype) for t in op.inputs)
        return ("op", opdef.key, attrs, specs, len(op.outputs), where)

    def units(self) -> list[tuple[Op, ...]]:
        units: list[tuple[Op, ...]] = [(op,) for op in self.ops]
        counts: dict[Hashable, int] = {}
        for op in self.ops:
            key = self.keys[op]
            if key is not None:
                counts[key] = counts.get(key, 0) + 1
        for key, n in counts.items():
            if n >= MIN_GROUP:
                units = self._gather(units, key)
        return units

    def _gather(self, units: list[tuple[Op, ...]], key: Hashable) -> list[tuple[Op, ...]]:
        """Bring the units that are single ops of ``key`` together, group by group."""
        is_call = key[0] == "call"  # type: ignore[index]
        start = 0
        while True:
            firsts = [i for i in range(start, len(units)) if self._single(units[i], key)]
            if len(firsts) < MIN_GROUP:
                return units
            i, last = firsts[0], firsts[-1]
            members, before, after = [units[i]], [], []
            taint_m, taint_s, data_m = _Access(), _Access(), _Access()
            taint_m.add(self._union(units[i]))
            data_m.add(_data_only(taint_m))
            for unit in units[i + 1 : last + 1]:
                a = self._union(unit)
                # Members of an op group are independent; their effects (one stream,
                # buffer or collective) happen together, in order, when they are lowered.
                blocked = a.after(taint_s) or (not is_call and _data_only(a).after(data_m))
                if self._single(unit, key) and not blocked:
                    members.append(unit)
                    taint_m.add(a)
                    data_m.add(_data_only(a))
                elif a.after(taint_m) or a.after(taint_s):
                    after.append(unit)
                    taint_s.add(a)
                else:
                    before.append(unit)
            group = tuple(op for u in members for op in u)
            units = units[:i] + before + [group] + after + units[last + 1 :]
            start = i + len(before) + 1

    def _single(self, unit: tuple[Op, ...], key: Hashable) -> bool:
        return len(unit) == 1 and self.keys[unit[0]] == key

    def _union(self, unit: tuple[Op, ...]) -> _Access:
        if len(unit) == 1:
            return self.access[unit[0]]
        total = _Access()
        for op in unit:
            total.add(self.access[op])
        return total


__all__ = ["schedule", "signature", "OpGroup", "has_effects", "GROUP_OPDEF"]
