"""The whole IR as one compiled JAX step.

``step(state, stream_inputs) -> (state', (stream_outputs, store_counts))`` runs the main
graph once. ``state`` holds every variable (with a leading replica axis when there are
several replicas); stream inputs hold ``[slots, (replicas,) *shape]`` per host-to-device
stream. The per-replica step is mapped over a named replica axis with ``jax.vmap`` when
the IR is replicated. Steps are compiled once and cached in-process by the IR's structure.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compilation_cache import compilation_cache
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from popxl import dtypes
from popxl._op import Op
from popxl.graph import Graph
from popxl.ir import Ir
from popxl.ops._base import chosen_precision
from popxl.remote_buffer import RemoteBuffer
from popxl.streams import DeviceToHostStream, HostToDeviceStream
from popxl.tensor import Constant, Tensor, Variable
from popxl.transforms._storage import roots, written_inputs

from ..backend import transpose_sinking, xla_options
from ..backend.forms import cpu_forms
from ..backend.xla_workarounds import fenced
from ..devices.ipu_slots import SlotLayout
from ..devices.memory import tensor_ipu
from ..devices.placement import (
    ipus_used,
    placed_sharding,
    placed_step,
    placement_ipus,
    state_written,
)
from ..distributed import instances as distributed
from ..lowering import (  # noqa: F401  (register lowerings)
    calls,
    checks,
    control,
    host_io,
    remote,
    runs,
    scratch,
    state_layout,
    stochastic_rounding,
    vjp,
)
from ..lowering.core import Env, LoweringContext, lower_op, schedule
from ..lowering.graphs import convolves, reachable_graphs
from ..lowering.replica_sums import is_batched
from .sunk_step import SunkStep

REPLICA_AXIS = "replica"
# Compiled steps by IR structure, least recently used first; bounded so that programs built
# and dropped in a long process do not keep their IRs and executables alive forever. An
# entry holds its IR and so the IR's weights: beside the count, the entries other than the
# newest hold at most STEP_CACHE_BYTES of variable data (a zoo of models built one after
# another in a process would otherwise keep 64 models' weights).
_STEP_CACHE: OrderedDict[str, Any] = OrderedDict()
STEP_CACHE_SIZE = 64
STEP_CACHE_BYTES = 1 << 30
_STEP_CACHE_WEIGHTS: dict[str, int] = {}  # the bytes of variable data each entry holds


@dataclass
class Program:
    """A compiled IR and the layout of its state and streams.

    The state is the on-chip variables followed by the remote buffers. Variables are
    grouped into *entries* (``state_layout``): one variable each, or a stack of several
    (the per-layer variables of a run of calls); ``batched`` and ``written`` are per entry.
    """

    ir: Ir
    variables: list[Variable]
    buffers: list[RemoteBuffer]
    h2d: list[HostToDeviceStream]
    d2h: list[DeviceToHostStream]
    step: Any
    replicas: int
    mode: str
    uses_x64: bool
    key: str
    # Per state entry: whether it has a leading replica axis. Under vmap, variables that
    # every replica keeps identical (shared initial value, replica-invariant updates) are
    # stored once, so replicas do not multiply weight memory traffic.
    batched: tuple[bool, ...] = ()
    # Per state entry: whether the program writes it (only those are donated and returned).
    written: tuple[bool, ...] = ()
    # Run-time value checks (``runtime.checks``); their reports follow the store counts.
    checks: tuple[str, ...] = ()
    # Devices the virtual IPUs are placed on (0: one device), and then where each variable
    # lives (``runtime.ipu_slots``): the state's variable arrays are the layout's slots.
    ipus: int = 0
    slots: SlotLayout | None = None
    # Replicas run by this process; fewer than ``replicas`` when instances share them.
    local_replicas: int = 0
    # Per state entry: the indices of its variables (one, or several stacked).
    entries: tuple[tuple[int, ...], ...] = ()
    # The step's scratch buffers (``runtime.scratch``): donated after the written state
    # entries and returned after them.
    scratch: tuple[scratch.Buffer, ...] = ()
    # Per state entry: the transpose of the program's layout the state keeps it in (None:
    # as the program names it), chosen by the step (``SunkStep.choose_layouts``).
    layouts: tuple[tuple[int, ...] | None, ...] = ()

    @property
    def n_entries(self) -> int:
        """The number of state arrays holding variables (entries, or placed slots)."""
        return len(self.slots.slots) if self.slots else len(self.entries)

    @property
    def homes(self) -> tuple[int | None, ...]:
        """Per variable, the IPU whose device holds it when placed (else None)."""
        if self.slots is None:
            return (None,) * len(self.variables)
        return self.slots.owners

    def scratch_specs(self) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
        """(shape, dtype) of each scratch buffer as the step takes it: one per replica
        when replicas are mapped (``vmap``, ``shard_map``)."""
        lead = (self.replicas,) if self.mode in ("vmap", "shard_map") else ()
        return tuple(((*lead, *b.shape), b.dtype) for b in self.scratch)

    def variable_batched(self) -> dict[Variable, bool]:
        """Whether each variable's device value has a leading replica axis."""
        if self.slots:  # placed: every replica keeps its own copy
            return {v: self.replicas > 1 for v in self.variables}
        return {self.variables[i]: b for e, b in zip(self.entries, self.batched) for i in e}

    def pack(self, values: list) -> list:
        """Per-variable device-layout arrays → the state's variable entries."""
        if self.slots:  # placed programs keep one entry per variable
            return self.slots.pack(values, self.replica_lead)
        packed = state_layout.pack(self.entries, values, self.batched)
        return [v if p is None else np.transpose(v, p) for v, p in zip(packed, self._layouts())]

    def unpack(self, values: Sequence) -> list:
        """The state's variable entries → per-variable arrays."""
        if self.slots:
            return self.slots.unpack(values, self.replica_lead)
        logical = [
            v if p is None else np.transpose(v, transpose_sinking.inverse(p))
            for v, p in zip(values, self._layouts())
        ]
        return state_layout.unpack(self.entries, logical, self.batched)

    def _layouts(self) -> tuple[tuple[int, ...] | None, ...]:
        return self.layouts or (None,) * len(self.entries)

    def entry_layout(self, entry: int) -> tuple[int, ...] | None:
        """The layout state entry ``entry`` is kept in (None: the program's)."""
        return self.layouts[entry] if self.layouts else None

    @property
    def replica_lead(self) -> tuple[int, ...]:
        """The replica axis placed state arrays lead with: ``(replicas,)`` or none."""
        return (self.replicas,) if self.replicas > 1 else ()

    @property
    def ipu_axis(self) -> int:
        """The axis of placed state arrays that runs over the IPUs' devices."""
        return len(self.replica_lead)

    def split(self, state: tuple) -> tuple[tuple, tuple]:
        """(written entries, read-only entries) of a full state tuple."""
        # A training step writes every entry: nothing to sort out (sorting the 88 entries
        # of transformer_step's program took 22 us per run, passing them through 1 us).
        if all(self.written):
            return tuple(state), ()
        return (
            tuple(v for v, w in zip(state, self.written) if w),
            tuple(v for v, w in zip(state, self.written) if not w),
        )

    def merge(self, state: tuple, new_written: tuple) -> tuple:
        """``state`` with its written entries replaced by ``new_written``."""
        if all(self.written):
            return tuple(new_written)
        values = iter(new_written)
        return tuple(next(values) if w else v for v, w in zip(state, self.written))

    def store_counts(self, scalars: tuple) -> tuple:
        """The store counts of the d2h streams from a step's per-replica scalars, after
        raising the error of a failed run-time check (``runtime.checks``)."""
        n = len(self.d2h)
        checks.raise_if_failed(self.checks, scalars[n:])
        return scalars[:n]


