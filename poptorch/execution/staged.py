"""Execution strategies: a model split into blocks, placed on IPUs, pipelined or phased.

When a module marks blocks (``poptorch.Block`` / ``poptorch.BeginBlock``, see
``blocks``), its forward graph is cut into one subgraph per block (in op order) and the
program calls them one after another, each under ``popxl.ipu(k)`` of its stage; values
that cross IPUs go through ``ipu_copy``. Training differentiates each block's graph
separately and calls the gradient graphs in reverse order on the same IPUs, passing
gradients back with ``ipu_copy``; each weight's accumulator and update live on the IPU of
the block that uses it. On a machine with as many JAX devices as IPUs each IPU's ops run on
its own device (``runtime.devices.placement``).

* ``ShardedExecution``: the blocks run one after another, each micro-batch in turn.
* ``PipelinedExecution``: the micro-batch loop is a ``popxl_addons.pipelined_execution``
  pipeline whose stages are the runs of consecutive blocks on one IPU (PopTorch merged
  them): forward stage ``s`` is pipeline stage ``s``, its backward is pipeline stage
  ``2(S-1) - s`` on the same IPU (the last stage's forward and backward share a stage),
  activations are stashed between a stage's forward and backward. It needs at least as
  many micro-batches as pipeline stages (PopTorch's rule): gradient accumulation when
  training, device iterations (per output) when not.
* ``SerialPhasedExecution`` / ``ParallelPhasedExecution``: the phases run in order (the
  backward in reverse); weights, optimiser state and accumulators whose location is not
  set explicitly live in remote buffers, loaded when their phase runs and stored after
  the update, and with ``Liveness.OffChipAfter*`` the activations the backward needs go
  through streaming memory too. Parallel phases alternate between even and odd IPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

import popxl
from popxl import ops
from popxl.errors import InternalError
from popxl.transforms import autodiff
from popxl_addons.graph import GraphWithNamedArgs
from popxl_addons.transforms.recomputation import recompute_graph

from ..blocks import Mark
from ..enums import AutoStage, Liveness
from ..errors import Error
from ..strategies import (
    ExecutionStrategy,
    ParallelPhasedExecution,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
)
from .storage import read, write

UNLISTED_MSG = (
    "Block {block!r} is in no Stage of the {cls}. Every block the model marks must be listed, "
    "e.g. {cls}(Stage({blocks})) (blocks: {all})."
)
ORDER_MSG = (
    "Block {block!r} runs after block {before!r} but is given an earlier {what} ({got} < "
    "{prev}). Stages and phases must follow the order in which the model's blocks run."
)
PIPELINE_EDGE_MSG = (
    "PipelinedExecution runs a micro-batch's stages in order, but block {block!r} (stage "
    "{stage}, IPU {ipu}) reads {what} made in the later stage {src} on IPU {src_ipu}. Give "
    "blocks stages in the order they run."
)
STATE_LAST_STAGE_MSG = (
    "Block {block!r} (the last stage of an inference pipeline, IPU {ipu}) updates the model "
    "state {name!r}, which IPU {home} holds (the first block that reads it runs there), and "
    "no later stage can carry the new value to IPU {home}. Update it in a block on IPU "
    "{home}, or use ShardedExecution."
)
PIPELINE_TRAINING_STEPS_MSG = (
    "poptorch.Options().Training.gradientAccumulation must be greater than or equal to the "
    "number of pipeline stages ({stages}) when using poptorch.PipelinedExecution. Please note "
    "that a model with {forward} pipeline stages in PopTorch will have an additional "
    "{backward} stages when training."
)
PIPELINE_INFERENCE_STEPS_MSG = (
    "poptorch.Options().deviceIterations must be greater than or equal to the number of "
    "pipeline stages ({stages}) when using PopTorch.PipelinedExecution."
)


# The block of the ops that run before the model starts one (PopTorch's initial IPU 0).
DEFAULT_BLOCK = "<before the first block>"
RECOMPUTATION_CHECKPOINT = "poptorch::recomputation_checkpoint"  # its op's type


@dataclass
class BlockPlan:
    """One block: its ops, its stage, phase and IPU."""

    name: str
    start: int
    stop: int
    stage: int = 0
    phase: int = 0
    ipu: int = 0
    hint: int | None = None  # the IPU its ``Block(ipu_id=...)`` asked for


def block_ranges(marks: list[Mark], graph: popxl.Graph) -> list[BlockPlan]:
    """The blocks of ``graph`` as op ranges, from the recorded block starts (empty ranges
    dropped). Ops before the first start form PopTorch's default block, on IPU 0 in stage
    and phase 0."""
    mine = [m for m in marks if m.graph is graph]
    n = len(graph._ops)
    plans: list[BlockPlan] = []
    if mine and mine[0].start > 0:
        plans.append(BlockPlan(DEFAULT_BLOCK, 0, mine[0].start))
    for k, mark in enumerate(mine):
        stop = mine[k + 1].start if k + 1 < len(mine) else n
        start = mark.start
        if stop <= start:
            continue
        if plans and plans[-1].name == mark.user_id and plans[-1].hint == mark.ipu_id:
            plans[-1].stop = stop
            continue
        plans.append(BlockPlan(mark.user_id, start, stop, ipu=mark.ipu_id or 0, hint=mark.ipu_id))
    return plans


def _hints(marks: list[Mark]) -> dict[str, int | None]:
    return {m.user_id: m.ipu_id for m in marks}


def place_blocks(plans: list[BlockPlan], strategy: ExecutionStrategy, marks: list[Mark]) -> None:
    """Give each block its stage, phase and IPU as ``strategy`` says (in place)."""
    hints = _hints(marks)
    placed = [p for p in plans if p.name != DEFAULT_BLOCK]  # the default stays at 0
    if isinstance(strategy, (SerialPhasedExecution, ParallelPhasedExecution)):
        _place_phased(placed, strategy, hints)
    elif strategy.stages:
        _place_listed(placed, strategy, strategy.stages, hints)
    else:
        _place_auto(placed, strategy.auto_stage, hints)
    _check_order(plans)


def _unlisted(plans: list[BlockPlan], strategy: ExecutionStrategy, block: str) -> ValueError:
    names = [p.name for p in plans]
    listed = ", ".join(repr(n) for n in names)
    return ValueError(
        UNLISTED_MSG.format(block=block, cls=type(strategy).__name__, blocks=listed, all=names)
    )


def _place_listed(
    plans: list[BlockPlan],
    strategy: ExecutionStrategy,
    stages: list[Stage],
    hints: dict[str, int | None],
) -> None:
    where = {b: (i, s) for i, s in enumerate(stages) for b in s.blocks}
    for p in plans:
        if p.name not in where:
            raise _unlisted(plans, strategy, p.name)
        index, stage = where[p.name]
        hint = hints.get(p.name)
        p.stage = index
        p.ipu = stage.ipu_id if stage.ipu_id is not None else hint if hint is not None else index


def _place_auto(plans: list[BlockPlan], auto: AutoStage, hints: dict[str, int | None]) -> None:
    """``AutoIncrement``: each new block id gets the next stage, counting from 1 (the
    default block holds stage 0), and by default the IPU of its stage number; ``SameAsIpu``:
    the stage is the IPU, a block without one staying on the IPU before it."""
    ipu = 0
    stages: dict[str, int] = {}
    for p in plans:
        hint = hints.get(p.name)
        if auto == AutoStage.AutoIncrement:
            p.stage = stages.setdefault(p.name, len(stages) + 1)
            p.ipu = hint if hint is not None else p.stage
        else:
            ipu = hint if hint is not None else ipu
            p.stage = p.ipu = ipu


def _place_phased(plans: list[BlockPlan], strategy: Any, hints: dict[str, int | None]) -> None:
    parallel = isinstance(strategy, ParallelPhasedExecution)
    where = {}
    for phase_index, phase in enumerate(strategy.phases):
        for position, stage in enumerate(phase.stages):
            default = 2 * position + phase_index % 2 if parallel else position
            for b in stage.blocks:
                where[b] = (phase_index, stage.ipu_id, default)
    for p in plans:
        if p.name not in where:
            raise _unlisted(plans, strategy, p.name)
        p.phase, stage_ipu, default = where[p.name]
        # The stage's IPU if it names one, else the block's own, else the strategy's default.
        p.ipu = next(i for i in (stage_ipu, p.hint, default) if i is not None)
        p.stage = p.phase


def stage_by_ipu_runs(plans: list[BlockPlan]) -> None:
    """A pipeline's stages as PopTorch made them: consecutive blocks on one IPU are one
    stage, a new one starting wherever the IPU changes (``CompilerImpl::numPipelineStages``
    counts the IPU switches): a model whose blocks sit on IPUs 0, 1, 1, 1, 0 is pipelined in
    three stages and needs three micro-batches, five when training."""
    stage, ipu = -1, None
    for p in plans:
        if p.ipu != ipu:
            stage, ipu = stage + 1, p.ipu
        p.stage = stage


def recompute_units(plans: list[BlockPlan]) -> list[BlockPlan]:
    """The pieces a recomputing pipeline's backward runs again: each stage's blocks as one
    (PopART recomputed a whole stage from the values entering it), cut after every
    ``poptorch.recomputationCheckpoint`` (see ``cut_at_checkpoints``). Values passed between
    blocks of one stage are recomputed, not stashed. A merged piece is named after its
    blocks, joined by ``+``."""
    units: list[BlockPlan] = []
    for p in plans:
        if units and units[-1].stage == p.stage and units[-1].ipu == p.ipu:
            last = units[-1]
            units[-1] = replace(last, name=f"{last.name}+{p.name}", stop=p.stop)
        else:
            units.append(replace(p))
    return units


def cut_at_checkpoints(plans: list[BlockPlan], graph: popxl.Graph) -> list[BlockPlan]:
    """``plans`` with each block before the last stage cut after every
    ``poptorch.recomputationCheckpoint`` in it: a recomputing backward then recomputes each
    piece from its own inputs, the checkpointed values among them (stashed, as PopART stashed
    checkpoints), rather than the whole block from the block's inputs. The pieces keep their
    block's stage and IPU; the second and later are named ``<block>.1``, ``<block>.2``."""
    ops = graph._ops
    last = max((p.stage for p in plans), default=0)
    pieces: list[BlockPlan] = []
    for p in plans:
        marked = range(p.start, p.stop - 1) if p.stage != last else range(0)
        cuts = [i + 1 for i in marked if ops[i].type == RECOMPUTATION_CHECKPOINT]
        for k, (start, stop) in enumerate(zip([p.start, *cuts], [*cuts, p.stop])):
            pieces.append(replace(p, name=f"{p.name}.{k}" if k else p.name, start=start, stop=stop))
    return pieces


