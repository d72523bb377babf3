"""What a program's graphs hold, asked by several lowering stages: the graphs a program
reaches from its main graph, and whether any of them, or any of its repeated ones,
convolves."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from popxl.graph import Graph
from popxl.ir import Ir


def reachable_graphs(ir: Ir) -> list[Graph]:
    """The main graph and every graph it calls, directly or not, in discovery order."""
    return reached_from([ir.main_graph])


def reached_from(graphs: Iterable[Graph]) -> list[Graph]:
    """``graphs`` and every graph they call, directly or not, in discovery order."""
    seen = dict.fromkeys(graphs)
    stack = list(seen)
    while stack:
        for op in stack.pop()._ops:
            for g in op.referenced_graphs:
                if g not in seen:
                    seen[g] = None
                    stack.append(g)
    return list(seen)


def convolves(ir: Ir) -> bool:
    """Whether the program runs a convolution (forward or gradient) in a graph it reaches."""
    return _any_convolution(reachable_graphs(ir))


def repeated_graphs_convolve(ir: Ir) -> bool:
    """Whether a graph that two ops of the program or more call (a model's repeated layer,
    its gradient), or one that such a graph calls, runs a convolution."""
    calls = (g for graph in reachable_graphs(ir) for op in graph._ops for g in op.called_graphs)
    return _any_convolution(reached_from(g for g, n in Counter(calls).items() if n >= 2))


def _any_convolution(graphs: Iterable[Graph]) -> bool:
    return any(op.opdef.key.startswith("conv") for g in graphs for op in g._ops)
