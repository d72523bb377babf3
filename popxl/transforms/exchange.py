"""``merge_exchange``, ``io_tile_exchange`` and ``decompose_sum``.

On the IPU these fused host/remote transfers into one exchange and split wide sums into
add trees to save memory. XLA schedules and fuses transfers itself, so here they keep their
argument checks and effects on placement, and otherwise leave the program unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import context
from .._op import Op
from ..graph import Graph

EXCHANGE_OPS = {"host_load", "host_store", "remote_load", "remote_load_", "remote_store"}
OVERLAP_MSG = (
    "More than one Op remained after io_tile_exchange. Only host and remote loads/stores (and "
    "Init ops) can be merged into one exchange; move the other ops {ops} out of the block, or "
    "pass verify_overlap=False."
)


@contextlib.contextmanager
def merge_exchange() -> Iterator[None]:
    """Group the host/remote loads and stores created inside into one exchange.

    Transfers created inside must not depend on each other, as on the IPU; ops still run in
    creation order.
    """
    context.get_current_graph()  # like the original, only valid while building a graph
    yield


@contextlib.contextmanager
def io_tile_exchange(verify_overlap: bool = True) -> Iterator[None]:
    """``io_tiles()`` + ``merge_exchange()`` + ``in_sequence(False)`` in one block.

    Raises:
        RuntimeError: with ``verify_overlap``, if ops other than loads/stores (and Init)
            were created inside, since they would not overlap with compute.
    """
    graph = context.get_current_graph()
    created: list[Op] = []
    handle = graph.register_op_created_hook(created.append)
    try:
        with context.io_tiles(), merge_exchange(), context.in_sequence(False):
            yield
    finally:
        graph.remove_op_created_hook(handle)
    if verify_overlap:
        others = [
            op for op in created if op.opdef.key not in EXCHANGE_OPS and op.opdef.key != "init"
        ]
        exchanges = any(op.opdef.key in EXCHANGE_OPS for op in created)
        if len(others) + int(exchanges) > 1:
            raise RuntimeError(OVERLAP_MSG.format(ops=others))


def decompose_sum(graph: Graph) -> Graph:
    """Split sums of more than two tensors into trees of additions; returns ``graph``.

    Gradient accumulation here already produces pairwise ``Add`` ops, so graphs never hold
    wider sums and the graph is returned as it is.
    """
    return graph


__all__ = ["merge_exchange", "io_tile_exchange", "decompose_sum"]
