"""Build the one explicit popxl program a PopTorch-style model runs per host call.

Per call the program runs ``deviceIterations`` device iterations; each one runs
``gradientAccumulation`` micro-batches (training), then reduces the gradients over
replicas and updates the weights::

    repeat(deviceIterations):            # outer loop (output modes Final/EveryN nest it)
        repeat(gradientAccumulation):    # micro-batches
            x = host_load(...)           # one host transfer per micro-batch
            outputs, loss = forward(x)
            accum += d(loss * loss_scaling)/dw
            (store / keep / sum the outputs: the output mode)
        g = all_reduce(accum) / (GA * R if Mean) / loss_scaling, clipped to max_grad_norm
        w = optimizer(w, g); accum = 0

The loops are built flat in the main graph and moved into ``repeat`` subgraphs by
``popxl_addons.transforms.repeat_graph``, so what ``print_schedule`` shows is the program
that runs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import popxl
import popxl_addons as addons
from popxl import ops
from popxl.context import get_current_context
from popxl.errors import InternalError
from popxl_addons.transforms.repeat_graph import repeat_graph

from . import _host_io, _instances, _staged
from ._anchors import LOSS_SCALE, UPDATED, Anchors
from ._lowering_log import log_placements
from ._staged import block_ranges
from ._storage import (
    flush,
    full_shape,
    is_off_chip,
    is_sharded,
    place,
    read,
    read_stored,
    shard_group,
    write,
    write_stored,
)
from .blocks import recording
from .enums import CommGroupType, OutputMode, ReductionType
from .errors import Error
from .optim import Optimizer, group_of_each, sharded_update
from .options import Options, TensorLocationSettings, _TensorLocationOptions, resolved_output_mode
from .strategies import PipelinedExecution, ShardedExecution

LOSS_MISSING_MSG = (
    "trainingModel needs a loss: {cls}.build must return it, marked with "
    "poptorch.identity_loss(x, reduction='mean') or as its last output (a scalar). It "
    "returned {n} output(s)."
)
NO_LOSS_MSG = (
    "Couldn't find a loss in graph: {cls} marks no output with poptorch.identity_loss, and "
    "its last output, taken as the loss, has shape {shape}. The loss must be a scalar: reduce "
    "it with poptorch.identity_loss(x, reduction='mean') or 'sum' and return it."
)
LOSS_SHAPE_MSG = (
    "The loss must be a scalar, but {cls}.build's loss has shape {shape}. Reduce it with "
    "poptorch.identity_loss(x, reduction='mean') or 'sum'."
)
EVERY_N_MSG = (
    "OutputMode.EveryN with output_return_period {n} needs deviceIterations to be a multiple "
    "of {n}, but deviceIterations is {di}."
)
INPUT_GROUP_MSG = (
    "inputReplicaGrouping group size {k} must divide replicationFactor {r}: each group of "
    "{k} replicas reads one slice of the batch."
)
NO_WEIGHTS_MSG = "trainingModel needs weights to train, but {cls} declares no variables."


class NoLossError(Error, ValueError):
    """trainingModel found no loss (PopTorch raised ``poptorch.Error``; a ``ValueError``
    too, as for other malformed losses)."""


_LOSSES: contextvars.ContextVar[list[popxl.Tensor] | None] = contextvars.ContextVar(
    "poptorch_losses", default=None
)


def identity_loss(x: Any, reduction: str) -> Any:
    """Mark ``x`` as the loss a ``trainingModel`` minimises, reduced as asked.

    Works on popxl tensors (in a popxl_addons ``Module``'s ``build``) and on torch tensors
    (in a ``torch.nn.Module``'s ``forward``, where it is the op ``poptorch::identity_loss``,
    which also runs in plain PyTorch).

    Args:
        x: the loss values.
        reduction: ``"sum"``, ``"mean"`` or ``"none"``.

    Returns:
        The reduced loss (a scalar for "sum" and "mean").
    """
    reducers = {"sum": ops.sum, "mean": ops.mean, "none": lambda t: t}
    if reduction not in reducers:
        raise ValueError(
            f"identity_loss reduction must be 'sum', 'mean' or 'none', got {reduction!r}."
        )
    if not isinstance(x, popxl.Tensor):
        from . import _torch_ops  # noqa: PLC0415 (torch only for torch models)

        code = {"sum": 0, "mean": 1, "none": 2}[reduction]
        return _torch_ops.identity_loss(x, code)
    loss = reducers[reduction](x)
    marked = _LOSSES.get()
    if marked is not None:
        marked.append(loss)
    return loss


@contextlib.contextmanager
def _collect_losses() -> Iterator[list[popxl.Tensor]]:
    found: list[popxl.Tensor] = []
    token = _LOSSES.set(found)
    try:
        yield found
    finally:
        _LOSSES.reset(token)


@dataclass
class Built:
    """The built program and the handles the executor needs."""

    ir: popxl.Ir
    inputs: list[popxl.HostToDeviceStream]
    outputs: list[popxl.DeviceToHostStream]
    output_specs: list[popxl.TensorSpec]
    stores_per_call: int
    weights: dict[str, popxl.Variable]
    state: dict[str, dict[str, popxl.Variable]] = field(default_factory=dict)
    # Keyed by (weight name or group index, attribute); see ``_Trainer``.
    hyper: dict[tuple[str | int, str], popxl.Variable] = field(default_factory=dict)
    constants: dict[tuple[str | int, str], float] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    step: popxl.Variable | None = None
    loss_index: int | None = None
    locations: _TensorLocationOptions = field(default_factory=_TensorLocationOptions)
    # Automatic loss scaling: finite optimiser steps in a row (None: the scale is fixed).
    good_steps: popxl.Variable | None = None
    # The execution strategy's blocks, stages and IPUs (and pipeline schedule), if any.
    description: str = ""
    interface: Interface | None = None
    # Options.anchorTensor's tensors and the variables holding them.
    anchors: Anchors | None = None
    # EveryN with gradient accumulation: each output's next row in its holder.
    output_rows: list[popxl.Variable] = field(default_factory=list)

    def forward_interface(self) -> Interface:
        """``interface``, which ``build`` sets before anything reads it."""
        if self.interface is None:
            raise InternalError("the program's forward interface is read before build() sets it")
        return self.interface


@dataclass(frozen=True)
class Interface:
    """How the program uses the forward graph's outputs and named inputs.

    A popxl_addons ``Module`` returns only its outputs and trains every variable. A captured
    torch model (``poptorch._capture``) also returns new values for its buffers (written
    back to their variables after each micro-batch) and for inputs it modifies in place
    (sent to the host after its outputs), and trains only its parameters that require
    gradients.
    """

    n_outputs: int
    state_outputs: tuple[str, ...] = ()
    input_outputs: tuple[int, ...] = ()
    trainable: tuple[str, ...] | None = None  # None: every named input
    loss_index: int | None = None  # None: marked by identity_loss, or the last output
    overlaps: Any = None  # overlapped IO marks (``_capture.overlap.Overlaps``)

    @classmethod
    def of(cls, module: Any, fwd: Any) -> Interface:
        forward = getattr(module, "forward", None)
        if forward is None or not hasattr(forward, "state_outputs"):
            return cls(len(fwd.graph.outputs))
        return cls(
            forward.n_outputs,
            tuple(forward.state_outputs),
            tuple(forward.input_outputs),
            tuple(forward.trainable),
            forward.loss_index,
            forward.overlaps,
        )

    @property
    def host_outputs(self) -> list[int]:
        """Forward outputs sent to the host: the model's, then the modified inputs'."""
        first_input = self.n_outputs + len(self.state_outputs)
        return [*range(self.n_outputs), *range(first_input, first_input + len(self.input_outputs))]

    def state_indices(self) -> list[tuple[int, str]]:
        return [(self.n_outputs + i, name) for i, name in enumerate(self.state_outputs)]

    def trained(self, fwd: Any) -> list[str]:
        names = list(fwd.args.to_dict())
        return names if self.trainable is None else [n for n in names if n in self.trainable]


INFERENCE_ACCUMULATION_MSG = (
    "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it as its "
    "default value (1) when running a poptorch.inferenceModel()."
)
PIPELINED_INFERENCE_HINT = (
    " Use poptorch.Options().deviceIterations to process a sufficient number of batches each "
    "run for pipelined execution instead."
)


def check_inference_accumulation(options: Options) -> None:
    """Inference accumulates nothing: PopTorch refused an inference model with gradient
    accumulation when it was created."""
    if options.Training.gradient_accumulation == 1:
        return
    strategy = options._execution_strategy
    pipelined = isinstance(strategy, PipelinedExecution) and not isinstance(
        strategy, ShardedExecution
    )
    message = INFERENCE_ACCUMULATION_MSG + (PIPELINED_INFERENCE_HINT if pipelined else "")
    raise Error(message, "poptorch_py_error")


@dataclass(frozen=True)
class Layout:
    """How many of everything one host call runs."""

    device_iterations: int
    accumulation: int
    replicas: int
    mode: OutputMode
    period: int
    reduction: ReductionType

    @classmethod
    def of(cls, options: Options, training: bool) -> Layout:
        ga = options.training.gradient_accumulation
        if not training:
            check_inference_accumulation(options)
        mode = resolved_output_mode(options, training)
        di = options.device_iterations
        period = {OutputMode.Final: di, OutputMode.EveryN: options.output_return_period}.get(
            mode, 1
        )
        if di % period:
            raise ValueError(EVERY_N_MSG.format(n=period, di=di))
        r, k = options.replication_factor, options.input_group_size
        if r % k:
            raise ValueError(INPUT_GROUP_MSG.format(k=k, r=r))
        replicas = _instances.global_replicas(options)
        return cls(
            di, ga if training else 1, replicas, mode, period, options.training.reduction_type
        )

    @property
    def rows_per_store(self) -> int:
        """Micro-batch values per output store: ``EveryN`` returns every micro-batch of
        each N-th device iteration (PopART's EveryN anchor: ``steps * accumulation / N``
        values), the other accumulated modes one."""
        return self.accumulation if self.mode == OutputMode.EveryN else 1

    @property
    def stores_per_call(self) -> int:
        if self.mode == OutputMode.All:
            return self.device_iterations * self.accumulation
        if self.mode == OutputMode.Sum:
            return 1
        return self.device_iterations // self.period


def replica_grouping(ir: popxl.Ir, kind: CommGroupType, size: int) -> popxl.ReplicaGrouping:
    """A popxl replica grouping from PopTorch's ``CommGroupType`` and group size."""
    r = ir.replication_factor
    if kind == CommGroupType.All:
        return ir.replica_grouping()
    if kind == CommGroupType.NoGrouping:
        return ir.replica_grouping(group_size=1)
    if kind == CommGroupType.Consecutive:
        return ir.replica_grouping(stride=1, group_size=size)
    return ir.replica_grouping(stride=r // size, group_size=size)


def build(
    module: addons.Module,
    options: Options,
    specs: Sequence[popxl.TensorSpec],
    optimizer: Optimizer | None,
    groupings: dict[str, tuple[CommGroupType, int]],
) -> Built:
    """Build the program of ``module`` for micro-batch input ``specs``."""
    training = optimizer is not None
    layout = Layout.of(options, training)
    options.tensor_locations.check_io_tiles()
    ir = popxl.Ir(
        replication="popdist" if _instances.runs_on_instances(options) else layout.replicas
    )
    options.apply_to_session_options(ir._pb_ir.getSessionOptions(), training)
    main = ir.main_graph
    scope = options.model_name or ""
    with main, popxl.name_scope(scope) if scope else contextlib.nullcontext():
        inputs = [popxl.h2d_stream(s.shape, s.dtype, f"input{i}") for i, s in enumerate(specs)]
        with _collect_losses() as losses, recording() as recorder:
            facts, fwd = module.create_graph(*specs)
        interface = Interface.of(module, fwd)
        _host_io.check_overlapped_io(
            interface.overlaps, options, resolved_output_mode(options, training)
        )
        loss_index = _loss_index(module, fwd, losses, interface) if training else None
        for name, (kind, size) in groupings.items():
            facts.to_dict()[name].replica_grouping = replica_grouping(ir, kind, size)
        plans = block_ranges(recorder.marks, fwd.graph)
        if plans:
            _staged.place_blocks(plans, options.strategy, recorder.marks)
        log_placements(fwd.graph, plans, options.strategy)
        locations = _locations(options)
        named = _init(facts, options.random_seed, locations.weight)
        built = Built(
            ir,
            inputs,
            [],
            [],
            layout.stores_per_call,
            named,
            loss_index=loss_index,
            interface=interface,
        )
        built.locations = locations
        built.anchors = Anchors.of(
            options,
            resolved_output_mode(options, training),
            layout.accumulation * layout.device_iterations,
            layout.device_iterations,
        )
        if len(plans) > 1 or any(p.ipu for p in plans):
            # Ops not placed explicitly (loops, the optimiser's scalars) get no IPU, so
            # the variables they read are placed by the ops that use them.
            with popxl.ipu(None):
                _build_staged_body(built, fwd, optimizer, layout, options, plans)
        else:
            _build_body(built, fwd, optimizer, layout, options)
    built.anchors.check()
    ir.num_host_transfers = layout.device_iterations * layout.accumulation
    return built


def _locations(options: Options) -> _TensorLocationOptions:
    """The tensor locations the program uses: as set, except that phased execution keeps
    weights, optimiser state and accumulators whose storage is not set in remote buffers
    (and activations too with an ``OffChipAfter*`` liveness)."""
    locations = options.tensor_locations.model_copy(deep=True)
    strategy = options.strategy
    kinds = ["weight", "optimizer", "accumulator"] if _staged.is_phased(strategy) else []
    if _staged.offloads_activations(strategy):
        kinds.append("activation")
    for kind in kinds:
        settings = getattr(locations, kind)
        if settings.on_chip is None:
            settings.on_chip = False
    return locations


def _init(
    facts: Any, seed: int | None, settings: TensorLocationSettings
) -> dict[str, popxl.Variable]:
    """The module's weights (initial values seeded by ``seed`` if given)."""
    saved = np.random.get_state()
    if seed is not None:
        np.random.seed(seed)
    try:
        return {
            key: place(f.next_data(), f.dtype, key, f.replica_grouping, settings)
            for key, f in sorted(facts.to_dict().items())
        }
    finally:
        if seed is not None:
            np.random.set_state(saved)


def _loss_index(module: Any, fwd: Any, losses: list, interface: Interface) -> int:
    outs = list(fwd.graph.outputs)
    cls = getattr(module, "name", type(module).__name__)
    index = interface.loss_index
    if index is None:
        outs = outs[: interface.n_outputs]
        index = next((i for i, o in enumerate(outs) for m in losses if o is m), None)
    if index is None:
        if not outs:
            raise ValueError(LOSS_MISSING_MSG.format(cls=cls, n=0))
        index = len(outs) - 1
        if outs[index].shape != ():
            raise NoLossError(NO_LOSS_MSG.format(cls=cls, shape=outs[index].shape), "poptorch")
    if outs[index].shape != ():
        raise ValueError(LOSS_SHAPE_MSG.format(cls=cls, shape=outs[index].shape))
    return index


def _build_body(
    built: Built, fwd: Any, optimizer: Optimizer | None, layout: Layout, options: Options
) -> None:
    main = built.ir.main_graph
    interface = built.forward_interface()
    specs = _output_specs(built, fwd, layout)
    keep = _output_holders(built, specs, layout)
    trainer = _Trainer(built, fwd, optimizer, options) if _trains(built, fwd, optimizer) else None
    # Micro-batch: load, forward (and backward), handle the outputs.
    overlaps = interface.overlaps
    xs = [_host_io.load(s, i, overlaps) for i, s in enumerate(built.inputs)]
    on_chip = {k: read(v) for k, v in built.weights.items()}
    info = fwd.bind(addons.NamedTensors.from_dict(on_chip)).call_with_info(*xs)
    if trainer is not None:
        trainer.backward(info)
    _write_state(built, on_chip, info.outputs)
    outs = [info.outputs[i] for i in interface.host_outputs]
    _handle_outputs(built, outs, keep, layout.mode)
    _repeat(main, layout.accumulation)
    _finish(built, trainer, keep, layout, looped=False)


def _trains(built: Built, fwd: Any, optimizer: Optimizer | None) -> bool:
    """Whether the program has a backward and an optimiser step: a training model whose
    weights are all frozen (``requires_grad=False``) only runs its forward, as in PopTorch.
    (A model that declares no weights at all is refused: ``NO_WEIGHTS_MSG``.)"""
    if optimizer is None or built.interface is None:
        return optimizer is not None
    trained = set(built.interface.trained(fwd))
    return not built.weights or any(n in trained for n in built.weights)


def _output_specs(built: Built, fwd: Any, layout: Layout) -> list[popxl.TensorSpec]:
    """The forward outputs the host receives (per micro-batch), with one device-to-host
    stream each (a store carries ``layout.rows_per_store`` micro-batches' values)."""
    outs = [fwd.graph.outputs[i] for i in built.forward_interface().host_outputs]
    specs = [popxl.TensorSpec(o.shape, o.dtype) for o in outs]
    built.output_specs = specs
    rows = layout.rows_per_store
    lead = (rows,) if rows > 1 else ()
    built.outputs = [
        popxl.d2h_stream((*lead, *s.shape), s.dtype, f"output{i}") for i, s in enumerate(specs)
    ]
    return specs


def _write_state(built: Built, on_chip: dict[str, popxl.Tensor], outs: Sequence[Any]) -> None:
    """Buffers the forward updated (BatchNorm statistics, counters, the random seed): their
    new values become the variables' values for the next micro-batch."""
    for index, name in built.forward_interface().state_indices():
        write(built.weights[name], on_chip[name], outs[index])


def _finish(
    built: Built, trainer: _Trainer | None, keep: list, layout: Layout, looped: bool
) -> None:
    """After the micro-batch loop: the optimiser step, then the device-iteration loops
    with the stores each output mode needs. ``looped``: the first of those loops is
    already built (an inference pipeline over the device iterations)."""
    main = built.ir.main_graph
    # One device iteration: reduce and update.
    if trainer is not None:
        trainer.optimizer_step(layout)
    # Device iterations, with the stores each output mode needs.
    first = 1 if looped else None
    if layout.mode == OutputMode.All:
        _repeat(main, first or layout.device_iterations)
        return
    if layout.mode == OutputMode.Sum:
        _repeat(main, first or layout.device_iterations)
        _store(built, keep)
        for k in keep:
            ops.var_updates.accumulator_scale_(k, 0.0)
        return
    _repeat(main, first or layout.period)
    _store(built, keep)
    _repeat(main, layout.device_iterations // layout.period)


def _build_staged_body(
    built: Built,
    fwd: Any,
    optimizer: Optimizer | None,
    layout: Layout,
    options: Options,
    plans: list[_staged.BlockPlan],
) -> None:
    """``_build_body`` for a model split into blocks placed by an execution strategy (see
    ``_staged``)."""
    strategy = options.strategy
    specs = _output_specs(built, fwd, layout)
    keep = _output_holders(built, specs, layout)
    trainer = (
        _Trainer(built, fwd, optimizer, options, whole=False)
        if _trains(built, fwd, optimizer)
        else None
    )
    stage_ids = sorted({p.stage for p in plans})
    for p in plans:
        p.stage = stage_ids.index(p.stage)
    blocks = _staged.split(fwd.graph, plans)
    weights_of = {t: key for key, t in fwd.args.to_dict().items()}
    if trainer is not None:
        loss = fwd.graph.outputs[built.loss_index]
        _staged.differentiate(blocks, loss, set(weights_of))
        for block in blocks:
            for t in block.inputs:
                if t in weights_of:
                    trainer.ipu_of.setdefault(weights_of[t], block.plan.ipu)
    pipelined = _staged.is_pipelined(strategy) and len(stage_ids) > 1
    training = trainer is not None
    if training:
        steps = layout.accumulation
    elif layout.mode in (OutputMode.All, OutputMode.Sum):
        steps = layout.device_iterations
    else:
        steps = layout.period
    built.description = _staged.describe(plans, strategy)
    if pipelined:
        data = [t for t in fwd.graph.inputs if t not in weights_of][: len(built.inputs)]
        _staged.check_pipeline_edges(blocks, data)
        n = 2 * len(stage_ids) - 1 if training else len(stage_ids)
        _staged.pipeline_steps_check(n, steps, training)
        with addons.pipelined_execution(steps, min_steps=n) as pipeline:
            _staged_micro_batch(built, blocks, fwd, trainer, keep, layout, pipeline, weights_of)
        built.description += "\n" + pipeline.print_schedule()
    else:
        _staged_micro_batch(built, blocks, fwd, trainer, keep, layout, None, weights_of)
        _repeat(built.ir.main_graph, layout.accumulation)
    _finish(built, trainer, keep, layout, looped=pipelined and not training)


def _staged_micro_batch(
    built: Built,
    blocks: list[_staged.BlockGraph],
    fwd: Any,
    trainer: _Trainer | None,
    keep: list,
    layout: Layout,
    pipeline: Any,
    weights_of: dict[popxl.Tensor, str],
) -> None:
    """One micro-batch through the blocks: host loads, forward calls, outputs, and the
    backward calls in reverse order."""
    stager = _staged.Stager(pipeline, len({b.plan.stage for b in blocks}))
    data = [t for t in fwd.graph.inputs if t not in weights_of][: len(built.inputs)]
    consumers: dict[popxl.Tensor, set[int]] = {}
    for block in blocks:
        for t in block.inputs:
            consumers.setdefault(t, set()).add(block.plan.ipu)
    interface = built.forward_interface()
    outputs = fwd.graph.outputs
    out_index = {outputs[j]: k for k, j in enumerate(interface.host_outputs)}
    state_of = {outputs[j]: name for j, name in interface.state_indices()}
    vals, infos = _staged.Values(), {}
    for b, block in enumerate(blocks):
        plan = block.plan
        with stager.forward(plan):
            for i, t in enumerate(data):
                if not vals.has(t) and (t in block.inputs or b == 0 and t not in consumers):
                    loaded = _host_io.load(built.inputs[i], i, interface.overlaps)
                    vals.set(t, loaded, plan.ipu)
                    _copy_ahead(vals, t, consumers)
            args = [
                read(built.weights[weights_of[t]]) if t in weights_of else vals.on(t, plan.ipu)
                for t in block.inputs
            ]
            info = ops.call_with_info(block.graph, *args)
            infos[b] = info
            for t, out in zip(block.outputs, info.outputs):
                vals.set(t, out, plan.ipu)
                _copy_ahead(vals, t, consumers)
                if t in out_index:
                    _handle_output(built, out_index[t], out, keep, layout.mode)
                if t in state_of:
                    var = built.weights[state_of[t]]
                    write(var, read(var), out)
    if trainer is not None:
        _staged_backward(built, blocks, trainer, stager, infos, vals, weights_of)


def _copy_ahead(vals: Any, t: popxl.Tensor, consumers: dict[popxl.Tensor, set[int]]) -> None:
    """Copy ``t`` to the other IPUs that read it, in its producer's stage."""
    for ipu in sorted(consumers.get(t, ())):
        vals.on(t, ipu)


def _staged_backward(
    built: Built,
    blocks: list[_staged.BlockGraph],
    trainer: _Trainer,
    stager: Any,
    infos: dict[int, Any],
    vals: Any,
    weights_of: dict[popxl.Tensor, str],
) -> None:
    loss = trainer.fwd.graph.outputs[built.loss_index]
    grads = _staged.Values()
    for b in reversed(range(len(blocks))):
        block = blocks[b]
        if block.grad is None:
            continue
        plan = block.plan
        with stager.backward(plan):
            provided = []
            for t in block.provided:
                if t is loss:
                    provided.append(trainer.seed())
                elif grads.has(t):
                    provided.append(grads.on(t, plan.ipu))
                else:
                    provided.append(_staged.zeros_like(t))
            if stager.pipeline is not None:
                acts = stager.pipeline.stash_and_restore_activations(infos[b], block.grad)
            else:
                acts = block.grad.inputs_dict(infos[b])
            acts = _offload_activations(acts, built.locations.activation)
            outs = ops.call(block.grad.graph, *provided, inputs_dict=acts)
            for t, g in zip(block.required, outs):
                if t in weights_of:
                    trainer.accumulate(weights_of[t], g)
                    continue
                if grads.has(t):
                    g = grads.on(t, plan.ipu) + g
                grads.set(t, g, plan.ipu)
                grads.on(t, vals.homes[t])  # back to the producer's IPU, in this stage


def _repeat(graph: popxl.Graph, count: int) -> None:
    """``repeat_graph``, leaving the weights-from/to-host fragment ops (which load and
    store on-chip replica-sharded variables' shards) outside the loop."""
    fragments = [op for op in graph._ops if op.execution_context != "Normal"]
    graph._ops = [op for op in graph._ops if op.execution_context == "Normal"]
    repeat_graph(graph, count)
    graph._ops = [*fragments, *graph._ops]


def _output_holders(
    built: Built, specs: list[popxl.TensorSpec], layout: Layout
) -> list[popxl.Variable]:
    """Variables holding the outputs between stores (none for ``All``): a float32 sum
    (``Sum``), the last value (``Final``, ``EveryN``), or with ``EveryN`` and gradient
    accumulation every micro-batch's value, one row each, written at a per-output row
    counter (``built.output_rows``)."""
    mode = layout.mode
    if mode == OutputMode.All:
        return []

    def dtype(s):
        return popxl.float32 if mode == OutputMode.Sum and s.dtype.is_floating_point else s.dtype  # noqa: E731

    rows = layout.rows_per_store
    lead = (rows,) if rows > 1 else ()
    if rows > 1:
        built.output_rows = [
            popxl.variable(np.int32(0), popxl.int32, f"output{i}_row") for i in range(len(specs))
        ]
    return [
        popxl.variable(
            np.zeros((*lead, *s.shape), dtype(s).as_numpy()), dtype(s), f"output{i}_held"
        )
        for i, s in enumerate(specs)
    ]


def _handle_outputs(
    built: Built, outs: Sequence[popxl.Tensor], keep: list, mode: OutputMode
) -> None:
    for i, out in enumerate(outs):
        _handle_output(built, i, out, keep, mode)


def _handle_output(built: Built, i: int, out: popxl.Tensor, keep: list, mode: OutputMode) -> None:
    if mode == OutputMode.All:
        _host_io.store(built.outputs[i], i, out, built.forward_interface().overlaps)
    elif mode == OutputMode.Sum:
        ops.var_updates.accumulate_(keep[i], out)
    elif built.output_rows:
        _write_row(keep[i], built.output_rows[i], out)
    else:
        ops.var_updates.copy_var_update_(keep[i], out)


def _write_row(held: popxl.Variable, row: popxl.Variable, out: popxl.Tensor) -> None:
    """``held[row] = out``, then the next row (wrapping after the last)."""
    index = ops.reshape(ops.cast(row, popxl.uint32), (1,))
    value = ops.reshape(out, (1, *out.shape))
    ops.dynamic_update_(held, index, value, axes=[0], sizes=[1], no_overlap=True)
    rows = popxl.constant(np.int32(held.shape[0]))
    ops.var_updates.copy_var_update_(row, ops.fmod(row + 1, rows))


def _store(built: Built, keep: list) -> None:
    for i, (stream, held) in enumerate(zip(built.outputs, keep)):
        value = held if held.dtype == stream.dtype else ops.cast(held, stream.dtype)
        _host_io.store(stream, i, value, built.forward_interface().overlaps)


class _Trainer:
    """The training half of the program: gradients, accumulators, optimiser update.

    The optimiser arrives as a ``Spec`` (``poptorch._optim_rules``). Its hyper-parameters
    are kept per weight, as PopART's "specific" optimiser tensors: ``built.hyper[(weight,
    attr)]`` is a scalar float32 variable (named as PopTorch's ``ipu_param`` keys, e.g.
    ``learningRate___specific___fc.weight``) and ``built.constants[(weight, attr)]`` a
    value baked into the program. Integer keys give each group's view: ``(i, attr)`` is
    the entry of group ``i``'s first weight, ``(0, "loss_scaling")`` the global loss
    scaling (``lossScaling_FLOAT``) and, with automatic loss scaling,
    ``(0, "loss_scale_update_factor")`` the factor it has applied so far.
    """

    def __init__(
        self, built: Built, fwd: Any, optimizer: Any, options: Options, whole: bool = True
    ) -> None:
        self.built, self.fwd = built, fwd
        self.training = options.training
        # Weight name -> the IPU its accumulator and update run on (staged programs).
        self.ipu_of: dict[str, int] = {}
        self._copies: dict[tuple, popxl.Tensor] = {}
        trained = built.forward_interface().trained(fwd)
        names = [n for n in built.weights if n in trained]
        if not names:
            raise ValueError(NO_WEIGHTS_MSG.format(cls=type(fwd).__name__))
        from . import _optim_link  # noqa: PLC0415 (it imports the executor's optimisers)

        self.optimizer = optimizer
        self.spec = _optim_link.build_spec(optimizer, options)
        self.rule = self.spec.rule
        built.groups = group_of_each(self.spec, names)
        loss = fwd.graph.outputs[built.loss_index]
        args = fwd.args.to_dict()
        required = [args[n] for n in trained]
        if whole:  # staged programs differentiate block by block instead
            self.bwd = addons.autodiff(fwd, grads_provided=[loss], grads_required=required)
        self.keys = [_key_of(fwd, t) for t in required]
        self.loss_dtype = loss.dtype
        acc = self.spec.accum_type
        where = built.locations.accumulator
        # Without gradient accumulation, a weight whose accumulator would be an ordinary
        # on-chip variable takes its gradient straight from the backward: no accumulator to
        # add into, read back and zero (what PopART did too).
        single = whole and options.training.gradient_accumulation == 1

        def direct(k: str) -> bool:
            w = built.weights[k]
            shape = full_shape(w)
            return single and not (
                is_off_chip(where, shape) or is_sharded(where, shape, w.replica_grouping)
            )

        self.accums = {
            k: _zeros_like(built.weights[k], acc, f"accum.{k}", where)
            for k in self.keys
            if not direct(k)
        }
        self.grads: dict[str, popxl.Tensor] = {}
        self._make_hyper()
        self._make_state()
        _optim_link.program_built(optimizer, self.spec, built.groups)

    def _make_hyper(self) -> None:
        from . import _optim_rules as rules  # noqa: PLC0415 (names of PopTorch's tensors)

        built, spec = self.built, self.spec
        attrs = [*self.rule.attrs, *self.rule.internal]
        views: tuple[dict[tuple[str | int, str], Any], ...] = (built.hyper, built.constants)
        for name, group in built.groups.items():
            for attr in attrs:
                value, const = spec.groups[group][attr]
                if const:
                    built.constants[(name, attr)] = value
                else:
                    var_name = rules.specific_name(attr, name)
                    built.hyper[(name, attr)] = popxl.variable(
                        np.float32(value), popxl.float32, var_name
                    )
                for view in views:
                    if (name, attr) in view:
                        view.setdefault((group, attr), view[(name, attr)])
        value, const = spec.loss_scaling
        automatic = self.training.automatic_loss_scaling
        if const and not automatic:
            built.constants[(0, "loss_scaling")] = value
        else:
            built.hyper[(0, "loss_scaling")] = popxl.variable(
                np.float32(value), popxl.float32, rules.LOSS_SCALING_VAR
            )
        built.constants[(0, "max_grad_norm")] = spec.max_grad_norm
        built.step = popxl.variable(np.float32(0.0), popxl.float32, rules.STEP_VAR)
        if automatic:
            built.hyper[(0, "loss_scale_update_factor")] = popxl.variable(
                np.float32(1.0), popxl.float32, rules.UPDATE_FACTOR_VAR
            )
            built.good_steps = popxl.variable(np.float32(0.0), popxl.float32, rules.GOOD_STEPS_VAR)

    def _make_state(self) -> None:
        from . import _optim_rules as rules  # noqa: PLC0415

        built, spec = self.built, self.spec
        prefixes = rules.SLOT_PREFIXES[self.rule.family]
        for name, group in built.groups.items():
            built.state[name] = {
                slot: self._state_variable(
                    built.weights[name],
                    spec.slot_dtype(slot),
                    f"{prefixes[slot]}{name}",
                    self.rule.initial(slot),
                )
                for slot in self.rule.slots(spec.groups[group])
            }

    def _state_variable(
        self, w: popxl.Variable, dtype: popxl.dtype, name: str, fill: float
    ) -> popxl.Variable:
        """An optimiser state variable like ``w`` (its whole shape and replica grouping,
        one value per group) filled with ``fill``, placed as optimiser state."""
        group = w.replica_grouping
        lead = (group.num_groups,) if group.num_groups > 1 else ()
        data = np.full(lead + full_shape(w), fill, dtype.as_numpy())
        return place(data, dtype, name, group, self.built.locations.optimizer)

    def hyper(self, key: Any, attr: str) -> Any:
        """A hyper-parameter (``key``: a weight name, or 0 for global ones) as the update
        uses it: a constant, or its variable (on the current IPU)."""
        if (key, attr) in self.built.hyper:
            return self.here(self.built.hyper[(key, attr)])
        return self.built.constants[(key, attr)]

    def loss_scale(self) -> Any:
        """The loss scaling in force: the optimiser's, times the factor automatic loss
        scaling applied."""
        scale = self.hyper(0, "loss_scaling")
        factor = self.built.hyper.get((0, "loss_scale_update_factor"))
        return scale if factor is None else self.here(factor) * scale

    def here(self, t: Any) -> Any:
        """``t`` on the current IPU: in a staged program, an ``ipu_copy`` of a tensor known
        to live on another IPU (the optimiser's scalars live on IPU 0)."""
        if not self.ipu_of or not isinstance(t, popxl.Tensor):
            return t
        current = get_current_context().ipu_id
        try:
            home = t._placement("ipu")
        except Exception:  # not placed yet: it will live where it is first used
            return t
        if home is None or home == current:
            return t
        key = (t, current, popxl.gcg())
        if key not in self._copies:
            self._copies[key] = ops.ipu_copy(t, current, home)
        return self._copies[key]

    def seed(self) -> popxl.Tensor:
        """The loss gradient: the loss scaling, in the loss's dtype."""
        scale = self.loss_scale()
        if isinstance(scale, popxl.Tensor):
            return ops.cast(scale, self.loss_dtype)
        return popxl.constant(np.asarray(scale, self.loss_dtype.as_numpy()), self.loss_dtype)

    def backward(self, info: Any) -> None:
        args = _offload_activations(
            self.bwd.grad_graph_info.inputs_dict(info), self.built.locations.activation
        )
        grads = self.bwd.call(self.seed(), args=args)
        for key, g in zip(self.keys, grads):
            self.accumulate(key, g)

    def accumulate(self, key: str, g: popxl.Tensor) -> None:
        """Add a micro-batch gradient of weight ``key`` to its accumulator (or keep it,
        for a weight updated without one)."""
        if self.built.anchors is not None:
            self.built.anchors.gradient(key, g)
        if key not in self.accums:
            dtype = self.spec.accum_type
            self.grads[key] = g if g.dtype == dtype else ops.cast(g, dtype)
            return
        accum = self.accums[key]
        group = shard_group(accum)
        if group is not None:  # a sharded accumulator keeps this replica's reduced shard
            g = ops.collectives.replicated_reduce_scatter(g, "add", group, True)
        acc = read_stored(accum)
        ops.var_updates.accumulate_(acc, g)
        flush(accum, acc)

    def _on(self, name: str) -> Any:
        """The IPU context of weight ``name``'s accumulator and update."""
        return popxl.ipu(self.ipu_of[name]) if name in self.ipu_of else contextlib.nullcontext()

    def _sharding(self, name: str) -> popxl.ReplicaGrouping | None:
        """The group a weight's update runs sharded over: that of the weight, its
        accumulator or its optimiser state, whichever is replica-sharded (else None)."""
        tensors = [self.built.weights[name], *self.built.state[name].values()]
        if name in self.accums:
            tensors.append(self.accums[name])
        return next((g for g in map(shard_group, tensors) if g is not None), None)

    def _reduced_grad(self, name: str, acc: popxl.Tensor, layout: Layout) -> popxl.Tensor:
        """The step's gradient of weight ``name`` from its accumulator ``acc`` (as stored):
        reduced over the replicas sharing the weight, this replica's shard of it if the
        update is sharded, unscaled and divided for a Mean reduction."""
        accum = self.accums.get(name)
        group = self.built.weights[name].replica_grouping
        sharding = self._sharding(name)
        if accum is not None and shard_group(accum) is not None:
            g = acc  # reduce-scattered micro-batch by micro-batch
        elif sharding is not None:
            g = ops.collectives.replicated_reduce_scatter(acc, "add", sharding, True)
        else:
            if layout.replicas > 1 and group.group_size > 1:
                ops.collectives.replicated_all_reduce_(acc, op="add", group=group)
            g = acc
        g = g if g.dtype == popxl.float32 else ops.cast(g, popxl.float32)
        # Replicas sharing a weight value reduce their gradients together.
        mean = layout.reduction == ReductionType.Mean
        divisor = layout.accumulation * group.group_size if mean else 1
        return g * _inverse(self.loss_scale(), divisor)

    def optimizer_step(self, layout: Layout) -> None:
        built = self.built
        grads, loaded, shards = {}, {}, {}
        for name in built.groups:
            with self._on(name):
                if name in self.grads:
                    loaded[name] = self.grads[name]
                else:
                    loaded[name] = read_stored(self.accums[name])
                grads[name] = self._reduced_grad(name, loaded[name], layout)
            shards[name] = self._sharding(name)
        anchors = built.anchors
        if anchors is not None and anchors.wanted(LOSS_SCALE):
            scale = self.loss_scale()
            if not isinstance(scale, popxl.Tensor):
                scale = popxl.constant(np.float32(scale))
            anchors.step(LOSS_SCALE, _f32(scale))
        finite = None
        if built.good_steps is not None:
            bad = {n: self._bad_count(n, g) for n, g in grads.items()}
            finite = _all_finite(list(bad.values()), any(shards.values()), layout.replicas)
        grads = self._clip(grads, shards)
        if built.step is None:
            raise InternalError("a training program has no step counter")
        one = popxl.constant(np.float32(1.0))
        ops.var_updates.accumulate_(built.step, one if finite is None else _f32(finite))
        for name in built.groups:
            with self._on(name):
                self._update(name, grads[name], shards[name], finite)
        if finite is not None:
            self._adapt_scale(finite)
        for name in built.groups:
            if anchors is not None and anchors.wanted(UPDATED + name):
                with self._on(name):
                    anchors.step(UPDATED + name, read_stored(built.weights[name]))
        for name, var in self.accums.items():
            with self._on(name):
                zeroed = loaded[name] if name in loaded else read_stored(var)
                ops.var_updates.accumulator_zero_(zeroed)
                flush(var, zeroed)

    def _bad_count(self, name: str, g: popxl.Tensor) -> popxl.Tensor:
        """How many elements of ``g`` are inf or NaN (counted on the weight's IPU, then
        moved to IPU 0)."""
        with self._on(name):
            bad = ops.sum(_f32(ops.logical_not(ops.isfinite(g))))
        return self.here(bad)

    def _clip(
        self, grads: dict[str, Any], shards: dict[str, popxl.ReplicaGrouping | None]
    ) -> dict[str, Any]:
        """Scale the gradients so their global norm is at most ``max_grad_norm``
        (``torch.nn.utils.clip_grad_norm_``)."""
        max_norm = self.spec.max_grad_norm
        if max_norm == float("inf") or not grads:
            return grads
        squares = []
        for name, g in grads.items():
            with self._on(name):
                s = ops.sum(g * g)
                if shards[name] is not None:  # add up the shards of every replica of the group
                    s = ops.collectives.replicated_all_reduce(s, "add", shards[name])
            squares.append(self.here(s))
        total = squares[0]
        for s in squares[1:]:
            total = total + s
        norm = ops.sqrt(total)
        coef = max_norm / (norm + 1e-6)
        one = popxl.constant(np.float32(1.0))
        coef = ops.where(ops.greater(coef, one), one, coef)
        clipped = {}
        for name, g in grads.items():
            with self._on(name):
                clipped[name] = g * self.here(coef)
        return clipped

    def _update(
        self,
        name: str,
        grad: popxl.Tensor,
        sharding: popxl.ReplicaGrouping | None,
        finite: popxl.Tensor | None,
    ) -> None:
        """Update weight ``name`` and its optimiser state: whole tensors, or (``sharding``)
        this replica's shards, with the new weight gathered where it is kept whole."""
        built = self.built
        var = built.weights[name]
        w_loaded = read_stored(var)
        w = _as_shard(var, w_loaded, sharding)
        w32 = w if w.dtype == popxl.float32 else ops.cast(w, popxl.float32)
        h = {a: self.hyper(name, a) for a in [*self.rule.attrs, *self.rule.internal]}
        slots = built.state[name]
        state_loaded = {slot: read_stored(v) for slot, v in slots.items()}
        state = {slot: _as_shard(slots[slot], t, sharding) for slot, t in state_loaded.items()}
        keep = finite is not None
        before = {slot: ops.identity(t) for slot, t in state.items()} if keep else {}
        with sharded_update(sharding):
            new = self.rule.update(w32, grad, state, h, self.here(built.step))
        if finite is not None:
            # An overflowing step changes nothing: keep the old weight and state.
            finite = self.here(finite)
            new = ops.where(finite, new, w32)
            for slot, old in before.items():
                ops.var_updates.copy_var_update_(state[slot], ops.where(finite, state[slot], old))
        _put_back(var, w_loaded, new, sharding)
        for slot, v in slots.items():
            if sharding is not None and shard_group(v) is None:
                _put_back(v, state_loaded[slot], state[slot], sharding)
            else:
                flush(v, state_loaded[slot])

    def _adapt_scale(self, finite: popxl.Tensor) -> None:
        """Automatic loss scaling: back off on overflow, grow after a run of good steps
        (the factor applied to the optimiser's loss scaling)."""
        factor = self.built.hyper[(0, "loss_scale_update_factor")]
        good = self.built.good_steps
        if good is None:
            raise InternalError("automatic loss scaling runs without its good-step counter")
        t = self.training
        zero = popxl.constant(np.float32(0.0))
        counted = ops.where(finite, good + 1.0, zero)
        grow = ops.greater(counted, popxl.constant(np.float32(t.als_growth_interval - 0.5)))
        change = ops.where(
            finite,
            ops.where(
                grow,
                popxl.constant(np.float32(t.als_growth_factor)),
                popxl.constant(np.float32(1.0)),
            ),
            popxl.constant(np.float32(t.als_backoff_factor)),
        )
        ops.var_updates.copy_var_update_(factor, factor * change)
        ops.var_updates.copy_var_update_(good, ops.where(grow, zero, counted))


def _zeros_like(
    w: popxl.Variable, dtype: popxl.dtype, name: str, settings: TensorLocationSettings
) -> popxl.Variable:
    """Zeros with ``w``'s (whole) shape and replica grouping (one value per group), placed
    as ``settings`` say."""
    group = w.replica_grouping
    lead = (group.num_groups,) if group.num_groups > 1 else ()
    data = np.zeros(lead + full_shape(w), dtype.as_numpy())
    return place(data, dtype, name, group, settings)


def _as_shard(
    var: popxl.Variable, loaded: popxl.Tensor, sharding: popxl.ReplicaGrouping | None
) -> popxl.Tensor:
    """``loaded`` (``var`` as stored) in the form the update uses: as is, or this
    replica's shard of the whole tensor when the update is sharded but ``var`` is not."""
    if sharding is None or shard_group(var) is not None:
        return loaded
    return ops.collectives.replica_sharded_slice(loaded, sharding)


def _put_back(
    var: popxl.Variable,
    loaded: popxl.Tensor,
    value: popxl.Tensor,
    sharding: popxl.ReplicaGrouping | None,
) -> None:
    """Write ``value`` (in the update's form) to ``var`` (read as ``loaded``)."""
    if sharding is not None and shard_group(var) is None:
        whole = ops.collectives.replicated_all_gather(value, group=sharding, output_shape="concat")
        value = ops.reshape(whole, var.shape)
    write_stored(var, loaded, value)


def _offload_activations(
    args: dict[popxl.Tensor, popxl.Tensor], settings: TensorLocationSettings
) -> dict[popxl.Tensor, popxl.Tensor]:
    """``setActivationLocation`` off chip: the forward values the backward needs (not the
    weights) pass through streaming memory: stored after the forward, loaded for the
    backward."""
    moved = {}
    for key, t in args.items():
        if isinstance(t, popxl.Variable) or not is_off_chip(settings, t.shape):
            moved[key] = t
            continue
        buffer = popxl.remote_buffer(t.shape, t.dtype, 1)
        ops.remote_store(buffer, 0, t)
        moved[key] = ops.remote_load(buffer, 0, f"{t.name}_reloaded")
    return moved


def _f32(t: popxl.Tensor) -> popxl.Tensor:
    return ops.cast(t, popxl.float32)


def _all_finite(bad: list[popxl.Tensor], sharded: bool, replicas: int) -> popxl.Tensor:
    """A bool scalar: no gradient has an inf or NaN, from each gradient's count of them.
    With sharded gradients every replica counts its shards' bad values and the counts are
    summed, so all replicas agree."""
    total = bad[0]
    for b in bad[1:]:
        total = total + b
    if sharded and replicas > 1:
        total = ops.collectives.replicated_all_reduce(total, "add")
    return ops.equal(total, popxl.constant(np.float32(0.0)))


def _inverse(loss_scaling: Any, divisor: int) -> Any:
    if isinstance(loss_scaling, popxl.Tensor):
        return 1.0 / (loss_scaling * float(divisor))
    return 1.0 / (float(loss_scaling) * divisor)


def _key_of(fwd: Any, t: popxl.Tensor) -> str:
    for key, arg in fwd.args.to_dict().items():
        if arg is t:
            return key
    raise KeyError(t.name)
