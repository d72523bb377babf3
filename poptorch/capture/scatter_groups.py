"""Scatter-reduces of one tensor by one index, with sources of one shape, run as one op.

A model that scatters several sources into the same tensor with the same index
(``inp.scatter_reduce(0, index, src[i], "amax")`` for each ``i``) makes as many scatters
as sources. As PopART did, the capture groups them: one ``grouped_scatter`` node scatters
the stacked sources (``group_size`` of them) at once, and each original result becomes one
slice of it. The group is formed only where that changes no order: every source exists
before any of the results is used.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import Any

import torch
from torch.ops import aten

from .._log import logger
from ..aten.index import grouped_scatter

_GROUPABLE = (aten.scatter_reduce.two, aten.scatter_add.default)


def _key(node: torch.fx.Node) -> tuple | None:
    if node.op != "call_function" or node.target not in _GROUPABLE:
        return None
    args: tuple[Any, ...] = tuple(node.args)
    x, dim, index, src = args[:4]
    if not (
        isinstance(x, torch.fx.Node)
        and isinstance(index, torch.fx.Node)
        and isinstance(src, torch.fx.Node)
    ):
        return None
    reduce: Any = "sum"
    include_self: Any = True
    if node.target is not aten.scatter_add.default:
        reduce = args[4]
        include_self = node.kwargs.get("include_self", args[5] if len(args) > 5 else True)
    val = src.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    return (x, dim, index, reduce, bool(include_self), tuple(val.shape), val.dtype)


def group_scatters(graph: torch.fx.Graph) -> bool:
    """Group the scatters of ``graph`` that qualify; True if any were."""
    groups: dict[tuple, list[torch.fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        key = _key(node)
        if key is not None:
            groups[key].append(node)
    changed = False
    for (x, dim, index, reduce, include_self, _, _), members in groups.items():
        if len(members) < 2:
            continue
        position = {n: i for i, n in enumerate(graph.nodes)}
        srcs = [m.args[3] for m in members]
        ready = max(position[n] for n in (x, index, *srcs))
        first_use = min(position[u] for m in members for u in m.users)
        if ready >= first_use:
            continue
        after = max((x, index, *srcs), key=position.__getitem__)
        with graph.inserting_after(after):
            grouped = graph.call_function(
                grouped_scatter, (x, dim, index, srcs, reduce, include_self)
            )
        grouped.meta = dict(members[0].meta)
        grouped.meta["val"] = tuple(m.meta["val"] for m in members)
        logger.debug("Grouping %d scatter-reduces into %s", len(members), grouped.name)
        anchor = grouped
        for i, m in enumerate(members):
            with graph.inserting_after(anchor):
                part = graph.call_function(operator.getitem, (grouped, i))
            part.meta = dict(m.meta)
            m.replace_all_uses_with(part)
            graph.erase_node(m)
            anchor = part
        changed = True
    return changed
