"""Lowering graphs to JAX: an interpreter over ops, run once while ``jax.jit`` traces.

Each graph invocation gets an ``Env`` mapping tensors to *storage*. Ordinary op outputs own
their storage. Views (``reshape_``, ``slice_``, the handle returned by an in-place op...)
do not: reading one applies the view to its base, and writing one writes the base through
the view's inverse, so every handle on the same storage sees in-place updates, as on the IPU.

Ops whose lowering needs more than a pure function of their inputs (subgraph calls, host
and remote IO) name a ``special`` handler, registered here with ``@special``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popxl._float8_host import to_ml
from popxl._op import Op, OpDef
from popxl.errors import InternalError
from popxl.graph import Graph
from popxl.ops.collectives import sums_every_replica
from popxl.tensor import Constant, Tensor

from .replica_sums import LINEAR_ACCUMULATES, Deferred, deferred_accumulation

Array = Any
Fx = dict[str, Array]

SPECIAL: dict[str, Callable[[LoweringContext, Env, Op], None]] = {}


# The lowering of casts under the session's ``enableStochasticRounding``, registered by
# ``stochastic_rounding``: it returns False for a cast that rounds as usual.
_ROUNDED_CAST: list[Callable[[Env, Op], bool]] = []


def rounded_cast(fn: Callable[[Env, Op], bool]) -> Callable[[Env, Op], bool]:
    """Register ``fn`` as the lowering of casts under stochastic rounding (once)."""
    if _ROUNDED_CAST:
        raise InternalError(
            SPECIAL_TWICE_MSG.format(name="cast", a=_where(_ROUNDED_CAST[0]), b=_where(fn))
        )
    _ROUNDED_CAST.append(fn)
    return fn


SPECIAL_TWICE_MSG = "Special lowering {name!r} has two handlers ({a} and {b}); keep one."


def _where(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def special(name: str) -> Callable:
    """Register the runtime handler for ops whose ``OpDef.special`` is ``name``."""

    def register(fn: Callable[[LoweringContext, Env, Op], None]) -> Callable:
        if name in SPECIAL:
            raise InternalError(
                SPECIAL_TWICE_MSG.format(name=name, a=_where(SPECIAL[name]), b=_where(fn))
            )
        SPECIAL[name] = fn
        return fn

    return register


def _identity_inverse(old: Sequence[Array], new: Array) -> tuple[Array]:
    return (new,)


@dataclass(frozen=True)
class _View:
    forward: Callable[..., Array]
    inverse: Callable[..., tuple]
    parents: tuple[Tensor, ...]
    attrs: Mapping[str, Any]


class Env:
    """Tensor → value for one graph invocation, with views aliasing their bases.

    A value may be ``Deferred`` (see ``replica_sums``): ``read`` computes it, ``read_raw``
    hands it over as it is (to a consumer that can do better, or across a subgraph call).
    """

    def __init__(self, graph: Graph | None = None) -> None:
        self.values: dict[Tensor, Array] = {}
        self.views: dict[Tensor, _View] = {}
        # The graph whose ops this environment runs (None for a scratch environment).
        self.graph = graph

    def read_raw(self, t: Tensor) -> Array:
        value = self.values.get(t)
        if value is None and t in self.views:  # a row of a deferred stack (runtime.calls)
            view = self.views[t]
            pick = getattr(view.forward, "of_deferred", None)
            parent = self.values.get(view.parents[0])
            row = pick(parent) if pick is not None and isinstance(parent, Deferred) else None
            if row is not None:
                return row
        return value if isinstance(value, Deferred) else self.read(t)

    def read(self, t: Tensor) -> Array:
        value = self.values.get(t)
        if value is not None:
            if isinstance(value, Deferred):
                value = self.values[t] = value.value()
            return value
        view = self.views.get(t)
        if view is not None:
            return view.forward(*(self.read(p) for p in view.parents), **view.attrs)
        if isinstance(t, Constant):
            value = self.values[t] = jnp.asarray(to_ml(t._data))
            return value
        raise KeyError(f"tensor {t.id} has no value yet (it is read before it is written)")

    def write(self, t: Tensor, value: Array) -> None:
        view = self.views.get(t)
        if view is None:
            self.values[t] = value
            return
        if isinstance(value, Deferred):
            value = value.value()
        old = [self.read(p) for p in view.parents]
        for parent, new in zip(view.parents, view.inverse(old, value, **view.attrs)):
            self.write(parent, new)

    def alias(self, handle: Tensor, base: Tensor) -> None:
        """Make ``handle`` share ``base``'s storage."""
        self.views[handle] = _View(lambda x: x, _identity_inverse, (base,), {})

    def view(self, out: Tensor, opdef: OpDef, parents: tuple[Tensor, ...], attrs: Mapping) -> None:
        if opdef.lower is None or opdef.view_inverse is None:
            raise InternalError(f"{opdef.key} is lowered as a view but is not one")
        self.views[out] = _View(opdef.lower, opdef.view_inverse, parents, attrs)


