"""``GroupQuantizeDecompress``: unpack 4-bit group-quantised weights (FlexGen).

FlexGen (https://arxiv.org/abs/2303.06865) compresses a tensor by groups along one axis:
each group is mapped onto the 16 levels between its min and max, and four 4-bit ids are
packed into one uint16 (the first id in the high nibble). Decompression unpacks the ids
and applies ``id * scale + bias`` per group. The decompressed axis is stored last; ``dim``
moves it elsewhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import popxl
from popxl.tensor_spec import TensorSpec

from .._native import core_error, define, jnp, lax, record

_SHIFTS = (12, 8, 4, 0)
MSG = "GroupQuantizeDecompressOp::setup {}"


def _infer(x: Any, scale: Any, bias: Any) -> list:
    if len(x.shape) != 3:
        raise core_error(MSG.format("x should have rank 3"))
    for name, t in (("groupScale", scale), ("groupBias", bias)):
        if len(t.shape) != 3:
            raise core_error(MSG.format(f"{name} should same rank as x"))
        if t.shape[2] != 1:
            raise core_error(MSG.format(f"{name} shape at last dimension should be 1"))
    if scale.shape != bias.shape:
        raise core_error(MSG.format("groupScale and groupBias should have same shape"))
    rows, groups, ids = x.shape
    return [TensorSpec((rows, groups * ids * 4), scale.dtype)]


def _unpack(packed: Any, xp: Any) -> Any:
    """``(*lead, groups, ids)`` uint16 -> ``(*lead, groups, ids * 4)`` 4-bit ids."""
    nibbles = xp.stack([(packed >> s) & 15 for s in _SHIFTS], axis=-1)
    return nibbles.reshape(*packed.shape[:-1], packed.shape[-1] * 4)


def _lower(x: Any, scale: Any, bias: Any) -> Any:
    """``ids * scale + bias`` rounded as float16 units without a fused multiply-add (and
    NumPy) round it: the product, then the sum. XLA:CPU contracts a float16 multiply and add
    into one rounding on CPUs with AVX-512 FP16, which moved results by up to 4 units in the
    last place where the sum cancels; computed in float32 with each rounding explicit, every
    CPU gives the same."""
    wide = jnp.promote_types(scale.dtype, jnp.float32)
    info = jnp.finfo(scale.dtype)
    ids = _unpack(x, jnp).astype(wide)
    product = lax.reduce_precision(ids * scale.astype(wide), info.nexp, info.nmant)
    return (product + bias.astype(wide)).astype(scale.dtype).reshape(x.shape[0], -1)


GROUP_QUANTIZE_DECOMPRESS = define(
    "group_quantize_decompress", "GroupQuantizeDecompress", _infer, _lower, nondiff_inputs=(0,)
)


def _trailing_to(t: Any, dim: int) -> Any:
    """Move the last axis to position ``dim`` (a popxl tensor or a NumPy array)."""
    if dim == -1:
        return t
    perm = list(range(len(t.shape)))
    perm.insert(dim, perm.pop(-1))
    return t.transpose(perm)


def _group_param(name: str, p: popxl.Tensor, t: popxl.Tensor) -> popxl.Tensor:
    if p.rank < t.rank - 1 or p.rank > t.rank:
        raise ValueError(f"{name}.rank must be equal to or one less than t.rank")
    if p.rank == t.rank - 1:
        p = p.reshape((*p.shape, 1))
    if t.shape[:-1] != p.shape[: t.rank - 1]:
        raise ValueError(f"The first two dimensions of t and {name} must be the same")
    return p


def group_quantize_decompress(
    t: popxl.Tensor, group_scale: popxl.Tensor, group_bias: popxl.Tensor, dim: int = -1
) -> popxl.Tensor:
    """Decompress a packed 4-bit group-quantised tensor.

    Args:
        t: ``(rows, groups, ids)`` uint16, four 4-bit ids per element.
        group_scale: ``(rows, groups, 1)`` (or ``(rows, groups)``) scale of each group.
        group_bias: like ``group_scale``: the group's minimum.
        dim: where the decompressed axis goes (default: last).

    Returns:
        ``(rows, groups * ids * 4)`` in ``group_scale``'s dtype, its last axis moved to
        ``dim``. Differentiable w.r.t. ``group_scale`` and ``group_bias``.

    Raises:
        NotImplementedError: ``t`` is not rank 3 (as in the original).
        ValueError: scale/bias ranks or leading shapes do not match ``t``.
    """
    if t.rank != 3:
        raise NotImplementedError(
            "4-bit decompression currently supported only for packed tensors with rank 3"
        )
    group_scale = _group_param("group_scale", group_scale, t)
    group_bias = _group_param("group_bias", group_bias, t)
    inputs = {"t": t, "group_scale": group_scale, "group_bias": group_bias}
    out = record(GROUP_QUANTIZE_DECOMPRESS, inputs, {}, ["t_decompressed"])[0]
    return _trailing_to(out, dim)


def group_quantize_decompress_numpy(
    t: np.ndarray, group_scale: np.ndarray, group_bias: np.ndarray, dim: int = -1
) -> np.ndarray:
    """NumPy decompression: ``t`` is ``(*lead, groups, ids)`` uint16; the result is
    ``(*lead, groups * ids * 4)`` float16 with the last axis moved to ``dim``."""
    ids = _unpack(t, np).astype(np.float16)
    scaled = ids * group_scale + group_bias
    return _trailing_to(scaled.reshape(*t.shape[:-2], -1), dim)


def group_quantize_compress_numpy(
    t: np.ndarray, group_size: int, dim: int = -1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NumPy compression of ``t`` along ``dim`` in groups of ``group_size`` elements.

    Returns:
        ``(packed, scale, bias)``: ``(*other, groups, group_size // 4)`` uint16 and two
        ``(*other, groups, 1)`` float16 arrays, where ``other`` are the remaining axes.

    Raises:
        ValueError: ``t`` contains non-finite values.
    """
    if dim != -1:
        perm = list(range(t.ndim))
        perm.append(perm.pop(dim))
        t = t.transpose(perm)
    if not np.isfinite(t).all():
        raise ValueError("Cannot compress t which contains non-finite values")
    lead = t.shape[:-1]
    grouped = t.reshape(*lead, t.shape[-1] // group_size, group_size)
    top = grouped.max(-1, keepdims=True).astype(np.float16)
    bias = grouped.min(-1, keepdims=True).astype(np.float16)
    scale = (top - bias) / (2**4 - 1)
    ids = np.round((grouped - bias) / scale).astype(np.uint16)
    weights = (2 ** (np.arange(4) * 4)[::-1]).astype(np.uint16)
    packed = ids.reshape(*ids.shape[:-1], group_size // 4, 4) @ weights
    return packed.astype(np.uint16), scale, bias


__all__ = [
    "group_quantize_decompress",
    "group_quantize_decompress_numpy",
    "group_quantize_compress_numpy",
]
