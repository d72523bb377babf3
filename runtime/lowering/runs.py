"""Runs: consecutive ``call`` ops of one graph whose inputs line up, planned per graph so
that ``calls`` lowers each run as one ``lax.scan`` (XLA compiles the graph once).

A run's *slots* say what each input of the called graph is across the calls: a **carry**
(the previous call's output), the **same** tensor in every call, or **stacked** (a
different tensor per call: the weights). ``POPXL_CALLS=inline`` (``set_policy("inline")``)
turns runs off; every call is then inlined.

Without either, a program is lowered with runs unless its builder preferred inlining for it
(``prefer_inline``): PopTorch does so for a captured training model whose repeated layers
do not convolve and whose calls, inlined, stay within ``INLINE_BUDGET`` ops, on the CPU. There
XLA:CPU runs the inlined layers faster than their scan (no stacks of weights and residuals
copied row by row), at some compile time: the 12-layer encoder of ``bench/poptorch_models.py``
(2,317 ops inlined), SGD step, 128.8 -> 111.0 ms (8 of 8 alternated rounds), first call
13.2 -> 15.5 s; timm's ViT-Tiny (a convolution before its layers) 86.1 -> 71.9 ms (6 of 6);
at 48 layers (9,229 ops) the encoder's first call went 17.2 -> 38.7 s, so long stacks keep
their scan. Layers that convolve keep it too (ResNet-18 and MobileNetV2 were not faster
inlined), and so does inference (BERT 3.3 -> 3.9 ms, Llama 5.0 -> 6.5 inlined).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax

from popxl._op import Op
from popxl.graph import Graph
from popxl.ir import Ir
from popxl.tensor import Tensor
from popxl.transforms._storage import roots

from . import grouping
from .core import LoweringContext, scheduler
from .graphs import repeated_graphs_convolve

Array = Any

POLICIES = ("scan", "inline")


_policy: str | None = None


MIN_RUN = 2  # shortest run worth a scan
INLINE_BUDGET = 4000  # ops a preferred inlining may unroll (see the module's docstring)

_preferred: weakref.WeakSet[Ir] = weakref.WeakSet()  # programs preferred inline


def policy(ir: Ir | None = None) -> str:
    """How repeated calls of ``ir`` are lowered: ``"scan"`` or ``"inline"``; the forced
    policy, else ``POPXL_CALLS``, else what was preferred for ``ir``, else ``"scan"``."""
    choice = _policy or os.environ.get("POPXL_CALLS") or None  # set but empty: unset
    if choice is None:
        # The backend is asked only here, while a session lowers the program: asked when
        # the program is built, it would start JAX before a distributed run is set up.
        preferred = ir is not None and ir in _preferred and jax.default_backend() == "cpu"
        return "inline" if preferred else "scan"
    if choice not in POLICIES:
        raise ValueError(f"POPXL_CALLS must be one of {', '.join(POLICIES)}, got {choice!r}.")
    return choice


def prefer_inline(ir: Ir) -> bool:
    """Lower ``ir``'s calls inline on the CPU (unless a policy is forced or set in
    ``POPXL_CALLS``) where that is measured faster: for a program whose repeated graphs
    (those called from two ops or more) do not convolve and whose main graph, every call
    inlined (loops' bodies once), has at most ``INLINE_BUDGET`` ops. Returns whether
    ``ir`` qualifies; call it once ``ir`` is built. Touches no JAX backend."""
    if repeated_graphs_convolve(ir) or _inlined_size(ir.main_graph, {}) > INLINE_BUDGET:
        return False
    _preferred.add(ir)
    return True


def _inlined_size(graph: Graph, memo: dict[int, int]) -> int:
    """``graph``'s ops, each call counted with the ops of the graph it calls."""
    if id(graph) not in memo:
        memo[id(graph)] = sum(
            1 + sum(_inlined_size(g, memo) for g in op.attrs.get("graphs", ())) for op in graph._ops
        )
    return memo[id(graph)]


def set_policy(choice: str | None) -> None:
    """Force a policy for programs built from now on (``None``: back to ``POPXL_CALLS``).

    Compiled steps are cached by IR structure and policy, so switching never reuses a step
    lowered the other way.
    """
    global _policy
    if choice is not None and choice not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {choice!r}.")
    _policy = choice


@scheduler
def _schedule(ctx: LoweringContext, graph: Graph) -> Sequence[Any]:
    """Lowering order: groups brought together (``grouping``), unless calls are inlined or
    the step is placed on several devices."""
    if policy(graph.ir) == "inline" or ctx.placement is not None:
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
        graph_b is not None
        and grouping.signature(graph_b) == grouping.signature(graph_a)
        and not _kept_apart(graph_a)
    )
    return (
        same_graph
        and b.modified_inputs == a.modified_inputs
        and len(b.inputs) == len(a.inputs)
        and b.execution_context == a.execution_context
    )


