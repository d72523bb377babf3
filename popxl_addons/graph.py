"""``GraphWithNamedArgs`` (a graph and its named inputs) and ``BoundGraph`` (a graph with
some inputs already connected)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import popxl
from popxl import ops
from popxl._printing import format_schedule
from popxl.ops.call import CallSiteInfo
from popxl.transforms import GradGraphInfo

from .dot_tree import to_mapping
from .named_tensors import NamedTensors, TensorMap

if TYPE_CHECKING:
    from .module import Module

AUTODIFF_TWICE_MSG = (
    "Autodiff has already been applied to {graph}: it adds outputs to the forward graph, so a "
    "second gradient graph would see the first one's outputs. Pass force=True to do it anyway."
)


class BoundGraph:
    """A subgraph plus parent tensors already bound to some of its inputs.

    Args:
        graph: the subgraph.
        args: ``{subgraph input: parent tensor}``.
    """

    def __init__(self, graph: popxl.Graph, args: TensorMap | None = None) -> None:
        self.graph = graph
        self.args: dict[popxl.Tensor, popxl.Tensor] = dict(args or {})

    def _inputs_dict(self, args: TensorMap | None) -> dict[popxl.Tensor, Any]:
        return {**self.args, **(args or {})}

    def call(self, *targs: Any, args: TensorMap | None = None) -> tuple[popxl.Tensor, ...]:
        """Call the graph: ``targs`` fill inputs 0, 1, ...; ``args`` override bound inputs."""
        return ops.call(self.graph, *targs, inputs_dict=self._inputs_dict(args))

    def call_with_info(self, *targs: Any, args: TensorMap | None = None) -> CallSiteInfo:
        """Like ``call``, returning the call site's ``CallSiteInfo``."""
        return ops.call_with_info(self.graph, *targs, inputs_dict=self._inputs_dict(args))

    def bind(self, args: TensorMap) -> BoundGraph:
        """A new BoundGraph with ``args`` added (they win over existing bindings)."""
        return BoundGraph(self.graph, self._inputs_dict(args))

    def subgraph_io_map(
        self, *targs: Any, args: TensorMap | None = None, outs: Iterable[popxl.Tensor] = ()
    ) -> dict[popxl.Tensor, Any]:
        """``{graph input: parent value}`` for ``targs`` and the bound args, plus
        ``{graph output: outs[i]}``."""
        mapping: dict[popxl.Tensor, Any] = dict(zip(self.graph.inputs, targs))
        mapping.update(self._inputs_dict(args))
        mapping.update(zip(self.graph.outputs, outs))
        return mapping


class GraphWithNamedArgs:
    """A graph and its named inputs (``args``), as made by ``Module.create_graph``.

    Args:
        graph: the popxl graph.
        args: the named (usually variable) inputs of the graph.
        grad_graph_info: set when the graph is a gradient graph.
        from_module: the module that built it (used for custom gradients).
    """

    def __init__(
        self,
        graph: popxl.Graph,
        args: NamedTensors | None = None,
        grad_graph_info: GradGraphInfo | None = None,
        from_module: Module | None = None,
        aux: Any = None,
        called_graphs_grad_info: Mapping[popxl.Graph, GradGraphInfo] | None = None,
    ) -> None:
        self.graph = graph
        self.args = args if args is not None else NamedTensors()
        self._grad_graph_info = grad_graph_info
        self.from_module = from_module
        self.aux = aux
        self.called_graphs_grad_info = dict(called_graphs_grad_info or {})
        self.autodiff_applied = False

    @classmethod
    def from_grad_graph(
        cls, grad_graph_info: GradGraphInfo, args: NamedTensors | None = None
    ) -> GraphWithNamedArgs:
        return cls(grad_graph_info.graph, args, grad_graph_info)

    @property
    def grad_graph_info(self) -> GradGraphInfo:
        if self._grad_graph_info is None:
            raise AttributeError(f"{self.graph.id} has no grad_graph_info. Not a gradient graph.")
        return self._grad_graph_info

    @grad_graph_info.setter
    def grad_graph_info(self, info: GradGraphInfo) -> None:
        self._grad_graph_info = info

    def bind(self, args: NamedTensors | None = None) -> BoundGraph:
        """Bind named inputs to tensors with the same keys (other keys are ignored)."""
        return BoundGraph(self.graph, to_mapping(self.args, args) if args is not None else {})

    def call(self, *targs: Any, args: TensorMap | None = None) -> tuple[popxl.Tensor, ...]:
        return BoundGraph(self.graph).call(*targs, args=args)

    def call_with_info(self, *targs: Any, args: TensorMap | None = None) -> CallSiteInfo:
        return BoundGraph(self.graph).call_with_info(*targs, args=args)

    def autodiff(
        self,
        grads_provided: Iterable[popxl.Tensor] | None = None,
        grads_required: Iterable[popxl.Tensor] | None = None,
        called_graphs_grad_info: Mapping[Any, Any] | None = None,
        method: str = "auto",
        force: bool = False,
    ) -> GraphWithNamedArgs:
        """The gradient graph: from the module's ``build_grad`` or from ``autodiff``.

        Args:
            method: ``"auto"`` (``build_grad`` if the module defines one), ``"build_grad"``
                or ``"autodiff"``.
            force: allow differentiating the same graph a second time.
        """
        if method not in ("auto", "build_grad", "autodiff"):
            raise ValueError(
                f"`method` should be one of 'auto', 'build_grad' or 'autodiff'. Not: {method!r}"
            )
        if self.autodiff_applied and not force:
            raise RuntimeError(AUTODIFF_TWICE_MSG.format(graph=self.graph.id))
        module = self.from_module
        use_build_grad = method == "build_grad" or (
            method == "auto" and module is not None and module.implements_grad_graph
        )
        if use_build_grad:
            if module is None:
                raise ValueError(
                    "method='build_grad' needs `build_grad` overridden in a module and "
                    "`from_module` is specified when this GraphWithNamedArgs was made "
                    "(Module.create_graph sets it); this graph has no from_module."
                )
            grad = module.create_grad_graph(self, grads_provided, grads_required)
        else:
            from .transforms.autodiff import autodiff  # noqa: PLC0415

            grad = autodiff(self, grads_provided, grads_required, called_graphs_grad_info)
        self.autodiff_applied = True
        return grad

    def copy(self) -> GraphWithNamedArgs:
        return GraphWithNamedArgs(self.graph, self.args.copy(), self._grad_graph_info)

    def print_schedule(self) -> str:
        """The graph's schedule as text, with named inputs shown as ``key=%n``."""
        names, tensors = self.args.unpack()
        return format_schedule(self.graph, dict(zip(tensors, names)))


__all__ = ["BoundGraph", "GraphWithNamedArgs"]
