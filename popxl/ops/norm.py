"""Normalisation ops: ``batch_norm_inference``, ``group_norm`` and ``layer_norm``."""

from __future__ import annotations

from typing import Any

from .. import dtypes
from .._op import core_error, define
from ..tensor import Tensor
from ._base import jnp, lax, record, same_dtype, spec
from .nn import FLOATS, _compute_type

# Normalisation ---------------------------------------------------------------------------


def _channel_params_dtype(op: str, t: Any, *params: Any) -> dtypes.dtype:
    if len(t.shape) < 2:
        raise core_error(f"{op}: expected an input (N, C, ...) of rank >= 2, got shape {t.shape}.")
    for p in params:
        if p.shape != (t.shape[1],):
            raise core_error(
                f"{op}: per-channel parameters must have shape ({t.shape[1]},) "
                f"for an input of shape {t.shape}, got {p.shape}."
            )
    dt = same_dtype(op, t, *params)
    if dt not in FLOATS:
        raise core_error(f"{op}: inputs must be float16 or float32, got {dt.name}.")
    return dt


def _per_channel(p: Any, x: Any) -> Any:
    return p.astype(_compute_type(x)).reshape((1, -1) + (1,) * (x.ndim - 2))


def _batch_norm_infer(t: Any, *params: Any, epsilon: float, momentum: float) -> list:
    return [spec(t.shape, _channel_params_dtype("BatchNormalization", t, *params))]


def _lower_batch_norm(
    x: Any, scale: Any, bias: Any, mean: Any, var: Any, *, epsilon: float, momentum: float
) -> Any:
    # The per-channel factor is formed before it meets the data (as torch's CPU kernel does):
    # the scale's gradient is then the sum of ``dy * centred``, times the per-channel
    # ``rsqrt``, rather than a sum over a full-size broadcast of it (which XLA:CPU built in
    # memory for every batch norm of a training step: 1 ms for MobileNetV2's 96-channel
    # 32x32 ones; MobileNetV2's SGD step 59.7 -> 54.7 ms, EfficientNet-B0's 84.4 -> 78.2).
    centred = x.astype(_compute_type(x)) - _per_channel(mean, x)
    factor = lax.rsqrt(_per_channel(var, x) + epsilon) * _per_channel(scale, x)
    return (centred * factor + _per_channel(bias, x)).astype(x.dtype)


BATCH_NORM = define(
    "batch_norm_inference", "BatchNormalization", _batch_norm_infer, _lower_batch_norm
)


def batch_norm_inference(
    t: Tensor,
    scale: Tensor,
    bias: Tensor,
    mean: Tensor,
    var: Tensor,
    epsilon: float = 1e-05,
    momentum: float = 0.9,
) -> Tensor:
    """Inference batch normalisation: ``(t - mean) / sqrt(var + epsilon) * scale + bias``.

    ``t`` is ``(N, C, ...)``; the other inputs are ``(C,)`` and apply along axis 1. All share
    one dtype; float16 data is normalised in float32. ``momentum`` only matters when training
    statistics, so it has no effect here. Every input is differentiable.

    Returns:
        The normalised tensor, named ``batch_norm_out``.

    Raises:
        PopXLException: parameters not of shape ``(C,)`` or mismatched dtypes.
    """
    inputs = {"t": t, "scale": scale, "bias": bias, "mean": mean, "var": var}
    attrs = {"epsilon": float(epsilon), "momentum": float(momentum)}
    return record(BATCH_NORM, inputs, attrs, ["batch_norm_out"])[0]


def _group_norm_infer(t: Any, weight: Any, bias: Any, *, num_groups: int, eps: float) -> list:
    dt = _channel_params_dtype("GroupNormalization", t, weight, bias)
    if t.shape[1] % num_groups:
        raise core_error(
            f"group_norm: the {t.shape[1]} channels of the input {t.shape} do not "
            f"split into num_groups={num_groups} equal groups."
        )
    stats = spec((t.shape[0] * num_groups,), dt)
    return [spec(t.shape, dt), stats, stats]


def _lower_group_norm(x: Any, weight: Any, bias: Any, *, num_groups: int, eps: float) -> Any:
    # One group over 2-D rows (a layer norm): no unit group axis, which would keep XLA from
    # reusing the input's producer (a residual sum) across the statistics' fusions, and made
    # it copy the scan carry once per layer (12-layer encoder: 1,799 -> 1,787 kernels per SGD
    # step, inference 412 -> 400).
    lead = (x.shape[0],) if num_groups == 1 and x.ndim == 2 else (x.shape[0], num_groups)
    groups = x.astype(_compute_type(x)).reshape(*lead, -1)
    mean = groups.mean(axis=-1, keepdims=True)
    inv_std = lax.rsqrt(jnp.square(groups - mean).mean(axis=-1, keepdims=True) + eps)
    y = ((groups - mean) * inv_std).reshape(x.shape)
    y = y * _per_channel(weight, x) + _per_channel(bias, x)
    return y.astype(x.dtype), mean.reshape(-1).astype(x.dtype), inv_std.reshape(-1).astype(x.dtype)


GROUP_NORM = define("group_norm", "GroupNormalization", _group_norm_infer, _lower_group_norm)


def group_norm(
    t: Tensor, weight: Tensor, bias: Tensor, num_groups: int, eps: float = 1e-05
) -> Tensor:
    """Group normalisation of an ``(N, C, ...)`` input with per-channel ``weight``/``bias``.

    The channels split into ``num_groups`` consecutive groups; each (sample, group) is
    normalised over its channels and all remaining axes with the biased variance:
    ``(t - mean) / sqrt(var + eps) * weight + bias``. ``weight`` and ``bias`` are ``(C,)``
    of ``t``'s dtype. The op also records the statistics ``group_norm_mean`` and
    ``group_norm_inv_std_dev`` (shape ``(N * num_groups,)``) as the original does, but only
    the normalised tensor is returned.

    Returns:
        The normalised tensor, named ``group_norm_out``.

    Raises:
        ValueError: ``num_groups`` < 1.
        PopXLException: ``C`` not divisible by ``num_groups``, parameters not ``(C,)`` or
            mismatched dtypes.

    See also ``torch.nn.functional.group_norm``.
    """
    if int(num_groups) < 1:
        raise ValueError(f"group_norm: num_groups must be >= 1, got {num_groups}.")
    inputs = {"t": t, "weight": weight, "bias": bias}
    attrs = {"num_groups": int(num_groups), "eps": float(eps)}
    names = ["group_norm_out", "group_norm_mean", "group_norm_inv_std_dev"]
    return record(GROUP_NORM, inputs, attrs, names)[0]


def layer_norm(t: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-05) -> Tensor:
    """``group_norm(t, weight, bias, num_groups=1, eps)``, as in the original.

    Each sample is normalised over all axes but the first, while ``weight`` and ``bias``
    are per channel (axis 1, shape ``(C,)``): this equals ``torch.nn.LayerNorm`` only for
    2-D inputs.

    Returns:
        The normalised tensor, named ``group_norm_out``.
    """
    return group_norm(t, weight, bias, num_groups=1, eps=eps)
