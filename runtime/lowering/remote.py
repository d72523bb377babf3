"""Lowering of remote-buffer IO.

Each remote buffer is part of the step's state: per replica an array ``(entries,
*tensor_shape)``, carried in ``ctx.fx`` while the step runs so loads and stores inside loops
and branches see each other. Offsets are clamped to the valid slots.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from popxl._op import Op
from popxl.tensor import Tensor

from .core import Env, LoweringContext, special


def buffer_key(buffer_id: int) -> str:
    return f"remote:{buffer_id}"


def _slot(env: Env, offset_tensor: Tensor, entries: int) -> jax.Array:
    offset = env.read(offset_tensor).reshape(()).astype(jnp.int32)
    return jnp.clip(offset, 0, entries - 1)


@special("remote_load")
def _lower_remote_load(ctx: LoweringContext, env: Env, op: Op) -> None:
    key = buffer_key(op.attrs["buffer_id"])
    buffer = ctx.fx[key]
    value = lax.dynamic_index_in_dim(
        buffer, _slot(env, op.inputs[1], buffer.shape[0]), 0, keepdims=False
    )
    if op.opdef.modifies:
        env.write(op.inputs[0], value)
        env.alias(op.outputs[0], op.inputs[0])
    else:
        env.values[op.outputs[0]] = value


@special("remote_store")
def _lower_remote_store(ctx: LoweringContext, env: Env, op: Op) -> None:
    key = buffer_key(op.attrs["buffer_id"])
    buffer = ctx.fx[key]
    slot = _slot(env, op.inputs[1], buffer.shape[0])
    ctx.fx[key] = lax.dynamic_update_index_in_dim(buffer, env.read(op.inputs[0]), slot, 0)
