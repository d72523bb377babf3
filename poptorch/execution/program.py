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
from typing import Any

import numpy as np

import popxl
import popxl_addons as addons
from popxl import ops
from popxl.session_options import RecomputationType
from popxl_addons.transforms.repeat_graph import repeat_graph

from ..blocks import recording
from ..compat.lowering_log import log_placements
from ..enums import CommGroupType, OutputMode
from ..errors import Error
from ..optim.optimizers import Optimizer
from ..options.core import (
    Options,
    TensorLocationSettings,
    _TensorLocationOptions,
    resolved_output_mode,
)
from . import host_io as _host_io
from . import instances as _instances
from . import staged as _staged
from .anchors import Anchors
from .layout import (
    Built,
    ForwardModel,
    Interface,
    Layout,
    replica_grouping,
)
from .staged import block_ranges
from .storage import (
    place,
    read,
    write,
)
from .trainer import Trainer, loss_dependencies, offload_activations

LOSS_MISSING_MSG = (
    "trainingModel needs a loss: {cls}.build must return it, marked with "
    "poptorch.identity_loss(x, reduction='mean') or as its last output (a scalar). It "
    "returned {n} output(s)."
)
NO_LOSS_MSG = (
    "Couldn't find a loss in graph: {cls} marks no output with poptorch.identity_loss, and "
    "its last output, taken as the loss, has shape {shape}. The loss must be a scalar (or one element): reduce "
    "it with poptorch.identity_loss(x, reduction='mean') or 'sum' and return it."
)
LOSS_SHAPE_MSG = (
    "The loss must be a scalar (or one element), but {cls}.build's loss has shape {shape}. Reduce it with "
    "poptorch.identity_loss(x, reduction='mean') or 'sum'."
)


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
        from ..ops import torch_ops as _torch_ops  # noqa: PLC0415 (torch only for torch models)

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


def build(
    module: ForwardModel,
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
    options.apply_to_session_options(ir.session_options, training)
    main = ir.main_graph
    scope = options.model_name or ""
    with main, popxl.name_scope(scope) if scope else contextlib.nullcontext():
        inputs = [popxl.h2d_stream(s.shape, s.dtype, f"input{i}") for i, s in enumerate(specs)]
        # Initial values draw from NumPy's generator: a factory its first value when the
        # graph is made, further ones (groups of replicas) when the weights are placed.
        with _seeded(options.random_seed):
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
            named = _init(facts, locations.weight)
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
    if training:
        # A model's layers as calls of one graph: inlined where XLA runs a training step
        # faster than with a scan. Inference keeps the scan, measured faster inlined only
        # for ViT-Tiny (BERT 3.3 -> 3.9 ms, Llama 5.0 -> 6.5, the encoder 33.9 -> 36.4).
        from runtime.lowering.runs import prefer_inline  # noqa: PLC0415 (runtime imported lazily)

        prefer_inline(ir)
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


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Within: NumPy's global generator seeded by ``Options.randomSeed`` (a 64-bit seed as
    its two 32-bit words), as the weights' initial values draw from it; restored after.
    Nothing changes without a seed."""
    if seed is None:
        yield
        return
    saved = np.random.get_state()
    np.random.seed(seed if seed < 2**32 else [seed & 0xFFFFFFFF, seed >> 32])
    try:
        yield
    finally:
        np.random.set_state(saved)


def _init(facts: Any, settings: TensorLocationSettings) -> dict[str, popxl.Variable]:
    """The module's weights, from their factories."""
    return {
        key: place(f.next_data(), f.dtype, key, f.replica_grouping, settings)
        for key, f in sorted(facts.to_dict().items())
    }


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
        if not _one_element(outs[index].shape):
            raise NoLossError(NO_LOSS_MSG.format(cls=cls, shape=outs[index].shape), "poptorch")
    if not _one_element(outs[index].shape):
        raise ValueError(LOSS_SHAPE_MSG.format(cls=cls, shape=outs[index].shape))
    return index


