"""``GradGraphInfo``: how a gradient graph connects to the forward graph it differentiates."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..graph import Graph
    from ..ops.call import CallSiteInfo
    from ..tensor import Tensor


class ExpectedConnectionType(enum.Enum):
    """``Fwd``: a forward tensor (activation); ``FwdGrad``: the gradient of a forward tensor."""

    Fwd = "Fwd"
    FwdGrad = "FwdGrad"


class ExpectedConnection:
    """One input or output of a gradient graph, described by a forward-graph tensor."""

    _fwd_tensor: Tensor
    _type: ExpectedConnectionType

    def __init__(self) -> None:
        raise TypeError("ExpectedConnection cannot be constructed directly; read GradGraphInfo.")

    @classmethod
    def _create(
        cls, fwd_tensor: Tensor, connection_type: ExpectedConnectionType
    ) -> ExpectedConnection:
        self = object.__new__(cls)
        self._fwd_tensor = fwd_tensor
        self._type = connection_type
        return self

    @property
    def fwd_tensor(self) -> Tensor:
        return self._fwd_tensor

    @property
    def connection_type(self) -> ExpectedConnectionType:
        return self._type

    def __repr__(self) -> str:
        return f"({self._type}, {self._fwd_tensor})"


class GradGraphInfo:
    """The result of ``autodiff``: the gradient graph and what its inputs and outputs mean.

    ``expected_inputs`` start with one ``FwdGrad`` per ``grads_provided`` tensor (in that
    order), followed by the ``Fwd`` activations; ``expected_outputs`` are the gradients of
    ``grads_required`` in that order.
    """

    _graph: Graph
    _forward_graph: Graph
    _expected_inputs: tuple[ExpectedConnection, ...]
    _expected_outputs: tuple[ExpectedConnection, ...]

    def __init__(self) -> None:
        raise TypeError("GradGraphInfo cannot be constructed directly; use transforms.autodiff.")

    @classmethod
    def _create(
        cls,
        graph: Graph,
        forward_graph: Graph,
        expected_inputs: list[ExpectedConnection],
        expected_outputs: list[ExpectedConnection],
    ) -> GradGraphInfo:
        self = object.__new__(cls)
        self._graph = graph
        self._forward_graph = forward_graph
        self._expected_inputs = tuple(expected_inputs)
        self._expected_outputs = tuple(expected_outputs)
        return self

    @property
    def graph(self) -> Graph:
        """The gradient graph."""
        return self._graph

    @property
    def forward_graph(self) -> Graph:
        """The graph that was differentiated."""
        return self._forward_graph

    @property
    def expected_inputs(self) -> tuple[ExpectedConnection, ...]:
        return self._expected_inputs

    @property
    def expected_outputs(self) -> tuple[ExpectedConnection, ...]:
        return self._expected_outputs

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The forward tensors described by ``expected_inputs``."""
        return tuple(ec.fwd_tensor for ec in self._expected_inputs)

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        """The forward tensors whose gradients the graph outputs."""
        return tuple(ec.fwd_tensor for ec in self._expected_outputs)

    def _check_forward_site(self, fwd_call_info: CallSiteInfo) -> None:
        if fwd_call_info.called_graph is not self._forward_graph:
            raise TypeError("The called graph does not match the graph that was differentiated.")

    def inputs_dict(self, fwd_call_info: CallSiteInfo) -> dict[Tensor, Tensor]:
        """Gradient-graph input → parent tensor at the forward call site, for every ``Fwd``
        input. Pass the gradients (``FwdGrad`` inputs) positionally."""
        self._check_forward_site(fwd_call_info)
        return {
            self._graph.inputs[i]: fwd_call_info.graph_to_parent(ec.fwd_tensor)
            for i, ec in enumerate(self._expected_inputs)
            if ec.connection_type is ExpectedConnectionType.Fwd
        }

    def fwd_graph_ins_to_grad_parent_outs(
        self, grad_call_info: CallSiteInfo
    ) -> dict[Tensor, Tensor]:
        """Forward-graph tensor → its gradient at the gradient call site."""
        return {
            ec.fwd_tensor: grad_call_info.graph_to_parent(self._graph.outputs[i])
            for i, ec in enumerate(self._expected_outputs)
        }

    def fwd_parent_ins_to_grad_parent_outs(
        self, fwd_call_info: CallSiteInfo, grad_call_info: CallSiteInfo
    ) -> dict[Tensor, Tensor]:
        """Parent tensor at the forward call site → its gradient at the gradient call site
        (e.g. a variable → its gradient)."""
        self._check_forward_site(fwd_call_info)
        return {
            fwd_call_info.graph_to_parent(fwd): grad
            for fwd, grad in self.fwd_graph_ins_to_grad_parent_outs(grad_call_info).items()
        }

    def __repr__(self) -> str:
        lines = ["GradGraphInfo[", f"  graph={self._graph.id}", "  expected_inputs=["]
        lines += [f"    {ec!r}" for ec in self._expected_inputs]
        lines += ["  ]", "  expected_outputs=["]
        lines += [f"    {ec!r}" for ec in self._expected_outputs]
        lines += ["  ]", "]"]
        return "\n".join(lines)


__all__ = ["ExpectedConnectionType", "ExpectedConnection", "GradGraphInfo"]
