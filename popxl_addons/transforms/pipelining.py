"""Pipelined execution: ``pipelined_execution(steps)`` and its stage context.

Ops created inside ``pipelined_execution`` are tagged with a pipeline stage
(``pipeline.stage(i)``). When the context closes they are moved out of the graph into one
subgraph per stage and kind (host loads, compute, host stores; every ``ipu_copy`` goes
into one shared copies graph) and the graph gains one call of a ``pipeline_graph`` that
runs the classic schedule over ``steps`` micro-batches in ``steps + S - 1`` cycles:

* **fill** (ramp up): cycles ``0 .. S-2``, where stage ``s`` runs from cycle ``s`` on;
* **main**: cycles ``S-1 .. steps-1``, running every stage;
* **flush** (ramp down): cycles ``steps .. steps+S-2``, where stage ``s`` has finished
  once its last micro-batch ran (cycle ``steps-1+s``).

All cycles are one ``repeat`` of one cycle graph: each stage's pieces are called through
``guarded_<piece>``, a conditional that skips them in cycles where the stage has no
micro-batch, so every stage is compiled once however many cycles the ramps have (PopART
unrolled the ramps instead).

In one cycle stage ``s`` works on micro-batch ``cycle - s``; tensors pass between stages
through ``ipu_copy`` (copied at the end of the cycle, consumed in the next) or through a
stash on the same IPU (``stash_and_restore_tensor``). Placed on several devices (see
``runtime.devices.placement``) the stages of one cycle run concurrently.

When the stages will share one device (``runtime.devices.placement.placement_ipus`` says the
program is not placed), overlapping them gains nothing, and the cycle graph costs compile
time: each stage's layers are compiled once per stage. The pipeline is then one ``repeat``
over the micro-batches of a graph that runs the stages in turn (stage order, program order
within a stage; the copies between IPUs, which copy nothing on one device, left out), so
calls of one graph in several stages are consecutive and compile once. A restored value is
the one its stash took earlier in the same micro-batch (the ring buffers' slots advance
together), so its consumers read that value; the stash and the restore still run, leaving
their buffers and counters as the cycles leave them. It computes exactly
what the cycles compute, given that no stage touches storage, a stream or another effect
that a different stage writes or uses (the stashes excepted: their ring buffers give each
micro-batch its own slot in either order) and no stage reads a later stage's values; a
pipeline that breaks one of these keeps the cycles. The GPT program of
``bench/build_compile.py`` on one device (2026-11-23/24): 1,471 kernels with the ramps
unrolled, 711 as one cycle loop, 398 with the stages in turn (the unpipelined JAX
reference: 363); its step went from 0.89 to 1.15 of the reference's speed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial

import numpy as np

import popxl
from popxl import ops
from popxl._op import Op
from popxl.context import hint_new_ops
from popxl.errors import InternalError
from popxl.graph import Graph
from popxl.ops._base import add_op
from popxl.ops.call import CallSiteInfo
from popxl.transforms import GradGraphInfo
from popxl.transforms._storage import roots

from ..module import Module

__all__ = ["pipelined_execution", "PipelineContext", "Stash", "Restore"]

NO_STAGE_MSG = (
    "Operation {op} was created inside pipelined_execution but outside a stage context. Wrap it "
    "in `with pipeline.stage(i):`; every op of a pipeline belongs to exactly one stage."
)
TOO_FEW_STEPS_MSG = (
    "Pipelining requires the steps at least 2x the number of stages in the pipeline. "
    "steps={steps} stages={stages}"
)
STASH_SIZE_MSG = "Stash must be larger than 1. size={size}, t={t}"
NO_FROM_STAGE_MSG = (
    "If the tensor to be stash does not have a producer `from_stage` must be specified to "
    "`stash_and_restore_tensor`"
)
NOT_IN_STAGE_MSG = "`stash_and_restore_tensor` must be called in a stage context."
UNSTAGED_PRODUCER_MSG = (
    "{tensor} is made by {op}, which is in no pipeline stage, so its stage is unknown; pass "
    "`from_stage` to `stash_and_restore_tensor`"
)
MISSING_STAGE_MSG = (
    "Pipeline stages must be numbered 0 .. {n}, but stage(s) {missing} have no ops. Number the "
    "stages consecutively from 0."
)

LOAD, COMPUTE, STORE, COPY = "loads", "stage", "stores", "copies"

# ``Op.hints`` key of the ops this transform makes, for tools that show the program the way
# PopART listed a pipeline (each op once, stashes as ``Stash`` / ``Restore`` ops): ``SCHEDULE``
# on the calls, loops and conditionals that only run the schedule, ``STASH`` / ``RESTORE`` on
# the calls of a stash's and a restore's graph.
PIPELINE_ROLE = "__pipeline_role"
SCHEDULE, STASH, RESTORE = "schedule", "Stash", "Restore"


class PipelineContext:
    """What ``pipelined_execution`` yields: stage annotation and stash/restore helpers."""

    def __init__(self, graph: popxl.Graph, steps: int) -> None:
        self.graph = graph
        self.steps = steps
        self._stage: int | None = None
        self.ops: dict[int, list[Op]] = defaultdict(list)
        self._stage_of: dict[Op, int] = {}
        self.pipeline: _Pipeline | None = None
        # One stash and one restore graph per tensor spec (and stash size), not per tensor.
        self._stash, self._restore = Stash(cache=True), Restore(cache=True)
        self.stashes: set[popxl.Tensor] = set()
        self.restored: dict[popxl.Tensor, popxl.Tensor] = {}  # restored value -> stashed
        # (activation, from stage, to stage) -> its restored value, for gradient graphs
        self._activations: dict[tuple[popxl.Tensor, int | None, int | None], popxl.Tensor] = {}

    def hook(self, op: Op) -> None:
        if self._stage is None:
            raise RuntimeError(NO_STAGE_MSG.format(op=op))
        self.ops[self._stage].append(op)
        self._stage_of[op] = self._stage

    @contextmanager
    def stage(self, i: int) -> Iterator[None]:
        """Put the ops created in this scope on pipeline stage ``i``."""
        prev, self._stage = self._stage, i
        try:
            yield
        finally:
            self._stage = prev

    def stage_of(self, op: Op) -> int | None:
        return self._stage_of.get(op)

    def _is_external_input(self, t: popxl.Tensor) -> bool:
        return t._producer is None or self.stage_of(t._producer) is None

    def stash_and_restore_tensor(
        self, t: popxl.Tensor, from_stage: int | None = None
    ) -> popxl.Tensor:
        """Stash ``t`` on its producing stage and restore it on the current stage.

        The stash holds ``to_stage - from_stage + 1`` micro-batches in a ring buffer, so the
        current stage reads the value of its own micro-batch.

        Raises:
            RuntimeError: ``from_stage`` is not given and ``t`` has no producer or its
                producer is in no stage, or the call is outside a stage context.
        """
        if from_stage is None:
            if t._producer is None:
                raise RuntimeError(NO_FROM_STAGE_MSG)
            from_stage = self.stage_of(t._producer)
            if from_stage is None:
                raise RuntimeError(UNSTAGED_PRODUCER_MSG.format(tensor=t.id, op=t._producer))
        to_stage = self._stage
        if to_stage is None:
            raise RuntimeError(NOT_IN_STAGE_MSG)
        stash_size = to_stage - from_stage + 1
        with self.stage(from_stage):
            args, graph = self._stash.create_graph(t, stash_size)
            stash_args = args.init()
            self.stashes.add(stash_args.stash)
            with _marked(STASH):
                graph.bind(stash_args).call(t)
        with self.stage(to_stage):
            rargs, rgraph = self._restore.create_graph(stash_args.stash)
            with _marked(RESTORE):
                (restored,) = rgraph.bind(rargs.init()).call(stash_args.stash)
            if restored.shape != t.shape:  # a scalar takes one element of the stash
                restored = restored.reshape(t.shape)
        self.restored[restored] = t
        return restored

    def stash_and_restore_activations(
        self, call_info: CallSiteInfo, grad_info: GradGraphInfo
    ) -> dict[popxl.Tensor, popxl.Tensor]:
        """The gradient graph's activations for ``call_info``, stashed from the forward's
        stage when the current stage is a different one (inputs from outside the pipeline,
        e.g. weights, are passed as they are). A value that several gradient graphs of one
        stage read (a mask every layer uses) is stashed once."""
        activations = grad_info.inputs_dict(call_info)
        from_stage = self.stage_of(call_info._op)
        if self._stage == from_stage:
            return activations
        for sg_tensor, act in activations.items():
            if not self._is_external_input(act):
                key = (act, from_stage, self._stage)
                if key not in self._activations:
                    self._activations[key] = self.stash_and_restore_tensor(act, from_stage)
                activations[sg_tensor] = self._activations[key]
        return activations

    def print_schedule(self) -> str:
        """The pipeline as built: one row per stage, one column per cycle (``.`` = idle),
        the fill/main/flush phases, and the subgraphs each cycle calls; or, for stages on
        one device, the micro-batch graph that runs them in turn."""
        if self.pipeline is None:
            raise RuntimeError("The pipeline is built when pipelined_execution's context closes.")
        return self.pipeline.describe()


@contextmanager
def pipelined_execution(steps: int, *, min_steps: int | None = None) -> Iterator[PipelineContext]:
    """Run the ops created in this context as a pipeline over ``steps`` micro-batches.

    ``min_steps``: the fewest steps accepted, by default twice the number of stages
    (popxl-addons' rule). The schedule itself is correct from as many steps as stages
    (PopTorch's rule, which its front end passes).

    Annotate every op with ``pipeline.stage(i)`` (and usually ``popxl.ipu(k)``); pass
    tensors between stages with ``copy_to_ipu`` or ``stash_and_restore_*``.

    >>> import numpy as np, popxl, popxl.ops as ops, popxl_addons as addons
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     x_in, y_out = popxl.h2d_stream((), popxl.int32), popxl.d2h_stream((), popxl.int32)
    ...     with addons.pipelined_execution(4) as p:
    ...         with p.stage(0), popxl.ipu(0):
    ...             x = (ops.host_load(x_in) + 1).copy_to_ipu(1)
    ...         with p.stage(1), popxl.ipu(1):
    ...             ops.host_store(y_out, x * 10)
    >>> ir.num_host_transfers = 4
    >>> with popxl.Session(ir, "ipu_model") as s:
    ...     print(s.run({x_in: np.arange(4, dtype=np.int32)})[y_out])
    [10 20 30 40]

    Raises:
        RuntimeError: an op created outside a stage context.
        ValueError: ``steps`` is smaller than ``min_steps``.
    """
    graph = popxl.gcg()
    pipeline = PipelineContext(graph, steps)
    handle = graph.register_op_created_hook(pipeline.hook)
    try:
        yield pipeline
    finally:
        graph.remove_op_created_hook(handle)
    pipeline.pipeline = _Pipeline(graph, steps, dict(pipeline.ops), min_steps, pipeline)
    pipeline.pipeline.build()


class Stash(Module):
    """Write ``t`` into slot ``counter`` of a ring buffer of ``stash_size`` entries."""

    @popxl.in_sequence()
    def build(self, t: popxl.Tensor, stash_size: int) -> None:
        counter = self.add_variable_input(
            "counter", partial(np.zeros, (1,)), popxl.uint32, by_ref=True
        )
        shape = t.shape or (1,)
        t = t.reshape((1, *shape))
        if stash_size <= 1:
            raise TypeError(STASH_SIZE_MSG.format(size=stash_size, t=t))
        stash = self.add_variable_input(
            "stash", partial(np.zeros, (stash_size, *shape)), t.dtype, by_ref=True
        )
        ops.dynamic_update_(stash, counter, t, axes=[0], sizes=[1], no_overlap=True)
        ops.increment_mod_(counter, 1, stash_size)


class Restore(Module):
    """Read slot ``counter`` of a stash and advance the counter."""

    @popxl.in_sequence()
    def build(self, stash: popxl.TensorByRef) -> popxl.Tensor:
        counter = self.add_variable_input(
            "counter", partial(np.zeros, (1,)), popxl.uint32, by_ref=True
        )
        t = ops.dynamic_slice(stash, counter, axes=[0], sizes=[1], no_overlap=True)
        ops.increment_mod_(counter, 1, stash.shape[0])
        return t.reshape(t.shape[1:])


# The transform --------------------------------------------------------------------------


def _kind(op: Op) -> str:
    key = op.opdef.key
    if key == "host_load" or _feeds_only_host_load(op):
        return LOAD
    if key == "host_store":
        return STORE
    if key == "ipu_copy":
        return COPY
    return COMPUTE


def _feeds_only_host_load(op: Op) -> bool:
    """An ``init`` whose output only a ``host_load`` consumes belongs with the load."""
    if op.opdef.key != "init" or len(op.outputs) != 1:
        return False
    consumers = op.outputs[0]._consumers
    return len(consumers) == 1 and consumers[0].opdef.key == "host_load"


@dataclass(eq=False)
class _Piece:
    """One subgraph of the pipeline: its original ops, what it reads and what it makes."""

    name: str
    stage: int | None
    ops: list[Op] = field(default_factory=list)
    reads: list[popxl.Tensor] = field(default_factory=list)  # original tensors, by order
    modified: set[popxl.Tensor] = field(default_factory=set)
    produces: list[popxl.Tensor] = field(default_factory=list)
    graph: popxl.Graph | None = None
    outputs: list[popxl.Tensor] = field(default_factory=list)  # produced and used elsewhere

    def built(self) -> popxl.Graph:
        """The piece's subgraph, once ``_Pipeline.build`` made it."""
        if self.graph is None:
            raise InternalError(f"pipeline piece {self.name} is used before it is built")
        return self.graph


class _Pipeline:
    """Moves the staged ops into subgraphs and writes the fill/main/flush schedule."""

    def __init__(
        self,
        graph: popxl.Graph,
        steps: int,
        stage_ops: dict[int, list[Op]],
        min_steps: int | None = None,
        context: PipelineContext | None = None,
    ) -> None:
        self.graph = graph
        self.ir = graph.ir
        self.steps = steps
        self.num_stages = max(stage_ops) + 1 if stage_ops else 0
        missing = [s for s in range(self.num_stages) if not stage_ops.get(s)]
        if missing:
            raise ValueError(MISSING_STAGE_MSG.format(n=self.num_stages - 1, missing=missing))
        if steps < max(
            min_steps if min_steps is not None else 2 * self.num_stages, self.num_stages
        ):
            raise ValueError(TOO_FEW_STEPS_MSG.format(steps=steps, stages=self.num_stages))
        self.pieces: dict[tuple[str, int | None], _Piece] = {}
        self.stage_of = {op: s for s, stage_list in stage_ops.items() for op in stage_list}
        self.stashes = context.stashes if context is not None else set()
        self.restored = context.restored if context is not None else {}
        self.one_device = False
        for op in graph._ops:
            if op in self.stage_of:
                self._piece_for(op, self.stage_of[op]).ops.append(op)

    def _piece_for(self, op: Op, stage: int) -> _Piece:
        kind = _kind(op)
        key = (kind, None if kind == COPY else stage)
        if key not in self.pieces:
            name = "ipu_copies" if kind == COPY else f"{kind}_{stage}"
            self.pieces[key] = _Piece(name, key[1])
        return self.pieces[key]

    def piece(self, kind: str, stage: int | None) -> _Piece | None:
        return self.pieces.get((kind, stage))

    def cycle_order(self, start: int, end: int, last: bool) -> list[_Piece]:
        """The pieces one cycle calls: loads, compute, stores of stages ``start..end-1``,
        then the copies (skipped in the last cycle)."""
        order: list[_Piece] = []
        for kind in (LOAD, COMPUTE, STORE):
            for stage in range(start, end):
                p = self.piece(kind, stage)
                if p is not None:
                    order.append(p)
        copies = self.piece(COPY, None)
        if copies is not None and not last:
            order.append(copies)
        return order

    # Analysis ---------------------------------------------------------------------------

    def analyse(self) -> None:
        producer: dict[popxl.Tensor, _Piece] = {}
        for p in self.pieces.values():
            for op in p.ops:
                for t in op.outputs:
                    producer[t] = p
                    p.produces.append(t)
        for p in self.pieces.values():
            made = set(p.produces)
            seen: dict[popxl.Tensor, None] = {}
            for op in p.ops:
                for t in op.inputs:
                    if t not in made:
                        seen[t] = None
                for i in op.modified_input_indices():
                    if op.inputs[i] not in made:
                        p.modified.add(op.inputs[i])
            p.reads = list(seen)
        self.producer = producer
        used_elsewhere = {t for p in self.pieces.values() for t in p.reads if t in producer}
        for p in self.pieces.values():
            p.outputs = [t for t in p.produces if t in used_elsewhere]
        self.externals = list(
            dict.fromkeys(t for p in self.pieces.values() for t in p.reads if t not in producer)
        )
        self.modified_externals = {
            t for p in self.pieces.values() for t in p.modified if t not in producer
        }
        main = self.cycle_order(0, self.num_stages, last=False)
        position = {p: i for i, p in enumerate(main)}
        # Values made by a piece and read by one that runs no later in the cycle cross
        # from one cycle to the next: they are the main loop's carried values.
        self.carried = list(
            dict.fromkeys(
                t
                for p in main
                for t in p.reads
                if t in producer and position[producer[t]] >= position[p]
            )
        )

    # Building ---------------------------------------------------------------------------

    def build(self) -> None:
        staged = [op for op in self.graph._ops if op in self.stage_of]
        if _shares_one_device(staged, self.ir) and _stages_commute(
            staged, self.stage_of, self.stashes
        ):
            self._build_one_device(staged)
            return
        self.analyse()
        self._remove_ops()
        for p in self.pieces.values():
            self._build_piece(p)
        pipeline_graph = self.ir.create_empty_graph("pipeline_graph")
        with pipeline_graph:
            ins = [self._input_like(t, t in self.modified_externals) for t in self.externals]
            self._write_schedule(dict(zip(self.externals, ins)))
        self.pipeline_graph = pipeline_graph
        with self.graph, popxl.in_sequence(False), _marked(SCHEDULE):
            ops.call(pipeline_graph, *self.externals)

    def _build_one_device(self, staged: list[Op]) -> None:
        """``repeat(steps)`` of ``pipeline_micro_batch``, which runs every stage in turn
        (see the module docstring)."""
        self.one_device = True
        position = {op: i for i, op in enumerate(staged)}
        order = sorted(staged, key=lambda op: (self.stage_of[op], position[op]))
        made = {t for op in order for t in op.outputs}
        externals = list(dict.fromkeys(t for op in order for t in op.inputs if t not in made))
        written = {op.inputs[i] for op in order for i in op.modified_input_indices()}
        self._remove_ops()
        micro = self.ir.create_empty_graph("pipeline_micro_batch")
        with micro:
            env = {t: self._input_like(t, t in written) for t in externals}
            for op in order:
                if op.opdef.key == "ipu_copy":
                    env[op.outputs[0]] = env[op.inputs[0]]
                    continue
                clone = _clone_op(op, micro, tuple(env[t] for t in op.inputs))
                env.update(zip(op.outputs, clone.outputs))
                for t in op.outputs:
                    if t in self.restored:  # what the restore reads is what was just stashed
                        env[t] = env[self.restored[t]]
        self.pipeline_graph = self.ir.create_empty_graph("pipeline_graph")
        with self.pipeline_graph:
            ins = [self._input_like(t, t in written) for t in externals]
            with popxl.ipu(0), _marked(SCHEDULE):
                ops.repeat(micro, self.steps, *ins)
        self.micro_batch_graph = micro
        with self.graph, popxl.in_sequence(False), _marked(SCHEDULE):
            ops.call(self.pipeline_graph, *externals)

    def _remove_ops(self) -> None:
        moved = {op for p in self.pieces.values() for op in p.ops}
        self.graph._ops = [op for op in self.graph._ops if op not in moved]
        for op in moved:
            for t in op.inputs:
                if op in t._consumers:
                    t._consumers.remove(op)
            for g in op.called_graphs:
                sites = self.ir._call_sites.get(g, [])
                if op in sites:
                    sites.remove(op)
            for t in op.outputs:
                self.graph._tensors.pop(t.id, None)

    @staticmethod
    def _input_like(t: popxl.Tensor, by_ref: bool) -> popxl.Tensor:
        return popxl.graph_input(t.shape, t.dtype, t.name, by_ref=by_ref, meta_shape=t.meta_shape)

    def _build_piece(self, p: _Piece) -> None:
        graph = self.ir.create_empty_graph(p.name)
        with graph:
            env = {t: self._input_like(t, t in p.modified) for t in p.reads}
            for op in p.ops:
                clone = _clone_op(op, graph, tuple(env[t] for t in op.inputs))
                env.update(zip(op.outputs, clone.outputs))
            for t in p.outputs:
                popxl.graph_output(env[t])
        p.graph = graph

    def _call_piece(self, p: _Piece, values: dict[popxl.Tensor, popxl.Tensor]) -> None:
        graph = p.built()
        args = [self._value(t, values) for t in p.reads]
        # The call runs on the stage's IPU (placement runs a pure call where it is placed).
        with popxl.ipu(_main_ipu(p.ops)):
            outs = ops.call(graph, *args)
        values.update(zip(p.outputs, outs))

    def _value(self, t: popxl.Tensor, values: dict[popxl.Tensor, popxl.Tensor]) -> popxl.Tensor:
        """The current value of ``t``; a zero placeholder before its stage first ran (fill)
        or after the main loop (flush), where the result is never used."""
        if t not in values:
            producer = self.producer[t]
            ipu = producer.ops[0].ipu if producer.ops else 0
            with popxl.ipu(ipu):
                values[t] = ops.init(t.shape, t.dtype, "dummy__" + t.name, "zero")
        return values[t]

    def _write_schedule(self, values: dict[popxl.Tensor, popxl.Tensor]) -> None:
        """One ``repeat`` of ``steps + stages - 1`` cycles. Every cycle calls every piece;
        a stage's pieces run only in the cycles where its micro-batch exists (``cycle -
        stage`` in ``0 .. steps-1``), so the ramps (fill and flush) reuse the main cycle
        and each stage is compiled once."""
        n = self.num_stages
        ipus = sorted({_main_ipu(p.ops) for p in self.pieces.values() if p.stage is not None})
        counters = []
        for ipu in ipus:
            with popxl.ipu(ipu):
                counters.append(ops.init((), popxl.int32, f"cycle_ipu{ipu}", "zero"))
        carried = [self._value(t, values) for t in self.carried]
        fixed = [values[t] for t in self.externals]
        body = self.cycle_graph = self.ir.create_empty_graph("pipeline_cycle")
        with body:
            cycle = {}
            for ipu in ipus:
                cycle[ipu] = popxl.graph_input((), popxl.int32, f"cycle_ipu{ipu}")
            inner = {t: self._input_like(t, False) for t in self.carried}
            for t in self.externals:
                inner[t] = self._input_like(t, t in self.modified_externals)
            active: dict[int, popxl.Tensor] = {}
            for p in self.cycle_order(0, n, last=False):
                if p.stage is None:  # the copies: harmless in cycles where nothing reads them
                    self._call_piece(p, inner)
                    continue
                ipu = _main_ipu(p.ops)
                if p.stage not in active:
                    active[p.stage] = self._is_active(cycle[ipu], p.stage, ipu)
                self._call_guarded(p, inner, active[p.stage])
            for ipu in ipus:
                with popxl.ipu(ipu):
                    popxl.graph_output(cycle[ipu] + popxl.constant(1, popxl.int32))
            for t in self.carried:
                popxl.graph_output(inner[t])
        with popxl.ipu(0), _marked(SCHEDULE):
            outs = ops.repeat(body, self.steps + n - 1, *counters, *carried, *fixed)
        values.update(zip(self.carried, outs[len(ipus) :]))

    def _is_active(self, cycle: popxl.Tensor, stage: int, ipu: int) -> popxl.Tensor:
        """Whether ``stage`` has a micro-batch in ``cycle``: ``stage <= cycle < steps + stage``."""
        with popxl.ipu(ipu):
            started = ops.greater(cycle, popxl.constant(stage - 1, popxl.int32))
            ended = ops.greater(cycle, popxl.constant(self.steps + stage - 1, popxl.int32))
            return ops.logical_and(started, ops.logical_not(ended))

    def _call_guarded(self, p: _Piece, values: dict, active: popxl.Tensor) -> None:
        graph = self._guarded_graph(p)
        args = [self._value(t, values) for t in p.reads]
        with popxl.ipu(_main_ipu(p.ops)), _marked(SCHEDULE):
            outs = ops.call(graph, active, *args)
        values.update(zip(p.outputs, outs))

    def _guarded_graph(self, p: _Piece) -> popxl.Graph:
        """``<piece>_guarded(active, reads...)``: a conditional between the piece and a skip
        that returns zeros (never read: the consumers of a skipped stage are skipped too).
        The inputs the piece modifies pass by reference through both. It is one call, so
        placed on several devices it runs on the stage's device as a unit."""
        graph = p.built()
        with popxl.ipu(_main_ipu(p.ops)):
            skip = self.ir.create_empty_graph(f"{p.name}_skip")
            with skip:
                for t in p.outputs:
                    popxl.graph_output(ops.init(t.shape, t.dtype, f"skipped__{t.name}", "zero"))
            guarded = self.ir.create_empty_graph(f"{p.name}_guarded")
            with guarded:
                active = popxl.graph_input((), popxl.bool, "active")
                ins = [self._input_like(t, t in p.modified) for t in p.reads]
                with _marked(SCHEDULE):
                    outs = ops.conditional(active, graph, skip, then_inputs=ins)
                for out in outs:
                    popxl.graph_output(out)
        return guarded

    def describe(self) -> str:
        if self.one_device:
            return "\n".join([
                f"Pipeline: {self.num_stages} stages over {self.steps} steps on one device: "
                "each micro-batch runs through the stages in turn (the same results as the "
                "cycle schedule, which overlaps the stages on separate devices)",
                self.pipeline_graph.print_schedule(),
                self.micro_batch_graph.print_schedule(),
            ])  # fmt: skip
        n = self.num_stages
        count = self.steps - (n - 1)
        lines = [
            f"Pipeline: {n} stages over {self.steps} steps: {n - 1} fill, {count} main, "
            f"{n - 1} flush cycles, all one repeated cycle (a stage is skipped where it has "
            "no micro-batch)",
            "cycle    phase  " + "".join(f"{'stage ' + str(s):>10}" for s in range(n)),
        ]
        for c in range(n - 1):
            cells = [f"mb {c - s}" if s <= c else "." for s in range(n)]
            lines.append(f"{c:<9}{'fill':<7}" + "".join(f"{x:>10}" for x in cells))
        cells = ["mb c" if s == 0 else f"mb c-{s}" for s in range(n)]
        label = f"{n - 1}..{self.steps - 1}"
        lines.append(f"{label:<9}{'main':<7}" + "".join(f"{x:>10}" for x in cells))
        for c in range(self.steps, self.steps + n - 1):
            cells = [f"mb {c - s}" if c - s < self.steps else "." for s in range(n)]
            lines.append(f"{c:<9}{'flush':<7}" + "".join(f"{x:>10}" for x in cells))
        lines.append("")
        lines.append(self.pipeline_graph.print_schedule())
        lines.append(self.cycle_graph.print_schedule())
        for p in self.pieces.values():
            lines.append(p.built().print_schedule())
        return "\n".join(lines)


def _main_ipu(stage_ops: list[Op]) -> int:
    """The IPU most of ``stage_ops`` run on (0 for none)."""
    counts = Counter(op.ipu or 0 for op in stage_ops)
    return counts.most_common(1)[0][0] if counts else 0


def _clone_op(op: Op, graph: popxl.Graph, inputs: tuple[popxl.Tensor, ...]) -> Op:
    """``op`` recorded again in ``graph`` on ``inputs``, keeping its placement."""
    specs = [t._spec for t in op.outputs]
    names = [t.name for t in op.outputs]
    clone = add_op(graph, op.opdef, inputs, dict(op.attrs), specs, names)
    clone.ipu = op.ipu
    clone.tile_set = op.tile_set
    clone.scope = op.scope
    clone.location = op.location
    clone.execution_context = op.execution_context
    clone.modified_inputs = set(op.modified_inputs)
    clone.hints = dict(op.hints)
    return clone


def _marked(role: str) -> AbstractContextManager[None]:
    """Within: the calls, loops and conditionals made in the current graph play ``role``
    in the pipeline (``PIPELINE_ROLE``)."""
    return hint_new_ops(PIPELINE_ROLE, role, ("Call", "Loop", "If"))


def _shares_one_device(staged: list[Op], ir: popxl.Ir) -> bool:
    """Whether the session will run the pipeline's IPUs on one device (the runtime's
    placement rule; a session that places them anyway still computes the same results)."""
    from runtime.devices.placement import placement_ipus  # noqa: PLC0415 (runtime imported lazily)

    ipus = 1 + max((max(op.ipu or 0, op.attrs.get("destination") or 0) for op in staged), default=0)
    try:
        return placement_ipus(ipus, ir.replication_factor) == 0
    except ValueError:  # placement asked for and impossible: the session says so
        return False


def _stages_commute(staged: list[Op], stage_of: dict[Op, int], stashes: set) -> bool:
    """Whether running each micro-batch through the stages in turn computes what the cycles
    compute: no stage reads a later stage's values, and nothing one stage writes (storage,
    a stream, another effect) is used by another stage, stashes excepted."""
    producer_stage = {t: stage_of[op] for op in staged for t in op.outputs}
    used: dict[object, set[int]] = defaultdict(set)
    written: dict[object, set[int]] = defaultdict(set)
    effects: dict[Graph, set] = {}
    for op in staged:
        stage = stage_of[op]
        if any(producer_stage.get(t, stage) > stage for t in op.inputs):
            return False
        for t in op.inputs:
            for r in roots(t):
                used[r].add(stage)
        for i in op.modified_input_indices():
            for r in roots(op.inputs[i]):
                written[r].add(stage)
        for token in _effects(op, effects):
            used[token].add(stage)
            written[token].add(stage)
    shared = (key for key, stages in written.items() if len(stages | used[key]) > 1)
    return all(key in stashes for key in shared)


def _effects(op: Op, memo: dict[Graph, set]) -> set:
    """Tokens for ``op``'s effects: a host stream's id, or one token for any other effect."""
    found: set = set()
    for g in op.referenced_graphs:
        if g not in memo:
            memo[g] = set()  # recursion guard
            memo[g] = set().union(*(_effects(inner, memo) for inner in g._ops))
        found |= memo[g]
    if op.opdef.special in ("host_load", "host_store"):
        found.add(("stream", op.attrs.get("stream_id")))
    elif op.opdef.effect or op.opdef.special == "log2_scale_checked":
        found.add(("effect",))
    return found
