"""Calling subgraphs: ``call``, ``call_with_info`` and ``CallSiteInfo``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .. import context
from .._op import Op, core_error, define
from ..tensor import Tensor, TensorLike
from ..utils import flatten_once, table_to_string
from ._base import add_op, spec

if TYPE_CHECKING:
    from ..graph import Graph

TOO_MANY_MSG = (
    "Too many inputs have been provided to the called graph. The number of positional "
    "inputs exceeds the number of inputs of the graph. {n} > {m}. For graph: {graph}"
)
PARENT_NOT_IN_GRAPH_MSG = 'Parent input tensor "{t}" is not in parent graph "{g}".'
KEY_NOT_IN_CALLEE_MSG = 'The graph input tensor "{t}" is not in the called graph ({g}).'
SPECIFIED_TWICE_MSG = (
    "Graph input tensor is specified twice for the called graph, in `inputs_dict` and "
    "positionally in `inputs`: {t}"
)
NOT_COERCIBLE_MSG = "Input {where} could not be coerced into a tensor for the called graph: {err}"
NOT_ENOUGH_MSG = (
    "Not enough inputs have been provided for the called graph ({graph}).\n\nMissing inputs:\n"
)
NOT_A_GRAPH_MSG = (
    "The graph to call must be a popxl.Graph, got {type}. Build one with ir.create_graph(fn, ...)."
)
OTHER_IR_MSG = "Graph {g} belongs to {g_ir}, but the current graph belongs to {ir}; graphs can only be called within their own Ir."
MAIN_CALLED_MSG = "The main graph cannot be called, repeated or branched to; build a subgraph with ir.create_graph instead."
RECURSIVE_MSG = (
    "Calling graph {g} from graph {parent} would recurse: {g} already calls {parent}, "
    "directly or indirectly. Recursive graphs cannot run; restructure the program."
)


def _infer_none(*_: Any, **__: Any) -> list:
    return []


CALL = define("call", "Call", _infer_none, special="call", grad="call")


def _coerce(graph_input: Tensor, value: Any, where: str) -> Tensor:
    try:
        return graph_input._ensure_tensor(value)
    except Exception as err:  # any conversion failure is the caller's value
        raise TypeError(NOT_COERCIBLE_MSG.format(where=where, err=err)) from None


def _missing_inputs_error(graph: Graph, label: str, connected: dict[int, Tensor]) -> ValueError:
    missing = [("Index", "Graph Tensor")] + [
        (i, t) for i, t in enumerate(graph.inputs) if i not in connected
    ]
    present = [("Index", "Graph Tensor", "Parent Graph Tensor")] + [
        (i, graph.inputs[i], p) for i, p in sorted(connected.items())
    ]
    return ValueError(
        NOT_ENOUGH_MSG.format(graph=label)
        + table_to_string(missing)
        + "\n\nConnected inputs:\n"
        + table_to_string(present)
    )


def _check_connection(graph_input: Tensor, parent: Tensor, label: str) -> None:
    if graph_input.shape != parent.shape or graph_input.dtype is not parent.dtype:
        raise core_error(
            f"The parent tensor {parent.id} {parent.dtype.name}{parent.shape} does not match "
            f"the input {graph_input.id} {graph_input.dtype.name}{graph_input.shape} of the "
            f"called graph {label}. Shapes and dtypes must be equal; reshape or cast first."
        )


def _calls(graph: Graph, target: Graph) -> bool:
    """Whether running ``graph`` runs ``target`` (through any depth of calls)."""
    pending, seen = [graph], set()
    while pending:
        g = pending.pop()
        if g is target:
            return True
        if g not in seen:
            seen.add(g)
            pending.extend(g.called_graphs)
    return False


def check_callable(graph: Any, parent_graph: Graph) -> None:
    """Raise unless ``graph`` is a subgraph that ``parent_graph`` may call."""
    from ..graph import Graph  # noqa: PLC0415  (graph imports tensor, which ops build on)

    if not isinstance(graph, Graph):
        raise TypeError(NOT_A_GRAPH_MSG.format(type=type(graph).__name__))
    if graph.ir is not parent_graph.ir:
        raise ValueError(OTHER_IR_MSG.format(g=graph.id, g_ir=graph.ir, ir=parent_graph.ir))
    if graph is graph.ir.main_graph:
        raise ValueError(MAIN_CALLED_MSG)
    if _calls(graph, parent_graph):
        raise ValueError(RECURSIVE_MSG.format(g=graph.id, parent=parent_graph.id or "main"))


def prepare_inputs(
    graph: Graph,
    inputs: Iterable[TensorLike | Iterable[TensorLike]],
    inputs_dict: Mapping[Tensor, TensorLike] | None,
    label: str | None = None,
) -> list[Tensor]:
    """The parent tensor for every input of ``graph``, validated as PopXL does for calls."""
    parent_graph = context.get_current_graph()
    check_callable(graph, parent_graph)
    label = label or graph.id
    positional = flatten_once(inputs)
    n_inputs = len(graph._inputs)
    if len(positional) > n_inputs:
        raise ValueError(TOO_MANY_MSG.format(n=len(positional), m=n_inputs, graph=label))
    connected: dict[int, Tensor] = {}
    for i, value in enumerate(positional):
        if isinstance(value, Tensor):
            if value._graph is not parent_graph:
                raise ValueError(PARENT_NOT_IN_GRAPH_MSG.format(t=value, g=parent_graph.id))
            connected[i] = value
        else:
            connected[i] = _coerce(graph._inputs[i], value, f'at position "{i}"')
    for key, value in (inputs_dict or {}).items():
        if not isinstance(key, Tensor) or key._graph is not graph or key not in graph._inputs:
            raise ValueError(KEY_NOT_IN_CALLEE_MSG.format(t=key, g=label))
        index = graph._inputs.index(key)
        if index in connected:
            raise ValueError(SPECIFIED_TWICE_MSG.format(t=key))
        if isinstance(value, Tensor):
            if value._graph is not parent_graph:
                raise ValueError(PARENT_NOT_IN_GRAPH_MSG.format(t=value, g=parent_graph.id))
            connected[index] = value
        else:
            connected[index] = _coerce(key, value, f'"{key}"')
    if len(connected) < n_inputs:
        raise _missing_inputs_error(graph, label, connected)
    parents = [connected[i] for i in range(n_inputs)]
    for graph_input, parent in zip(graph._inputs, parents):
        _check_connection(graph_input, parent, label)
    return parents


def add_call_like(
    opdef: Any,
    graphs: tuple[Graph, ...],
    offsets: tuple[int, ...],
    inputs: list[Tensor],
    output_specs: list,
    names: list[str],
    **attrs: Any,
) -> Op:
    """Append a subgraph-calling op and return it."""
    parent_graph = context.get_current_graph()
    all_attrs = {"graphs": graphs, "input_offsets": offsets, **attrs}
    return add_op(parent_graph, opdef, tuple(inputs), all_attrs, output_specs, names)


def _call_op(graph: Graph, parents: list[Tensor]) -> Op:
    specs = [spec(t.shape, t.dtype, t.meta_shape) for t in graph._outputs]
    names = [t.name for t in graph._outputs]
    op = add_call_like(CALL, (graph,), (0,), parents, specs, names)
    mark_by_ref_inputs(op, graph, 0)
    return op


def mark_by_ref_inputs(op: Op, graph: Graph, offset: int) -> None:
    """Record that ``op`` writes back the inputs that ``graph`` (fed from op input
    ``offset`` on) takes by reference."""
    by_ref = graph._by_ref_inputs
    if by_ref:
        op.modified_inputs.update(offset + k for k, t in enumerate(graph._inputs) if t in by_ref)


def call(
    graph: Graph,
    *inputs: TensorLike | Iterable[TensorLike],
    inputs_dict: Mapping[Tensor, TensorLike] | None = None,
) -> tuple[Tensor, ...]:
    """Call ``graph`` with ``inputs`` and return its outputs in the current graph.

    Positional inputs fill the graph's inputs in order (iterables are expanded one level);
    ``inputs_dict`` maps graph inputs to parent tensors. Python values become constants of
    the graph input's dtype. Inputs are passed by value unless the graph input is by
    reference.

    Raises:
        ValueError: too many, missing or foreign inputs.
        TypeError: a value that cannot become a tensor.
        PopXLException: a parent tensor whose shape or dtype differs from the graph input.
    """
    return call_with_info(graph, *inputs, inputs_dict=inputs_dict).outputs


def call_with_info(
    graph: Graph,
    *inputs: TensorLike | Iterable[TensorLike],
    inputs_dict: Mapping[Tensor, TensorLike] | None = None,
    check_inputs: bool = True,
) -> CallSiteInfo:
    """Like ``call``, returning the ``CallSiteInfo`` of the new call site.

    ``check_inputs`` is accepted for compatibility: every graph input must be connected
    here, because the program cannot run otherwise.
    """
    parents = prepare_inputs(graph, inputs, inputs_dict)
    return CallSiteInfo(_call_op(graph, parents))


class CallSiteInfo:
    """How a call site connects parent tensors to a called graph's inputs and outputs."""

    def __init__(self, op: Op) -> None:
        self._op = op

    @property
    def called_graph(self) -> Graph:
        return self._op.attrs["graphs"][0]

    def _offset(self) -> int:
        return self._op.attrs["input_offsets"][0]

    def graph_to_parent_input_index(self, idx: int) -> int:
        return idx + self._offset()

    def parent_to_graph_input_index(self, idx: int) -> int:
        return idx - self._offset()

    def graph_to_parent_output_index(self, idx: int) -> int:
        return idx

    def parent_to_graph_output_index(self, idx: int) -> int:
        return idx

    def graph_to_parent(self, graph_tensor: Tensor) -> Tensor:
        """The parent tensor connected to a graph input or output."""
        graph = self.called_graph
        if graph_tensor in graph._inputs:
            return self.parent_input(
                self.graph_to_parent_input_index(graph._inputs.index(graph_tensor))
            )
        if graph_tensor in graph._outputs:
            index = graph._outputs.index(graph_tensor)
            return self.parent_output(self.graph_to_parent_output_index(index))
        raise ValueError(
            f"Tensor {graph_tensor.name} is not an input or output of the called graph(s)."
        )

    def parent_to_graph(self, parent_tensor: Tensor) -> Tensor:
        """The graph input fed by the first occurrence of ``parent_tensor``."""
        graph = self.called_graph
        offset = self._offset()
        for i, t in enumerate(self._op.inputs[offset : offset + len(graph._inputs)]):
            if t is parent_tensor:
                return graph._inputs[i]
        raise ValueError(
            f"Tensor {parent_tensor.name} is not a parent graph input of the call site."
        )

    def parent_input(self, idx: int) -> Tensor:
        return self._op.inputs[idx]

    def parent_output(self, idx: int) -> Tensor:
        return self._op.outputs[idx]

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self._op.inputs

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return self._op.outputs

    def set_parent_input_modified(
        self, parent_tensor: Tensor, infer_modified_regions: bool = False
    ) -> None:
        """Write the final value of the graph input fed by ``parent_tensor`` back to it."""
        graph_tensor = self.parent_to_graph(parent_tensor)
        index = self.graph_to_parent_input_index(self.called_graph._inputs.index(graph_tensor))
        self._op.modified_inputs.add(index)

    def __repr__(self) -> str:
        return f"CallSiteInfo[{self._op!r} -> {self.called_graph.id}]"


__all__ = ["call", "call_with_info", "CallSiteInfo"]
