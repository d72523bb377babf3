"""What a program's graphs hold, asked by several lowering stages: the graphs a program
reaches from its main graph, and whether any of them convolves."""

from __future__ import annotations

from popxl.graph import Graph
from popxl.ir import Ir


def reachable_graphs(ir: Ir) -> list[Graph]:
    """The main graph and every graph it calls, directly or not, in discovery order."""
    seen: dict[Graph, None] = {ir.main_graph: None}
    stack = [ir.main_graph]
    while stack:
        for op in stack.pop()._ops:
            for g in op.referenced_graphs:
                if g not in seen:
                    seen[g] = None
                    stack.append(g)
    return list(seen)


def convolves(ir: Ir) -> bool:
    """Whether the program runs a convolution (forward or gradient) in a graph it reaches."""
    return any(op.opdef.key.startswith("conv") for g in reachable_graphs(ir) for op in g._ops)
