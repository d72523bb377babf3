"""``conditional``: run one of two subgraphs depending on a runtime boolean."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .. import context, dtypes
from .._op import core_error, define
from ..tensor import Tensor, TensorLike
from ._base import check_in_graph, spec
from .call import (
    CallSiteInfo,
    add_call_like,
    check_callable,
    mark_by_ref_inputs,
    prepare_inputs,
)

if TYPE_CHECKING:
    from ..graph import Graph

CONDITIONAL = define("conditional", "If", lambda *_, **__: [], special="conditional", grad="repeat")


class ConditionalSiteInfo(CallSiteInfo):
    """Call-site info of a conditional: op input 0 is the condition, then each branch's inputs."""

    @property
    def called_graph(self) -> tuple[Graph, Graph]:  # type: ignore[override]
        return self._op.attrs["graphs"]

    def _branch(self, then_branch: bool) -> tuple[Graph, int]:
        k = 0 if then_branch else 1
        return self._op.attrs["graphs"][k], self._op.attrs["input_offsets"][k]

    def graph_to_parent_input_index(self, idx: int, then_branch: bool = True) -> int:
        graph, offset = self._branch(then_branch)
        if not 0 <= idx < len(graph.inputs):
            raise IndexError(f"{graph.id} has no input {idx}.")
        return offset + idx

    def parent_to_graph_input_index(self, idx: int) -> int:
        for then_branch in (True, False):
            graph, offset = self._branch(then_branch)
            if offset <= idx < offset + len(graph.inputs):
                return idx - offset
        raise IndexError(f"Op input {idx} is not a branch input of the conditional.")

    def is_parent_index_in_then_branch(self, idx: int) -> bool:
        graph, offset = self._branch(True)
        return offset <= idx < offset + len(graph.inputs)

    def graph_to_parent_output_index(self, idx: int, then_branch: bool = True) -> int:
        if not 0 <= idx < len(self._op.outputs):
            raise IndexError(f"The conditional has no output {idx}.")
        return idx

    def parent_to_graph_output_index(self, idx: int, then_branch: bool = True) -> int:
        return self.graph_to_parent_output_index(idx, then_branch)

    def graph_to_parent(self, graph_tensor: Tensor) -> Tensor:
        for then_branch in (True, False):
            graph, offset = self._branch(then_branch)
            if graph_tensor in graph._inputs:
                return self._op.inputs[offset + graph._inputs.index(graph_tensor)]
            if graph_tensor in graph._outputs:
                return self._op.outputs[graph._outputs.index(graph_tensor)]
        raise ValueError(
            f"Tensor {graph_tensor.name} is not an input or output of the called graph(s)."
        )

    def parent_to_graph(self, parent_tensor: Tensor) -> Tensor:
        for then_branch in (True, False):
            graph, offset = self._branch(then_branch)
            for i, t in enumerate(self._op.inputs[offset : offset + len(graph.inputs)]):
                if t is parent_tensor:
                    return graph._inputs[i]
        raise ValueError(
            f"Tensor {parent_tensor.name} is not a parent graph input of the call site."
        )

    def set_parent_input_modified(
        self, parent_tensor: Tensor, infer_modified_regions: bool = False
    ) -> None:
        """Write the final value of the branch input(s) fed by ``parent_tensor`` back to it
        (from the branch that ran; the other branch leaves it unchanged)."""
        fed = [i for i, t in enumerate(self._op.inputs) if t is parent_tensor and i > 0]
        if not fed:
            raise ValueError(
                f"Tensor {parent_tensor.name} is not a parent graph input of the call site."
            )
        self._op.modified_inputs.update(fed)


def conditional(
    cond: Tensor,
    then_branch: Graph,
    else_branch: Graph,
    then_inputs: Iterable[TensorLike] | None = None,
    else_inputs: Iterable[TensorLike] | None = None,
    then_inputs_dict: Mapping[Tensor, TensorLike] | None = None,
    else_inputs_dict: Mapping[Tensor, TensorLike] | None = None,
) -> tuple[Tensor, ...]:
    """Run ``then_branch`` if the single-element bool ``cond`` is true, else ``else_branch``.

    Both branches must have the same number of outputs with equal shapes and dtypes.
    """
    return conditional_with_info(
        cond, then_branch, else_branch, then_inputs, else_inputs, then_inputs_dict, else_inputs_dict
    ).outputs


def conditional_with_info(
    cond: Tensor,
    then_branch: Graph,
    else_branch: Graph,
    then_inputs: Iterable[TensorLike] | None = None,
    else_inputs: Iterable[TensorLike] | None = None,
    then_inputs_dict: Mapping[Tensor, TensorLike] | None = None,
    else_inputs_dict: Mapping[Tensor, TensorLike] | None = None,
    check_inputs: bool = True,
) -> ConditionalSiteInfo:
    """Like ``conditional``, returning a ``ConditionalSiteInfo``."""
    parent_graph = context.get_current_graph()
    check_in_graph(parent_graph, cond=cond)
    check_callable(then_branch, parent_graph)
    check_callable(else_branch, parent_graph)
    if cond.dtype is not dtypes.bool or cond.nelms != 1:
        raise ValueError(
            f"`cond` must be a single-element bool tensor, got {cond.dtype.name}{cond.shape}. "
            "Use ops.cast or ops.equal/ops.greater to make one."
        )
    if len(then_branch.outputs) != len(else_branch.outputs):
        raise ValueError(
            "then_branch graph and else_branch graph must have the same number of outputs: "
            f"{len(then_branch.outputs)} != {len(else_branch.outputs)}"
        )
    for a, b in zip(then_branch.outputs, else_branch.outputs):
        if a.shape != b.shape or a.dtype is not b.dtype:
            raise core_error(
                f"Conditional branch outputs differ: {a.id} {a.dtype.name}{a.shape} vs "
                f"{b.id} {b.dtype.name}{b.shape}."
            )
    then_parents = prepare_inputs(then_branch, then_inputs or [], then_inputs_dict, "then_branch")
    else_parents = prepare_inputs(else_branch, else_inputs or [], else_inputs_dict, "else_branch")
    specs = [spec(t.shape, t.dtype, t.meta_shape) for t in then_branch.outputs]
    names = [f"{a.name}_or_{b.name}" for a, b in zip(then_branch.outputs, else_branch.outputs)]
    offsets = (1, 1 + len(then_parents))
    op = add_call_like(
        CONDITIONAL,
        (then_branch, else_branch),
        offsets,
        [cond, *then_parents, *else_parents],
        specs,
        names,
    )
    for graph, at in zip((then_branch, else_branch), offsets):
        mark_by_ref_inputs(op, graph, at)
    return ConditionalSiteInfo(op)


__all__ = ["conditional", "conditional_with_info", "ConditionalSiteInfo"]