def _attr_key(value: Any, graph_index: dict[Graph, int]) -> Any:
    if isinstance(value, Graph):
        return ("graph", graph_index[value])
    if isinstance(value, (tuple, list)):
        return tuple(_attr_key(v, graph_index) for v in value)
    if isinstance(value, dtypes.dtype):
        return value.name
    if isinstance(value, np.ndarray):
        # repr() elides the middle of large arrays; hash the bytes instead.
        digest = hashlib.blake2b(np.ascontiguousarray(value).tobytes(), digest_size=16)
        return ("ndarray", value.shape, value.dtype.str, digest.hexdigest())
    if hasattr(value, "structural_key"):
        return value.structural_key(lambda v: _attr_key(v, graph_index))
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return value


def structural_key(
    ir: Ir,
    graphs: Sequence[Graph],
    variables: Sequence[Variable],
    buffers: Sequence[RemoteBuffer] = (),
    mode: str = "none",
    run_checks: tuple[str, ...] = (),
) -> str:
    """A digest of everything that determines the compiled step."""
    h = hashlib.blake2b(digest_size=20)
    graph_index = {g: i for i, g in enumerate(graphs)}
    numbering: dict[Tensor, int] = {}

    def num(t: Tensor) -> int:
        return numbering.setdefault(t, len(numbering))

    def feed(*items: Any) -> None:
        h.update(repr(items).encode())

    feed("R", ir.replication_factor, "nht", ir.num_host_transfers, "mode", mode)
    feed("stochastic rounding", ir.session_options.enableStochasticRounding)
    feed("synthetic data", ir.session_options.syntheticDataMode.value)
    # The user's float32 matmul precision (``popxl.ops._base.dot_precision``) is traced in.
    feed("matmul precision", chosen_precision())
    feed("calls", runs.policy(ir))
    for b in buffers:
        feed("buffer", b.remote_buffer_id, b.entries, b.tensor_shape, b.tensor_dtype.name)
    for v in variables:
        feed("var", num(v), v.shape, v.dtype.name)
    for s in ir._streams:
        feed("stream", num(s._handle), s.shape, s.dtype.name, s._is_h2d, s._used)
    for g in graphs:
        feed("graph", graph_index[g], [num(t) for t in g._inputs])
        for op in g._ops:
            attrs = sorted((k, _attr_key(v, graph_index)) for k, v in op.attrs.items())
            for t in op.inputs:
                # Constants are baked into the step, so their values are part of its identity.
                if isinstance(t, Constant) and t not in numbering:
                    feed("const", num(t), t.shape, t.dtype.name)
                    h.update(np.ascontiguousarray(t._data).tobytes())
            feed(
                op.opdef.key,
                attrs,
                [num(t) for t in op.inputs],
                sorted(op.modified_inputs),
                op.execution_context,
            )
            feed([(num(t), t.shape, t.dtype.name) for t in op.outputs])
        feed("outs", [num(t) for t in g._outputs])
    feed("checks", run_checks)
    return h.hexdigest()


