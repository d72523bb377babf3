"""Placement of virtual IPUs on JAX devices.

When a program uses ``N > 1`` virtual IPUs (``popxl.ipu(n)``, ``ipu_copy``) and JAX has at
least ``N`` devices, the step runs under ``shard_map`` over a mesh axis ``"ipu"`` of ``N``
devices: device ``k`` is virtual IPU ``k``.

* **Compute.** An op placed on IPU ``k`` runs only on device ``k`` (``lax.cond`` on the
  device's index; the other devices skip it). A ``call`` of a subgraph without effects
  runs as one unit on the call site's IPU. ``print_tensor`` prints from its IPU's device.
* **Values.** Every value has a *home*: the device where it is valid (``None``: valid on
  every device, e.g. host loads and values computed from them everywhere). An op on IPU
  ``k`` that reads a value homed elsewhere first moves it to ``k`` with ``lax.ppermute``:
  ``ipu_copy`` is exactly such a device-to-device transfer, and implicit transfers keep
  programs that read across IPUs without a copy correct. The copies of one call of a
  copies-only graph (a pipeline cycle's transfers) that share a shape and dtype travel in
  one ``ppermute``, so the devices meet once per cycle rather than once per copy.
* **Updates.** An in-place op skipped on a foreign device leaves its input unchanged;
  elementwise variable updates (optimizer steps, accumulator resets) are computed on every
  device and selected, which XLA fuses into one in-place pass (a branch would copy).
* **State.** Each variable is owned by one IPU (the one whose ops leave its last write,
  found by tracing the step; else the first IPU to read it) and held only on that IPU's
  device: variables of equal dtype and size owned by different IPUs share one array
  (``runtime.ipu_slots``), so per-device variable memory is what that IPU owns. Host
  stores, remote stores and branch predicates are broadcast from their home so streams
  and remote buffers stay valid on every device.

* **Replicas.** A program of ``R > 1`` replicas runs over a 2-D mesh of ``R x N`` devices
  with axes ``("replica", "ipu")``: device ``(r, k)`` runs IPU ``k`` of replica ``r``.
  Placement works along ``"ipu"`` within each replica's row of devices; collectives between
  replicas keep using ``"replica"``, so each IPU's column of devices reduces among the
  replicas of that IPU, as IPUs do. Variable slots gain a leading replica axis
  (``(R, N, size)``, split over both axes, so a device holds its IPU's variables of its
  replica only), remote buffers are ``(R, N, entries, ...)`` (one copy per replica, valid on
  each of its devices) and stream data keeps its replica axis, split over ``"replica"``.

Otherwise (one IPU, too few devices, or ``POPXL_PLACEMENT=off``) the program runs on one
device with identical results; replicated programs then run unplaced, each replica on its
own device when JAX has enough (see ``placement_ipus``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from popxl._op import Op
from popxl.errors import InternalError
from popxl.graph import Graph
from popxl.ops.collectives import REPLICA_AXIS
from popxl.tensor import Tensor

from ..backend.xla_workarounds import fenced
from ..lowering.core import Env, LoweringContext, apply_results, lower_graph, plain_lower_op
from .ipu_slots import SlotLayout

IPU_AXIS = "ipu"
Array = Any
# Ops whose lowering touches state shared by all devices (streams, remote buffers).
_SHARED_EFFECTS = ("host_load", "host_store", "remote_load", "remote_store")
_BROADCAST_INPUTS = ("host_store", "remote_store", "remote_load")
_CONTROL = ("call", "repeat", "conditional")

PLACEMENT_VMAP_MSG = (
    "POPXL_PLACEMENT=on with POPXL_REPLICATION=vmap: vmap runs the {replicas} replicas on "
    "one device, so their IPUs cannot have devices of their own. Unset POPXL_REPLICATION "
    "(or set it to auto) to place, or use POPXL_PLACEMENT=auto."
)


def ipus_used(graphs: Iterable[Graph]) -> int:
    """How many virtual IPUs the ops of ``graphs`` use (largest IPU index + 1)."""
    top = 0
    for g in graphs:
        for op in g._ops:
            top = max(top, op.ipu or 0, op.attrs.get("destination") or 0)
    return top + 1


def placement_ipus(ipus: int, replicas: int) -> int:
    """The number of devices per replica to place the program on, or 0 to run each
    replica's IPUs on one device.

    ``POPXL_PLACEMENT`` = ``auto`` (default: place when JAX has at least
    ``ipus * replicas`` devices), ``off``, or ``on`` (place, or raise when there are too
    few devices). A replicated program placed runs on an ``(replicas, ipus)`` mesh of
    devices (see the module docstring); unplaced, its replicas are mapped instead
    (``vmap`` on one device, or ``shard_map`` with one device per replica, see
    ``runtime.session.program``) and every replica's IPUs share that replica's device.
    ``POPXL_REPLICATION=vmap`` asks for replicas on one device, so it is never placed.
    """
    choice = os.environ.get("POPXL_PLACEMENT", "auto")
    if choice not in ("auto", "off", "on"):
        raise ValueError(f"POPXL_PLACEMENT must be auto, off or on, got {choice!r}.")
    if choice == "off" or ipus < 2:
        return 0
    if replicas > 1 and os.environ.get("POPXL_REPLICATION") == "vmap":
        if choice == "on":
            raise ValueError(PLACEMENT_VMAP_MSG.format(replicas=replicas))
        return 0
    devices = len(jax.local_devices())
    if devices < ipus * replicas:
        if choice == "on":
            raise ValueError(_too_few_devices(ipus, replicas, devices))
        return 0
    return ipus


def _too_few_devices(ipus: int, replicas: int, devices: int) -> str:
    needed = ipus * replicas
    used = f"{ipus} IPUs"
    if replicas > 1:
        used += f" per replica x {replicas} replicas = {needed} devices"
    return (
        f"POPXL_PLACEMENT=on: the program uses {used} but JAX has {devices} devices. Force "
        f"host devices with XLA_FLAGS=--xla_force_host_platform_device_count={needed} (set "
        "before JAX starts), or use POPXL_PLACEMENT=auto to run each replica's IPUs on one "
        "device."
    )


def ipu_mesh(ipus: int, replicas: int = 1) -> jax.sharding.Mesh:
    """``ipus`` devices on axis ``"ipu"``; replicated, ``(replicas, ipus)`` devices on axes
    ``("replica", "ipu")`` (device ``(r, k)``: IPU ``k`` of replica ``r``)."""
    import numpy as np  # noqa: PLC0415

    if replicas == 1:
        return jax.sharding.Mesh(np.array(jax.local_devices()[:ipus]), (IPU_AXIS,))
    devices = np.array(jax.local_devices()[: replicas * ipus]).reshape(replicas, ipus)
    return jax.sharding.Mesh(devices, (REPLICA_AXIS, IPU_AXIS))


def placed_sharding(ipus: int, replicas: int = 1) -> jax.sharding.NamedSharding:
    """Where placed state lives: split over the IPU axis (after the replica axis)."""
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    spec = P(IPU_AXIS) if replicas == 1 else P(REPLICA_AXIS, IPU_AXIS)
    return jax.sharding.NamedSharding(ipu_mesh(ipus, replicas), spec)


@dataclass
class Placement:
    """Lowering state for a placed step: this device's index and the home of each value."""

    ipus: int
    index: Array
    # id(array) -> (array, home); arrays not listed are valid on every device.
    homes: dict[int, tuple[Array, int]] = field(default_factory=dict)
    pure: dict[Graph, bool] = field(default_factory=dict)

    # Homes -------------------------------------------------------------------------------

    def home(self, value: Array) -> int | None:
        entry = self.homes.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else None

    def register(self, value: Array, home: int | None) -> Array:
        if home is None:
            self.homes.pop(id(value), None)
        elif hasattr(value, "dtype"):
            self.homes[id(value)] = (value, home)
        return value

    def move(self, value: Array, home: int | None, dest: int | None) -> Array:
        """``value`` (valid on ``home``) made valid on ``dest`` (``None``: every device)."""
        if home is None or home == dest:
            return value
        if dest is None:
            return self.register(self._broadcast(value, home), None)
        return self.register(lax.ppermute(value, IPU_AXIS, [(home, dest)]), dest)

    def _broadcast(self, value: Array, home: int) -> Array:
        wide = value.astype(jnp.int32) if value.dtype == jnp.bool_ else value
        summed = lax.psum(jnp.where(self.index == home, wide, jnp.zeros_like(wide)), IPU_AXIS)
        return summed.astype(value.dtype)

    def storage(self, env: Env, t: Tensor) -> list[Tensor]:
        """The tensors holding ``t``'s storage in ``env`` (itself, or a view's bases)."""
        if t in env.values or t not in env.views:
            return [t]
        out: list[Tensor] = []
        for p in env.views[t].parents:
            out.extend(self.storage(env, p))
        return out

    def localise(self, env: Env, tensors: Iterable[Tensor], dest: int | None) -> None:
        """Move the storage of ``tensors`` to ``dest`` (in place in ``env``)."""
        for t in tensors:
            for r in self.storage(env, t):
                value = env.values.get(r)
                if value is not None and hasattr(value, "dtype"):
                    env.values[r] = self.move(value, self.home(value), dest)

    def reader(self, env: Env, read: Callable[[Tensor], Array]) -> Callable[[Tensor], Array]:
        """``read`` whose values carry the home of the storage they were read from (a
        view read at a graph's end is a new array, valid only where its base is)."""

        def placed_read(t: Tensor) -> Array:
            home = self.home_in(env, t)
            return self.register(read(t), home)

        return placed_read

    def mark(self, env: Env, tensors: Iterable[Tensor], home: int | None) -> None:
        for t in tensors:
            for r in self.storage(env, t):
                value = env.values.get(r)
                if value is not None:
                    self.register(value, home)

    # Running ops -------------------------------------------------------------------------

    def on_device(
        self, ipu: int, fn: Callable[..., Any], *args: Array, keep: Sequence[int] = ()
    ) -> Any:
        """``fn(*args)`` computed on device ``ipu`` only; elsewhere zeros, except that the
        second part of ``fn``'s ``(outputs, updated)`` result is ``args[keep]`` unchanged
        (in-place updates are skipped without writing weight-sized zeros)."""
        shapes = jax.eval_shape(fn, *args)

        def zeros(tree: Any) -> Any:
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)

        def skip(*a: Array) -> Any:
            if not keep:
                return zeros(shapes)
            return zeros(shapes[0]), tuple(a[i] for i in keep)

        return lax.cond(self.index == ipu, fn, skip, *args)

    def is_pure(self, graph: Graph) -> bool:
        """Whether ``graph`` (and all it calls) only computes: no streams, remote buffers,
        collectives, prints or IPU copies, so it can run as one unit on one device."""
        known = self.pure.get(graph)
        if known is None:
            self.pure[graph] = True  # recursion guard
            known = self.pure[graph] = all(self._op_is_pure(op) for op in graph._ops)
        return known

    def _op_is_pure(self, op: Op) -> bool:
        opdef = op.opdef
        if opdef.key in ("ipu_copy",) or opdef.special in (*_SHARED_EFFECTS, "collective"):
            return False
        if opdef.effect and opdef.special not in _CONTROL:
            return False
        return all(self.is_pure(g) for g in op.referenced_graphs)

    def lower(self, ctx: LoweringContext, env: Env, op: Op) -> None:
        """Lower ``op`` with placement (see the module docstring)."""
        opdef = op.opdef
        ipu = op.ipu or 0
        if opdef.key == "ipu_copy":
            self._copy(env, op)
        elif opdef.special == "call" and _only_copies(op.attrs["graphs"][0]):
            self._copy_call(env, op)
        elif opdef.special == "call" and self.is_pure(op.attrs["graphs"][0]):
            self._pure_call(ctx, env, op, ipu)
        elif opdef.special in _CONTROL:
            if opdef.special == "conditional":
                self.localise(env, op.inputs[:1], None)
            plain_lower_op(ctx, env, op)
        elif opdef.special in _SHARED_EFFECTS:
            if opdef.special in _BROADCAST_INPUTS:
                self.localise(env, op.inputs, None)
            plain_lower_op(ctx, env, op)
        elif opdef.view_inverse is not None:
            plain_lower_op(ctx, env, op)
        elif opdef.special is None and opdef.lower is not None and not opdef.effect:
            self._compute(env, op, ipu)
        elif opdef.key == "print_tensor":  # its callback runs on the op's device only
            self._compute(env, op, ipu)
        else:
            self.localise(env, op.inputs, ipu)
            plain_lower_op(ctx, env, op)
            self.mark(env, (*op.outputs, *_written(op)), ipu)

    def home_in(self, env: Env, t: Tensor) -> int | None:
        """Where ``t``'s storage in ``env`` is valid (``None``: everywhere). Storage split
        over several devices is first gathered on the lowest one."""
        roots = [r for r in self.storage(env, t) if r in env.values]
        homes = sorted({h for r in roots if (h := self.home(env.values[r])) is not None})
        if len(homes) > 1:
            self.localise(env, [t], homes[0])
        return homes[0] if homes else None

    def _copy(self, env: Env, op: Op) -> None:
        home = self.home_in(env, op.inputs[0])
        value = env.read(op.inputs[0])
        env.values[op.outputs[0]] = self.move(value, home, op.attrs["destination"])

    def _copy_call(self, env: Env, op: Op) -> None:
        """A call of a graph of IPU copies (a pipeline cycle's transfers): copies of one
        shape and dtype between distinct sources and destinations travel in one
        ``ppermute``, so the devices meet once per batch rather than once per copy."""
        graph = op.attrs["graphs"][0]
        values: dict[Tensor, tuple[Array, int | None]] = {}
        for inner, outer in zip(graph._inputs, op.inputs):
            home = self.home_in(env, outer)
            values[inner] = (env.read(outer), home)
        batches: list[list[Op]] = []
        for copy in graph._ops:
            value, home = values[copy.inputs[0]]
            dest = copy.attrs["destination"]
            if home is None or home == dest:
                values[copy.outputs[0]] = (value, home if home == dest else None)
                continue
            batch = next((b for b in batches if self._fits(b, copy, values)), None)
            if batch is None:
                batches.append([copy])
            else:
                batch.append(copy)
        for batch in batches:
            pairs = [(values[c.inputs[0]][1], c.attrs["destination"]) for c in batch]
            send = values[batch[-1].inputs[0]][0]
            for c, (src, _) in zip(batch[:-1], pairs[:-1]):
                send = jnp.where(self.index == src, values[c.inputs[0]][0], send)
            received = lax.ppermute(send, IPU_AXIS, pairs)
            for c, (_, dest) in zip(batch, pairs):
                # A distinct array per copy, so each output has its own home.
                out = received if len(batch) == 1 else jnp.array(received, copy=True)
                values[c.outputs[0]] = (self.register(out, dest), dest)
        for inner, outer in zip(graph._outputs, op.outputs):
            env.values[outer] = values[inner][0]

    def _fits(self, batch: list[Op], copy: Op, values: dict) -> bool:
        first = batch[0].inputs[0]
        src = values[copy.inputs[0]][1]
        return (
            copy.inputs[0].shape == first.shape
            and copy.inputs[0].dtype == first.dtype
            and all(values[c.inputs[0]][1] != src for c in batch)
            and all(c.attrs["destination"] != copy.attrs["destination"] for c in batch)
        )

    def _compute(self, env: Env, op: Op, ipu: int) -> None:
        self.localise(env, op.inputs, ipu)
        lower, attrs = op.opdef.lower, op.attrs
        if lower is None:
            raise InternalError(f"{op.opdef.key} has no lowering", op, op.graph)
        args = [env.read(t) for t in op.inputs]
        # Elsewhere an in-place result is its input unchanged (no weight-sized zeros, and
        # XLA can update the buffer in place); other results are zeros.
        written = {result: arg for arg, result in op.opdef.modifies}

        def run(*a: Array) -> tuple:
            results = lower(*a, **attrs)
            return results if isinstance(results, tuple) else (results,)

        shapes = jax.eval_shape(run, *args)

        def skip(*a: Array) -> tuple:
            return tuple(
                a[written[k]] if k in written else jnp.zeros(s.shape, s.dtype)
                for k, s in enumerate(shapes)
            )

        if _elementwise_update(op):
            # Cheap and fusable: computed everywhere and selected, so XLA updates the
            # variable in one pass in place (a branch would need a copy of its output).
            here = self.index == ipu
            results = tuple(
                jnp.where(here, r, s) for r, s in zip(run(*args), skip(*args), strict=True)
            )
        else:
            results = lax.cond(self.index == ipu, run, skip, *args)
        apply_results(env, op, results)
        self.mark(env, (*op.outputs, *_written(op)), ipu)

    def _pure_call(self, ctx: LoweringContext, env: Env, op: Op, ipu: int) -> None:
        graph = op.attrs["graphs"][0]
        self.localise(env, op.inputs, ipu)
        written = sorted(op.modified_inputs)
        inner = replace(ctx, placement=None)

        def run(*values: Array) -> tuple:
            outs, finals, _ = lower_graph(inner, graph, list(values))
            return tuple(outs), tuple(finals[i] for i in written)

        values = [env.read(t) for t in op.inputs]
        outs, finals = self.on_device(ipu, run, *values, keep=written)
        for index, value in zip(written, finals):
            env.write(op.inputs[index], value)
        for t, value in zip(op.outputs, outs):
            env.values[t] = value
        self.mark(env, (*op.outputs, *(op.inputs[i] for i in written)), ipu)

    # Loops and branches -------------------------------------------------------------------

    def homes_of(self, values: Sequence[Array]) -> list[int | None]:
        return [self.home(v) for v in values]

    def input_homes(self, env: Env, tensors: Sequence[Tensor]) -> list[int | None]:
        return [self.home_in(env, t) for t in tensors]

    def settle(self, values: Sequence[Array], homes: Sequence[int | None]) -> tuple:
        """``values`` moved to ``homes`` (loop bodies must keep their carry's homes)."""
        return tuple(self.move(v, self.home(v), h) for v, h in zip(values, homes))

    def adopt(self, values: Sequence[Array], homes: Sequence[int | None]) -> tuple:
        """Give fresh arrays (a loop's carry) the homes of the values they stand for."""
        return tuple(self.register(v, h) for v, h in zip(values, homes))


