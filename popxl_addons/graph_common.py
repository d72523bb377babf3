"""Type aliases for graph-like values, and normalising gradient-info mappings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import popxl
from popxl.transforms import GradGraphInfo

from .graph import BoundGraph, GraphWithNamedArgs

GraphLike = popxl.Graph | GraphWithNamedArgs | BoundGraph
GradGraphInfoLike = GradGraphInfo | GraphWithNamedArgs
CalledGraphsGradInfoLike = Mapping[Any, Any]
CalledGraphsGradInfo = Mapping[popxl.Graph, GradGraphInfo]


def _graph_of(value: Any) -> popxl.Graph:
    return value if isinstance(value, popxl.Graph) else value.graph


def _normalise_called_graphs_grad_info(
    mapping: CalledGraphsGradInfoLike | None,
) -> dict[popxl.Graph, GradGraphInfo]:
    """``{popxl.Graph: GradGraphInfo}`` from any mix of graph-likes and grad-info-likes."""
    result: dict[popxl.Graph, GradGraphInfo] = {}
    for key, value in (mapping or {}).items():
        info = value.grad_graph_info if isinstance(value, GraphWithNamedArgs) else value
        result[_graph_of(key)] = info
    return result