def _check_order(plans: list[BlockPlan]) -> None:
    for before, p in zip(plans, plans[1:]):
        if p.stage < before.stage:
            raise ValueError(
                ORDER_MSG.format(
                    block=p.name, before=before.name, what="stage", got=p.stage, prev=before.stage
                )
            )


def describe(plans: list[BlockPlan], strategy: ExecutionStrategy) -> str:
    """One line per block: stage, phase, IPU."""
    lines = [f"Execution strategy: {type(strategy).__name__}"]
    phased = isinstance(strategy, (SerialPhasedExecution, ParallelPhasedExecution))
    for p in plans:
        where = f"phase {p.phase}" if phased else f"stage {p.stage}"
        lines.append(f"  block {p.name!r}: {where}, IPU {p.ipu} ({p.stop - p.start} ops)")
    return "\n".join(lines)


# Splitting the forward graph -------------------------------------------------------------


@dataclass
class BlockGraph:
    """One block's subgraph: which forward-graph tensors it reads and produces."""

    plan: BlockPlan
    graph: popxl.Graph
    inputs: list[popxl.Tensor]  # forward-graph tensors, one per graph input
    outputs: list[popxl.Tensor] = field(default_factory=list)  # forward-graph tensors
    provided: list[popxl.Tensor] = field(default_factory=list)  # outputs given gradients
    required: list[popxl.Tensor] = field(default_factory=list)  # inputs needing gradients
    grad: Any = None


