"""Graphviz DOT text of an Ir (``Ir.dot_checkpoint``): one cluster per graph, ops as boxes,
tensors as ellipses, a folder node per graph, and dashed edges from calling ops to the
graphs they call."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph import Graph
    from .ir import Ir


def _q(text: str) -> str:
    return json.dumps(text)


def _graph_lines(graph: Graph, index: int) -> list[str]:
    label = graph.id or "main"
    lines = [
        f"  subgraph cluster_{index} {{",
        f"    label={_q(label)};",
        f"    {_q('graph:' + graph.id)} [shape=folder, label={_q(label)}];",
    ]
    for t in graph._tensors.values():
        lines.append(f"    {_q('t:' + t.id)} [label={_q(f'{t.name} {t.dtype.name}{t.shape}')}];")
    for op in graph._ops:
        node = _q(f"op:{op.id}")
        lines.append(f"    {node} [shape=box, label={_q(repr(op))}];")
        lines += [f"    {_q('t:' + t.id)} -> {node};" for t in op.inputs]
        lines += [f"    {node} -> {_q('t:' + t.id)};" for t in op.outputs]
    lines.append("  }")
    return lines


def to_dot(ir: Ir) -> str:
    """The whole Ir as DOT text."""
    graphs = list(ir._graphs.values())
    lines = ["digraph ir {"]
    for index, graph in enumerate(graphs):
        lines += _graph_lines(graph, index)
    for graph in graphs:
        for op in graph._ops:
            for called in op.called_graphs:
                lines.append(f"  {_q(f'op:{op.id}')} -> {_q('graph:' + called.id)} [style=dashed];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_dot(ir: Ir, path: Path) -> None:
    """Write ``to_dot(ir)`` to ``path``."""
    path.write_text(to_dot(ir))


def enabled_checks(ir: Ir) -> set[str]:
    """The checkpoint names that write a file: the session options' ``dotChecks`` and the
    colon-separated ``POPART_DOT_CHECKS``, upper-cased."""
    names = set(ir._session_options.dotChecks)
    names.update(os.environ.get("POPART_DOT_CHECKS", "").split(":"))
    return {n.upper() for n in names if n}


def checkpoint(ir: Ir, check: str) -> Path | None:
    """Write ``<logDir>/<check>.dot`` if ``check`` (or ``ALL``) is enabled; the path, if
    written."""
    enabled = enabled_checks(ir)
    if "ALL" not in enabled and check.upper() not in enabled:
        return None
    folder = Path(ir._session_options.logDir or Path.cwd())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{check}.dot"
    write_dot(ir, path)
    return path


__all__ = ["checkpoint", "enabled_checks", "to_dot", "write_dot"]
