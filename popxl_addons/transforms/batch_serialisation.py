"""Batch serialisation: run a graph ``steps`` times over slices of a batch.

``batch_serialise(graph, steps, ...)`` builds a new graph that repeats ``graph`` ``steps``
times. Each step loads some inputs (from host streams or remote buffers), calls the graph
and stores some outputs (to host streams or remote buffers); every other input is passed
through (by reference where the graph modifies it). A remote buffer is seen as a matrix:
row ``r``, step ``i`` is entry ``r * steps + i``; the returned graph's first input is the
row, and a ``RemoteHandle``'s ``row_offset`` shifts (an ``int``), maps (a function) or
ignores (``None``: always row 0) it.

``io_mode`` says where the loads and stores run: ``"compute"`` tiles, the ``"io"`` tiles
(needs ``numIOTiles``), or ``"io_overlapped"``: IO tiles, with the loop rearranged so that
step ``i + 1``'s loads and step ``i - 1``'s stores sit beside step ``i``'s compute::

    load 0 | load 1, compute 0 | repeat: store i-2, load i, compute i-1 | store n-1, compute n
    | store n

``batch_serialise_fwd_and_grad`` does both passes of a layer, storing the activations the
gradient needs to remote buffers in the forward loop and loading them in the backward loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import popxl
from popxl import ops
from popxl.errors import InternalError
from popxl.transforms import ExpectedConnectionType, GradGraphInfo
from popxl.transforms.grad_graph_info import ExpectedConnection

from ..graph import GraphWithNamedArgs
from ..named_tensors import NamedTensors
from ..remote import create_remote_buffer
from ..rts import gather_replica_sharded_tensor
from ..utils import suffix_graph_name

__all__ = ["batch_serialise", "batch_serialise_fwd_and_grad", "batch_serial_buffer", "RemoteHandle"]

RowOffset = int | None | Callable[[popxl.Tensor], popxl.Tensor]
IoMode = Literal["compute", "io", "io_overlapped"]
IO_MODES = ("compute", "io", "io_overlapped")

NO_IO_TILES_MSG = (
    "IR must have IO tiles: io_mode={mode!r} loads and stores on the IO tiles. Set "
    "ir._pb_ir.getSessionOptions().numIOTiles (e.g. 32) or use io_mode='compute'."
)
BAD_HANDLE_MSG = "Incompatible handle in `load_handles` for tensor {t} : {handle}"
NO_GRAD_HANDLE_MSG = (
    "FwdGrad input (idx={idx} {t}) to Gradient graph must have a load_handle specified"
)
MISSING_FWD_MSG = (
    "Fwd Connection {t} missing. You need to provide it either in forward_variables or in "
    "load_handles"
)


@dataclass
class RemoteHandle:
    """Where a tensor lives in a remote buffer.

    Attributes:
        buffer: the remote buffer.
        row_offset: ``int``: rows to skip; a function: maps the row the graph is called with
            to the row to use; ``None``: always the first row (entry ``step``).
        shard_group: replicas the tensor is sharded over (RTS); ``None``: not sharded.
    """

    buffer: popxl.RemoteBuffer
    row_offset: RowOffset = 0
    shard_group: popxl.ReplicaGrouping | None = None


Handle = popxl.HostToDeviceStream | RemoteHandle


@dataclass
class BatchSerialResult:
    """The transformed graph and where the transform stored tensors.

    Attributes:
        graph: the repeating graph; inputs: row index, (seed,) passed-through inputs.
        stored_buffers: ``{tensor of the original graph: RemoteHandle}`` of stored values.
    """

    graph: GraphWithNamedArgs
    stored_buffers: dict[popxl.Tensor, RemoteHandle]
    _remap_dict: dict[popxl.Tensor, popxl.Tensor]

    def remap_tensors(self, ts: NamedTensors) -> NamedTensors:
        """``ts`` with tensors of the original graph replaced by the transformed graph's."""
        return ts.remap(self._remap_dict)