def split(graph: popxl.Graph, plans: list[BlockPlan]) -> list[BlockGraph]:
    """Move the ops of each block of ``graph`` into a subgraph of their own."""
    ops_of = [list(graph._ops[p.start : p.stop]) for p in plans]
    producer = {t: b for b, block_ops in enumerate(ops_of) for op in block_ops for t in op.outputs}
    used_later: set[popxl.Tensor] = set(graph.outputs)
    for b, block_ops in enumerate(ops_of):
        for op in block_ops:
            used_later.update(t for t in op.inputs if producer.get(t, b) != b)
    ir = graph.ir
    blocks = []
    graph._ops = []
    for plan, block_ops in zip(plans, ops_of):
        sub = ir.create_empty_graph(f"block_{plan.name}")
        produced = {t for op in block_ops for t in op.outputs}
        external = list(
            dict.fromkeys(
                t
                for op in block_ops
                for t in op.inputs
                if t not in produced and not isinstance(t, popxl.Constant)
            )
        )
        mapping: dict[popxl.Tensor, popxl.Tensor] = {}
        with sub:
            for t in external:
                mapping[t] = popxl.graph_input(t.shape, t.dtype, t.name, meta_shape=t.meta_shape)
        for op in block_ops:
            _move(op, graph, sub, mapping)
        block = BlockGraph(plan, sub, external)
        with sub:
            for t in block_ops_outputs(block_ops):
                if t in used_later:
                    popxl.graph_output(t)
                    block.outputs.append(t)
        blocks.append(block)
    return blocks


