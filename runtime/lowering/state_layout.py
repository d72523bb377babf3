"""Which variables the compiled step stores stacked, and moving values in and out of stacks.

Variables fed to the same input of a run of calls (``calls``), one per call (a layer's
weights, its gradient accumulators, its Adam state), are stored as one array with a
leading axis over the calls: an *entry* of the step's state. Then the run scans that array
directly and every per-variable update (the optimizer's) is one kernel over the stack, so
neither copies nor the number of XLA kernels grow with the number of calls. Other
variables are entries of their own.

A stack's rows follow the run that reads them, not the variables' creation order: PopTorch
creates variables in ``state_dict`` name order (``layers.10`` before ``layers.2``), and a
stack in that order was gathered into layer order every step (12 gathers, 7 of the 12-layer
encoder's 140 ms; bytes accessed per step 298 -> 250 MB, hand-written JAX 253; 2026-11-24).

A replicated (batched) entry keeps the replica axis first: ``(replicas, calls, *shape)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from popxl.graph import Graph
from popxl.tensor import Variable

from . import runs, stacks

Entry = tuple[int, ...]  # indices into the program's variables; one index: not stacked


def variable_groups(
    graph: Graph, variables: Sequence[Variable], compatible: Callable[[Variable], Any]
) -> list[Entry]:
    """Groups of variables to stack: the stacked inputs of runs (in ``graph`` or in the
    graphs it calls, ``runs.stacked_feeds``) that are distinct variables of one shape,
    dtype and ``compatible(v)``, each variable in the first group found for it, in
    creation order."""
    if runs.policy(graph.ir) == "inline":
        return []
    index = {v: i for i, v in enumerate(variables)}
    taken: set[Variable] = set()
    groups: list[Entry] = []
    for rows in runs.stacked_feeds(graph):
        members = [t for t in rows if isinstance(t, Variable) and t in index]
        if len(members) != len(rows):
            continue
        if len(set(members)) != len(members) or taken.intersection(members):
            continue
        first = members[0]
        key = (first.shape, first.dtype, compatible(first))
        if any((t.shape, t.dtype, compatible(t)) != key for t in members):
            continue
        # In creation order (layer 0 first, usually), whichever run met them first: the
        # forward and gradient runs then scan the same stack in opposite directions. When
        # the run takes them in neither that order nor its reverse (variables created in
        # name order: layer 10 before layer 2), in the run's order, which every step
        # would otherwise rebuild with a gather.
        order = [index[t] for t in members]
        ascending = sorted(order)
        groups.append(tuple(ascending if order in (ascending, ascending[::-1]) else order))
        taken.update(members)
    return groups


def entries_for(n_variables: int, groups: Sequence[Entry]) -> tuple[Entry, ...]:
    """The state's entries: ungrouped variables one each (in order), then the groups."""
    grouped = {i for g in groups for i in g}
    return tuple((i,) for i in range(n_variables) if i not in grouped) + tuple(groups)


def pack(entries: Sequence[Entry], values: Sequence[Any], batched: Sequence[bool]) -> list:
    """Per-variable host arrays → per-entry arrays (groups stacked after any replica axis)."""
    return [
        values[e[0]] if len(e) == 1 else np.stack([values[i] for i in e], axis=int(b))
        for e, b in zip(entries, batched)
    ]


def unpack(entries: Sequence[Entry], values: Sequence[Any], batched: Sequence[bool]) -> list:
    """Per-entry arrays → per-variable arrays (rows of stacks are views)."""
    n = sum(len(e) for e in entries)
    out: list[Any] = [None] * n
    for e, value, b in zip(entries, values, batched):
        if len(e) == 1:
            out[e[0]] = value
            continue
        for row, i in enumerate(e):
            out[i] = value[:, row] if b else value[row]
    return out


def locate(entries: Sequence[Entry]) -> dict[int, tuple[int, int | None]]:
    """Variable index → (entry index, row in the stack or None)."""
    where: dict[int, tuple[int, int | None]] = {}
    for k, e in enumerate(entries):
        for row, i in enumerate(e):
            where[i] = (k, row if len(e) > 1 else None)
    return where


def seed_env(
    env: Any, entries: Sequence[Entry], variables: Sequence[Variable], state: Sequence[Any]
) -> list:
    """Put the state's entries into the main graph's environment; returns each entry's key
    (the variable, or the stack key) for reading the final values back."""
    keys: list[Any] = []
    for e, value in zip(entries, state):
        if len(e) == 1:
            env.values[variables[e[0]]] = value
            keys.append(variables[e[0]])
        else:
            keys.append(stacks.add_stack(env, [variables[i] for i in e], value))
    return keys


def read_entries(env: Any, keys: Sequence[Any]) -> list:
    """Final values of the entries (a plain variable is read through the environment)."""
    return [env.read(k) for k in keys]  # a stack may hold a ``replica_sums.Summed``
