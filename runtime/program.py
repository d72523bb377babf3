"""The whole IR as one compiled JAX step.

``step(state, stream_inputs) -> (state', (stream_outputs, store_counts))`` runs the main
graph once. ``state`` holds every variable (with a leading replica axis when there are
several replicas); stream inputs hold ``[slots, (replicas,) *shape]`` per host-to-device
stream. The per-replica step is mapped over a named replica axis with ``jax.vmap`` when
the IR is replicated. Steps are compiled once and cached in-process by the IR's structure.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from popxl import dtypes
from popxl.graph import Graph
from popxl.ir import Ir
from popxl.streams import DeviceToHostStream, HostToDeviceStream
from popxl.tensor import Constant, Tensor, Variable

from . import control, host_io, vjp  # noqa: F401  (register special lowerings)
from .lowering import LoweringContext, lower_graph

REPLICA_AXIS = "replica"
_STEP_CACHE: dict[str, Any] = {}


@dataclass
class Program:
    """A compiled IR and the layout of its state and streams."""

    ir: Ir
    variables: list[Variable]
    h2d: list[HostToDeviceStream]
    d2h: list[DeviceToHostStream]
    step: Any
    replicas: int
    uses_x64: bool
    key: str


def reachable_graphs(ir: Ir) -> list[Graph]:
    """The main graph and every graph it calls, directly or not, in discovery order."""
    seen: dict[Graph, None] = {ir.main_graph: None}
    stack = [ir.main_graph]
    while stack:
        for op in stack.pop()._ops:
            for g in op.referenced_graphs:
                if g not in seen:
                    seen[g] = None
                    stack.append(g)
    return list(seen)


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


def structural_key(ir: Ir, graphs: Sequence[Graph], variables: Sequence[Variable]) -> str:
    """A digest of everything that determines the compiled step."""
    h = hashlib.blake2b(digest_size=20)
    graph_index = {g: i for i, g in enumerate(graphs)}
    numbering: dict[Tensor, int] = {}

    def num(t: Tensor) -> int:
        return numbering.setdefault(t, len(numbering))

    def feed(*items: Any) -> None:
        h.update(repr(items).encode())

    feed("R", ir.replication_factor, "nht", ir.num_host_transfers)
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
            feed(op.opdef.key, attrs, [num(t) for t in op.inputs], sorted(op.modified_inputs))
            feed([(num(t), t.shape, t.dtype.name) for t in op.outputs])
        feed("outs", [num(t) for t in g._outputs])
    return h.hexdigest()


def _uses_x64(graphs: Sequence[Graph]) -> bool:
    return any(
        dtypes.is_64_bit(t.dtype) for g in graphs for t in g._tensors.values()
    )


def _make_step(
    ir: Ir, variables: list[Variable], h2d: list[HostToDeviceStream], d2h: list[DeviceToHostStream]
) -> Any:
    replicas = ir.replication_factor
    nht = ir.num_host_transfers
    main = ir.main_graph

    def replica_step(state: tuple, inputs: tuple) -> tuple:
        ctx = LoweringContext(replicas=replicas, axis_name=REPLICA_AXIS if replicas > 1 else None)
        for stream, buffer in zip(h2d, inputs):
            sid = stream.tensor_id
            ctx.h2d[sid] = buffer
            ctx.h2d_slots[sid] = buffer.shape[0]
            if buffer.shape[0] > 1:
                ctx.fx[host_io.cursor_key(sid)] = jnp.zeros((), jnp.int32)
        for stream in d2h:
            sid = stream.tensor_id
            ctx.d2h_slots[sid] = nht
            shape = (nht, *stream.shape)
            ctx.fx[host_io.buffer_key(sid)] = jnp.zeros(shape, stream.dtype.as_numpy())
            ctx.fx[host_io.count_key(sid)] = jnp.zeros((), jnp.int32)
        _, _, new_state = lower_graph(
            ctx, main, [], extra=dict(zip(variables, state)), read_back=variables
        )
        outs = tuple(ctx.fx[host_io.buffer_key(s.tensor_id)] for s in d2h)
        counts = tuple(ctx.fx[host_io.count_key(s.tensor_id)] for s in d2h)
        return tuple(new_state), (outs, counts)

    if replicas == 1:
        step = replica_step
    else:
        step = jax.vmap(
            replica_step,
            in_axes=(0, 1),
            out_axes=(0, (1, 0)),
            axis_name=REPLICA_AXIS,
            axis_size=replicas,  # a program may have no variables and no inputs to map over
        )
    return jax.jit(step, donate_argnums=(0,))


def enable_persistent_cache() -> None:
    """Use JAX's persistent compilation cache when ``POPXL_CACHE_DIR`` is set."""
    cache_dir = os.environ.get("POPXL_CACHE_DIR")
    if cache_dir and jax.config.jax_compilation_cache_dir != cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        # JAX opens its cache once per process; reopen it so the new directory is used.
        compilation_cache.reset_cache()


def build_program(ir: Ir) -> Program:
    """Lower ``ir`` to a jitted step, reusing a cached step for a structurally equal IR."""
    graphs = reachable_graphs(ir)
    variables = [v for v in ir._variables if v._remote_buffer is None]
    h2d = [s for s in ir._streams if s._is_h2d and s._used]
    d2h = [s for s in ir._streams if not s._is_h2d and s._used]
    key = structural_key(ir, graphs, variables)
    step = _STEP_CACHE.get(key)
    if step is None:
        step = _STEP_CACHE[key] = _make_step(ir, variables, h2d, d2h)
    return Program(ir, variables, h2d, d2h, step, ir.replication_factor, _uses_x64(graphs), key)


def abstract_state(program: Program) -> tuple:
    r = program.replicas
    lead = (r,) if r > 1 else ()
    return tuple(
        jax.ShapeDtypeStruct(lead + v.shape, v.dtype.as_numpy()) for v in program.variables
    )


def abstract_inputs(program: Program) -> tuple:
    r = program.replicas
    lead = (r,) if r > 1 else ()
    nht = program.ir.num_host_transfers
    return tuple(
        jax.ShapeDtypeStruct((nht, *lead, *s.shape), s.dtype.as_numpy()) for s in program.h2d
    )


def zero_state_like(program: Program) -> tuple:
    return tuple(np.zeros(s.shape, s.dtype) for s in abstract_state(program))
