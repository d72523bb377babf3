"""``autodiff`` for GraphWithNamedArgs, and ``autodiff_with_accumulation``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import popxl
from popxl import ops
from popxl.transforms import ExpectedConnectionType, GradGraphInfo
from popxl.transforms import autodiff as popxl_autodiff
from popxl.transforms.autodiff import make_grad_graph_info

from ..dot_tree import sanitise
from ..graph import GraphWithNamedArgs
from ..graph_common import CalledGraphsGradInfoLike, GraphLike, _normalise_called_graphs_grad_info
from ..named_replica_grouping import NamedReplicaGrouping
from ..named_tensors import NamedTensors
from ..variable_factory import NamedVariableFactories, VariableFactory


def _as_gwna(graph: GraphLike) -> GraphWithNamedArgs:
    if isinstance(graph, GraphWithNamedArgs):
        return graph
    if isinstance(graph, popxl.Graph):
        return GraphWithNamedArgs(graph)
    return GraphWithNamedArgs(graph.graph)


def autodiff(
    graph: GraphLike,
    grads_provided: Iterable[popxl.Tensor] | None = None,
    grads_required: Iterable[popxl.Tensor] | None = None,
    called_graphs_grad_info: CalledGraphsGradInfoLike | None = None,
) -> GraphWithNamedArgs:
    """The gradient graph of ``graph`` (popxl ``autodiff``), as a GraphWithNamedArgs.

    Defaults: gradients of all outputs are provided and gradients of all inputs, in graph
    input order, are required. Gradient infos of called graphs known to the graph (e.g.
    custom gradients of outlined modules) are used; ``called_graphs_grad_info`` wins.
    """
    fwd = _as_gwna(graph)
    infos = _normalise_called_graphs_grad_info(fwd.called_graphs_grad_info)
    infos.update(_normalise_called_graphs_grad_info(called_graphs_grad_info))
    all_infos = popxl_autodiff(
        fwd.graph, grads_provided, grads_required, infos, return_all_grad_graphs=True
    )
    return GraphWithNamedArgs.from_grad_graph(all_infos[fwd.graph])  # type: ignore[index]


def _accumulator_key(fwd: GraphWithNamedArgs, t: popxl.Tensor) -> str:
    for key, arg in fwd.args.to_dict().items():
        if arg is t:
            return key
    return sanitise(t.name)


def autodiff_with_accumulation(
    graph: GraphWithNamedArgs,
    tensors_to_accumulate_grads: Iterable[popxl.Tensor],
    grads_provided: Iterable[popxl.Tensor] | None = None,
    grads_required: Iterable[popxl.Tensor] | None = None,
    called_graphs_grad_info: CalledGraphsGradInfoLike | None = None,
    replica_groupings: NamedReplicaGrouping | None = None,
) -> tuple[NamedVariableFactories, GraphWithNamedArgs]:
    """Gradient graph that keeps a running mean of some gradients in accumulators.

    For every tensor in ``tensors_to_accumulate_grads`` the gradient graph gets a by-ref
    input ``accum.<key>`` and updates it as ``accum = (accum * n + grad) / (n + 1)``, with
    ``n`` the by-ref input ``mean_accum_counter`` (incremented after all updates). Those
    gradients are no longer outputs. Reset by zeroing the counter.

    Returns:
        The factories of the counter and accumulators, and the gradient graph whose ``args``
        hold them under the same keys.
    """
    accumulate = list(tensors_to_accumulate_grads)
    required = list(grads_required or []) + accumulate
    grad = autodiff(graph, grads_provided, required, called_graphs_grad_info)
    info = grad.grad_graph_info
    bwd = info.graph
    n_plain = len(required) - len(accumulate)
    grads = list(bwd.outputs)
    factories: dict[str, VariableFactory] = {}
    args: dict[str, popxl.Tensor] = {}
    with bwd, popxl.in_sequence(True):
        counter_factory = VariableFactory(
            lambda: np.zeros((), np.float32), popxl.float32, "mean_accum_counter", True
        )
        counter = counter_factory.create_input()
        factories["mean_accum_counter"], args["mean_accum_counter"] = counter_factory, counter
        with popxl.in_sequence(False):
            for t, g in zip(accumulate, grads[n_plain:]):
                arg_key = _accumulator_key(graph, t)
                key = f"accum.{arg_key}"
                group = replica_groupings.to_dict().get(arg_key) if replica_groupings else None
                factory = VariableFactory(_zeros(t), t.dtype, key, True, group)
                accum = factory.create_input()
                ops.var_updates.accumulate_mean_(accum, g, counter)
                factories[key], args[key] = factory, accum
        ops.var_updates.accumulate_(counter, popxl.constant(1.0, popxl.float32))
    bwd._outputs = grads[:n_plain]
    kept_outputs = [ec.fwd_tensor for ec in info.expected_outputs[:n_plain]]
    expected_inputs = [(ec.fwd_tensor, ec.connection_type) for ec in info.expected_inputs]
    new_info = make_grad_graph_info(bwd, info.forward_graph, expected_inputs, kept_outputs)
    return (
        NamedVariableFactories.from_dict(factories),
        GraphWithNamedArgs(bwd, NamedTensors.from_dict(args), new_info),
    )


def _zeros(t: popxl.Tensor) -> Any:
    shape, dtype = t.shape, t.dtype.as_numpy()
    return lambda: np.zeros(shape, dtype)


__all__ = ["autodiff", "autodiff_with_accumulation"]

del ExpectedConnectionType, GradGraphInfo