def _uses_x64(graphs: Sequence[Graph]) -> bool:
    return any(dtypes.is_64_bit(t.dtype) for g in graphs for t in g._tensors.values())


def replication_mode(replicas: int) -> str:
    """How replicas are mapped: ``"none"`` (one replica), ``"vmap"`` (one device) or
    ``"shard_map"`` (one device per replica).

    ``POPXL_REPLICATION`` = ``auto`` (default: ``shard_map`` when JAX has at least
    ``replicas`` devices, else ``vmap``), ``vmap`` or ``shard_map``.
    """
    if replicas == 1:
        return "none"
    choice = os.environ.get("POPXL_REPLICATION", "auto")
    if choice not in ("auto", "vmap", "shard_map"):
        raise ValueError(f"POPXL_REPLICATION must be auto, vmap or shard_map, got {choice!r}.")
    enough = len(jax.local_devices()) >= replicas
    if choice == "shard_map" and not enough:
        raise ValueError(
            f"POPXL_REPLICATION=shard_map needs {replicas} devices, JAX has {len(jax.devices())}. "
            "Use vmap, or force host devices with XLA_FLAGS=--xla_force_host_platform_device_count."
        )
    if choice == "auto":
        return "shard_map" if enough else "vmap"
    return choice


def main_schedule(ir: Ir, ops: Sequence[Any] | None = None) -> list[Op]:
    """The main graph's ops (or ``ops``, an order of them) in run order: ops of the
    weights-to-host fragment run last."""
    ops = ir.main_graph._ops if ops is None else ops
    last = [op for op in ops if op.execution_context == "WeightsToHostFragment"]
    return [op for op in ops if op.execution_context != "WeightsToHostFragment"] + last


