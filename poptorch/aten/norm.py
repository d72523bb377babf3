"""Normalisations: batch norm (inference and training), layer, group and instance norm.

The normalised tensor is popxl's op (``BatchNormalization``, ``GroupNormalization``; layer
norm is a one-group group norm of the input viewed as ``(rows, features)``). Batch
statistics come from one ``aten::moments`` op (mean and biased variance, in float32), which
training batch norm feeds to the inference op, so gradients flow through them. The saved
statistics outputs (mean, 1/std) are computed only when something reads them.

Training batch norm (``_native_batch_norm_legit_functional``) also returns the new running
statistics (``(1 - momentum) * running + momentum * batch``, the variance unbiased), which
the capture writes back to the module's buffers. In an inference model (a module left in
training mode, wrapped by ``inferenceModel``) the batch still normalises itself but the
running statistics stay as they are: as in PopTorch, only training updates them. Instance norm reaches the table as a batch
norm of the input viewed as ``(1, N * C, ...)`` (``_native_batch_norm_legit.no_stats``).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from torch.ops import aten

import popxl
from popxl import ops

from .registry import NodeContext, lowering


def _moments(x: Any, axes: tuple[int, ...], shape: tuple[int, ...]) -> tuple[Any, Any]:
    """Mean and biased variance over ``axes`` in float32, reshaped to ``shape``."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(axis=axes)
    var = jnp.square(xf - xf.mean(axis=axes, keepdims=True)).mean(axis=axes)
    return mean.reshape(shape), var.reshape(shape)