def _kept_apart(graph: Graph) -> bool:
    """Whether calls of ``graph`` and of another graph with its signature stay out of one
    run: gradient graphs (PopTorch's per-block ones, one per differentiated copy of a
    layer) of a replicated program, whose calls lowered apart let each weight gradient's
    replica sum wait for its accumulator (``replica_sums``), which a run's stacked outputs
    would compute per replica instead."""
    return graph.ir.replication_factor > 1 and any(
        "recipe" in op.attrs or op.opdef.special == "vjp_output" for op in graph._ops
    )


def runs_of(graph: Graph) -> dict[Op, Run]:
    """The graph's runs, keyed by their first call."""
    return plan_of(graph)[0]


def plan_of(graph: Graph) -> tuple[dict[Op, Run], set[Op]]:
    """(runs keyed by their first call, the other calls of every run); cached while the
    graph is unchanged."""
    cached = graph._lowering_memo.get("plan")
    if cached is not None and cached[0] == tuple(graph._ops):
        return cached[1], cached[2]
    ops = graph._ops if policy(graph.ir) == "inline" else grouping.schedule(graph)
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
    graph._lowering_memo["plan"] = (tuple(graph._ops), runs, members)
    return runs, members


def stacked_feeds(graph: Graph, _memo: dict[int, list] | None = None) -> list:
    """For every stacked input of every run and op group in ``graph``, and of those in the
    graphs it calls (``call``, ``repeat``, ``conditional``: their inputs traced back to
    ``graph``'s tensors), the tensors of ``graph`` fed to the rows, in call order; these are
    the variables worth storing stacked (``state_layout``). Inputs of chained runs (the
    layers) come first, so the weights are stacked as the layers scan them.

    An op group's rows that are also read on their own (a weight its group of updates
    shares with the forward pass) are left out, with every row of the ops ``calls`` then
    lowers on their own (``loose_reads``): each such read of a stacked variable would copy
    its row, where ops on separate arrays copy nothing."""
    feeds = _feeds(graph, {} if _memo is None else _memo)
    loose = loose_reads(graph, {})
    kept = []
    for kind, rows in sorted(feeds, key=lambda f: f[0] != "chain"):
        if kind == "group":
            rows = [t for t in rows if id(t) not in loose]
        if len(rows) >= MIN_RUN:
            kept.append(rows)
    return kept


def _feeds(graph: Graph, memo: dict[int, list]) -> list[tuple[str, list[Tensor]]]:
    """(kind, rows) per stacked input: kind ``"chain"`` (a run with a carry: layers),
    ``"run"`` (other runs) or ``"group"`` (an op group)."""
    if id(graph) in memo:
        return memo[id(graph)]
    feeds = [
        ("chain" if any(s.kind == "carry" for s in run.slots) else "run", run.stacked(j))
        for run in runs_of(graph).values()
        for j in _stacked_slots(run)
    ]
    feeds += [("group", [op.inputs[j] for op in group.ops]) for group, j in _group_slots(graph)]
    known = {tuple(map(id, rows)): k for k, (_, rows) in enumerate(feeds)}
    for op, sub, offset in _called(graph):
        outer = dict(zip(sub._inputs, op.inputs[offset : offset + len(sub._inputs)]))
        for kind, rows in _feeds(sub, memo):
            mapped = [outer.get(t) for t in rows]
            if any(t is None for t in mapped):
                continue
            k = known.setdefault(tuple(map(id, mapped)), len(feeds))
            if k == len(feeds):
                feeds.append((kind, mapped))  # type: ignore[arg-type]
            elif kind == "chain":
                # The same rows a group here reads (the updates of the weights a called
                # forward graph's layers scan): a chain still, so that it comes first.
                feeds[k] = (kind, mapped)  # type: ignore[assignment]
    memo[id(graph)] = feeds
    return feeds