def batch_serial_buffer(
    t: popxl.Tensor,
    steps: int = 1,
    rows: int = 1,
    shard_group: popxl.ReplicaGrouping | None = None,
) -> popxl.RemoteBuffer:
    """A remote buffer of ``steps * rows`` entries shaped like ``t`` (entry
    ``row * steps + step``), sharded over ``shard_group`` when given."""
    shard_over = shard_group.group_size if shard_group else 1
    return create_remote_buffer(
        t, entries=steps * rows, replica_group=shard_group, shard_over=shard_over
    )


def _as_handles(handles: Mapping[popxl.Tensor, Any]) -> dict[popxl.Tensor, Any]:
    """Accept the older ``(buffer, row_offset)`` tuples as ``RemoteHandle``s."""
    out: dict[popxl.Tensor, Any] = {}
    for t, h in handles.items():
        if isinstance(h, tuple) and len(h) >= 2 and isinstance(h[0], popxl.RemoteBuffer):
            h = RemoteHandle(*h)
        out[t] = h
    return out


@dataclass
class _Plan:
    """What each step loads, stores and passes through, and how to address the buffers."""

    graph: GraphWithNamedArgs
    steps: int
    rows: int
    load_handles: dict[popxl.Tensor, Handle]
    store_streams: dict[popxl.Tensor, popxl.DeviceToHostStream]
    store_buffers: dict[popxl.Tensor, RemoteHandle]
    seed_input: popxl.Tensor | None
    use_io_tiles: bool

    def __post_init__(self) -> None:
        inputs = self.graph.graph.inputs
        self.loaded = [t for t in inputs if t in self.load_handles]
        self.passed = [t for t in inputs if t is not self.seed_input and t not in self.load_handles]
        outputs = self.graph.graph.outputs
        self.stored = [
            t
            for t in dict.fromkeys((*inputs, *outputs))
            if not self._stored_where_loaded(t)
            and (t in self.store_streams or t in self.store_buffers)
        ]

    def _stored_where_loaded(self, t: popxl.Tensor) -> bool:
        """``t`` is loaded from a remote buffer and would only be stored back into it (an
        output that is a loaded input but has a buffer of its own must still be stored)."""
        load = self.load_handles.get(t)
        if not isinstance(load, RemoteHandle) or t in self.store_streams:
            return False
        store = self.store_buffers.get(t)
        return store is None or store.buffer is load.buffer

    def tiles(self) -> AbstractContextManager:
        return popxl.io_tiles() if self.use_io_tiles else nullcontext()

    def entry(self, index: popxl.Tensor, handle: RemoteHandle) -> popxl.Tensor:
        """The buffer entry for the step at ``index`` (= row * steps + step); grows the
        buffer to fit."""
        steps, rows, offset = self.steps, self.rows, handle.row_offset
        if offset is None:
            entry, size = index % steps, steps
        elif callable(offset):
            entry, size = offset(index / steps) * steps + index % steps, steps * rows
        elif offset != 0:
            entry, size = index + offset * steps, steps * (offset + rows)
        else:
            entry, size = index, steps * rows
        handle.buffer.entries = max(handle.buffer.entries, size)
        return entry

    def load(self, index: popxl.Tensor) -> list[popxl.Tensor]:
        """Load every loaded input of one step (on the IO tiles in io modes)."""
        with self.tiles():
            targets: list[tuple[popxl.Tensor, Any, popxl.Tensor | None]] = []
            for t in self.loaded:
                handle = self.load_handles[t]
                if isinstance(handle, popxl.HostToDeviceStream):
                    targets.append((t, handle, None))
                elif isinstance(handle, RemoteHandle):
                    targets.append((t, handle, self.entry(index, handle)))
                else:
                    raise TypeError(BAD_HANDLE_MSG.format(t=t, handle=handle))
        with self.tiles(), popxl.transforms.merge_exchange(), popxl.in_sequence(False):
            loaded = [
                ops.host_load(h, t.name) if e is None else ops.remote_load(h.buffer, e, t.name)
                for t, h, e in targets
            ]
        with self.tiles():
            return [self._gathered(t, x) for t, x in zip(self.loaded, loaded)]

    def _gathered(self, t: popxl.Tensor, x: popxl.Tensor) -> popxl.Tensor:
        handle = self.load_handles[t]
        group = handle.shard_group if isinstance(handle, RemoteHandle) else None
        if group is not None and group.group_size != 1:
            return gather_replica_sharded_tensor(x, use_io_tiles=False, replica_group=group)
        return x

    def to_compute(self, ts: list[popxl.Tensor]) -> list[popxl.Tensor]:
        """Copy loaded tensors from the IO tiles to the compute tiles (io modes)."""
        return [ops.io_tile_copy(t) for t in ts] if self.use_io_tiles else list(ts)

    def to_io(self, ts: list[popxl.Tensor]) -> list[popxl.Tensor]:
        """Copy tensors to store from the compute tiles to the IO tiles (io modes)."""
        if not self.use_io_tiles:
            return list(ts)
        with popxl.io_tiles():
            return [ops.io_tile_copy(t) for t in ts]

    def compute(
        self, loaded: list[popxl.Tensor], passed: list[popxl.Tensor], seed: popxl.Tensor | None
    ) -> list[popxl.Tensor]:
        """Call the graph for one step; returns the values to store."""
        args = dict(zip(self.loaded, loaded))
        args.update(zip(self.passed, passed))
        if self.seed_input is not None and seed is not None:
            args[self.seed_input] = seed
        info = self.graph.call_with_info(args=args)
        return [info.graph_to_parent(t) for t in self.stored]

    def store(self, index: popxl.Tensor, values: list[popxl.Tensor]) -> None:
        """Slice sharded values and store one step's values (streams and buffers)."""
        with self.tiles():
            values = [self._sliced(t, v) for t, v in zip(self.stored, values)]
            entries = {
                t: self.entry(index, self.store_buffers[t])
                for t in self.stored
                if t in self.store_buffers
            }
        with self.tiles(), popxl.transforms.merge_exchange(), popxl.in_sequence(False):
            for t, value in zip(self.stored, values):
                if t in self.store_streams:
                    ops.host_store(self.store_streams[t], value)
                if t in entries:
                    ops.remote_store(self.store_buffers[t].buffer, entries[t], value)

    def _sliced(self, t: popxl.Tensor, value: popxl.Tensor) -> popxl.Tensor:
        handle = self.store_buffers.get(t)
        group = handle.shard_group if handle is not None else None
        if group is not None and group.group_size != 1:
            return ops.collectives.replica_sharded_slice(value, group=group)
        return value

    # The graphs ---------------------------------------------------------------------------

    def outer_inputs(self) -> tuple[popxl.Tensor, popxl.Tensor, list[popxl.Tensor]]:
        """Inputs of the returned graph: the row, the seed (or a constant), passed inputs."""
        row = popxl.graph_input([], popxl.int32, "batch_serial_loop_index")
        with self.tiles():
            index = ops.io_tile_copy(row) if self.use_io_tiles else row
            index = index * self.steps
        if self.seed_input is not None:
            seed = popxl.graph_input((2,), popxl.uint32, "batch_serial_random_seed")
        else:
            seed = popxl.constant((0, 0), popxl.uint32, "dummy_random_seed")
        graph = self.graph.graph
        passed = [
            popxl.graph_input(t.shape, t.dtype, t.name, t in graph._by_ref_inputs, t.meta_shape)
            for t in self.passed
        ]
        return index, seed, passed

    def step_seed(self, seed: popxl.Tensor) -> tuple[popxl.Tensor, popxl.Tensor]:
        return ops.split_random_seed(seed)  # type: ignore[return-value]

    def next_index(self, index: popxl.Tensor) -> popxl.Tensor:
        with self.tiles():
            return index + 1

    def outer_graph(self, fill: Callable[[popxl.Tensor, popxl.Tensor, list], None]) -> popxl.Graph:
        """The graph the caller calls: its inputs (start index, seed, passed tensors), then
        ``fill(index, seed, passed)`` builds the steps in sequence."""
        ir = self.graph.graph.ir
        outer = ir.create_empty_graph(suffix_graph_name(self.graph.graph.name, "_repeat_graph"))
        with outer, popxl.in_sequence():
            index, seed, passed = self.outer_inputs()
            fill(index, seed, passed)
        self.outer_passed = passed
        return outer

    def build_serial(self) -> popxl.Graph:
        """load, compute, store; ``steps`` times in a loop."""
        ir = self.graph.graph.ir

        @popxl.in_sequence(True)
        def step(index: popxl.Tensor, seed: popxl.Tensor, passed: list[popxl.TensorByRef]) -> Any:
            seed, next_seed = self.step_seed(seed)
            loaded = self.to_compute(self.load(index))
            stored = self.to_io(self.compute(loaded, passed, seed))
            self.store(index, stored)
            return self.next_index(index), next_seed

        def fill(index: popxl.Tensor, seed: popxl.Tensor, passed: list) -> None:
            body = ir.create_graph(step, index, seed, passed)
            ops.repeat(body, self.steps, index, seed, *passed)

        return self.outer_graph(fill)

    def build_overlapped(self) -> popxl.Graph:
        """Loads of the next step and stores of the previous one beside each compute."""
        ir = self.graph.graph.ir
        n_loaded = len(self.loaded)

        @popxl.in_sequence()
        def step(
            index: popxl.Tensor,
            seed: popxl.Tensor,
            loaded: list[popxl.Tensor],
            stored: list[popxl.Tensor],
            passed: list[popxl.TensorByRef],
        ) -> Any:
            seed, next_seed = self.step_seed(seed)
            with self.tiles():
                previous = index - 2
            loaded_next = self.load(index)
            self.store(previous, stored)
            stored_now = self.to_io(self.compute(loaded, passed, seed))
            return (self.next_index(index), next_seed, *self.to_compute(loaded_next), *stored_now)

        def fill(index: popxl.Tensor, seed: popxl.Tensor, passed: list) -> None:
            loaded = self.to_compute(self.load(index))
            index = self.next_index(index)
            seed_0, seed = self.step_seed(seed)
            loaded_next = self.load(index)
            stored = self.to_io(self.compute(loaded, passed, seed_0))
            loaded = self.to_compute(loaded_next)
            index = self.next_index(index)
            if self.steps > 2:
                body = ir.create_graph(step, index, seed, loaded, stored, passed)
                # On the IO tiles: the carried index and stored values are IO-tile tensors.
                with self.tiles():
                    index, seed, *rest = ops.repeat(
                        body, self.steps - 2, index, seed, *loaded, *stored, *passed
                    )
                loaded, stored = list(rest[:n_loaded]), list(rest[n_loaded:])
            with self.tiles():
                previous = index - 2
            seed_n, seed = self.step_seed(seed)
            self.store(previous, stored)
            stored = self.to_io(self.compute(loaded, passed, seed_n))
            with self.tiles():
                previous = previous + 1
            self.store(previous, stored)

        return self.outer_graph(fill)

    def result(self, graph: popxl.Graph) -> BatchSerialResult:
        remap = dict(zip(self.passed, self.outer_passed))
        named = GraphWithNamedArgs(graph, self.graph.args.remap(remap))
        stored: dict[popxl.Tensor, RemoteHandle] = {}
        for t, handle in self.store_buffers.items():
            if t in self.graph.graph:
                load = self.load_handles.get(t)
                stored[t] = load if isinstance(load, RemoteHandle) else handle
        return BatchSerialResult(named, stored, remap)