def block_ops_outputs(block_ops: list[Any]) -> Iterator[popxl.Tensor]:
    for op in block_ops:
        yield from op.outputs


def _move(op: Any, source: popxl.Graph, target: popxl.Graph, mapping: dict) -> None:
    new_inputs = []
    for t in op.inputs:
        if t in mapping:
            t._consumers.remove(op)
            t = mapping[t]
            t._consumers.append(op)
        elif isinstance(t, popxl.Constant) and t._graph is source:
            if t not in mapping:
                with target:
                    mapping[t] = popxl.constant(t.data, t.dtype, t.name)
            t = mapping[t]
        new_inputs.append(t)
    op.inputs = tuple(new_inputs)
    op.graph = target
    gid = source.id
    for out in op.outputs:
        name = out._id[len(gid) + 1 :] if gid else out._id
        source._tensors.pop(out.id, None)
        out._graph = target
        out._id = f"{target.id}/{name}"
        target._tensors[out.id] = out
    target._ops.append(op)


def differentiate(
    blocks: list[BlockGraph], loss: popxl.Tensor, weights: set, recompute: bool = False
) -> None:
    """Each block's gradient graph: gradients of its float outputs that the loss depends
    on, to its float inputs that are weights or earlier blocks' outputs. With ``recompute``
    (PopART's ``autoRecomputation``; ``blocks`` are then ``recompute_units``), the gradient
    graph of a block before the last stage runs the block's forward again instead of taking
    its activations, so a pipeline stashes only those of the block's inputs its gradient
    depends on (the last stage's backward runs in its forward's stage: nothing of it is
    stashed)."""
    last = max(block.plan.stage for block in blocks)
    made: set[popxl.Tensor] = set()
    for block in blocks:
        block.required = [
            t for t in block.inputs if t.dtype.is_floating_point and (t in weights or t in made)
        ]
        made.update(block.outputs)
    needed: set[popxl.Tensor] = {loss}
    for block in reversed(blocks):
        block.provided = [t for t in block.outputs if t in needed and t.dtype.is_floating_point]
        if block.provided and block.required:
            grads_provided = [block.graph.outputs[block.outputs.index(t)] for t in block.provided]
            grads_required = [block.graph.inputs[block.inputs.index(t)] for t in block.required]
            block.grad = autodiff(block.graph, grads_provided, grads_required)
            if recompute and block.plan.stage != last:
                whole = GraphWithNamedArgs.from_grad_graph(block.grad)
                block.grad = recompute_graph(whole, needed_only=True).grad_graph_info
            needed.update(block.required)


# Building the micro-batch ---------------------------------------------------------------


