"""``Graph``: an ordered list of ops with inputs and outputs, inside an ``Ir``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import context
from ._popart_compat import PbGraph
from .tensor import Constant, Tensor, Variable

if TYPE_CHECKING:
    from ._op import Op
    from .ir import Ir


class Graph:
    """A graph of the IR: the main graph, or a subgraph to be called, repeated or branched to.

    Ops run in the order they were created. Use the graph as a context manager to add ops
    to it. Obtain graphs from ``Ir.main_graph``, ``Ir.create_graph`` or
    ``Ir.create_empty_graph``; they cannot be constructed directly.
    """

    _ir: Ir
    _id: str
    _ops: list[Op]
    _tensors: dict[str, Tensor]
    _inputs: list[Tensor]
    _outputs: list[Tensor]
    _by_ref_inputs: set[Tensor]
    _hooks: dict[int, Callable[[Op], Any]]
    _next_hook: int
    # Set only by popxl_addons on graphs built from a custom ``build_grad``; read with getattr.
    _autodiff_safe: bool
    # The runtime's analyses of this graph (its schedule, signature and run plan), each with
    # the ops it was made from: kept here so that they live and die with the graph.
    _lowering_memo: dict[str, Any]

    def __init__(self) -> None:
        raise TypeError(
            "popxl.Graph cannot be constructed directly. Use ir.main_graph, "
            "ir.create_graph(fn, ...) or ir.create_empty_graph(name)."
        )

    @classmethod
    def _create(cls, ir: Ir, graph_id: str) -> Graph:
        self = object.__new__(cls)
        self._ir = ir
        self._id = graph_id
        self._ops = []
        self._tensors = {}
        self._inputs = []
        self._outputs = []
        self._by_ref_inputs = set()
        self._hooks = {}
        self._next_hook = 0
        self._lowering_memo = {}
        ir._graphs[graph_id] = self
        return self

    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str:
        return self._id

    @property
    def ir(self) -> Ir:
        return self._ir

    @property
    def _pb_graph(self) -> PbGraph:
        """PopART's graph handle as real PopXL code uses it (``getOps()``)."""
        return PbGraph(self)

    @property
    def main_graph(self) -> Graph:
        return self._ir.main_graph

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return tuple(self._inputs)

    @property
    def inputs_by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in self._inputs}

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(self._outputs)

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(self._tensors.values())

    @property
    def variables(self) -> tuple[Variable, ...]:
        return tuple(t for t in self._tensors.values() if isinstance(t, Variable))

    @property
    def constants(self) -> tuple[Constant, ...]:
        return tuple(t for t in self._tensors.values() if isinstance(t, Constant))

    @property
    def called_graphs(self) -> tuple[Graph, ...]:
        seen: dict[Graph, None] = {}
        for op in self._ops:
            for g in op.called_graphs:
                seen[g] = None
        return tuple(seen)

    @property
    def ops(self) -> tuple[Op, ...]:
        """The ops in execution (creation) order."""
        return tuple(self._ops)

    def get_tensor(self, tensor_id: str) -> Tensor:
        try:
            return self._tensors[tensor_id]
        except KeyError:
            raise KeyError(f"No tensor with id '{tensor_id}' in graph {self!r}.") from None

    def __contains__(self, t: Any) -> bool:
        if not isinstance(t, Tensor):
            raise TypeError(f"Graph membership can only be tested for Tensors, got {type(t)}.")
        return self._tensors.get(t.id) is t

    def __enter__(self) -> Graph:
        context.get_current_context().push_graph(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        context.get_current_context().pop_graph()

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Graph):
            raise TypeError(f"Cannot compare a popxl.Graph with {type(other).__name__}.")
        return self is other

    def __hash__(self) -> int:
        return hash((self._id, self._ir.id))

    def __repr__(self) -> str:
        return f"Graph[id={self._id} name={self.name}]"

    def register_op_created_hook(self, fn: Callable[[Op], Any]) -> int:
        """Call ``fn(op)`` for every op created in this graph; returns a handle."""
        handle = self._next_hook
        self._next_hook += 1
        self._hooks[handle] = fn
        return handle

    def remove_op_created_hook(self, handle: int) -> None:
        if handle not in self._hooks:
            raise ValueError(f"No op-created hook with handle {handle} on graph {self!r}.")
        del self._hooks[handle]

    def _create_tensor_id(self, name: str | None = None) -> str:
        """A new unique tensor id: graph prefix, name scopes, then ``__t<k>`` if taken.

        ``k`` comes from an Ir-wide counter. Unlike the original, a suffixed id that is
        itself taken (a user named a tensor ``a__t0``) draws the next ``k``.
        """
        scopes = context.get_current_context().name_scopes
        base = name or "t"
        if scopes:
            base = "/".join(scopes) + "/" + base
        base = f"{self._id}/{base}" if self._id else base
        tid = base
        while tid in self._tensors:
            tid = f"{base}__t{self._ir._next_dedup()}"
        return tid

    def _add_tensor(self, t: Tensor) -> None:
        self._tensors[t.id] = t

    def print_schedule(self, arg_names: Mapping[Tensor, str] | None = None) -> str:
        """The graph's ops as text, one per line, in execution order.

        >>> import popxl, popxl.ops as ops
        >>> ir = popxl.Ir()
        >>> g = ir.create_graph(lambda x: ops.relu(x), popxl.TensorSpec((2,), popxl.float32))
        >>> print(g.print_schedule())
        Graph : <lambda>_subgraph(0)
          (%1) -> (%2) {
            Relu.100 (%1 [(2,) float32]) -> (%2 [(2,) float32])
          }
        """
        from ._printing import format_schedule  # noqa: PLC0415

        return format_schedule(self, arg_names or {})

    def verify(self) -> None:
        """Check the graph's invariants and those of the graphs it calls.

        Raises:
            popxl.errors.InternalError: a broken invariant, naming the op and graph.
        """
        from ._verify import verify_graph  # noqa: PLC0415

        verify_graph(self)


__all__ = ["Graph"]