def batch_serialise(
    graph: GraphWithNamedArgs,
    steps: int,
    load_handles: Mapping[popxl.Tensor, Any],
    store_streams: Mapping[popxl.Tensor, popxl.DeviceToHostStream],
    store_buffers: Mapping[popxl.Tensor, Any],
    seed_input: popxl.Tensor | None = None,
    rows: int = 1,
    io_mode: IoMode = "io",
) -> BatchSerialResult:
    """Repeat ``graph`` ``steps`` times, loading and storing per step (see module docs).

    Args:
        graph: the graph to repeat.
        steps: number of batch-serial steps.
        load_handles: ``{graph input: h2d stream | RemoteHandle | (buffer, row_offset)}``.
        store_streams: ``{graph input or output: d2h stream}``.
        store_buffers: ``{graph input or output: RemoteHandle | (buffer, row_offset)}``.
        seed_input: a ``(2,)`` uint32 graph input that gets a fresh seed every step.
        rows: rows of the remote buffers (calls of the result with different rows use
            different entries).
        io_mode: ``"compute"``, ``"io"`` or ``"io_overlapped"``.

    Returns:
        BatchSerialResult: the repeating graph (inputs: row index, seed when
        ``seed_input`` is given, then passed-through inputs) and the stored buffers.

    Raises:
        ValueError: ``rows < 1``, an unknown ``io_mode``, or an io mode without IO tiles.
        TypeError: a load handle that is neither a stream nor a remote handle.
    """
    load_handles = _as_handles(load_handles)
    store_buffers = _as_handles(store_buffers)
    if io_mode not in IO_MODES:
        raise ValueError(f"Unknown 'io_mode' {io_mode}. Supported: (compute, io, io_overlapped)")
    if rows < 1:
        raise ValueError("rows must be >0")
    if io_mode == "io_overlapped" and steps < 2:
        logging.warning("io_mode='io_overlapped' needs at least 2 steps; using io_mode='io'.")
        io_mode = "io"
    opts = graph.graph.ir.session_options
    if io_mode != "compute" and opts.numIOTiles < 1:
        raise ValueError(NO_IO_TILES_MSG.format(mode=io_mode))
    plan = _Plan(
        graph,
        steps,
        rows,
        load_handles,
        dict(store_streams),
        store_buffers,
        seed_input,
        io_mode != "compute",
    )
    built = plan.build_overlapped() if io_mode == "io_overlapped" else plan.build_serial()
    return plan.result(built)


