"""``autodiff``: build an explicit gradient graph for a forward graph.

The walk is reverse-mode over the forward ops, as in micrograd's ``backward()``:

    for step in reversed(forward steps):
        cotangents = accumulated gradients of the versions the op produced
        for version, gradient in rule(op)(cotangents):
            accumulate(version, gradient)

Each forward op becomes one gradient op in the new graph (``GeluGrad``, ``MatMulGrad``...)
whose lowering is ``jax.vjp`` of the forward op's lowering, so derivative formulas are not
written by hand; the exceptions are ops whose gradient reads their output instead of their
input (``OpDef.grad_from_output``: relu, softmax), as PopART's do. Structural ops have
their own rules: a ``call`` becomes a call of the callee's gradient graph, ``print_tensor``
can print its gradient, and ops marked ``grad="none"`` (detach, host IO, variable updates)
stop gradients. Only values that depend on a required input are differentiated.

Forward values the gradient ops need become ``Fwd`` inputs of the gradient graph; forward
intermediates among them are added as outputs of the forward graph, and every existing
call site of the forward graph gains the matching outputs. Each is a copy a training step
keeps from its forward to its backward pass (for a run of layers, a stack written per
layer), so the gradient graph takes as few as it can: a product's operand only where
another operand's gradient is wanted (``grad_needs="others"``), and reshapes computed
again from their source. A layer of the 12-layer ``nn.TransformerEncoderLayer`` stack kept
13 values (1.37 M floats) before these rules and keeps 9 (0.85 M): 38% fewer bytes written
and read per step (2026-11-27).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._op import Op, core_error
from ..errors import InternalError
from ..graph import Graph
from ..ops import elementwise
from ..ops._base import add_op, spec
from ..ops.call import call
from ..ops.host_io import init
from ..ops.shape import CONCAT
from ..tensor import Constant, Tensor, constant, graph_input
from ._grad_ops import VjpRecipe, grad_opdef, output_grad_opdef
from ._storage import (
    Analysis,
    Step,
    Version,
    analyse,
    is_identity_alias,
    modifies_graph_input,
    move_before,
    parents,
    written_inputs,
)
from .grad_graph_info import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

MODIFYING_OP_MSG = (
    "The graph {graph} contains a modifying op ({op}) that writes one of the graph's inputs "
    "in place, which autodiff cannot differentiate. Use the out-of-place op instead (e.g. "
    "ops.add rather than ops.add_ / +=) on graph inputs."
)
NON_FLOAT_REQUIRED_MSG = (
    "grads_required contains {t}, whose dtype {dtype} is not a floating point type, so it has "
    "no gradient. Remove it from grads_required."
)
FOREIGN_TENSOR_MSG = "{what} contains {t}, which is not a tensor of the graph {graph}."

GradInfos = dict[Graph, GradGraphInfo]
# Ops whose results the gradient graph computes again from the forward graph's inputs rather
# than take from the forward graph: layout changes, as cheap as reading a kept copy. (Not
# casts: under stochastic rounding a cast is not a function of its input.) A kept weight
# transpose was a stack the layers' scan wrote per call: ConvNeXt-T's step 150 -> 74 ms.
RECOMPUTED = frozenset({"transpose", "reshape"})


def autodiff(
    graph: Graph,
    grads_provided: Iterable[Tensor] | None = None,
    grads_required: Iterable[Tensor] | None = None,
    called_graphs_grad_info: Mapping[Graph, GradGraphInfo] | None = None,
    return_all_grad_graphs: bool = False,
) -> GradGraphInfo | GradInfos:
    """Differentiate ``graph``: build a gradient graph in the same Ir.

    Args:
        graph: the forward graph.
        grads_provided: forward tensors whose gradients the gradient graph takes as its first
            inputs, in this order (default: all outputs).
        grads_required: forward tensors whose gradients it outputs, in this order (default:
            all inputs). They must have floating point dtypes.
        called_graphs_grad_info: gradient graphs to reuse for graphs that ``graph`` calls.
        return_all_grad_graphs: return ``{graph: info}`` for ``graph`` and every called graph
            differentiated on the way, rather than only ``graph``'s info.

    Returns:
        The ``GradGraphInfo`` of the gradient graph (or a dict of them).

    Raises:
        PopXLException: ``graph`` modifies one of its inputs in place.
        ValueError: a non-float tensor in ``grads_required``, or a tensor of another graph.
    """
    provided = list(graph.outputs if grads_provided is None else grads_provided)
    required = list(graph.inputs if grads_required is None else grads_required)
    given = dict(called_graphs_grad_info or {})
    infos: GradInfos = dict(given)
    info = _Differentiator(graph, provided, required, infos).build()
    infos[graph] = info
    if return_all_grad_graphs:
        return {g: i for g, i in infos.items() if g not in given}
    return info


def _is_float(t: Tensor) -> bool:
    return t.dtype.is_floating_point


class _Differentiator:
    """Bookkeeping for one autodiff call: versions, cotangents, activations."""

    def __init__(
        self, graph: Graph, provided: list[Tensor], required: list[Tensor], infos: GradInfos
    ):
        self.fwd = graph
        self.provided = provided
        self.required = required
        self.infos = infos
        self.ir = graph.ir
        self.cotangents: dict[Version, Tensor] = {}
        # Cotangents of slices of a version, held back until the version's gradient is read
        # (``_slice_piece``): slices that tile it are joined by one concat.
        self.pieces: dict[Version, list[tuple[Step, Tensor]]] = {}
        self.activations: dict[Version, Tensor] = {}
        self.expected_inputs: list[ExpectedConnection] = []
        self.call_inputs: dict[tuple[Op, int], Tensor] = {}
        self._produced_by: dict[Version, Step] | None = None

    # The walk ---------------------------------------------------------------------------

    def build(self) -> GradGraphInfo:
        self._validate()
        self._differentiate_called_graphs()
        self._snapshot_view_handles()
        analysis = analyse(self.fwd)
        self.analysis = analysis
        self.active = self._active_versions(analysis)
        self.grad = self.ir._graph_with_id(f"{self.fwd.id}_bwd")
        with self.grad:
            seeds = self._seed_inputs(analysis)
            for step in reversed(analysis.steps):
                cots = [self.cotangent(v) for v in step.results]
                if all(c is None for c in cots):
                    continue
                for version, gradient in RULES[step.op.opdef.grad](self, step, cots):
                    self._accumulate(version, gradient)
            outputs = self._required_outputs(analysis)
        expected_outputs = [
            ExpectedConnection._create(t, ExpectedConnectionType.FwdGrad) for t in self.required
        ]
        for t in outputs:
            self.grad._outputs.append(t)
        expected_inputs = seeds + self.expected_inputs
        return GradGraphInfo._create(self.grad, self.fwd, expected_inputs, expected_outputs)

    # Preparation ------------------------------------------------------------------------

    def _validate(self) -> None:
        op = modifies_graph_input(self.fwd)
        if op is not None:
            raise core_error(MODIFYING_OP_MSG.format(graph=self.fwd.id, op=op))
        for what, tensors in (("grads_provided", self.provided), ("grads_required", self.required)):
            for t in tensors:
                if not isinstance(t, Tensor) or t._graph is not self.fwd:
                    raise ValueError(FOREIGN_TENSOR_MSG.format(what=what, t=t, graph=self.fwd.id))
        for t in self.required:
            if not _is_float(t):
                raise ValueError(NON_FLOAT_REQUIRED_MSG.format(t=t, dtype=t.dtype.name))

    def _differentiate_called_graphs(self) -> None:
        """Gradient graphs of called graphs first: they add outputs to our call sites."""
        for op in list(self.fwd._ops):
            if op.opdef.grad != "call":
                continue
            callee = op.attrs["graphs"][0]
            if callee in self.infos:
                continue
            if not getattr(callee, "_autodiff_safe", True):
                raise ValueError(
                    f"The graph {callee.id} called from {self.fwd.id} has been marked as unsafe "
                    "to autodiff (it has a custom gradient). Pass its GradGraphInfo in "
                    "called_graphs_grad_info."
                )
            floats_out = [t for t in callee.outputs if _is_float(t)]
            floats_in = [t for t in callee.inputs if _is_float(t)]
            result = autodiff(
                callee, floats_out, floats_in, self.infos, return_all_grad_graphs=True
            )
            self.infos.update(result)  # type: ignore[arg-type]

    def _snapshot_view_handles(self) -> None:
        """Calls and seeds that read views get an identity copy, so their gradients flow
        through an ordinary op (whose gradient handles the view)."""
        for op in list(self.fwd._ops):
            if op.opdef.grad not in ("call", "collective", "adjoint"):
                continue
            modified = op.modified_input_indices()
            for k, h in enumerate(op.inputs):
                if parents(h) is not None and k not in modified:
                    copy = self.call_inputs[(op, k)] = self._identity(h, before=op)
                    _rewire(op, k, copy)
        # Seeds of views go to a copy; the expected inputs keep naming the graph's own outputs.
        self.seed_handles = list(self.provided)
        # So do seeds of in-place aliases of views (``add_`` on a slice): their gradient
        # belongs to the part of the root the view covers.
        for i, t in enumerate(self.provided):
            if not is_identity_alias(t):
                self.seed_handles[i] = self._identity(t, before=None)

    def _identity(self, h: Tensor, before: Op | None) -> Tensor:
        with self.fwd:
            op = add_op(
                self.fwd, elementwise.OPS["identity"], (h,), {}, [h.spec], [f"{h.name}_snapshot"]
            )
        move_before(self.fwd, op, before)
        return op.outputs[0]

    # Seeds and results ------------------------------------------------------------------

    def _seed_inputs(self, analysis: Analysis) -> list[ExpectedConnection]:
        seeds = []
        for t, handle in zip(self.provided, self.seed_handles):
            grad_in = graph_input(t.shape, t.dtype, f"Gradient___{t.name}")
            seeds.append(ExpectedConnection._create(t, ExpectedConnectionType.FwdGrad))
            if _is_float(t):
                self._accumulate(analysis.version(_roots_of(handle)[0]), grad_in)
        return seeds

    def _required_outputs(self, analysis: Analysis) -> list[Tensor]:
        outputs = []
        for t in self.required:
            version = analysis.handle_version.get(t) or analysis.version(t)
            grad = self.cotangent(version)
            if grad is None:
                grad = init(t.shape, t.dtype, f"Gradient___{t.name}", "zero")
            outputs.append(grad)
        return outputs

    def _accumulate(self, version: Version, gradient: Tensor) -> None:
        if not _is_float(version.root):
            return
        previous = self.cotangents.get(version)
        if previous is None:
            self.cotangents[version] = gradient
        else:
            name = f"Gradient___{version.root.name}"
            op = add_op(
                self.grad, elementwise.OPS["add"], (previous, gradient), {}, [previous.spec], [name]
            )
            self.cotangents[version] = op.outputs[0]

    def cotangent(self, version: Version) -> Tensor | None:
        """The accumulated gradient of ``version``, its held-back slice cotangents added."""
        pieces = self.pieces.pop(version, None)
        if pieces:
            joined = _joined_slices(self, version, pieces)
            contributions = (
                [(version, joined)]
                if joined is not None
                else [c for step, cot in pieces for c in _vjp_rule(self, step, [cot], hold=False)]
            )
            for v, gradient in contributions:
                self._accumulate(v, gradient)
        return self.cotangents.get(version)

    def _active_versions(self, analysis: Analysis) -> set[Version] | None:
        """The versions that depend on a required input: the only ones whose gradients
        can reach the outputs (None: all, where a required tensor is not an input).

        The gradient of a constant (attention's scale) or of an input left out of
        ``grads_required`` is never computed, nor kept for: neither is a forward value
        only such a gradient would read.
        """
        if any(t not in self.fwd._inputs for t in self.required):
            return None
        active = {analysis.handle_version[t] for t in self.required}
        for step in analysis.steps:
            if any(v in active for v in step.befores):
                active.update(step.results)
        return active

    def is_active(self, version: Version) -> bool:
        return self.active is None or version in self.active

    # Activations -----------------------------------------------------------------------

    def fwd_value(self, version: Version) -> Tensor:
        """A gradient-graph tensor holding the forward value ``version``."""
        tensor = self.activations.get(version)
        if tensor is not None:
            return tensor
        root = version.root
        if isinstance(root, Constant):
            tensor = constant(root._data, root.dtype, root.name)
        elif (recomputed := self._recomputed(version)) is not None:
            tensor = recomputed
        else:
            source = root if self.analysis.is_final(version) else self._tap(version)
            self._export(source)
            tensor = graph_input(source.shape, source.dtype, source.name)
            self.expected_inputs.append(
                ExpectedConnection._create(source, ExpectedConnectionType.Fwd)
            )
        self.activations[version] = tensor
        return tensor

    def _recomputed(self, version: Version) -> Tensor | None:
        """``version`` computed again in the gradient graph, where it is a layout change
        (``RECOMPUTED``) of the forward graph's inputs and constants, directly or through
        more of them (a weight's transpose is read again from the weight rather than kept),
        or a reshape of any forward value.
        Kept, it would be a new output of the forward graph, and of every call: a stack that a
        run of calls writes per call and the gradient calls read back. None otherwise."""
        step = self._producers().get(version)
        if step is None or not self._recomputable(step):
            return None
        inputs = tuple(self.fwd_value(v) for v in step.befores)
        op = step.op
        return add_op(self.grad, op.opdef, inputs, dict(op.attrs), [version.root.spec],
                      [version.root.name]).outputs[0]  # fmt: skip

    def _recomputable(self, step: Step) -> bool:
        if not self._layout_change(step):
            return False
        # A reshape is free to compute again from its source, which is kept instead: one
        # kept value where the gradients read both (a relu's output, and its reshape for
        # the next matmul's gradient). Other layout changes only of inputs and constants.
        return step.op.opdef.key == "reshape" or self._layout_of_inputs(step)

    def _layout_change(self, step: Step) -> bool:
        op = step.op
        if op.opdef.key not in RECOMPUTED or len(op.outputs) != 1 or step.written:
            return False
        return [v.root for v in step.befores] == list(op.inputs)  # else read through a view

    def _layout_of_inputs(self, step: Step) -> bool:
        producers = self._producers()
        for v in step.befores:
            if isinstance(v.root, Constant):
                continue
            if v.root in self.fwd._inputs and self.analysis.is_final(v):
                continue
            inner = producers.get(v)
            if inner is None or not self._layout_change(inner):
                return False
            if not self._layout_of_inputs(inner):
                return False
        return True

    def _producers(self) -> dict[Version, Step]:
        if self._produced_by is None:
            self._produced_by = {v: s for s in self.analysis.steps for v in s.new_outputs}
        return self._produced_by

    def _tap(self, version: Version) -> Tensor:
        """Copy a root's value before the op that overwrites it."""
        return self._identity(version.root, before=version.overwritten_by)

    def _export(self, t: Tensor) -> None:
        add_graph_output(self.fwd, t)

    def call_input(self, op: Op, k: int) -> Tensor:
        return self.call_inputs.get((op, k), op.inputs[k])

    def version_before(self, step: Step, h: Tensor) -> Version:
        for v in step.befores:
            if v.root is h:
                return v
        raise InternalError(f"{h.id} is not read by the op", step.op, step.op.graph)


def _rewire(op: Op, k: int, new: Tensor) -> None:
    """Make input ``k`` of ``op`` read ``new`` (the storage analysis then sees the copy)."""
    old = op.inputs[k]
    op.inputs = (*op.inputs[:k], new, *op.inputs[k + 1 :])
    if old not in op.inputs and op in old._consumers:
        old._consumers.remove(op)
    if op not in new._consumers:
        new._consumers.append(op)


def add_graph_output(graph: Graph, t: Tensor, inputs_too: bool = False) -> None:
    """Make ``t`` an output of ``graph``; every existing call site gains the output too.

    A graph input is left as it is unless ``inputs_too`` (then it is passed through).

    Raises:
        NotImplementedError: the graph is repeated or branched to somewhere, whose outputs
            cannot grow.
    """
    if (t in graph._inputs and not inputs_too) or t in graph._outputs:
        return
    sites = graph.ir._call_sites_of(graph)
    for site in sites:
        if site.opdef.key != "call":
            raise NotImplementedError(
                f"{t.id} must become a new output of {graph.id}, but the graph is used by a "
                f"{site.type} op, whose outputs cannot grow. Differentiate the graph before "
                "repeating or branching to it."
            )
    graph._outputs.append(t)
    for site in sites:
        parent = site.graph
        name = f"autodiff_output__t{graph.ir._next_dedup()}"
        tid = f"{parent.id}/{name}" if parent.id else name
        out = Tensor._create(parent, tid, spec(t.shape, t.dtype, t.meta_shape), site)
        site.outputs = (*site.outputs, out)


def make_grad_graph_info(
    grad_graph: Graph,
    forward_graph: Graph,
    expected_inputs: Iterable[tuple[Tensor, ExpectedConnectionType]],
    expected_outputs: Iterable[Tensor],
) -> GradGraphInfo:
    """A GradGraphInfo for a gradient graph built by other means (custom gradients,
    recomputation, accumulation)."""
    ins = [ExpectedConnection._create(t, kind) for t, kind in expected_inputs]
    outs = [ExpectedConnection._create(t, ExpectedConnectionType.FwdGrad) for t in expected_outputs]
    return GradGraphInfo._create(grad_graph, forward_graph, ins, outs)


# Gradient rules ---------------------------------------------------------------------------

Contribution = list[tuple[Version, Tensor]]


def _vjp_rule(
    d: _Differentiator, step: Step, cots: list[Tensor | None], hold: bool = True
) -> Contribution:
    """One gradient op whose lowering is ``jax.vjp`` of the forward op (a slice's is held
    back, ``_slice_piece``)."""
    op = step.op
    _check_no_effects(op)
    held = cots[0] if hold and _slice_piece(d, step, cots) else None
    if held is not None:
        d.pieces.setdefault(step.befores[0], []).append((step, held))
        return []
    nondiff_roots = {r for i in op.opdef.nondiff_inputs for r in _roots_of(op.inputs[i])}
    diff_roots = {
        r for i, h in enumerate(op.inputs) if i not in op.opdef.nondiff_inputs for r in _roots_of(h)
    }
    grad_for = tuple(
        k
        for k, v in enumerate(step.befores)
        if _is_float(v.root)
        and (v.root in diff_roots or v.root not in nondiff_roots)
        and d.is_active(v)
    )
    if not grad_for:
        return []
    cot = cots[0]
    if cot is not None and _from_output(step):
        y = d.fwd_value(step.new_outputs[0])
        root = step.befores[0].root
        grad_op = add_op(d.grad, output_grad_opdef(op.opdef), (y, cot), dict(op.attrs),
                         [root.spec], [f"Gradient___{root.name}"])  # fmt: skip
        return [(step.befores[0], grad_op.outputs[0])]
    needed = _values_needed(step, grad_for)
    recipe = VjpRecipe.capture(
        op,
        tuple(v.root for v in step.befores),
        needed,
        tuple(c is not None for c in cots),
        grad_for,
    )
    inputs = [d.fwd_value(v) for v, need in zip(step.befores, needed) if need]
    inputs += [c for c in cots if c is not None]
    specs = [step.befores[k].root.spec for k in grad_for]
    names = [f"Gradient___{step.befores[k].root.name}" for k in grad_for]
    grad_op = add_op(d.grad, grad_opdef(op.opdef), tuple(inputs), {"recipe": recipe}, specs, names)
    return [(step.befores[k], out) for k, out in zip(grad_for, grad_op.outputs)]


def _slice_piece(d: _Differentiator, step: Step, cots: list[Tensor | None]) -> bool:
    """Whether the op is a unit-step slice of a float value whose gradient is wanted, to be
    held back (``_Differentiator.pieces``): its gradient alone is its cotangent padded with
    zeros to the value's shape, and the gradients of the three slices of a fused q/k/v
    projection (``nn.MultiheadAttention``, GPT-2's ``split``, timm's ``unbind``) were three
    such pads summed, each written and read whole by every consumer (a 12-layer encoder
    step: 36 pads, 2.9 ms, and the reads of them)."""
    op = step.op
    if op.opdef.key != "slice" or cots[0] is None or len(step.befores) != 1:
        return False
    v = step.befores[0]
    return (
        op.inputs[0] is v.root
        and not step.written
        and _is_float(v.root)
        and d.is_active(v)
        and all(s == 1 and 0 <= a < b for a, b, s in op.attrs["bounds"])
    )


def _joined_slices(
    d: _Differentiator, version: Version, pieces: list[tuple[Step, Tensor]]
) -> Tensor | None:
    """The gradient of ``version`` from the cotangents of slices that tile it along one
    axis, each part once: their concat. None where they do not (gaps, overlaps, or cuts
    along several axes)."""
    shape = version.root.shape
    bounds = [p[0].op.attrs["bounds"] for p in pieces]
    cut = {i for b in bounds for i, (a, z, _) in enumerate(b) if (a, z) != (0, shape[i])}
    if len(pieces) < 2 or len(cut) != 1:
        return None
    axis = cut.pop()
    order = sorted(range(len(pieces)), key=lambda k: bounds[k][axis][0])
    edges = [bounds[k][axis][:2] for k in order]
    if edges[0][0] != 0 or edges[-1][1] != shape[axis]:
        return None
    if any(a[1] != b[0] for a, b in zip(edges, edges[1:])):
        return None
    root = version.root
    inputs = tuple(pieces[k][1] for k in order)
    op = add_op(d.grad, CONCAT, inputs, {"axis": axis}, [root.spec], [f"Gradient___{root.name}"])
    return op.outputs[0]


def _from_output(step: Step) -> bool:
    """Whether the op's gradient is computed from its output (``grad_from_output``): an op
    of one input it reads directly and one new output, writing nothing."""
    op = step.op
    return (
        op.opdef.grad_from_output is not None
        and len(op.inputs) == 1
        and [v.root for v in step.befores] == list(op.inputs)
        and not step.written
        and len(step.new_outputs) == 1
        and len(op.outputs) == 1
    )


def _values_needed(step: Step, grad_for: tuple[int, ...]) -> tuple[bool, ...]:
    """For each root the op reads, whether its gradient op needs the root's value.

    ``grad_needs="others"`` (products: ``mul``, ``matmul``, ``conv``): the gradient of one
    operand needs only the values of the others, so an operand is kept only where another
    one's gradient is wanted. A product by a constant (attention's ``q * scale``) then keeps
    no copy of ``q`` for the gradient graph, as PopART's ``MulArg0Grad`` takes only the
    other argument. Where an operand is a view or is read twice (``x * x``), all are kept.
    """
    needs = step.op.opdef.grad_needs
    count = len(step.befores)
    if needs == "none":
        return (False,) * count
    if needs == "others" and [v.root for v in step.befores] == list(step.op.inputs):
        return tuple(any(j != k for j in grad_for) for k in range(count))
    return (True,) * count


def _check_no_effects(op: Op) -> None:
    for graph in op.referenced_graphs:
        for inner in graph._ops:
            if inner.opdef.effect:
                raise NotImplementedError(
                    f"autodiff cannot differentiate {op} because the graph {graph.id} it runs "
                    f"contains {inner}, which has a side effect (host IO, printing, remote "
                    "memory). Move the side effect out of the repeated/branched graph."
                )
            _check_no_effects(inner)


def _roots_of(h: Tensor) -> tuple[Tensor, ...]:
    from ._storage import roots  # noqa: PLC0415

    return roots(h)


def _call_rule(d: _Differentiator, step: Step, cots: list[Tensor | None]) -> Contribution:
    """A call's gradient is a call of the callee's gradient graph."""
    op = step.op
    callee = op.attrs["graphs"][0]
    info = d.infos[callee]
    out_cots = {v.root: c for v, c in zip(step.results, cots)}
    args = []
    for ec in info.expected_inputs:
        t = ec.fwd_tensor
        if ec.connection_type is ExpectedConnectionType.FwdGrad:
            parent = op.outputs[callee._outputs.index(t)]
            cot = out_cots.get(parent)
            args.append(
                cot if cot is not None else init(t.shape, t.dtype, f"Gradient___{t.name}", "zero")
            )
        elif t in callee._inputs:
            handle = d.call_input(op, callee._inputs.index(t))
            args.append(d.fwd_value(d.version_before(step, handle)))
        else:
            parent = op.outputs[callee._outputs.index(t)]
            args.append(d.fwd_value(d.analysis.handle_version[parent]))
    grads = call(info.graph, *args)
    contributions = []
    for ec, grad in zip(info.expected_outputs, grads):
        handle = d.call_input(op, callee._inputs.index(ec.fwd_tensor))
        contributions.append((d.version_before(step, handle), grad))
    return contributions


def _collective_rule(d: _Differentiator, step: Step, cots: list[Tensor | None]) -> Contribution:
    """PopXL's adjoints: all-gather <-> replicated slice (no reduction), and the
    identical-inputs all-reduce pair (all-reduce <-> identity)."""
    from ..ops import collectives as coll  # noqa: PLC0415
    from ..ops.shape import reshape  # noqa: PLC0415

    op = step.op
    key = op.opdef.key
    inputs = [d.call_input(op, k) for k in range(len(op.inputs))]
    grads: Sequence[Tensor | None]
    if key == "all_reduce_identical_grad_inputs":
        grads = list(cots)
    else:
        present = [
            c if c is not None else init(t.shape, t.dtype, "zero_grad", "zero")
            for c, t in zip(cots, op.outputs)
        ]
        if key == "all_reduce_identical_inputs":
            grads = coll._record_ipu_reduce(
                coll.IPU_ALL_REDUCE, present, list(range(len(present))), op.attrs["op"]
            )
        else:
            grads = [_collective_adjoint(coll, op, present[0])]
    contributions = []
    for h, g in zip(inputs, grads):
        if g is not None:
            if g.shape != h.shape:
                g = reshape(g, h.shape)
            contributions.append((d.version_before(step, h), g))
    return contributions


def _collective_adjoint(coll: Any, op: Op, cot: Tensor) -> Tensor:
    from ..ops._base import record  # noqa: PLC0415

    attrs = op.attrs
    groups = attrs["groups"]
    if op.opdef.key == "replicated_all_gather":
        if attrs["mode"] == "meta_shape":
            return record(
                coll.SHARDED_SLICE,
                {"t": cot},
                {"groups": groups, "rts": True},
                [f"{cot.name}_sharded_slice"],
            )[0]
        axis = 0 if attrs["mode"] == "new_axis" else attrs["axis"]
        return record(
            coll.SLICE,
            {"t": cot},
            {"axis": axis, "groups": groups},
            [f"{cot.name}_replicated_slice"],
        )[0]
    from ..ops.shape import reshape  # noqa: PLC0415

    source, axis = op.inputs[0], attrs["axis"]
    if cot.rank < source.rank:  # the slice dropped a length-1 axis: put it back
        cot = reshape(cot, source.shape[:axis] + (1,) + source.shape[axis + 1 :])
    attrs_gather = {"axis": axis, "mode": "concat", "groups": groups, "meta": ()}
    return record(coll.ALL_GATHER, {"t": cot}, attrs_gather, [f"{cot.name}_all_gathered"])[0]


Adjoint = Callable[[Op, list[Tensor]], Sequence["Tensor | None"]]
ADJOINTS: dict[str, Adjoint] = {}


def register_adjoint(key: str, adjoint: Adjoint) -> None:
    """Give the op kind ``key`` (declared with ``grad="adjoint"``) a structural gradient:
    ``adjoint(forward_op, output_cotangents)`` records ordinary ops in the gradient graph
    and returns one gradient (or None) per forward input. For ops whose original had a
    custom gradient op that is itself a forward op (the tensor-parallel all-reduce pairs)."""
    ADJOINTS[key] = adjoint


def _adjoint_rule(d: _Differentiator, step: Step, cots: list[Tensor | None]) -> Contribution:
    op = step.op
    present = [
        c if c is not None else init(t.shape, t.dtype, "zero_grad", "zero")
        for c, t in zip(cots, op.outputs)
    ]
    grads = ADJOINTS[op.opdef.key](op, present)
    inputs = [d.call_input(op, k) for k in range(len(op.inputs))]
    return [(d.version_before(step, h), g) for h, g in zip(inputs, grads) if g is not None]


def _print_rule(d: _Differentiator, step: Step, cots: list[Tensor | None]) -> Contribution:
    """``print_tensor`` passes its gradient through, printing it if asked to."""
    from ..ops import misc  # noqa: PLC0415
    from ..ops._base import record  # noqa: PLC0415

    (cot,) = cots
    op = step.op
    if cot is not None and op.attrs.get("print_gradient"):
        # The forward op's attributes were checked when it was made: record them as they are.
        attrs = dict(op.attrs)
        attrs["title"] = f"{op.attrs['title']}_gradient"
        attrs["print_self"] = True
        attrs["print_gradient"] = False
        cot = record(misc.PRINT_TENSOR, {"t": cot}, attrs, ["print_out"])[0]
    return [(step.befores[0], cot)] if cot is not None else []


def _no_grad(d: _Differentiator, step: Step, cots: list[Tensor | None]) -> Contribution:
    """Ops without a gradient pass none to what they read or overwrite. One that writes a
    view of a larger storage (``accumulate_`` on a slice) still passes on the gradient of
    the parts it leaves alone, through a gradient op that masks out the written part."""
    op = step.op
    partial = {
        r
        for i in written_inputs(op)
        if parents(op.inputs[i]) is not None
        for r in _roots_of(op.inputs[i])
    }
    written_cots = cots[: len(step.written)]
    if not partial or all(c is None for c in written_cots):
        return []
    grad_for = tuple(
        k for k, v in enumerate(step.befores) if v.root in partial and _is_float(v.root)
    )
    if not grad_for:
        return []
    present = tuple(c is not None for c in written_cots) + (False,) * len(step.new_outputs)
    roots = tuple(v.root for v in step.befores)
    no_values = (False,) * len(roots)
    recipe = VjpRecipe.capture(op, roots, no_values, present, grad_for, detached=True)
    specs = [step.befores[k].root.spec for k in grad_for]
    names = [f"Gradient___{step.befores[k].root.name}" for k in grad_for]
    inputs = tuple(c for c in written_cots if c is not None)
    grad_op = add_op(d.grad, grad_opdef(op.opdef), inputs, {"recipe": recipe}, specs, names)
    return [(step.befores[k], out) for k, out in zip(grad_for, grad_op.outputs)]


RULES: dict[str, Callable[[_Differentiator, Step, list], Contribution]] = {
    "vjp": _vjp_rule,
    "repeat": _vjp_rule,
    "call": _call_rule,
    "print": _print_rule,
    "collective": _collective_rule,
    "adjoint": _adjoint_rule,
    "none": _no_grad,
}