def _make_step(
    ir: Ir,
    variables: list[Variable],
    buffers: list[RemoteBuffer],
    h2d: list[HostToDeviceStream],
    d2h: list[DeviceToHostStream],
    mode: str,
    run_checks: tuple[str, ...],
    local_replicas: int,
    entries: tuple[tuple[int, ...], ...],
) -> Any:
    replicas = ir.replication_factor
    nht = ir.num_host_transfers
    main = ir.main_graph
    n_vars = len(entries)

    # Scratch stash buffers; not across instances (each would make only its own replicas').
    one_process = mode != "shard_map" or local_replicas == replicas
    stash = scratch.plan(ir) if mode in ("none", "vmap", "shard_map") and one_process else ()

    def replica_step(
        state: tuple, inputs: tuple, placement: Any = None, buffers_in: tuple = ()
    ) -> tuple:
        ctx = LoweringContext(
            replicas=replicas,
            axis_name=REPLICA_AXIS if replicas > 1 else None,
            collective_impl="gather" if mode == "vmap" else "native",
            stochastic_rounding=ir.session_options.enableStochasticRounding,
            synthetic_data=ir.session_options.syntheticDataMode.value,
            placement=placement,
        )
        checks.start(ctx, run_checks)
        _seed_streams(ctx, h2d, inputs, d2h, nht)
        for buffer, value in zip(buffers, state[n_vars:]):
            ctx.fx[remote.buffer_key(buffer.remote_buffer_id)] = value
        scratch.seed(ctx, stash[: len(buffers_in)], buffers_in)
        env = Env(main)
        keys = state_layout.seed_env(env, entries, variables, state[:n_vars])
        for op in main_schedule(ir, schedule(ctx, main)):
            lower_op(ctx, env, op)
        new_vars = state_layout.read_entries(env, keys)
        new_buffers = [ctx.fx[remote.buffer_key(b.remote_buffer_id)] for b in buffers]
        outs = tuple(ctx.fx[host_io.buffer_key(s.tensor_id)] for s in d2h)
        counts = tuple(ctx.fx[host_io.count_key(s.tensor_id)] for s in d2h)
        new_state = (*new_vars, *new_buffers)
        if run_checks:
            new_state = checks.keep_on_failure(checks.any_failed(ctx, run_checks), state, new_state)
        outputs = (outs, counts + checks.reports(ctx, run_checks))
        if buffers_in:
            return new_state, outputs, scratch.finals(ctx, stash)
        return new_state, outputs

    n_state = n_vars + len(buffers)
    shapes = [_entry_shape(variables, e) for e in entries]
    shapes += [((b.entries, *b.tensor_shape), b.tensor_dtype._np_device) for b in buffers]
    inputs = [(s.shape, s.dtype._np_device) for s in h2d]
    per_variable = written_state(ir, variables, buffers)
    written = tuple(any(per_variable[i] for i in e) for e in entries)
    written += per_variable[len(variables) :]
    if mode.startswith("placed"):
        ipus = int(mode.split(":")[1])
        step, layout = _placed(
            replica_step, variables, written, ipus, shapes, inputs, nht, replicas
        )
        writes = state_written(layout, written)
        return step, (True,) * len(writes), writes, layout, ()
    if mode == "vmap":
        candidates = [_may_be_shared(variables[e[0]]) for e in entries] + [False] * len(buffers)
        batched = _probe_batched(replica_step, candidates, shapes, inputs, nht, replicas)
    else:
        batched = (mode == "shard_map",) * n_state
    sink, large = _compiled_as(ir, mode)
    unstacked = tuple(len(e) == 1 for e in entries)
    step = _split_step(
        replica_step, batched, written, mode, replicas, local_replicas, stash, sink, large, unstacked
    )  # fmt: skip
    return step, batched, written, (), stash


