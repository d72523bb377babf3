"""Typed access to the arguments of torch.fx nodes.

torch types ``Node.args`` as a tuple of its wide ``Argument`` union (nodes, scalars, dtypes,
nested lists and dicts, ...). Which member an argument is depends on the op's schema, which
a type checker cannot see; the capture and the ATen records read arguments through these
helpers, which state that in one place instead of a cast at every use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from torch.fx import Node


def args_of(node: Node) -> tuple[Any, ...]:
    """``node.args``, each argument typed ``Any`` (its type follows the op's schema)."""
    return node.args


def node_arg(node: Node, index: int) -> Node:
    """Argument ``index`` of ``node``, which the op's schema makes a graph value (a node)."""
    return cast("Node", node.args[index])