@dataclass
class LoweringContext:
    """What lowering needs beyond one graph: stream buffers, effect state, replication."""

    h2d: dict[Any, Array] = field(default_factory=dict)
    h2d_slots: dict[Any, int] = field(default_factory=dict)
    d2h_slots: dict[Any, int] = field(default_factory=dict)
    fx: Fx = field(default_factory=dict)
    replicas: int = 1
    axis_name: str | None = None
    # How collectives compute reductions: "native" (psum & co.) or "gather" (fast under vmap).
    collective_impl: str = "native"
    print_fn: Callable[[str, Array], None] | None = None
    # The session options' enableStochasticRounding (see stochastic_rounding.py).
    stochastic_rounding: bool = False
    # The session options' syntheticDataMode, as an int (0: off; see host_io.py).
    synthetic_data: int = 0
    # A ``runtime.placement.Placement`` when virtual IPUs are placed on several devices.
    placement: Any = None
    # (first call of a run, output index) -> the ``fx`` key of its stack's scratch buffer
    # (``runtime.scratch``).
    scratch: dict[Any, str] = field(default_factory=dict)


def _checked(value: Array, t: Tensor) -> Array:
    """Cast the lowering's result to the inferred dtype; shapes must already agree."""
    want = t.dtype._np_device
    if value.dtype != want:
        value = value.astype(want)
    if tuple(value.shape) != t.shape:
        raise InternalError(
            f"the lowering produced shape {tuple(value.shape)} but shape inference said "
            f"{t.shape} for {t.id}",
            t._producer,
            t._graph,
        )
    return value


def lower_op(ctx: LoweringContext, env: Env, op: Op) -> None:
    if ctx.placement is not None:
        ctx.placement.lower(ctx, env, op)
    else:
        plain_lower_op(ctx, env, op)


def plain_lower_op(ctx: LoweringContext, env: Env, op: Op) -> None:
    """Lower ``op`` on the current device (placement, if any, is the caller's business)."""
    opdef = op.opdef
    if opdef.special is not None:
        SPECIAL[opdef.special](ctx, env, op)
        return
    if opdef.view_inverse is not None:
        env.view(op.outputs[0], opdef, op.inputs, op.attrs)
        return
    if ctx.stochastic_rounding and opdef.key == "cast" and _ROUNDED_CAST:
        if _ROUNDED_CAST[0](env, op):
            return
    if opdef.key in LINEAR_ACCUMULATES and ctx.collective_impl == "gather":
        if _deferred_accumulate(ctx, env, op):
            return
    if opdef.lower is None:
        raise InternalError(f"{opdef.key} has no lowering", op, op.graph)
    apply_results(env, op, opdef.lower(*(env.read(t) for t in op.inputs), **op.attrs))


