"""``AdamOptimizerStep``: one Adam(W) update of one variable, its state held in variables."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

import popxl
from popxl import ops

from ..module import Module

GLOBAL_NORM_MAX_MSG = (
    "AdamOptimizerStep: global_norm was given but global_norm_max was not. Pass the clipping "
    "threshold, e.g. global_norm_max=1.0."
)


def _float32(value: float | popxl.Tensor) -> popxl.Tensor:
    """A float32 tensor of ``value`` (a Python number becomes a constant)."""
    if isinstance(value, popxl.Tensor):
        return value if value.dtype == popxl.float32 else ops.cast(value, popxl.float32)
    return popxl.constant(float(value), popxl.float32)


def _is_one(value: Any) -> bool:
    return not isinstance(value, popxl.Tensor) and float(value) == 1.0


def _gradient_scale(
    loss_scaling: float | popxl.Tensor = 1,
    global_norm: popxl.Tensor | None = None,
    global_norm_max: float | popxl.Tensor | None = None,
) -> float | popxl.Tensor:
    """The factor the gradient is multiplied by before the update.

    ``1 / loss_scaling``, times ``global_norm_max / max(global_norm, global_norm_max)`` when
    ``global_norm`` is given (so gradients whose global norm exceeds the maximum are scaled
    down to it). A Python float when nothing is a tensor, else a float32 scalar tensor.

    Raises:
        ValueError: ``global_norm`` without ``global_norm_max``.
    """
    scale: float | popxl.Tensor = 1.0
    if isinstance(loss_scaling, popxl.Tensor):
        scale = ops.div(_float32(1.0), _float32(loss_scaling))
    elif float(loss_scaling) != 1.0:
        scale = 1.0 / float(loss_scaling)
    if global_norm is None:
        return scale
    if global_norm_max is None:
        raise ValueError(GLOBAL_NORM_MAX_MSG)
    norm_max = _float32(global_norm_max)
    clip = ops.div(norm_max, ops.maximum(_float32(global_norm), norm_max))
    return clip if _is_one(scale) else ops.mul(clip, _float32(scale))


class AdamOptimizerStep(Module):
    """One Adam step on ``var`` (updated in place), with decoupled weight decay.

    The state is three by-reference variables, created in this order: ``first_order``
    (``m``, in ``first_order_dtype``), ``second_order`` (``v``, float32) and, with
    ``bias_correction``, ``step`` (a float32 scalar counter). For a replica-sharded
    ``var`` (one with a ``meta_shape``) the moments are sharded the same way.

    The update, in order:

    1. ``g = grad * scale`` in float32 when the scale is not 1, where
       ``scale = 1/loss_scaling * global_norm_max / max(global_norm, global_norm_max)``
       (the clipping factor only with ``global_norm``; that norm should be the norm of the
       unscaled gradients, computed by the caller over all of them);
    2. ``m = beta1 m + (1 - beta1) g``; ``v = beta2 v + (1 - beta2) g**2``;
    3. with bias correction: ``step += 1``, ``m̂ = m / (1 - beta1**step)``,
       ``v̂ = v / (1 - beta2**step)`` (otherwise ``m̂ = m``, ``v̂ = v``);
    4. ``var -= lr * (m̂ / (sqrt(v̂) + eps) + weight_decay * var)``.

    Hyper-parameters given as Python numbers are baked into the graph; given as tensors
    (``TensorSpec`` at ``create_graph``) they become graph inputs, passed at call time
    after ``(var, grad)`` in parameter order (``lr``, then ``global_norm``, ...). With
    ``cache=True`` one graph serves every variable with the same spec and
    hyper-parameters.

    >>> # facts, graph = AdamOptimizerStep(cache=True).create_graph(w, w.spec, lr=1e-3)
    >>> # graph.bind(facts.init(prefix="w.adam")).call(w, dw)

    See also ``torch.optim.AdamW``.
    """

    @popxl.in_sequence()
    def build(
        self,
        var: popxl.TensorByRef,
        grad: popxl.Tensor,
        replica_grouping: popxl.ReplicaGrouping | None = None,
        *,
        lr: float | popxl.Tensor,
        beta1: float | popxl.Tensor = 0.9,
        beta2: float | popxl.Tensor = 0.999,
        eps: float | popxl.Tensor = 1e-5,
        weight_decay: float | popxl.Tensor = 1e-2,
        first_order_dtype: popxl.dtype = popxl.float16,
        bias_correction: bool = True,
        loss_scaling: float | popxl.Tensor = 1,
        global_norm: popxl.Tensor | None = None,
        global_norm_max: float | popxl.Tensor | None = None,
    ) -> None:
        scale = _gradient_scale(loss_scaling, global_norm, global_norm_max)
        if not _is_one(scale):
            grad = ops.mul(ops.cast(grad, popxl.float32), _float32(scale))

        first_order = self._state("first_order", var, first_order_dtype, replica_grouping)
        ops.var_updates.accumulate_moving_average_(first_order, grad, f=beta1)
        second_order = self._state("second_order", var, popxl.float32, replica_grouping)
        ops.var_updates.accumulate_moving_average_square_(second_order, grad, f=beta2)

        step = None
        if bias_correction:
            step = self.add_variable_input(
                "step",
                partial(np.zeros, ()),
                popxl.float32,
                by_ref=True,
                replica_grouping=replica_grouping,
            )
        updater = ops.var_updates.adam_updater(
            first_order,
            second_order,
            weight=var,
            weight_decay=weight_decay,
            time_step=step,
            beta1=beta1,
            beta2=beta2,
            epsilon=eps,
        )
        ops.scaled_add_(var, updater, b=-lr)

    def _state(
        self,
        name: str,
        var: popxl.Tensor,
        dtype: popxl.dtype,
        replica_grouping: popxl.ReplicaGrouping | None,
    ) -> popxl.Tensor:
        """A zero-initialised by-ref moment shaped (and sharded) like ``var``."""
        if var.meta_shape:
            shard_over = math.prod(var.meta_shape) // math.prod(var.shape)
            return self.add_replica_sharded_variable_input(
                name,
                partial(np.zeros, var.meta_shape),
                dtype,
                by_ref=True,
                replica_grouping=replica_grouping,
                shard_over=shard_over,
            )
        return self.add_variable_input(
            name,
            partial(np.zeros, var.shape),
            dtype,
            by_ref=True,
            replica_grouping=replica_grouping,
        )


__all__ = ["AdamOptimizerStep"]
