"""Routing a tensor of a parent graph into a (nested) called graph.

``route_tensor_into_graph(a, sg2)`` where ``main`` calls ``sg1`` which calls ``sg2`` adds an
input ``sg1/a`` to ``sg1`` fed by ``a`` at every call site of ``sg1`` in ``main``, then an input
``sg2/a`` fed by ``sg1/a`` at every call site of ``sg2`` in ``sg1``, and returns ``sg2/a``.
Every call path is connected; each graph gets at most one new input, whatever the number of
its call sites. ``repeat`` ops get the tensor as a loop-invariant input (new inputs come
after the loop-carried ones). With ``modified=True`` the inputs are by reference on every
call site, so in-place updates inside reach the parent tensor.

Differences from the original:

* Every call site of a graph on the way must be reachable from the tensor's graph, and a
  call site in the tensor's own graph must come after the tensor is produced; otherwise a
  ``ValueError`` is raised before anything changes (the original produced a broken IR).
* An existing input is reused only when every call site feeds it with the tensor (or with
  an input that itself holds the tensor) and, for ``repeat``, it is not loop-carried. The
  original reused whatever input the first call site it met fed with the tensor, even a
  loop-carried one (which holds the previous iteration's output) or one that other call
  sites feed with other tensors.
* ``conditional`` ops on the way raise ``NotImplementedError``.
* ``modified`` regions are not modelled: any non-empty iterable means the whole tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import popxl

if TYPE_CHECKING:
    from popxl._op import Op

GraphPath = tuple[popxl.Graph, ...]
InputMap = dict[popxl.Graph, popxl.Tensor]

NOT_REACHABLE_MSG = (
    "{tensor} is not in the graph {graph}. Additionally, the tensor is not in a known parent "
    "graph so cannot be moved into the graph. Route it from a graph that calls {graph} "
    "(directly or through other calls)."
)
OTHER_CALLER_MSG = (
    "Cannot route {tensor} into {graph}: {callee} is also called from {caller}, which is not "
    "called (directly or indirectly) by {source}, so that call site could not be given the "
    "tensor. Pass the tensor to {callee} explicitly instead."
)
CALLED_BEFORE_MSG = (
    "Cannot route {tensor} into {graph}: it is produced after the call site {op} of {callee}. "
    "Create the tensor before calling the graph."
)
NOT_CALL_MSG = (
    "Cannot route {tensor} into {graph}: {callee} is used by a {kind} op ({op}). Only call and "
    "repeat sites can be given new inputs; pass the tensor to the conditional's branches "
    "explicitly."
)
OUT_OF_STEP_MSG = (
    "{op} has {n} inputs but its graph {g} has {m}: the call site is out of step with its "
    "graph, so no tensor can be routed through it."
)


def _name(graph: popxl.Graph) -> str:
    return graph.id or "main"


def is_subgraph(parent: popxl.Graph, subgraph: popxl.Graph) -> bool:
    """Whether running ``parent`` runs ``subgraph`` (through any depth of calls).

    A graph counts as a subgraph of itself.
    """
    pending, seen = [parent], set()
    while pending:
        g = pending.pop()
        if g is subgraph:
            return True
        if g not in seen:
            seen.add(g)
            pending.extend(g.called_graphs)
    return False


def called_graph_paths(parent_graph: popxl.Graph, subgraph: popxl.Graph) -> list[GraphPath]:
    """Every chain of calls from ``parent_graph`` to ``subgraph``, both ends included.

    Paths are listed in the order their call ops were created (deterministic).
    """
    paths: list[GraphPath] = []

    def walk(graph: popxl.Graph, path: GraphPath) -> None:
        path = (*path, graph)
        if graph is subgraph:
            paths.append(path)
            return
        for called in graph.called_graphs:
            walk(called, path)

    walk(parent_graph, ())
    return paths


def _feeds(parent: popxl.Tensor, tensor: popxl.Tensor) -> bool:
    """Whether ``parent`` holds ``tensor``'s value: it is ``tensor``, or a graph input that
    every call site feeds (loop-invariantly) from such a tensor."""
    if parent is tensor:
        return True
    graph = parent._graph
    if parent not in graph._inputs:
        return False
    k = graph._inputs.index(parent)
    sites = graph.ir._call_sites_of(graph)
    return bool(sites) and all(
        op.opdef.key in ("call", "repeat")
        and (op.opdef.key == "call" or k >= len(graph._outputs))
        and k < len(op.inputs)
        and _feeds(op.inputs[k], tensor)
        for op in sites
    )


def _existing_input(graph: popxl.Graph, tensor: popxl.Tensor) -> popxl.Tensor | None:
    """An input of ``graph`` that already holds ``tensor`` (a parent-graph tensor) on every call."""
    return next((t for t in graph._inputs if _feeds(t, tensor)), None)


def _connect(
    op: Op, tensor: popxl.Tensor, input_tensors: InputMap, modified: bool, source: popxl.Tensor
) -> None:
    graph = op.attrs["graphs"][0]
    sub_tensor = input_tensors.get(graph)
    if sub_tensor is None:
        sub_tensor = _existing_input(graph, source)
    if sub_tensor is None:
        with graph:
            sub_tensor = popxl.graph_input(
                tensor.shape,
                tensor.dtype,
                tensor.name,
                by_ref=modified,
                meta_shape=tensor.meta_shape,
            )
    # Call and repeat ops feed their graph from op input 0, and every call site had as many
    # inputs as the graph before routing (checked first), so a new input goes at the end.
    index = graph._inputs.index(sub_tensor)
    if index > len(op.inputs):
        raise RuntimeError(
            OUT_OF_STEP_MSG.format(op=op, n=len(op.inputs), g=graph.id, m=len(graph._inputs))
        )
    if index == len(op.inputs):
        op.inputs = (*op.inputs, tensor)
        tensor._consumers.append(op)
    if modified:
        op.modified_inputs.add(index)
        graph._by_ref_inputs.add(sub_tensor)
    input_tensors[graph] = sub_tensor


def _check_site(op: Op, key: str) -> None:
    if op.opdef.key != key:
        raise NotImplementedError(f"{op} is a {op.type} op, not a {key} op.")


def connect_call_op(
    op: Op,
    tensor: popxl.Tensor,
    input_tensors: InputMap,
    modified: bool = False,
    source: popxl.Tensor | None = None,
) -> None:
    """Feed ``tensor`` (of the op's graph) to the graph called by the call op ``op``.

    The callee's input for it is ``input_tensors[callee]`` when routing already made one;
    otherwise an input that holds ``source`` (default ``tensor``) on every call site is
    reused, or a new input is added. The choice is recorded in ``input_tensors``.

    Raises:
        NotImplementedError: ``op`` is not a call op.
    """
    _check_site(op, "call")
    _connect(op, tensor, input_tensors, modified, source if source is not None else tensor)


def connect_loop_op(
    op: Op,
    tensor: popxl.Tensor,
    input_tensors: InputMap,
    modified: bool = False,
    source: popxl.Tensor | None = None,
) -> None:
    """Like ``connect_call_op`` for a repeat op; the tensor becomes a loop-invariant input
    (loop-carried inputs are never reused)."""
    _check_site(op, "repeat")
    _connect(op, tensor, input_tensors, modified, source if source is not None else tensor)


def connect_tensor_to_ops_on_path(
    path: GraphPath, from_tensor: popxl.Tensor, input_tensors: InputMap, modified: bool = False
) -> popxl.Tensor:
    """Connect ``from_tensor`` to every call site along ``path`` (graphs after the tensor's own).

    Returns:
        The tensor's counterpart in the last graph of ``path``.
    """
    parent_tensor = from_tensor
    for graph in path:
        for op in parent_tensor._graph._ops:
            if graph in op.called_graphs:
                connect = connect_loop_op if op.opdef.key == "repeat" else connect_call_op
                connect(op, parent_tensor, input_tensors, modified, from_tensor)
        parent_tensor = input_tensors[graph]
    return parent_tensor


def _check_routable(tensor: popxl.Tensor, target: popxl.Graph, paths: list[GraphPath]) -> None:
    """Raise, before anything changes, when some call site on the way cannot be connected."""
    source = tensor._graph
    on_paths = {g for path in paths for g in path}
    for callee in dict.fromkeys(g for path in paths for g in path[1:]):
        for op in target.ir._call_sites_of(callee):
            names = dict(tensor=tensor.id, graph=_name(target), callee=_name(callee), op=op)
            if op.opdef.key not in ("call", "repeat"):
                raise NotImplementedError(NOT_CALL_MSG.format(kind=op.type, **names))
            if len(op.inputs) != len(callee._inputs):
                raise RuntimeError(
                    OUT_OF_STEP_MSG.format(
                        op=op, n=len(op.inputs), g=callee.id, m=len(callee._inputs)
                    )
                )
            if op.graph not in on_paths:
                raise ValueError(
                    OTHER_CALLER_MSG.format(caller=_name(op.graph), source=_name(source), **names)
                )
            producer = tensor._producer
            if (
                op.graph is source
                and producer is not None
                and source._ops.index(producer) > source._ops.index(op)
            ):
                raise ValueError(CALLED_BEFORE_MSG.format(**names))


def _as_bool(modified: bool | Iterable) -> bool:
    return modified if isinstance(modified, bool) else bool(list(modified))


def route_tensor_into_graph(
    tensor: popxl.Tensor,
    graph: popxl.Graph | None = None,
    modified: bool | Iterable = False,
) -> popxl.Tensor:
    """Make ``tensor``, from a parent graph, available inside ``graph``.

    Adds inputs to every graph and call/repeat site between ``tensor``'s graph and ``graph``
    (see the module docstring). A tensor already in ``graph`` is returned as is.

    Args:
        tensor: a tensor of ``graph`` or of a graph that (indirectly) calls it.
        graph: where the tensor is needed; the current graph by default.
        modified: make the new inputs by reference, so in-place updates of the returned
            tensor reach ``tensor`` after each call.

    Returns:
        The tensor's counterpart in ``graph``.

    Raises:
        ValueError: ``graph`` is not called from ``tensor``'s graph, or a call site on the
            way cannot be connected (see the module docstring).
        NotImplementedError: a conditional op calls a graph on the way.

    >>> import popxl, popxl.ops as ops
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     a = popxl.variable(1.0, name="a")
    ...     sg = ir.create_empty_graph("sg")
    ...     _ = ops.call(sg)
    >>> with sg:
    ...     a_sg = route_tensor_into_graph(a)
    >>> a_sg.id, len(sg.inputs)
    ('sg_subgraph(0)/a', 1)
    """
    graph = graph if graph is not None else popxl.gcg()
    if tensor._graph is graph:
        return tensor
    source = tensor._graph
    if not is_subgraph(source, graph):
        raise ValueError(NOT_REACHABLE_MSG.format(tensor=tensor, graph=_name(graph)))
    paths = called_graph_paths(source, graph)
    _check_routable(tensor, graph, paths)
    flag = _as_bool(modified)
    input_tensors: InputMap = {}
    for path in paths:
        connect_tensor_to_ops_on_path(path[1:], tensor, input_tensors, flag)
    return input_tensors[graph]


__all__ = ["route_tensor_into_graph", "is_subgraph"]
