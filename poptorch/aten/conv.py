"""Convolutions: 1-3d, transposed, groups, dilation, padding; unfold/fold (im2col/col2im).

``aten.convolution`` is popxl's ``Conv``/``ConvTranspose`` (both take ONNX's layout, which is
torch's) plus a broadcast bias add. Padding modes other than zeros reach the table as
explicit pad ops (``pool.py``) before a zero-padded convolution. ``im2col``/``col2im`` are
kept whole (their decompositions are index arithmetic) and lowered to slices: each kernel
offset is one strided slice of the padded input, so ``col2im`` is its adjoint (slice adds).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from torch.ops import aten

import popxl
from popxl import ops

from .registry import NodeContext, lowering

_SPATIAL_MSG = "aten.convolution supports 1, 2 or 3 spatial axes; got an input of rank {rank}."


def _ints(values: Any, n: int) -> tuple[int, ...]:
    """A per-axis int tuple from torch's list (a single value applies to every axis)."""
    values = list(values)
    if len(values) == 1 and n > 1:
        values = values * n
    return tuple(int(v) for v in values)


@lowering(aten.convolution.default)
def _lower_convolution(
    ctx: NodeContext,
    x: popxl.Tensor,
    weight: popxl.Tensor,
    bias: popxl.Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> popxl.Tensor:
    dtype = ctx.out_dtype
    n = x.rank - 2
    if n not in (1, 2, 3):
        raise ValueError(_SPATIAL_MSG.format(rank=x.rank))
    x, weight = ctx.tensor(x, dtype), ctx.tensor(weight, dtype)
    pads = _ints(padding, n) * 2  # ONNX: every begin, then every end
    common: dict[str, Any] = {
        "stride": _ints(stride, n),
        "padding": pads,
        "dilation": _ints(dilation, n),
        "groups": int(groups),
    }
    if transposed:
        out = ops.conv_transpose(x, weight, output_padding=_ints(output_padding, n), **common)
    else:
        out = ops.conv(x, weight, **common)
    if bias is not None:
        out = ops.add(out, ops.reshape(ctx.tensor(bias, dtype), (1, -1) + (1,) * n))
    return out


# Unfold / fold ------------------------------------------------------------------------------


def _patch_slices(
    out: tuple[int, ...], kernel: Any, dilation: Any, stride: Any
) -> list[tuple[slice, slice]]:
    """For each kernel offset (row-major), the strided window it reads of the padded plane."""
    found = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            r0, c0 = i * dilation[0], j * dilation[1]
            found.append(
                (
                    slice(r0, r0 + stride[0] * (out[0] - 1) + 1, stride[0]),
                    slice(c0, c0 + stride[1] * (out[1] - 1) + 1, stride[1]),
                )
            )
    return found


def _blocks(size: int, k: int, d: int, p: int, s: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _im2col(x: Any, kernel: tuple, dilation: tuple, padding: tuple, stride: tuple) -> Any:
    """(N, C, H, W) -> (N, C * kh * kw, L): torch's unfold, channel-major then kernel offset."""
    n, c, h, w = x.shape
    out = tuple(_blocks(s, *a) for s, a in zip((h, w), zip(kernel, dilation, padding, stride)))
    xp = jnp.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    cols = [xp[:, :, r, q] for r, q in _patch_slices(out, kernel, dilation, stride)]
    return jnp.stack(cols, axis=2).reshape(n, c * len(cols), out[0] * out[1])


def _col2im(
    cols: Any, size: tuple, kernel: tuple, dilation: tuple, padding: tuple, stride: tuple
) -> Any:
    """(N, C * kh * kw, L) -> (N, C, H, W): torch's fold, the adjoint of ``_im2col`` (the
    values of overlapping patches add up)."""
    n, ckk, _ = cols.shape
    k = kernel[0] * kernel[1]
    c = ckk // k
    out = tuple(_blocks(s, *a) for s, a in zip(size, zip(kernel, dilation, padding, stride)))
    blocks = cols.reshape(n, c, k, out[0], out[1])
    hp, wp = size[0] + 2 * padding[0], size[1] + 2 * padding[1]
    acc = jnp.zeros((n, c, hp, wp), cols.dtype)
    for i, (r, q) in enumerate(_patch_slices(out, kernel, dilation, stride)):
        acc = acc.at[:, :, r, q].add(blocks[:, :, i])
    return acc[:, :, padding[0] : padding[0] + size[0], padding[1] : padding[1] + size[1]]


def _batched(ctx: NodeContext, x: popxl.Tensor, rank: int) -> tuple[popxl.Tensor, bool]:
    """``x`` with a leading batch axis (unfold/fold also take unbatched inputs)."""
    if x.rank == rank:
        return x, False
    return ops.reshape(x, (1, *x.shape)), True


@lowering(aten.im2col.default, preserve=True)
def _lower_im2col(
    ctx: NodeContext, x: popxl.Tensor, kernel_size: Any, dilation: Any, padding: Any, stride: Any
) -> popxl.Tensor:
    x4, unbatched = _batched(ctx, x, 4)
    shape = ctx.out_shape if not unbatched else (1, *ctx.out_shape)
    out = ctx.jax(
        "im2col",
        _im2col,
        x4,
        outputs=[(shape, ctx.out_dtype)],
        kernel=_ints(kernel_size, 2),
        dilation=_ints(dilation, 2),
        padding=_ints(padding, 2),
        stride=_ints(stride, 2),
    )
    return ops.reshape(out, ctx.out_shape) if unbatched else out


@lowering(aten.col2im.default, preserve=True)
def _lower_col2im(
    ctx: NodeContext,
    x: popxl.Tensor,
    output_size: Any,
    kernel_size: Any,
    dilation: Any,
    padding: Any,
    stride: Any,
) -> popxl.Tensor:
    x3, unbatched = _batched(ctx, x, 3)
    shape = ctx.out_shape if not unbatched else (1, *ctx.out_shape)
    out = ctx.jax(
        "col2im",
        _col2im,
        x3,
        outputs=[(shape, ctx.out_dtype)],
        size=_ints(output_size, 2),
        kernel=_ints(kernel_size, 2),
        dilation=_ints(dilation, 2),
        padding=_ints(padding, 2),
        stride=_ints(stride, 2),
    )
    return ops.reshape(out, ctx.out_shape) if unbatched else out
