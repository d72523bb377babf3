"""Text form of a graph's schedule (``Graph.print_schedule``).

Layout, as in the seed tutorial::

    Graph : Linear_subgraph(0)
      (%1, weight=%2, bias=%3) -> (%5) {
        MatMul.100 (%1 [(2, 4) float32], %2 [(4, 32) float32]) -> (%4 [(2, 32) float32])
        Add.101 (%4 [(2, 32) float32], %3 [(32,) float32]) -> (%5 [(2, 32) float32])
      }

Tensors are numbered ``%1, %2, ...`` on first appearance: graph inputs first, then op
inputs and outputs in schedule order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph import Graph
    from .tensor import Tensor


class _Numbering:
    def __init__(self) -> None:
        self.numbers: dict[Tensor, int] = {}

    def __call__(self, t: Tensor) -> str:
        n = self.numbers.get(t)
        if n is None:
            n = self.numbers[t] = len(self.numbers) + 1
        return f"%{n}"


def _annotated(t: Tensor, number: _Numbering) -> str:
    return f"{number(t)} [{t.shape} {t.dtype.name}]"


def format_schedule(graph: Graph, arg_names: Mapping[Tensor, str]) -> str:
    number = _Numbering()
    ins = []
    for t in graph.inputs:
        name = arg_names.get(t)
        ins.append(f"{name}={number(t)}" if name else number(t))
    lines = [f"Graph : {graph.name}"]
    header_index = len(lines)
    for op in graph.ops:
        callee = "".join(f"({g.name})" for g in op.called_graphs)
        op_ins = ", ".join(_annotated(t, number) for t in op.inputs)
        op_outs = ", ".join(_annotated(t, number) for t in op.outputs)
        lines.append(f"    {op.type}.{op.id}{callee} ({op_ins}) -> ({op_outs})")
    outs = ", ".join(number(t) for t in graph.outputs)
    lines.insert(header_index, f"  ({', '.join(ins)}) -> ({outs}) {{")
    inputs = set(graph.inputs)
    others = [
        f"{number(t)}={name}" for t, name in arg_names.items() if t not in inputs and t in number.numbers
    ]
    if others:  # named tensors of the graph that are not its inputs (e.g. variables)
        lines.append(f"    where {', '.join(sorted(others, key=_by_number))}")
    lines.append("  }")
    return "\n".join(lines)


def _by_number(entry: str) -> int:
    return int(entry[1 : entry.index("=")])
