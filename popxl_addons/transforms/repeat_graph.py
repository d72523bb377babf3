"""``repeat_graph``: run all of a graph's ops ``repeat_count`` times (device iterations)."""

from __future__ import annotations

import popxl
from popxl import ops


def repeat_graph(graph: popxl.Graph, repeat_count: int) -> popxl.Graph:
    """Move every op of ``graph`` into a new subgraph and repeat it ``repeat_count`` times.

    Tensors the ops read from outside (variables, inputs) become by-reference inputs of
    the new graph, so in-place updates persist across iterations. Typical use: build one
    training step in the main graph, then ``repeat_graph(ir.main_graph, n)`` with
    ``ir.num_host_transfers = n``. Tensor handles produced by the moved ops now belong to
    the new graph.

    Returns:
        The new graph, or ``graph`` itself when ``repeat_count <= 1``.
    """
    if repeat_count <= 1:
        return graph
    if graph.outputs:
        raise ValueError(
            f"repeat_graph cannot move {graph.id}: it has outputs. Use a graph without outputs."
        )
    ir = graph.ir
    body = ir._new_subgraph("repeat_graph")
    moved = list(graph._ops)
    produced = {t for op in moved for t in op.outputs}
    external = list(dict.fromkeys(t for op in moved for t in op.inputs if t not in produced))
    mapping: dict[popxl.Tensor, popxl.Tensor] = {}
    with body:
        for t in external:
            if isinstance(t, popxl.Constant):
                mapping[t] = popxl.constant(t.data, t.dtype, t.name)
            else:
                mapping[t] = popxl.graph_input(
                    t.shape, t.dtype, t.name, by_ref=True, meta_shape=t.meta_shape
                )
    graph._ops = []
    for op in moved:
        _move_op(op, graph, body, mapping)
    parents = [t for t in external if not isinstance(t, popxl.Constant)]
    with graph:
        ops.repeat(body, repeat_count, *parents)
    return body


def _move_op(op: object, source: popxl.Graph, target: popxl.Graph, mapping: dict) -> None:
    new_inputs = []
    for t in op.inputs:  # type: ignore[attr-defined]
        if t in mapping:
            t._consumers.remove(op)
            t = mapping[t]
            t._consumers.append(op)
        new_inputs.append(t)
    op.inputs = tuple(new_inputs)  # type: ignore[attr-defined]
    op.graph = target  # type: ignore[attr-defined]
    for out in op.outputs:  # type: ignore[attr-defined]
        name = _name_in(source, out)
        del source._tensors[out.id]
        out._graph = target
        out._id = f"{target.id}/{name}"
        target._tensors[out.id] = out
    target._ops.append(op)  # type: ignore[arg-type]


def _name_in(source: popxl.Graph, t: popxl.Tensor) -> str:
    gid = source.id
    return t._id[len(gid) + 1 :] if gid else t._id


__all__ = ["repeat_graph"]