class Stager:
    """Stage and IPU contexts for the micro-batch body (pipelined or not)."""

    def __init__(self, pipeline: Any, stages: int, training: bool = False) -> None:
        self.pipeline = pipeline
        self.stages = stages
        # The pipeline's stages: the forward ones, then the backward ones back down.
        self.pipeline_stages = 2 * stages - 1 if training else stages

    @contextlib.contextmanager
    def forward(self, plan: BlockPlan) -> Iterator[None]:
        with self._stage(plan.stage), popxl.ipu(plan.ipu):
            yield

    @contextlib.contextmanager
    def backward(self, plan: BlockPlan) -> Iterator[None]:
        with self._stage(2 * (self.stages - 1) - plan.stage), popxl.ipu(plan.ipu):
            yield

    def forward_stage(self, plan: BlockPlan) -> int | None:
        """The pipeline stage of ``plan``'s forward pass (``None`` without a pipeline)."""
        return plan.stage if self.pipeline is not None else None

    def backward_stage(self, plan: BlockPlan) -> int | None:
        """The pipeline stage of ``plan``'s backward pass: the stages run back down."""
        return 2 * (self.stages - 1) - plan.stage if self.pipeline is not None else None

    def _stage(self, stage: int) -> Any:
        return self.pipeline.stage(stage) if self.pipeline is not None else contextlib.nullcontext()


class Values:
    """Main-graph values of forward-graph tensors, copied between IPUs where needed, and in
    a pipeline carried from the stage that makes them to the stages that read them."""

    def __init__(self) -> None:
        self.values: dict[popxl.Tensor, popxl.Tensor] = {}
        self.homes: dict[popxl.Tensor, int] = {}
        self.stages: dict[popxl.Tensor, int | None] = {}
        self.copies: dict[tuple, popxl.Tensor] = {}

    def set(
        self, fwd: popxl.Tensor, value: popxl.Tensor, ipu: int, stage: int | None = None
    ) -> None:
        """``fwd``'s (new) value, on ``ipu``, made in pipeline stage ``stage``; copies of an
        older value are forgotten."""
        self.values[fwd] = value
        self.homes[fwd] = ipu
        self.stages[fwd] = stage
        for key in [k for k in self.copies if k[0] is fwd]:
            del self.copies[key]

    def has(self, fwd: popxl.Tensor) -> bool:
        return fwd in self.values

    def on(self, fwd: popxl.Tensor, ipu: int) -> popxl.Tensor:
        """The value on ``ipu`` (an ``ipu_copy`` made in the producer's IPU context)."""
        home = self.homes[fwd]
        if home == ipu:
            return self.values[fwd]
        key = (fwd, ipu)
        if key not in self.copies:
            with popxl.ipu(home):
                self.copies[key] = ops.ipu_copy(self.values[fwd], ipu, home)
        return self.copies[key]

    def at(self, fwd: popxl.Tensor, ipu: int, stage: int | None, pipeline: Any) -> popxl.Tensor:
        """The value for pipeline stage ``stage`` on ``ipu``, of that stage's micro-batch.

        A pipeline passes a value to the next stage by an ``ipu_copy`` made in the producing
        stage (delivered at the end of its cycle); a stage further on, or a later stage on
        the same IPU, would read a later micro-batch's value there. Such a value is stashed
        on its producer's IPU (one slot per micro-batch in flight) and restored in the stage
        that reads it, or, read on another IPU, in the stage before that one, whose copy then
        delivers it (as PopTorch forwarded values through the stages in between)."""
        src = self.stages[fwd]
        if src is None or stage is None or stage == src:
            return self.on(fwd, ipu)
        key = (fwd, ipu, stage)
        if key not in self.copies:
            self.copies[key] = self._carried(fwd, ipu, stage, pipeline)
        return self.copies[key]

    def _carried(self, fwd: popxl.Tensor, ipu: int, stage: int, pipeline: Any) -> popxl.Tensor:
        src, home, value = self.stages[fwd], self.homes[fwd], self.values[fwd]
        if src is None or stage <= src:
            raise InternalError(
                f"pipeline value {fwd.name!r} of stage {src} carried to stage {stage}",
                graph=fwd.graph,
            )
        if home == ipu:
            with popxl.ipu(home):
                return pipeline.stash_and_restore_tensor(value, from_stage=src)
        with pipeline.stage(stage - 1), popxl.ipu(home):
            if stage - 1 > src:
                value = pipeline.stash_and_restore_tensor(value, from_stage=src)
            return ops.ipu_copy(value, ipu, home)


