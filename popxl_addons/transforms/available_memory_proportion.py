"""Set the IPU's ``availableMemoryProportion`` planning option on ops, per virtual IPU.

On the IPU this option bounded the temporary memory Poplar's planner could give a matmul,
gather or convolution. Here it is recorded on each op (``op.hints``, and PopART's
``getAvailableMemoryProportion()`` through ``graph._pb_graph``) so the IR states the same
plan; XLA does its own memory planning and does not read it, so it does not change the
compiled program or its numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

import popxl
from popxl._op import AMP_HINT, AMP_OP_TYPES, CONV_AMP_HINT, CONV_OP_TYPES, Op

BAD_PROPORTION_MSG = (
    "available memory proportion for IPU {ipu} must be in (0, 1], got {value}. It is the "
    "fraction of each tile's memory the planner may use for temporaries."
)
EMPTY_MSG = "proportions is empty: give one available memory proportion per IPU, IPU 0 first."


def _proportions_by_ipu(proportions: Iterable[float]) -> dict[int, float]:
    by_ipu = dict(enumerate(float(p) for p in proportions))
    if not by_ipu:
        raise ValueError(EMPTY_MSG)
    for ipu, value in by_ipu.items():
        if not 0.0 < value <= 1.0:
            raise ValueError(BAD_PROPORTION_MSG.format(ipu=ipu, value=value))
    return by_ipu


def set_op_available_memory_proportion(op: Op, by_ipu: dict[int, float]) -> None:
    """Record the proportion of the op's IPU (IPU 0's if none was given for it)."""
    value = by_ipu.get(op.ipu or 0, by_ipu[0])
    if op.type in AMP_OP_TYPES:
        op.hints[AMP_HINT] = value
    elif op.type in CONV_OP_TYPES:
        op.hints[CONV_AMP_HINT] = [value]


def set_available_memory_proportion_by_ipu(ir: popxl.Ir, proportions: Iterable[float]) -> None:
    """Set the available memory proportion of every op in ``ir`` that has one.

    A proportion set on an op before (at its call site) is overridden. Recorded in the IR
    only: XLA's memory planning does not use it (see the module docstring).

    Args:
        ir: every graph of it is updated.
        proportions: ``proportions[n]`` is the proportion for ops on IPU ``n``; ops on an
            IPU without an entry get IPU 0's. Each must be in (0, 1].

    Raises:
        ValueError: an empty list, or a proportion outside (0, 1].
    """
    by_ipu = _proportions_by_ipu(proportions)
    for graph in ir._graphs.values():
        for op in graph._ops:
            set_op_available_memory_proportion(op, by_ipu)


def set_graph_available_memory_proportion_by_ipu(
    graph: popxl.Graph, proportions: Iterable[float]
) -> None:
    """As ``set_available_memory_proportion_by_ipu``, for the ops of ``graph`` and of every
    graph it calls (directly or through calls, repeats and conditionals), each once."""
    by_ipu = _proportions_by_ipu(proportions)
    seen: set[popxl.Graph] = set()
    pending = [graph]
    while pending:
        g = pending.pop()
        if g in seen:
            continue
        seen.add(g)
        for op in g._ops:
            pending.extend(op.called_graphs)
            set_op_available_memory_proportion(op, by_ipu)


__all__ = ["set_available_memory_proportion_by_ipu", "set_graph_available_memory_proportion_by_ipu"]
