"""The training half of a PopTorch program: gradients accumulated over micro-batches,
reduced over replicas, unscaled and clipped, then the optimiser step (``Trainer``).

The optimiser arrives as a ``Spec`` (``poptorch.optim.rules``). Its hyper-parameters are
variables the host writes (``setOptimizer`` without recompiling) unless PopTorch compiled
them as constants; its state lives where ``TensorLocations`` put it (``storage``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

import popxl
import popxl_addons as addons
from popxl import ops
from popxl.context import get_current_context
from popxl.errors import InternalError

from ..compat.popart_ir import tagged_update
from ..enums import ReductionType
from ..optim.optimizers import group_of_each, sharded_update
from ..options.core import (
    Options,
    TensorLocationSettings,
)
from .anchors import LOSS_SCALE, UPDATED
from .layout import Built, Layout
from .storage import (
    flush,
    full_shape,
    is_off_chip,
    is_sharded,
    place,
    read_stored,
    shard_group,
    write_stored,
)

NO_WEIGHTS_MSG = "trainingModel needs weights to train, but {cls} declares no variables."


class Trainer:
    """The training half of the program: gradients, accumulators, optimiser update.

    The optimiser arrives as a ``Spec`` (``poptorch.optim.rules``). Its hyper-parameters
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
        loss = fwd.graph.outputs[built.loss_index]
        args = fwd.args.to_dict()
        # A weight the loss does not depend on gets no gradient, and torch's optimisers
        # (as PopART's) leave it alone: no weight decay, no momentum, no state.
        used = loss_dependencies(loss)
        trained = [n for n in built.forward_interface().trained(fwd) if args[n] in used]
        names = [n for n in built.weights if n in trained]
        if not names:
            raise ValueError(NO_WEIGHTS_MSG.format(cls=type(fwd).__name__))
        from ..optim import link as _optim_link  # noqa: PLC0415 (it imports the executor's optimisers)

        self.optimizer = optimizer
        self.spec = _optim_link.build_spec(optimizer, options)
        self.rule = self.spec.rule
        built.groups = group_of_each(self.spec, names)
        required = [args[n] for n in trained]
        if whole:  # staged programs differentiate block by block instead
            self.bwd = addons.autodiff(fwd, grads_provided=[loss], grads_required=required)
        key_of = {id(arg): key for key, arg in fwd.args.to_dict().items()}
        self.keys = [key_of[id(t)] for t in required]
        self.loss_dtype = loss.dtype
        self.loss_shape = loss.shape  # () or one element, such as (1,)
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
        from ..optim import rules  # noqa: PLC0415 (names of PopTorch's tensors)

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
        from ..optim import rules  # noqa: PLC0415

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
        """The loss gradient: the loss scaling, in the loss's dtype and shape."""
        scale = self.loss_scale()
        if isinstance(scale, popxl.Tensor):
            seed = ops.cast(scale, self.loss_dtype)
        else:
            seed = popxl.constant(np.asarray(scale, self.loss_dtype.as_numpy()), self.loss_dtype)
        return seed if self.loss_shape == () else ops.reshape(seed, self.loss_shape)

    def backward(self, info: Any) -> None:
        args = offload_activations(
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
            with self._on(name), tagged_update(self._popart_kind(name), name):
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

    def _popart_kind(self, name: str) -> str:
        """PopTorch's optimiser type for the update of weight ``name``; ``SGD0`` for SGD
        without momentum, as PopART named that case."""
        kind = self.spec.kind
        if kind.startswith("SGD") and self.spec.groups[self.built.groups[name]]["momentum"] == (
            0.0,
            True,
        ):
            return "SGD0"
        return kind

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


def offload_activations(
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


def loss_dependencies(t: popxl.Tensor) -> set[popxl.Tensor]:
    """The tensors of ``t``'s graph that a gradient of ``t`` can reach, itself included
    (every input of an op that makes one of them counts, a called subgraph's inputs too),
    as torch's autograd sees them: no gradient flows back through a ``detach`` or out of an
    integer or boolean tensor (a comparison, an index, a sign test of a detached value)."""
    seen: set[popxl.Tensor] = set()
    todo = [t]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        op = current._producer
        if op is None or op.opdef.key in _GRADIENT_STOPS or not current.dtype.is_floating_point:
            continue
        todo.extend(op.inputs)
    return seen


_GRADIENT_STOPS = ("detach", "detach_")