def _compiled_as(ir: Ir, mode: str) -> tuple[bool, bool]:
    """(whether the step's transposes are sunk: a program with convolutions on the CPU's
    forms; whether it compiles for products of many rows, ``xla_options``)."""
    has_convolutions = convolves(ir)
    sink = mode != "shard_map" and cpu_forms() and has_convolutions
    ops = (op for g in reachable_graphs(ir) for op in g._ops)
    return sink, not has_convolutions and xla_options.large_products(ops)


def _seed_streams(
    ctx: LoweringContext,
    h2d: list[HostToDeviceStream],
    inputs: tuple,
    d2h: list[DeviceToHostStream],
    nht: int,
) -> None:
    """The step's host streams in the effect state: each input's data (with a cursor when
    it holds several transfers) and each output's buffer of ``nht`` rows with its count."""
    for stream, buffer in zip(h2d, inputs):
        sid = stream.tensor_id
        ctx.h2d[sid] = buffer
        ctx.h2d_slots[sid] = buffer.shape[0]
        if buffer.shape[0] > 1:
            ctx.fx[host_io.cursor_key(sid)] = jnp.zeros((), jnp.int32)
    for out_stream in d2h:
        sid = out_stream.tensor_id
        ctx.d2h_slots[sid] = nht
        shape = (nht, *out_stream.shape)
        ctx.fx[host_io.buffer_key(sid)] = jnp.zeros(shape, out_stream.dtype._np_device)
        ctx.fx[host_io.count_key(sid)] = jnp.zeros((), jnp.int32)


def _placed(
    replica_step: Any,
    variables: list[Variable],
    written: tuple,
    ipus: int,
    shapes: list,
    inputs: list,
    nht: int,
    replicas: int = 1,
) -> tuple[Any, SlotLayout]:
    """The jitted step placed on ``ipus`` devices (per replica), and its variables' slot
    layout.

    Each variable is owned by the IPU where the program leaves its last write (found by
    tracing, no compilation), else by the first IPU that reads it (``memory.tensor_ipu``);
    tracing again with those owners must give the same answer.
    """
    n_vars = len(variables)
    owners = [min(tensor_ipu(v), ipus - 1) for v in variables]
    lead = (replicas,) if replicas > 1 else ()
    ins = tuple(jax.ShapeDtypeStruct((nht, *lead, *shape), dt) for shape, dt in inputs)

    def abstract(layout: SlotLayout) -> tuple:
        arrays = [layout.slot_shape(k) for k in range(len(layout.slots))]
        arrays += [((ipus, *shape), dt) for shape, dt in shapes[n_vars:]]
        sharding = placed_sharding(ipus, replicas)  # as the session lowers the step
        structs = [
            jax.ShapeDtypeStruct((*lead, *shape), dt, sharding=sharding) for shape, dt in arrays
        ]
        writes = state_written(layout, written)
        mut = tuple(s for s, w in zip(structs, writes) if w)
        return mut, tuple(s for s, w in zip(structs, writes) if not w), ins

    for _ in range(4):
        layout = SlotLayout.build(ipus, shapes[:n_vars], owners)
        probe: list = []
        placed = placed_step(replica_step, layout, written, probe, replicas)
        # Probed through the jitted step itself: JAX keeps the trace, and lowering the
        # step for the same shapes reuses it (a pipelined GPT's trace took a second).
        jitted = xla_options.jit(placed, donate_argnums=(0,))
        jax.eval_shape(jitted, *abstract(layout))
        found = [h if w and h is not None else o for o, h, w in zip(owners, probe, written)]
        if found == owners:
            return jitted, layout
        owners = found
    layout = SlotLayout.build(ipus, shapes[:n_vars], owners)
    placed = placed_step(replica_step, layout, written, replicas=replicas)
    return xla_options.jit(placed, donate_argnums=(0,)), layout


def _entry_shape(variables: list[Variable], entry: tuple[int, ...]) -> tuple:
    """(shape, numpy dtype) of one state entry."""
    v = variables[entry[0]]
    lead = (len(entry),) if len(entry) > 1 else ()
    return (*lead, *v.shape), v.dtype._np_device