def _group_slots(graph: Graph) -> list[tuple[Any, int]]:
    """(op group, input index) for every input that differs between a group's ops."""
    if policy(graph.ir) == "inline":
        return []
    slots = []
    for group in grouping.schedule(graph):
        if isinstance(group, grouping.OpGroup):
            first = group.ops[0]
            slots += [
                (group, j)
                for j in range(len(first.inputs))
                if any(op.inputs[j] is not first.inputs[j] for op in group.ops)
            ]
    return slots


def _called(graph: Graph) -> list[tuple[Op, Graph, int]]:
    """(op, called graph, offset of its inputs among the op's) for every graph ``graph``
    calls, loops over or branches to."""
    found = []
    for op in graph._ops:
        if op.opdef.special not in ("call", "repeat", "conditional"):
            continue
        offsets = op.attrs.get("input_offsets", (0,) * len(op.attrs["graphs"]))
        found += [(op, sub, offset) for sub, offset in zip(op.attrs["graphs"], offsets)]
    return found


def loose_reads(graph: Graph, memo: dict[int, frozenset[int]]) -> frozenset[int]:
    """Ids of ``graph``'s tensors that some op reads on its own: other than as a row of a
    run's or an op group's stacked input, in ``graph`` or in the graphs it calls. That
    includes the rows of group members ``calls`` will lower on their own
    (``_split_groups``). Such a row is not stacked: on XLA:CPU each read of a row of a
    stack is a copy (``bench/mnist_step.py``'s step, whose forward reads the weights its
    grouped updates had stacked, ran at 0.84 of hand-written JAX, 1.04 unstacked)."""
    if id(graph) in memo:
        return memo[id(graph)]
    memo[id(graph)] = frozenset()  # recursion guard
    run_rows = {(id(op), j) for run in runs_of(graph).values() for op in run.ops
                for j in _stacked_slots(run)}  # fmt: skip
    group_slots = _group_slots(graph)
    calls = {id(op) for op, _, _ in _called(graph)}
    in_groups = {(id(op), j) for group, j in group_slots for op in group.ops}
    loose: set[int] = set()
    for op in graph._ops:
        if id(op) not in calls:
            loose |= {
                id(t)
                for j, t in enumerate(op.inputs)
                if (id(op), j) not in run_rows and (id(op), j) not in in_groups
            }
    for op, sub, offset in _called(graph):
        inner = loose_reads(sub, memo)
        for k, t in enumerate(sub._inputs):
            if (id(op), offset + k) not in run_rows and id(t) in inner:
                loose.add(id(op.inputs[offset + k]))
    _split_groups(graph, group_slots, loose)
    memo[id(graph)] = frozenset(loose)
    return memo[id(graph)]


def _split_groups(graph: Graph, group_slots: list[tuple[Any, int]], loose: set[int]) -> None:
    """Add to ``loose`` the rows of every op of a group that ``calls`` will lower on its
    own, until that no longer changes: an op with a row held alone (read alone, or made
    by an op of ``graph`` outside any group or by one lowered on its own). The outputs of
    calls and the graph's inputs may be rows of stacks, and are taken to be. Scalar rows
    never split an op off, and stay stacked (gathering them is cheap)."""
    slots: dict[int, list[int]] = {}
    members: list[Op] = []
    for group, j in group_slots:
        for op in group.ops:
            if id(op) not in slots:
                slots[id(op)] = []
                members.append(op)
            slots[id(op)].append(j)
    alone = {
        id(t)
        for op in graph._ops
        if id(op) not in slots and op.opdef.special not in ("call", "repeat", "conditional")
        for t in op.outputs
    }
    split: set[int] = set()
    changed = True
    while changed:
        changed = False
        for op in members:
            if id(op) in split:
                continue
            rows = [op.inputs[j] for j in slots[id(op)]]
            if any(t.nelms > 1 and (id(t) in loose or id(t) in alone) for t in rows):
                split.add(id(op))
                loose |= {id(t) for t in rows if t.nelms > 1}
                alone |= {id(t) for t in op.outputs}
                changed = True


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