def _stats(
    ctx: NodeContext, x: popxl.Tensor, axes: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[popxl.Tensor, popxl.Tensor]:
    spec = (tuple(shape), popxl.float32)
    return ctx.jax("moments", _moments, x, outputs=[spec, spec], axes=axes, shape=tuple(shape))


def _saved_mean(ctx: NodeContext, mean: popxl.Tensor, grad: bool = False) -> popxl.Tensor:
    """Output 1, the mean torch saves for its backward (differentiable only in group norm)."""
    return ctx.tensor(mean if grad else ops.detach(mean), ctx.out_spec(1)[1])


def _rstd(
    ctx: NodeContext, var: popxl.Tensor, eps: float, i: int, grad: bool = False
) -> popxl.Tensor:
    """Output ``i``: ``1 / sqrt(var + eps)`` in the node's dtype for it (saved for torch's
    backward; differentiable only in group norm)."""
    var = var if grad else ops.detach(var)
    return ctx.tensor(
        ops.div(ctx.constant(1.0, var.dtype), ops.sqrt(var + ctx.constant(eps, var.dtype))),
        ctx.out_spec(i)[1],
    )


def _compute_dtype(x: popxl.Tensor, *params: popxl.Tensor | None) -> popxl.dtype:
    """float32 if the input or any parameter is (torch normalises a float16 input with
    float32 parameters in float32), else the input's dtype."""
    dtypes = {x.dtype} | {p.dtype for p in params if p is not None}
    return popxl.float32 if popxl.float32 in dtypes else x.dtype


def _param(ctx: NodeContext, p: popxl.Tensor | None, n: int, fill: float, dtype: Any) -> Any:
    """A per-channel parameter, or ``fill`` when the module has none (``affine=False``)."""
    if p is None:
        return ctx.constant([fill] * n, dtype)
    return ctx.tensor(p, dtype)


def _channel_axes(x: popxl.Tensor) -> tuple[int, ...]:
    return (0, *range(2, x.rank))


# Batch norm ---------------------------------------------------------------------------------


def _batch_norm(
    ctx: NodeContext,
    x: popxl.Tensor,
    weight: Any,
    bias: Any,
    mean: popxl.Tensor,
    var: popxl.Tensor,
    eps: float,
) -> popxl.Tensor:
    dtype = _compute_dtype(x, weight, bias)
    c = x.shape[1]
    out = ops.batch_norm_inference(
        ctx.tensor(x, dtype),
        _param(ctx, weight, c, 1.0, dtype),
        _param(ctx, bias, c, 0.0, dtype),
        ctx.tensor(mean, dtype),
        ctx.tensor(var, dtype),
        epsilon=float(eps),
    )
    return ctx.tensor(out, ctx.out_dtype)


@lowering(aten._native_batch_norm_legit_no_training.default)
def _lower_batch_norm_eval(
    ctx: NodeContext,
    x: popxl.Tensor,
    weight: Any,
    bias: Any,
    running_mean: popxl.Tensor,
    running_var: popxl.Tensor,
    momentum: float,
    eps: float,
) -> tuple:
    """Normalised by the running statistics; the saved statistics are empty."""
    return _batch_norm(ctx, x, weight, bias, running_mean, running_var, eps), None, None


def _batch_statistics(ctx: NodeContext, x: popxl.Tensor) -> tuple[popxl.Tensor, popxl.Tensor]:
    return _stats(ctx, x, _channel_axes(x), (x.shape[1],))


@lowering(aten._native_batch_norm_legit.no_stats)
def _lower_batch_norm_no_stats(
    ctx: NodeContext,
    x: popxl.Tensor,
    weight: Any,
    bias: Any,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple:
    """Normalised by the batch's statistics (no running statistics kept)."""
    mean, var = _batch_statistics(ctx, x)
    out = _batch_norm(ctx, x, weight, bias, mean, var, eps)
    return out, _saved_mean(ctx, mean), _rstd(ctx, var, eps, 2)


@lowering(aten._native_batch_norm_legit_functional.default)
def _lower_batch_norm_train(
    ctx: NodeContext,
    x: popxl.Tensor,
    weight: Any,
    bias: Any,
    running_mean: popxl.Tensor,
    running_var: popxl.Tensor,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple:
    """Normalised by the batch's statistics, which also update the running ones."""
    if not training:
        out = _batch_norm(ctx, x, weight, bias, running_mean, running_var, eps)
        return out, None, None, ops.identity(running_mean), ops.identity(running_var)
    mean, var = _batch_statistics(ctx, x)
    out = _batch_norm(ctx, x, weight, bias, mean, var, eps)
    saved = (_saved_mean(ctx, mean), _rstd(ctx, var, eps, 2))
    if not ctx.training:
        return out, *saved, ops.identity(running_mean), ops.identity(running_var)
    n = math.prod(x.shape) // x.shape[1]
    unbiased = var * (n / (n - 1)) if n > 1 else var
    new_stats = []
    for running, batch in ((running_mean, mean), (running_var, unbiased)):
        batch = ctx.tensor(ops.detach(batch), running.dtype)
        keep = running * ctx.constant(1.0 - momentum, running.dtype)
        new_stats.append(keep + batch * ctx.constant(momentum, running.dtype))
    return (out, *saved, *new_stats)


# Layer and group norm -----------------------------------------------------------------------


@lowering(aten.native_layer_norm.default)
def _lower_layer_norm(
    ctx: NodeContext,
    x: popxl.Tensor,
    normalized_shape: Any,
    weight: Any,
    bias: Any,
    eps: float,
) -> tuple:
    """Each row of ``x`` viewed as ``(rows, features)`` normalised: a one-group norm."""
    k = math.prod(int(d) for d in normalized_shape)
    lead = x.shape[: x.rank - len(normalized_shape)]
    dtype = _compute_dtype(x, weight, bias)
    w = ops.reshape(_param(ctx, weight, k, 1.0, dtype), (k,))
    b = ops.reshape(_param(ctx, bias, k, 0.0, dtype), (k,))
    rows = ops.reshape(ctx.tensor(x, dtype), (math.prod(lead), k))
    out = ops.layer_norm(rows, w, b, eps=float(eps))
    out = ctx.tensor(ops.reshape(out, x.shape), ctx.out_dtype)
    if not (ctx.output_used(1) or ctx.output_used(2)):
        return out, None, None
    stats_shape = ctx.out_spec(1)[0]
    axes = tuple(range(len(lead), x.rank))
    mean, var = _stats(ctx, x, axes, stats_shape)
    return out, _saved_mean(ctx, mean), _rstd(ctx, var, eps, 2)


def _strided_groups(ctx: NodeContext) -> bool:
    options = ctx.options
    popart = options._Popart.options if options is not None else {}
    return bool(popart.get("groupNormStridedChannelGrouping", False))


@lowering(aten.native_group_norm.default)
def _lower_group_norm(
    ctx: NodeContext,
    x: popxl.Tensor,
    weight: Any,
    bias: Any,
    n: int,
    c: int,
    hxw: int,
    group: int,
    eps: float,
) -> tuple:
    dtype = _compute_dtype(x, weight, bias)
    c = x.shape[1]
    w, b = _param(ctx, weight, c, 1.0, dtype), _param(ctx, bias, c, 0.0, dtype)
    if _strided_groups(ctx) and int(group) > 1:
        # PopART's groupNormStridedChannelGrouping: group g holds channels g, g + G, g + 2G...
        # Normalise the channels reordered group by group, then put them back.
        per = c // int(group)
        order = [g + int(group) * k for g in range(int(group)) for k in range(per)]
        back = ctx.constant(np.argsort(order), popxl.int32)
        forward = ctx.constant(np.asarray(order), popxl.int32)
        x = ops.gather(x, forward, axis=1)
        w, b = ops.gather(w, forward), ops.gather(b, forward)
        out = ops.group_norm(ctx.tensor(x, dtype), w, b, int(group), eps=float(eps))
        out = ops.gather(out, back, axis=1)
    else:
        out = ops.group_norm(ctx.tensor(x, dtype), w, b, int(group), eps=float(eps))
    out = ctx.tensor(out, ctx.out_dtype)
    if not (ctx.output_used(1) or ctx.output_used(2)):
        return out, None, None
    grouped = ops.reshape(
        x, (x.shape[0], int(group), math.prod(x.shape) // (x.shape[0] * int(group)))
    )
    mean, var = _stats(ctx, grouped, (2,), ctx.out_spec(1)[0])
    return out, _saved_mean(ctx, mean, grad=True), _rstd(ctx, var, eps, 2, grad=True)