def _only_copies(graph: Graph) -> bool:
    return bool(graph._ops) and all(op.opdef.key == "ipu_copy" for op in graph._ops)


def _elementwise_update(op: Op) -> bool:
    """An in-place op whose inputs are the updated tensor's shape or scalars, and whose
    results are the updated tensors (optimizer and accumulator updates)."""
    modifies = op.opdef.modifies
    if not modifies or len(op.outputs) > len(modifies):
        return False
    shape = op.inputs[modifies[0][0]].shape
    return all(t.shape in (shape, ()) or t.nelms == 1 for t in op.inputs)


def _written(op: Op) -> list[Tensor]:
    return [op.inputs[i] for i in op.modified_input_indices()]


def placed_step(
    step: Callable[..., Any],
    layout: SlotLayout,
    written: Sequence[bool],
    probe: list | None = None,
    replicas: int = 1,
) -> Callable[..., Any]:
    """``step(state, inputs, placement)`` run under ``shard_map`` over ``layout.ipus`` devices
    (per replica: with ``replicas > 1``, over the ``(replicas, ipus)`` mesh, every state
    array, stream input and output and per-replica scalar having a replica axis).

    The state arrays are ``layout``'s variable slots (``runtime.ipu_slots``: each device
    holds only the variables its IPU owns) followed by the remote buffers (with a leading
    axis of ``ipus``, valid on every device). ``written`` says, per variable entry and then
    per buffer, whether the program writes it; the returned step takes and returns
    ``(written arrays, read-only arrays, inputs)`` like unplaced steps. Each variable enters
    homed on its owner and a written one is moved back there at the end, so ``probe``
    (when given) receives where the program left each variable's new value.
    """
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    n_vars, n_slots = len(layout.shapes), len(layout.slots)
    writes = state_written(layout, written)
    mutable = [i for i, w in enumerate(writes) if w]
    const = [i for i, w in enumerate(writes) if not w]

    def block(mut: tuple, fixed: tuple, inputs: tuple) -> tuple:
        placement = Placement(layout.ipus, lax.axis_index(IPU_AXIS))
        arrays: list[Any] = [None] * len(writes)
        for i, v in zip(mutable, mut):
            arrays[i] = v
        for i, v in zip(const, fixed):
            arrays[i] = v
        entries = layout.read(arrays[:n_slots])
        for value, owner in zip(entries, layout.owners):
            placement.register(value, owner)
        buffers = [b[0] for b in arrays[n_slots:]]
        new_state, outs = step((*entries, *buffers), inputs, placement)
        new_vars = new_state[:n_vars]
        if probe is not None:
            probe[:] = placement.homes_of(new_vars)
        final = [
            placement.move(new, placement.home(new), owner) if w else old
            for new, old, owner, w in zip(new_vars, entries, layout.owners, written)
        ]
        # Packed into slots and reshaped: no reshape may move into the writes (``fenced``).
        final, buffers = fenced((final, new_state[n_vars:]))
        new_arrays = [*layout.write(final, placement.index), *(b[None] for b in buffers)]
        return tuple(new_arrays[i] for i in mutable), outs

    if replicas == 1:
        return jax.shard_map(
            block,
            mesh=ipu_mesh(layout.ipus),
            in_specs=(P(IPU_AXIS), P(IPU_AXIS), P()),
            out_specs=(P(IPU_AXIS), P()),
            check_vma=False,
        )
    state, streams = P(REPLICA_AXIS, IPU_AXIS), P(None, REPLICA_AXIS)
    return jax.shard_map(
        _one_replica(block),
        mesh=ipu_mesh(layout.ipus, replicas),
        in_specs=(state, state, streams),
        out_specs=(state, (streams, P(REPLICA_AXIS))),
        check_vma=False,
    )


def _one_replica(block: Callable[..., Any]) -> Callable[..., Any]:
    """``block`` on one device of a replicated mesh: the leading replica axis (of size 1
    there) is dropped from the state and from the stream inputs (axis 1), and restored on
    the new state, the stream outputs and the per-replica scalars."""

    def replica_block(mut: tuple, fixed: tuple, inputs: tuple) -> tuple:
        new, (outs, scalars) = block(
            tuple(a[0] for a in mut), tuple(a[0] for a in fixed), tuple(i[:, 0] for i in inputs)
        )
        return tuple(a[None] for a in fenced(new)), (
            tuple(o[:, None] for o in outs),
            tuple(s[None] for s in scalars),
        )

    return replica_block


def state_written(layout: SlotLayout, written: Sequence[bool]) -> tuple[bool, ...]:
    """Per state array (slots, then buffers): whether the step writes it."""
    n_vars = len(layout.shapes)
    slots = tuple(any(written[i] for i in m if i is not None) for m in layout.slots)
    return slots + tuple(written[n_vars:])