def written_state(
    ir: Ir, variables: list[Variable], buffers: list[RemoteBuffer]
) -> tuple[bool, ...]:
    """Which variables and remote buffers the program may write (found from the IR).

    A variable is written when a main-graph op writes its storage (in-place ops, by-ref
    inputs of calls and loops); a buffer when any op stores to it.
    """
    written: set[Any] = set()
    for op in ir.main_graph._ops:
        for i in written_inputs(op):
            written.update(roots(op.inputs[i]))
    stored = {
        op.attrs["buffer_id"]
        for g in reachable_graphs(ir)
        for op in g._ops
        if op.opdef.key == "remote_store"
    }
    return tuple(v in written for v in variables) + tuple(
        b.remote_buffer_id in stored for b in buffers
    )


def _split_step(
    replica_step: Any,
    batched: tuple,
    written: tuple,
    mode: str,
    replicas: int,
    local: int,
    stash: tuple = (),
    sink: bool = False,
    large_products: bool = False,
    unstacked: tuple[bool, ...] = (),
) -> Any:
    """The jitted ``step(written_state, constant_state, inputs)``: only state the program
    writes is donated and returned; read-only state (e.g. weights of an inference program)
    is passed in and left where it is. The scratch buffers (``stash``) follow the written
    state, donated and returned the same way. ``large_products``: compiled for products of
    many rows (``xla_options``); ``unstacked``: per variable entry, whether it holds one
    variable (those a convolution program may store transposed, ``SunkStep``)."""
    mutable = [i for i, w in enumerate(written) if w]
    const = [i for i, w in enumerate(written) if not w]

    def step(mut: tuple, fixed: tuple, inputs: tuple) -> tuple:
        state: list[Any] = [None] * len(written)
        for i, v in zip(mutable, mut):
            state[i] = v
        for i, v in zip(const, fixed):
            state[i] = v
        if stash:
            buffers = tuple(mut[len(mutable) :])
            new_state, outs, buffers = replica_step(tuple(state), inputs, None, buffers)
            return (*(new_state[i] for i in mutable), *buffers), outs
        new_state, outs = replica_step(tuple(state), inputs)
        return tuple(new_state[i] for i in mutable), outs

    if mode == "vmap":
        mut_axes = tuple(0 if batched[i] else None for i in mutable) + (0,) * len(stash)
        const_axes = tuple(0 if batched[i] else None for i in const)
        step = jax.vmap(
            step,
            in_axes=(mut_axes, const_axes, 1),
            out_axes=(mut_axes, (1, 0)),
            axis_name=REPLICA_AXIS,
            axis_size=replicas,  # a program may have no variables and no inputs to map over
        )
    elif mode == "shard_map":
        step = _shard_mapped(step, replicas, local)
    if sink:  # the transposes between channels-last convolutions cancel
        candidates = unstacked + (False,) * (len(written) - len(unstacked))  # not buffers
        return SunkStep(step, written, candidates, len(stash))
    return xla_options.jit(step, large_products=large_products, donate_argnums=(0,))


def compiled_step(step: Any, executable: Any) -> Any:
    """The callable that runs ``executable``, compiled from ``step.lower`` (as the executable
    cache loads it), as ``step`` is called."""
    return step.compiled(executable) if isinstance(step, SunkStep) else executable


def _stacking_class(var: Variable) -> tuple:
    """Variables stacked together agree on this (their replica layout)."""
    grouping = var.replica_grouping
    return (_may_be_shared(var), grouping.num_groups, grouping.group_size, var.retrieval_mode)


def _may_be_shared(var: Variable) -> bool:
    grouping = var.replica_grouping
    per_replica = var.retrieval_mode == "all_replicas" and grouping.group_size > 1
    return grouping.num_groups == 1 and not per_replica