def _one_element(shape: tuple[int, ...]) -> bool:
    """A loss is a scalar or, as PopTorch took it, any tensor of one element (``(1,)``)."""
    return int(np.prod(shape)) == 1


def _build_body(
    built: Built, fwd: Any, optimizer: Optimizer | None, layout: Layout, options: Options
) -> None:
    main = built.ir.main_graph
    interface = built.forward_interface()
    specs = _output_specs(built, fwd, layout)
    keep = _output_holders(built, specs, layout)
    trainer = Trainer(built, fwd, optimizer, options) if _trains(built, fwd, optimizer) else None
    # Micro-batch: load, forward (and backward), handle the outputs.
    overlaps = interface.overlaps
    xs = [_host_io.load(s, i, overlaps) for i, s in enumerate(built.inputs)]
    on_chip = {k: read(v) for k, v in built.weights.items()}
    if built.anchors is not None:
        for name, value in on_chip.items():
            built.anchors.weight(name, value)
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
    weights are all frozen (``requires_grad=False``), or none of whose trainable weights
    the loss reads (a dropout module in eval mode with a dummy parameter), only runs its
    forward, as in PopTorch. (A model that declares no weights at all is refused:
    ``NO_WEIGHTS_MSG``.)"""
    if optimizer is None or built.interface is None:
        return optimizer is not None
    if not built.weights:
        return True
    args = fwd.args.to_dict()
    used = loss_dependencies(fwd.graph.outputs[built.loss_index])
    trained = set(built.interface.trained(fwd))
    return any(n in trained and args[n] in used for n in built.weights)


def _output_specs(built: Built, fwd: Any, layout: Layout) -> list[popxl.TensorSpec]:
    """The forward outputs the host receives (per micro-batch), with one device-to-host
    stream each (a store carries ``layout.rows_per_store`` micro-batches' values)."""
    outs = [fwd.graph.outputs[i] for i in built.forward_interface().host_outputs]
    specs = [popxl.TensorSpec(o.shape, o.dtype) for o in outs]
    built.output_specs = specs
    rows = layout.rows_per_store
    model_outputs = built.forward_interface().n_outputs
    built.outputs = [
        popxl.d2h_stream(
            (rows, *s.shape) if rows > 1 and i < model_outputs else s.shape, s.dtype, f"output{i}"
        )
        for i, s in enumerate(specs)
    ]
    return specs


def _write_state(built: Built, on_chip: dict[str, popxl.Tensor], outs: Sequence[Any]) -> None:
    """Buffers the forward updated (BatchNorm statistics, counters, the random seed): their
    new values become the variables' values for the next micro-batch."""
    for index, name in built.forward_interface().state_indices():
        write(built.weights[name], on_chip[name], outs[index])


def _finish(
    built: Built, trainer: Trainer | None, keep: list, layout: Layout, looped: bool
) -> None:
    """After the micro-batch loop: the optimiser step, then the device-iteration loops
    with the stores each output mode needs. ``looped``: the first of those loops is
    already built (an inference pipeline over the device iterations, which holds every
    iteration's output with ``EveryN``)."""
    main = built.ir.main_graph
    # One device iteration: reduce and update.
    if trainer is not None:
        trainer.optimizer_step(layout)
    # Device iterations, with the stores each output mode needs.
    first = 1 if looped else None
    if looped and layout.mode == OutputMode.EveryN:
        _repeat(main, 1)
        _store(built, keep, rows=range(layout.period - 1, layout.device_iterations, layout.period))
        return
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
    if _staged.is_pipelined(strategy):
        _staged.stage_by_ipu_runs(plans)
    stage_ids = sorted({p.stage for p in plans})
    pipelined = _staged.is_pipelined(strategy) and len(stage_ids) > 1
    training = _trains(built, fwd, optimizer)
    specs = _output_specs(built, fwd, layout)
    # An inference pipeline runs over all the device iterations (as in PopTorch), so with
    # EveryN each iteration's output gets a row and the host receives every N-th row.
    every_n = pipelined and not training and layout.mode == OutputMode.EveryN
    keep = _output_holders(built, specs, layout, layout.device_iterations if every_n else None)
    trainer = Trainer(built, fwd, optimizer, options, whole=False) if training else None
    for p in plans:
        p.stage = stage_ids.index(p.stage)
    recomputes = (
        trainer is not None and pipelined and options.recomputes(len({p.ipu for p in plans}))
    )
    if recomputes and "autoRecomputation" not in options.popart.options:
        built.ir.session_options.autoRecomputation = RecomputationType.Pipeline  # PopTorch's
    pieces = (
        _staged.cut_at_checkpoints(_staged.recompute_units(plans), fwd.graph)
        if recomputes
        else plans
    )
    blocks = _staged.split(fwd.graph, pieces)
    weights_of = {t: key for key, t in fwd.args.to_dict().items()}
    if trainer is not None:
        loss = fwd.graph.outputs[built.loss_index]
        _staged.differentiate(blocks, loss, set(weights_of), recomputes)
        for block in blocks:
            for t in block.inputs:
                if t in weights_of:
                    trainer.ipu_of.setdefault(weights_of[t], block.plan.ipu)
    steps = layout.accumulation if training else layout.device_iterations
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
    trainer: Trainer | None,
    keep: list,
    layout: Layout,
    pipeline: Any,
    weights_of: dict[popxl.Tensor, str],
) -> None:
    """One micro-batch through the blocks: host loads, forward calls, outputs, and the
    backward calls in reverse order."""
    stager = _staged.Stager(pipeline, len({b.plan.stage for b in blocks}), trainer is not None)
    data = [t for t in fwd.graph.inputs if t not in weights_of][: len(built.inputs)]
    consumers: dict[popxl.Tensor, set[int]] = {}
    for block in blocks:
        for t in block.inputs:
            consumers.setdefault(t, set()).add(block.plan.ipu)
    interface = built.forward_interface()
    outputs = fwd.graph.outputs
    out_index = {outputs[j]: k for k, j in enumerate(interface.host_outputs)}
    state_of = {outputs[j]: name for j, name in interface.state_indices()}
    state_homes = _staged.state_homes(blocks, weights_of)
    written = set(state_of.values())
    vals, infos = _staged.Values(), {}
    for b, block in enumerate(blocks):
        plan = block.plan
        stage = stager.forward_stage(plan)
        with stager.forward(plan):
            for i, t in enumerate(data):
                if not vals.has(t) and (t in block.inputs or b == 0 and t not in consumers):
                    loaded = _host_io.load(built.inputs[i], i, interface.overlaps)
                    vals.set(t, loaded, plan.ipu, stage)
                    _copy_ahead(vals, t, consumers, pipeline)
            for t in block.inputs:
                if t in weights_of and weights_of[t] in written and not vals.has(t):
                    # State the model itself updates (the random seed): read once per
                    # micro-batch and carried with it like an activation, so every block
                    # and a recomputing backward see this micro-batch's value.
                    name = weights_of[t]
                    vals.set(t, ops.identity(read(built.weights[name]), name), plan.ipu, stage)
            args = [
                read(built.weights[weights_of[t]])
                if t in weights_of and weights_of[t] not in written
                else vals.at(t, plan.ipu, stage, pipeline)
                for t in block.inputs
            ]
            info = ops.call_with_info(block.graph, *args)
            infos[b] = info
            for t, out in zip(block.outputs, info.outputs):
                vals.set(t, out, plan.ipu, stage)
                _copy_ahead(vals, t, consumers, pipeline)
                if t in out_index:
                    _handle_output(built, out_index[t], out, keep, layout.mode)
                if t in state_of:
                    name = state_of[t]
                    home = state_homes.get(name, plan.ipu)
                    _staged.write_state(built.weights[name], t, vals, plan, home, stager)
    if trainer is not None:
        _staged_backward(built, blocks, trainer, stager, infos, vals, weights_of)


