"""``RotaryPosEmbed``: rotate pairs of hidden features by position-dependent angles.

RoFormer (https://arxiv.org/abs/2104.09864), in GPT-J's interleaved layout: the features
``(2i, 2i+1)`` of a head are the real and imaginary parts of one complex number, rotated by
``phi = m * theta_i`` at sequence position ``m``, with ``theta_i = base^(-2i / rotary_dim)``.
Only the first ``rotary_dim`` features rotate. The gradient rotates back (by ``-phi``);
the tables get no gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import popxl
from popxl.tensor_spec import TensorSpec

from .._native import core_error, define, jax, jnp, record, rounded


def trig_tables(
    seq_len: int, rotary_dim: int, base: int = 10000, np_dtype: Any = "float32"
) -> tuple[np.ndarray, np.ndarray]:
    """``(sin, cos)`` of ``phi[m, i] = m * base^(-2i / rotary_dim)``, each
    ``(seq_len, rotary_dim // 2)``."""
    theta = base ** (-np.arange(0, rotary_dim, 2).astype(np_dtype) / rotary_dim)
    phi = np.outer(np.arange(seq_len).astype(np_dtype), theta)
    return np.sin(phi), np.cos(phi)


def trig_table_constants(
    seq_len: int, rotary_dim: int, base: int = 10000, dtype: popxl.dtype = popxl.float32
) -> tuple[popxl.Tensor, popxl.Tensor]:
    """``trig_tables`` as two popxl constants of ``dtype``."""
    sin, cos = trig_tables(seq_len, rotary_dim, base, dtype.as_numpy())
    return popxl.constant(sin, dtype), popxl.constant(cos, dtype)


def _infer(x: Any, sin: Any, cos: Any, *, rotary_dim: int) -> list:
    if len(x.shape) != 4:
        raise core_error("RotaryPosEmbedOp::setup x should have rank 4 (batch, heads, seq, hh)")
    if len(sin.shape) != 3 or len(cos.shape) != 3:
        raise core_error(
            "RotaryPosEmbedOp::setup trig functions should have rank 3 (1 or batch, seq, hh/2)"
        )
    return [TensorSpec(x.shape, x.dtype)]


def _rotate(x: Any, sin: Any, cos: Any, rotary_dim: int) -> Any:
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    pairs = rot.reshape(*rot.shape[:-1], rotary_dim // 2, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    s = sin[:, :, None, :].astype(x.dtype)  # (batch or 1, seq, heads, pairs)
    c = cos[:, :, None, :].astype(x.dtype)
    rc, is_, ic, rs = (rounded(p) for p in (real * c, imag * s, imag * c, real * s))
    turned = jnp.stack([rc - is_, ic + rs], axis=-1)
    return jnp.concatenate([turned.reshape(rot.shape), rest], axis=-1)


def _lower(x: Any, sin: Any, cos: Any, *, rotary_dim: int) -> Any:
    def forward(x: Any, sin: Any, cos: Any) -> tuple:
        return _rotate(x, sin, cos, rotary_dim), (sin, cos)

    def backward(tables: tuple, ct: Any) -> tuple:
        sin, cos = tables
        return _rotate(ct, -sin, cos, rotary_dim), None, None  # rotate back by -phi

    fn = jax.custom_vjp(lambda x, sin, cos: forward(x, sin, cos)[0])
    fn.defvjp(forward, backward)
    return fn(x, sin, cos)


ROTARY_POS_EMBED = define(
    "rotary_pos_embed", "RotaryPosEmbed", _infer, _lower, nondiff_inputs=(1, 2)
)


def rotary_pos_embed(
    t: popxl.Tensor, sin: popxl.Tensor, cos: popxl.Tensor, rotary_dim: int | None = None
) -> popxl.Tensor:
    """Apply rotary positional embeddings to ``t``.

    Applied to queries and keys before the attention scores, so that a score depends on
    the relative position of the two tokens.

    Args:
        t: ``(batch, seq, heads, head_dim)``.
        sin: ``trig_tables`` sine table, ``(seq, rotary_dim // 2)`` or with a leading axis
            of 1 or ``batch``.
        cos: the cosine table, shaped like ``sin``.
        rotary_dim: how many leading features of each head rotate (default: all).

    Returns:
        ``t`` rotated, same shape.

    Raises:
        popxl.errors.PopXLException: ``rotary_dim`` is odd, or wrong ranks.
    """
    rotary_dim = rotary_dim or t.shape[-1]
    if rotary_dim % 2:
        raise core_error("RotaryPosEmbedOp::RotaryPosEmbedOp rotary_dim must be a multiple of 2")
    if sin.rank == 2:
        sin = sin.reshape((1, *sin.shape))
    if cos.rank == 2:
        cos = cos.reshape((1, *cos.shape))
    return record(
        ROTARY_POS_EMBED,
        {"t": t, "sin": sin, "cos": cos},
        {"rotary_dim": int(rotary_dim)},
        ["t_rotated"],
    )[0]


__all__ = ["rotary_pos_embed", "trig_tables", "trig_table_constants"]
