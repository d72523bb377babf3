"""``repeat``: run a subgraph several times, feeding outputs back as inputs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .. import context
from .._op import core_error, define
from ..tensor import Tensor, TensorLike
from ._base import spec
from .call import (
    CallSiteInfo,
    add_call_like,
    check_callable,
    mark_by_ref_inputs,
    prepare_inputs,
)

if TYPE_CHECKING:
    from ..graph import Graph

REPEAT = define("repeat", "Loop", lambda *_, **__: [], special="repeat", grad="repeat")


def repeat(
    graph: Graph,
    repeat_count: int,
    *inputs: TensorLike | Iterable[TensorLike],
    inputs_dict: Mapping[Tensor, TensorLike] | None = None,
) -> tuple[Tensor, ...]:
    """Run ``graph`` ``repeat_count`` times.

    With N graph outputs, output ``i`` of one iteration is input ``i`` of the next for
    ``i < N``; the other inputs keep their values (by-reference inputs keep their in-place
    updates). Returns the last iteration's outputs (the initial inputs for 0 iterations).
    Host loads and stores inside run once per iteration.

    Raises:
        ValueError: ``repeat_count < 0``, more outputs than inputs, or bad inputs.
        PopXLException: a loop-carried output whose shape or dtype differs from its input.
    """
    return repeat_with_info(graph, repeat_count, *inputs, inputs_dict=inputs_dict).outputs


def repeat_with_info(
    graph: Graph,
    repeat_count: int,
    *inputs: TensorLike | Iterable[TensorLike],
    inputs_dict: Mapping[Tensor, TensorLike] | None = None,
    check_inputs: bool = True,
) -> CallSiteInfo:
    """Like ``repeat``, returning the call site's ``CallSiteInfo``.

    Deliberate simplification: the info refers to ``graph`` itself (the original exposed an
    internal loop-wrapper graph with shifted indices), so ``graph_to_parent`` works with
    the tensors of ``graph``.
    """
    check_callable(graph, context.get_current_graph())
    if repeat_count < 0:
        raise ValueError(
            f"Repeat count must be >= 0. Repeat count: {repeat_count}. Graph: {graph.id}"
        )
    n_in, n_out = len(graph.inputs), len(graph.outputs)
    if n_in < n_out:
        raise ValueError(
            f"To repeat the subgraph ({graph.id}) the number of inputs must be greater than "
            f"or equal to the number of outputs. {n_in} < {n_out}"
        )
    for i, (t_in, t_out) in enumerate(zip(graph.inputs, graph.outputs)):
        if t_in.shape != t_out.shape or t_in.dtype is not t_out.dtype:
            raise core_error(
                f"Loop-carried output {i} of {graph.id} ({t_out.dtype.name}{t_out.shape}) must "
                f"match input {i} ({t_in.dtype.name}{t_in.shape}) for repeat."
            )
    parents = prepare_inputs(graph, inputs, inputs_dict)
    ir = graph.ir
    specs = [spec(t.shape, t.dtype, t.meta_shape) for t in graph.outputs]
    names = [f"{t.name}__t{ir._next_dedup()}" for t in graph.outputs]
    op = add_call_like(
        REPEAT, (graph,), (0,), parents, specs, names, repeat_count=int(repeat_count)
    )
    mark_by_ref_inputs(op, graph, 0)
    return CallSiteInfo(op)


__all__ = ["repeat", "repeat_with_info"]