def _activations(grad_info: GradGraphInfo) -> Iterator[tuple[int, ExpectedConnection]]:
    for i, ec in enumerate(grad_info.expected_inputs):
        if ec.connection_type == ExpectedConnectionType.Fwd:
            yield i, ec


def batch_serialise_fwd_and_grad(
    forward_graph: GraphWithNamedArgs,
    gradient_graph: GraphWithNamedArgs,
    named_inputs_for_grad_graph: NamedTensors,
    steps: int,
    load_handles: Mapping[popxl.Tensor, Any],
    store_streams: Mapping[popxl.Tensor, popxl.DeviceToHostStream],
    store_buffers: Mapping[popxl.Tensor, Any],
    seed_input: popxl.Tensor | None = None,
    rows: int = 1,
    io_mode: IoMode = "io",
) -> tuple[BatchSerialResult, BatchSerialResult]:
    """Batch-serialise a forward graph and its gradient graph.

    Activations the gradient needs are stored to new remote buffers by the forward loop
    (unless ``store_buffers`` or ``load_handles`` already place them, or they are in
    ``named_inputs_for_grad_graph``, which become named inputs of the gradient graph) and
    loaded by the gradient loop. A ``ReplicaGrouping`` as a ``store_buffers`` value shards
    that activation's buffer over the group. ``load_handles`` must give every gradient
    the gradient graph expects (``FwdGrad`` inputs).

    Returns:
        (forward result, gradient result); the gradient result's graph has a
        ``grad_graph_info`` relating it to the forward result's graph.

    Raises:
        ValueError: a gradient input without a load handle.
        RuntimeError: an activation that is neither stored nor a named input.
    """
    store_buffers = _as_handles(store_buffers)
    load_handles = _as_handles(load_handles)
    shard_groups = {t: g for t, g in store_buffers.items() if isinstance(g, popxl.ReplicaGrouping)}
    buffers = {t: b for t, b in store_buffers.items() if t not in shard_groups}
    grad_info = gradient_graph.grad_graph_info
    named_tensors = named_inputs_for_grad_graph.tensors
    for _, ec in _activations(grad_info):
        t = ec.fwd_tensor
        if t in buffers or t in named_tensors:
            continue
        if isinstance(load_handles.get(t), RemoteHandle):
            buffers[t] = load_handles[t]
            continue
        group = shard_groups.get(t)
        buffer = batch_serial_buffer(t, steps=steps, rows=rows, shard_group=group)
        buffers[t] = RemoteHandle(buffer, 0, group)

    forward = batch_serialise(
        forward_graph, steps, load_handles, store_streams, buffers, seed_input, rows, io_mode
    )

    grad_inputs = gradient_graph.graph.inputs
    grad_loads: dict[popxl.Tensor, Any] = {}
    named: dict[str, popxl.Tensor] = {}
    names = {t: name for name, t in named_inputs_for_grad_graph.named_tensors.items()}
    for i, ec in _activations(grad_info):
        t = ec.fwd_tensor
        if t in names:
            named[names[t]] = grad_inputs[i]
        elif t in forward.stored_buffers:
            grad_loads[grad_inputs[i]] = forward.stored_buffers[t]
        else:
            raise RuntimeError(MISSING_FWD_MSG.format(t=t))
    named.update(gradient_graph.args.named_tensors)
    gradient_graph.args = NamedTensors.from_dict(named)
    for i, ec in enumerate(grad_info.expected_inputs):
        if ec.connection_type == ExpectedConnectionType.FwdGrad:
            if grad_inputs[i] not in load_handles:
                raise ValueError(NO_GRAD_HANDLE_MSG.format(idx=i, t=grad_inputs[i]))
            grad_loads[grad_inputs[i]] = load_handles[grad_inputs[i]]

    gradient = batch_serialise(
        gradient_graph, steps, grad_loads, store_streams, buffers, None, rows, io_mode
    )
    gradient.graph.grad_graph_info = remap_grad_info(
        grad_info, forward_graph.graph, gradient_graph.graph
    )
    return forward, gradient


def remap_grad_info(
    grad_info: GradGraphInfo, forward_graph: popxl.Graph, backward_graph: popxl.Graph
) -> GradGraphInfo:
    """``grad_info`` re-expressed for another forward graph with the same input and output
    positions (expected connections keep their indices)."""
    old = grad_info.forward_graph

    def moved(t: popxl.Tensor, allow_outputs: bool = True) -> popxl.Tensor:
        if t in old.inputs:
            return forward_graph.inputs[old.inputs.index(t)]
        if not allow_outputs:
            raise InternalError(f"{t.id} is not an input of the forward graph", graph=old)
        return forward_graph.outputs[old.outputs.index(t)]

    ins = [ExpectedConnection._create(moved(ec.fwd_tensor), ec.connection_type)
           for ec in grad_info.expected_inputs]  # fmt: skip
    outs = [ExpectedConnection._create(moved(ec.fwd_tensor, False), ec.connection_type)
            for ec in grad_info.expected_outputs]  # fmt: skip
    return GradGraphInfo._create(backward_graph, forward_graph, ins, outs)