def _deferred_accumulate(ctx: LoweringContext, env: Env, op: Op) -> bool:
    """Under vmap replication, an accumulate op fed a deferred gradient (or updating a
    deferred accumulator) leaves a ``replica_sums.Accumulation`` in the accumulator.
    Returns False where the ordinary lowering must run instead."""
    t_in, x_in = op.inputs[:2]
    dtype = t_in.dtype.as_numpy()
    if dtype not in (np.float32, np.float64):  # lower precision rounds at every update
        return False
    t, x = env.read_raw(t_in), env.read_raw(x_in)
    if op.attrs["tensor_args"]:
        factor = env.read(op.inputs[2]).reshape(()).astype(dtype)
    else:
        factor = np.asarray(op.attrs["f"], dtype)
    if ctx.axis_name is None:
        raise InternalError("a deferred accumulation needs the replica axis", op, op.graph)
    result = deferred_accumulation(op.opdef.key, t, x, factor, dtype, ctx.axis_name, ctx.replicas)
    if result is None:
        return False
    env.write(t_in, result)
    env.alias(op.outputs[0], t_in)
    return True


def apply_results(env: Env, op: Op, results: Any) -> None:
    """Store an op's lowering results: in-place writes, aliases and new outputs."""
    opdef = op.opdef
    if not isinstance(results, tuple):
        results = (results,)
    for in_index, result_index in opdef.modifies:
        target = op.inputs[in_index]
        env.write(target, _checked(results[result_index], target))
    aliased = dict(opdef.alias_outputs)
    for k, out in enumerate(op.outputs):
        if k in aliased:
            env.alias(out, op.inputs[aliased[k]])
        else:
            env.values[out] = _checked(results[k], out)


@special("collective")
def _lower_collective(ctx: LoweringContext, env: Env, op: Op) -> None:
    if op.opdef.lower is None:
        raise InternalError(f"{op.opdef.key} has no lowering", op, op.graph)
    impl = ctx.collective_impl
    args = [env.read_raw(t) for t in op.inputs]
    if isinstance(args[0], Deferred):
        if impl == "gather" and sums_every_replica(op):
            if ctx.axis_name is None:
                raise InternalError("a deferred replica sum needs the replica axis", op, op.graph)
            args[0], impl = args[0].replica_sum(ctx.axis_name, ctx.replicas), "summed"
        else:
            args[0] = env.read(op.inputs[0])
    apply_results(env, op, op.opdef.lower(*args, **op.attrs, impl=impl))


def lower_graph(
    ctx: LoweringContext,
    graph: Graph,
    inputs: Sequence[Array],
    extra: Mapping[Tensor, Array] | None = None,
    read_back: Sequence[Tensor] = (),
    ops: Sequence[Op] | None = None,
    raw_outputs: bool = False,
) -> tuple[list[Array], list[Array], list[Array]]:
    """Run ``graph``'s ops on ``inputs``.

    Returns:
        (output values, final values of the graph inputs, final values of ``read_back``).
        With ``raw_outputs`` outputs and final input values may be ``Deferred`` (for a
        caller that inlines).
    """
    env = Env(graph)
    for t, value in zip(graph._inputs, inputs):
        env.values[t] = value
    if extra:
        env.values.update(extra)
    for op in schedule(ctx, graph) if ops is None else ops:
        lower_op(ctx, env, op)
    read = env.read_raw if raw_outputs else env.read
    placement = ctx.placement
    if placement is not None:  # a value read from a view keeps its storage's home
        read = placement.reader(env, read)
    outs = [read(t) for t in graph._outputs]
    final_inputs = [read(t) for t in graph._inputs]
    return outs, final_inputs, [env.read(t) for t in read_back]


# The order a graph's ops are lowered in: program order unless ``runtime.calls`` registers a
# scheduler (which brings calls of one graph, and identical variable updates, together).
_SCHEDULER: list[Callable[[LoweringContext, Graph], Sequence[Any]]] = []


def scheduler(fn: Callable[[LoweringContext, Graph], Sequence[Any]]) -> Callable:
    """Register the function giving the order ``lower_graph`` lowers a graph's ops in."""
    _SCHEDULER[:] = [fn]
    return fn


def schedule(ctx: LoweringContext, graph: Graph) -> Sequence[Any]:
    """``graph``'s ops (and op groups) in lowering order."""
    return _SCHEDULER[0](ctx, graph) if _SCHEDULER else graph._ops


def zeros_for(t: Tensor) -> Array:
    return jnp.zeros(t.shape, t.dtype._np_device)


def host_value(array: Array) -> np.ndarray:
    return np.asarray(jax.device_get(array))
