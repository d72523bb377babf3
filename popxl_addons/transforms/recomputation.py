"""``recompute_graph``: a gradient graph that recomputes its forward activations."""

from __future__ import annotations

import popxl
from popxl import ops
from popxl.transforms import ExpectedConnectionType, GradGraphInfo
from popxl.transforms.autodiff import make_grad_graph_info

from ..graph import GraphWithNamedArgs
from ..utils import suffix_graph_name

Fwd = ExpectedConnectionType.Fwd
FwdGrad = ExpectedConnectionType.FwdGrad


def _input_like(t: popxl.Tensor, by_ref: bool = False) -> popxl.Tensor:
    return popxl.graph_input(t.shape, t.dtype, t.name, by_ref=by_ref, meta_shape=t.meta_shape)


def forward_inputs_needed(grad_info: GradGraphInfo) -> set[popxl.Tensor]:
    """The forward graph's inputs that the activations ``grad_info``'s gradient graph takes
    depend on (or that it takes itself): what a recomputation must be given. An op is
    followed back when it makes one of those activations or writes in place to one."""
    fwd = grad_info.forward_graph
    live = {ec.fwd_tensor for ec in grad_info.expected_inputs if ec.connection_type is Fwd}
    for op in reversed(fwd._ops):
        modified = (op.inputs[i] for i in op.modified_input_indices())
        if any(t in live for t in op.outputs) or any(t in live for t in modified):
            live.update(op.inputs)
    return {t for t in fwd.inputs if t in live}


def add_recompute_inputs(
    grad_info: GradGraphInfo, needed_only: bool = False
) -> tuple[dict[popxl.Tensor, popxl.Tensor], dict[popxl.Tensor, popxl.Tensor], list]:
    """Inputs of a recomputing gradient graph, in a deterministic order.

    Order: the gradient inputs; the activations that are forward inputs; the other forward
    inputs (sorted by name); the remaining gradient-graph inputs such as accumulators
    (sorted by name, keeping by-ref). Call inside the new graph. With ``needed_only``, a
    forward input that no activation of the gradient depends on (``forward_inputs_needed``)
    is no input: zeros stand for it in the recomputation, whose results from it go unused.

    Returns:
        (forward input → new input or zeros, gradient-graph input → new input, expected
        inputs).
    """
    bwd, fwd = grad_info.graph, grad_info.forward_graph
    needed = forward_inputs_needed(grad_info) if needed_only else set(fwd.inputs)
    fwd_map: dict[popxl.Tensor, popxl.Tensor] = {}
    grad_map: dict[popxl.Tensor, popxl.Tensor] = {}
    expected: list = []
    connections = list(enumerate(grad_info.expected_inputs))
    for i, ec in connections:
        if ec.connection_type is FwdGrad:
            grad_map[bwd.inputs[i]] = _input_like(bwd.inputs[i])
            expected.append((ec.fwd_tensor, FwdGrad))
    for _, ec in connections:
        t = ec.fwd_tensor
        if ec.connection_type is Fwd and t in fwd.inputs and t not in fwd_map:
            fwd_map[t] = _input_like(t)
            expected.append((t, Fwd))
    for t in sorted((t for t in fwd.inputs if t not in fwd_map), key=lambda t: t.name):
        if t in needed:
            fwd_map[t] = _input_like(t)
            expected.append((t, Fwd))
        else:
            fwd_map[t] = ops.init(
                t.shape, t.dtype, f"{t.name}_unused", "zero", meta_shape=t.meta_shape or None
            )
    extra = bwd.inputs[len(grad_info.expected_inputs) :]
    for t in sorted(extra, key=lambda t: t.name):
        grad_map[t] = _input_like(t, by_ref=t in bwd._by_ref_inputs)
    return fwd_map, grad_map, expected


def recompute_graph(
    grad_graph: GraphWithNamedArgs, needed_only: bool = False
) -> GraphWithNamedArgs:
    """A gradient graph that re-runs the forward graph instead of taking activations.

    Its ``Fwd`` inputs are only forward-graph inputs, so ``inputs_dict`` of the new
    ``grad_graph_info`` supplies the variables and inputs rather than intermediates. The
    gradients are the same as the original graph's. With ``needed_only`` (an extension), only
    the forward inputs the gradient depends on are inputs (``add_recompute_inputs``), so a
    pipeline stashes nothing else for it.
    """
    info = grad_graph.grad_graph_info
    bwd, fwd = info.graph, info.forward_graph
    ir = bwd.ir
    graph = ir.create_empty_graph(suffix_graph_name(bwd.name, "recomp"))
    with graph:
        fwd_map, grad_map, expected = add_recompute_inputs(info, needed_only)
        recomputed = ops.call(fwd, inputs_dict={t: fwd_map[t] for t in fwd.inputs})
        for i, ec in enumerate(info.expected_inputs):
            if ec.connection_type is Fwd and bwd.inputs[i] not in grad_map:
                t = ec.fwd_tensor
                grad_map[bwd.inputs[i]] = (
                    fwd_map[t] if t in fwd_map else recomputed[fwd.outputs.index(t)]
                )
        for g in ops.call(bwd, inputs_dict=grad_map):
            popxl.graph_output(g)
    new_info = make_grad_graph_info(graph, fwd, expected, info.outputs)
    return GraphWithNamedArgs(graph, grad_graph.args.remap(grad_map), new_info)


__all__ = ["recompute_graph", "add_recompute_inputs", "forward_inputs_needed"]