def _copy_ahead(
    vals: Any, t: popxl.Tensor, consumers: dict[popxl.Tensor, set[int]], pipeline: Any
) -> None:
    """Copy ``t`` to the other IPUs that read it, in its producer's IPU context (in a
    pipeline, ``Values.at`` makes each copy in the stage that must send it)."""
    if pipeline is not None:
        return
    for ipu in sorted(consumers.get(t, ())):
        vals.on(t, ipu)


def _staged_backward(
    built: Built,
    blocks: list[_staged.BlockGraph],
    trainer: Trainer,
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
        stage = stager.backward_stage(plan)
        with stager.backward(plan):
            provided = []
            for t in block.provided:
                if t is loss:
                    provided.append(trainer.seed())
                elif grads.has(t):
                    provided.append(grads.at(t, plan.ipu, stage, stager.pipeline))
                else:
                    provided.append(_staged.zeros_like(t))
            if stager.pipeline is not None:
                acts = stager.pipeline.stash_and_restore_activations(infos[b], block.grad)
            else:
                acts = block.grad.inputs_dict(infos[b])
            acts = offload_activations(acts, built.locations.activation)
            outs = ops.call(block.grad.graph, *provided, inputs_dict=acts)
            for t, g in zip(block.required, outs):
                if t in weights_of:
                    trainer.accumulate(weights_of[t], g)
                    continue
                if grads.has(t):
                    g = grads.at(t, plan.ipu, stage, stager.pipeline) + g
                grads.set(t, g, plan.ipu, stage)
                if stager.pipeline is None:
                    grads.on(t, vals.homes[t])  # back to the producer's IPU, copied early


def _repeat(graph: popxl.Graph, count: int) -> None:
    """``repeat_graph``, leaving the weights-from/to-host fragment ops (which load and
    store on-chip replica-sharded variables' shards) outside the loop."""
    fragments = [op for op in graph._ops if op.execution_context != "Normal"]
    graph._ops = [op for op in graph._ops if op.execution_context == "Normal"]
    repeat_graph(graph, count)
    graph._ops = [*fragments, *graph._ops]


def _output_holders(
    built: Built, specs: list[popxl.TensorSpec], layout: Layout, rows: int | None = None
) -> list[popxl.Variable]:
    """Variables holding the model's outputs between stores (none for ``All``): a float32
    sum (``Sum``), the last value (``Final``, ``EveryN``), or with ``EveryN`` and gradient
    accumulation (or ``rows`` given: an inference pipeline's device iterations) every
    micro-batch's value, one row each, written at a per-output row counter
    (``built.output_rows``). Inputs the model writes in place need none: every
    micro-batch's value goes to the host, whatever the output mode, so the whole input is
    written back."""
    mode = layout.mode
    if mode == OutputMode.All:
        return []
    specs = specs[: built.forward_interface().n_outputs]

    def dtype(s):
        return popxl.float32 if mode == OutputMode.Sum and s.dtype.is_floating_point else s.dtype  # noqa: E731

    rows = rows or layout.rows_per_store
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
    if mode == OutputMode.All or i >= built.forward_interface().n_outputs:
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


def _store(built: Built, keep: list, rows: Sequence[int] | None = None) -> None:
    """Send the held outputs to the host: whole, or one store per row in ``rows``."""
    for i, (stream, held) in enumerate(zip(built.outputs, keep)):
        value = held if held.dtype == stream.dtype else ops.cast(held, stream.dtype)
        for part in [value] if rows is None else [value[r] for r in rows]:
            _host_io.store(stream, i, part, built.forward_interface().overlaps)
