"""Gathers and scatters that read an expanded index read the index before its expansion.

``torch.gather(x, 0, idx.expand(3, 5))`` with ``idx`` of shape ``(3, 1)`` picks whole rows
of ``x``: an index along one dimension, repeated along the other. Elementwise, the gather
reads (and a scatter writes) one position per element of the expanded index; by rows, it
reads one index per row and moves rows (``jnp.take``, ``x.at[rows].add``), and the
expansion is not computed at all. As PopTorch did, the capture rewrites such nodes to take
the unexpanded index (the expansion node goes when nothing else reads it), and says so in
the TRACE log (``Removing index expansion node``, ``Optimising gather``).

A node qualifies when its tensor has exactly two dimensions larger than one (any others are
1): the gathered or scattered dimension, and the one dimension along which the index was
expanded from 1. The rewritten node keeps the expanded shape in ``meta[EXPANDED]``; the
records in ``poptorch/aten/index.py`` read it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.ops import aten

from .._log import logger
from ..aten.index import EXPANDED

# op -> its kind; each takes (tensor, dim, index, ...)
_INDEXED = {
    aten.gather.default: "gather",
    aten.scatter_add.default: "scatter",
    aten.scatter_reduce.two: "scatter",
}


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(int(d) for d in val.shape) if isinstance(val, torch.Tensor) else None


def _row_dims(
    data: tuple[int, ...], small: tuple[int, ...], big: tuple[int, ...], dim: int
) -> bool:
    """Whether the index ``small`` expanded to ``big`` addresses whole rows of ``data`` along
    ``dim`` (see the module's docstring)."""
    if len(data) != len(big) or len(small) != len(big) or not data:
        return False
    d = dim % len(data)
    spread = {a for a, (s, b) in enumerate(zip(small, big)) if s == 1 and b > 1}
    wide = {a for a, n in enumerate(data) if n > 1}
    return len(spread) == 1 and d not in spread and wide == spread | {d}


def describe(node: torch.fx.Node) -> str:
    """One node in TorchScript's printed form: ``%out = aten::op(%a, 2)``."""
    target = node.target
    name = (
        target._schema.name if hasattr(target, "_schema") else getattr(target, "__name__", target)
    )

    def arg(a: Any) -> str:
        if isinstance(a, torch.fx.Node):
            return f"%{a.name}"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(arg(x) for x in a) + "]"
        return repr(a)

    shape = _shape(node)
    typed = f" : {list(shape)}" if shape is not None else ""
    args = ", ".join(
        [arg(a) for a in node.args] + [f"{k}={arg(v)}" for k, v in node.kwargs.items()]
    )
    return f"%{node.name}{typed} = {name}({args})"


def remove_index_expansions(graph: torch.fx.Graph) -> bool:
    """Rewrite the qualifying gathers and scatters of ``graph``; True if any was."""
    changed = False
    for node in list(graph.nodes):
        kind = _INDEXED.get(node.target) if node.op == "call_function" else None
        if kind is None or len(node.args) < 3:
            continue
        data, dim, index = node.args[0], node.args[1], node.args[2]
        if not (isinstance(index, torch.fx.Node) and index.target is aten.expand.default):
            continue
        small_node = index.args[0]
        data_shape, small, big = _shape(data), _shape(small_node), _shape(index)
        if data_shape is None or small is None or big is None or not isinstance(dim, int):
            continue
        if not _row_dims(data_shape, small, big, dim):
            continue
        logger.debug("Removing index expansion node: %s", describe(index))
        if kind == "gather":
            logger.debug("Optimising gather: %s", describe(node))
        node.update_arg(2, small_node)
        node.meta[EXPANDED] = big
        if not index.users:
            graph.erase_node(index)
        changed = True
    return changed


def log_graph(title: str, graph: torch.fx.Graph) -> None:
    """The captured graph in the TRACE log, one node per line."""
    if not logger.isEnabledFor(10):  # logging.DEBUG: PopTorch's TRACE and DEBUG
        return
    lines = [describe(n) for n in graph.nodes if n.op == "call_function"]
    logger.debug("%s\n%s", title, "\n".join("  " + line for line in lines))