def state_homes(blocks: list[BlockGraph], weights_of: dict[popxl.Tensor, str]) -> dict[str, int]:
    """The IPU that holds each variable of the model: that of the first block reading it."""
    homes: dict[str, int] = {}
    for block in blocks:
        for t in block.inputs:
            if t in weights_of:
                homes.setdefault(weights_of[t], block.plan.ipu)
    return homes


def write_state(
    var: popxl.Variable, fwd: popxl.Tensor, vals: Values, plan: BlockPlan, home: int, stager: Any
) -> None:
    """Set model state ``var`` (e.g. the random seed that each block's dropout advances) to
    the value of ``fwd`` that ``plan``'s block made, on ``home``, the IPU that holds ``var``.

    Made on another IPU, the value is copied there; in a pipeline the copy arrives in the
    next stage (a backward stage when training), where the update runs, so each micro-batch
    leaves its own value.

    Raises:
        ValueError: the block is the last stage of an inference pipeline."""
    if home == plan.ipu:
        write(var, read(var), vals.values[fwd])
        return
    pipeline = stager.pipeline
    if pipeline is None:
        value = vals.on(fwd, home)
        with popxl.ipu(home):
            write(var, read(var), value)
        return
    stage = plan.stage + 1
    if stage >= stager.pipeline_stages:
        raise ValueError(
            STATE_LAST_STAGE_MSG.format(block=plan.name, ipu=plan.ipu, name=var.name, home=home)
        )
    value = vals.at(fwd, home, stage, pipeline)
    with pipeline.stage(stage), popxl.ipu(home):
        write(var, read(var), value)


def check_pipeline_edges(blocks: list[BlockGraph], data: list[popxl.Tensor]) -> None:
    """Raise where a block reads a value that a later stage makes (a pipeline runs the stages
    of one micro-batch in order; any earlier stage's value is carried to a later one)."""
    where: dict[popxl.Tensor, BlockPlan] = {}
    for block in blocks:
        plan = block.plan
        for t in block.inputs:
            if t in data and t not in where:
                where[t] = plan  # a host load in the first stage that reads it
            src = where.get(t)
            if src is not None and src.stage > plan.stage:
                raise ValueError(
                    PIPELINE_EDGE_MSG.format(
                        block=plan.name,
                        stage=plan.stage,
                        ipu=plan.ipu,
                        what=f"input {t.name!r}" if t in data else f"a value ({t.name!r})",
                        src=src.stage,
                        src_ipu=src.ipu,
                    )
                )
        for t in block.outputs:
            where[t] = plan


def zeros_like(t: popxl.Tensor) -> popxl.Tensor:
    return popxl.constant(np.zeros(t.shape, t.dtype.as_numpy()), t.dtype)


def pipeline_steps_check(stages: int, steps: int, training: bool) -> None:
    """PopTorch's rule: at least as many micro-batches per pipeline as pipeline stages
    (``stages`` counts the backward stages of a training pipeline)."""
    if steps >= stages:
        return
    if training:
        message = PIPELINE_TRAINING_STEPS_MSG.format(
            stages=stages, forward=(stages + 1) // 2, backward=(stages - 1) // 2
        )
    else:
        message = PIPELINE_INFERENCE_STEPS_MSG.format(stages=stages)
    raise Error(message, "poptorch_cpp_error")


def is_pipelined(strategy: ExecutionStrategy) -> bool:
    return type(strategy) is PipelinedExecution


def is_phased(strategy: ExecutionStrategy) -> bool:
    return isinstance(strategy, (SerialPhasedExecution, ParallelPhasedExecution))


def offloads_activations(strategy: ExecutionStrategy) -> bool:
    liveness = getattr(strategy, "liveness", Liveness.AlwaysLive)
    return is_phased(strategy) and liveness != Liveness.AlwaysLive


__all__ = ["BlockPlan", "BlockGraph", "ShardedExecution"]