def _probe_batched(
    replica_step: Any,
    candidates: list[bool],
    shapes: list[tuple],
    inputs: list[tuple],
    nht: int,
    replicas: int,
) -> tuple[bool, ...]:
    """Which state entries need one copy per replica under vmap: trace the mapped step
    (no compilation) with the candidates unmapped; any whose new value depends on the
    replica becomes mapped, until that no longer changes (the mapped set only grows)."""
    shared = list(candidates)
    ins = tuple(jax.ShapeDtypeStruct((nht, replicas, *shape), dt) for shape, dt in inputs)
    while True:
        flags: list[bool] = []

        def probe(state: tuple, ins: tuple, flags: list[bool] = flags) -> tuple:
            new_state, outs = replica_step(state, ins)
            flags[:] = [is_batched(x) for x in new_state]
            return new_state, outs

        state = tuple(
            jax.ShapeDtypeStruct(shape if s else (replicas, *shape), dt)
            for (shape, dt), s in zip(shapes, shared)
        )
        axes = tuple(None if s else 0 for s in shared)
        mapped = jax.vmap(
            probe,
            in_axes=(axes, 1),
            out_axes=(0, (1, 0)),
            axis_name=REPLICA_AXIS,
            axis_size=replicas,
        )
        jax.eval_shape(mapped, state, ins)
        still_shared = [s and not f for s, f in zip(shared, flags)]
        if still_shared == shared:
            return tuple(not s for s in shared)
        shared = still_shared


def replica_mesh(replicas: int, local_replicas: int | None = None) -> Mesh:
    """One device per replica: this process's devices, or every instance's
    (``local_replicas`` each) when instances share the replicas."""
    if local_replicas is None or local_replicas == replicas:
        devices = jax.local_devices()[:replicas]
    else:
        devices = distributed.replica_devices(replicas, local_replicas)
    return Mesh(np.array(devices), (REPLICA_AXIS,))


def _shard_mapped(replica_step: Any, replicas: int, local: int) -> Any:
    """``replica_step`` run on one device per replica (each block has a leading axis of 1)."""

    def block_step(mut: tuple, fixed: tuple, inputs: tuple) -> tuple:
        new_state, (outs, counts) = replica_step(
            tuple(s[0] for s in mut), tuple(s[0] for s in fixed), tuple(i[:, 0] for i in inputs)
        )
        return (
            tuple(s[None] for s in fenced(new_state)),
            (tuple(o[:, None] for o in outs), tuple(c[None] for c in counts)),
        )

    return jax.shard_map(
        block_step,
        mesh=replica_mesh(replicas, local),
        in_specs=(P(REPLICA_AXIS), P(REPLICA_AXIS), P(None, REPLICA_AXIS)),
        out_specs=(P(REPLICA_AXIS), (P(None, REPLICA_AXIS), P(REPLICA_AXIS))),
        check_vma=False,
    )


def enable_persistent_cache() -> None:
    """Use JAX's persistent compilation cache when ``POPXL_CACHE_DIR`` is set."""
    cache_dir = os.environ.get("POPXL_CACHE_DIR")
    if cache_dir and jax.config.jax_compilation_cache_dir != cache_dir:  # type: ignore[attr-defined]
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        # JAX opens its cache once per process; reopen it so the new directory is used.
        compilation_cache.reset_cache()


def _host_bytes(var: Variable) -> int:
    data = var._host_data
    return 0 if data is None or isinstance(data, np.memmap) else int(data.nbytes)


def _bound_step_cache() -> None:
    """Drop the least recently used steps past ``STEP_CACHE_SIZE`` entries, or while the
    entries before the newest hold more than ``STEP_CACHE_BYTES`` of weights."""

    def older_bytes() -> int:
        return sum(_STEP_CACHE_WEIGHTS.get(k, 0) for k in list(_STEP_CACHE)[:-1])

    while len(_STEP_CACHE) > STEP_CACHE_SIZE or (
        len(_STEP_CACHE) > 1 and older_bytes() > STEP_CACHE_BYTES
    ):
        key, _ = _STEP_CACHE.popitem(last=False)
        _STEP_CACHE_WEIGHTS.pop(key, None)


def build_program(ir: Ir) -> Program:
    """Lower ``ir`` to a jitted step, reusing a cached step for a structurally equal IR."""
    graphs = reachable_graphs(ir)
    variables = [v for v in ir._variables if v._remote_buffer is None]
    buffers = list(ir._remote_buffers)
    h2d = [cast(HostToDeviceStream, s) for s in ir._streams if s._is_h2d and s._used]
    d2h = [cast(DeviceToHostStream, s) for s in ir._streams if not s._is_h2d and s._used]
    local = ir.instance_replication_factor
    run_checks = checks.program_checks(ir, graphs)
    ipus = 0
    if distributed.is_multi_process(ir):
        mode = "shard_map"
        key = structural_key(ir, graphs, variables, buffers, f"{mode}/{local}", run_checks)
    else:
        mode = replication_mode(ir.replication_factor)
        ipus = placement_ipus(ipus_used(graphs), ir.replication_factor)
        if ipus:
            mode = f"placed:{ipus}"
        key = structural_key(ir, graphs, variables, buffers, mode, run_checks)
    cached = _STEP_CACHE.get(key)
    if cached is None:
        # Placed and multi-instance steps keep one entry per variable (no stacks).
        stacks = not ipus and not distributed.is_multi_process(ir)
        groups = (
            state_layout.variable_groups(ir.main_graph, variables, _stacking_class)
            if stacks
            else []
        )
        entries = state_layout.entries_for(len(variables), groups)
        made = _make_step(ir, variables, buffers, h2d, d2h, mode, run_checks, local, entries)
        cached = _STEP_CACHE[key] = (*made, entries)
        _STEP_CACHE_WEIGHTS[key] = sum(_host_bytes(v) for v in variables)
    _STEP_CACHE.move_to_end(key)
    _bound_step_cache()
    step, batched, written, slots, stash, entries = cached
    program = Program(
        ir,
        variables,
        buffers,
        h2d,
        d2h,
        step,
        ir.replication_factor,
        mode,
        _uses_x64(graphs),
        key,
        batched,
        written,
        run_checks,
        ipus,
        slots or None,
        local,
        entries,
        stash,
    )
    if isinstance(step, SunkStep):
        with jax.enable_x64(True) if program.uses_x64 else contextlib.nullcontext():
            program.layouts = step.choose_layouts(_abstract_arguments(program))
    return program


def _abstract_arguments(program: Program) -> tuple:
    """The step's arguments ``(written state and scratch, read-only state, inputs)``,
    abstract, in the program's layout."""
    mut, fixed = program.split(abstract_state(program))
    stash = tuple(jax.ShapeDtypeStruct(s, d) for s, d in program.scratch_specs())
    return (*mut, *stash), fixed, abstract_inputs(program)


def state_sharding(program: Program, device: jax.Device) -> jax.sharding.Sharding:
    """Where the state lives: one device, or split over the replica mesh."""
    if program.mode == "shard_map":
        return NamedSharding(
            replica_mesh(program.replicas, program.local_replicas), P(REPLICA_AXIS)
        )
    if program.ipus:
        return placed_sharding(program.ipus, program.replicas)
    return jax.sharding.SingleDeviceSharding(device)


def abstract_state(program: Program) -> tuple:
    r = program.replicas
    shapes = [_entry_shape(program.variables, e) for e in program.entries]
    if program.slots:  # (ipus, size) per slot: already per device
        layout = program.slots
        shapes = [(s[1:], dt) for s, dt in map(layout.slot_shape, range(len(layout.slots)))]
    shapes += [((b.entries, *b.tensor_shape), b.tensor_dtype._np_device) for b in program.buffers]
    lead = (*program.replica_lead, program.ipus) if program.ipus else (r,)
    layouts = program.layouts + (None,) * (len(shapes) - len(program.layouts))
    full = [
        ((lead if batched else ()) + shape, dt)
        for (shape, dt), batched in zip(shapes, program.batched)
    ]
    return tuple(
        jax.ShapeDtypeStruct(shape if p is None else tuple(shape[i] for i in p), dt)
        for (shape, dt), p in zip(full, layouts)
    )


def abstract_inputs(program: Program) -> tuple:
    r = program.replicas
    lead = (r,) if r > 1 else ()
    nht = program.ir.num_host_transfers
    return tuple(
        jax.ShapeDtypeStruct((nht, *lead, *s.shape), s.dtype._np_device) for s in program.h2d
    )
