"""Lowering of host streams.

A host-to-device stream's buffer holds ``slots`` transfers (at least
``num_host_transfers``); each executed ``host_load`` reads the slot at the stream's cursor
and advances it, wrapping around. A device-to-host stream has ``num_host_transfers`` slots
and a count of executed stores; each ``host_store`` writes slot ``count % slots``.

With synthetic data (the session option ``syntheticDataMode``) nothing crosses: a load gives
data made on the device, as PopART initialised such streams once (zeros, or ~N(0, 1) or
uniform on [-1, 1) draws converted to the stream's dtype, the same for every load), and a
store sends nothing, so the host's output buffers keep their zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from popxl._op import Op
from popxl.tensor import Tensor

from .core import Env, LoweringContext, special


def synthetic_value(mode: int, t: Tensor) -> jax.Array:
    """The synthetic data of a load of ``t``'s stream (``mode``: PopART's 1 zeros,
    2 random normal, 3 random uniform), every stream drawn from one fixed key."""
    dtype = t.dtype._np_device
    if mode == 1:
        return jnp.zeros(t.shape, dtype)
    key = jax.random.key(0)
    if mode == 2:
        draws = jax.random.normal(key, t.shape, jnp.float32)
    else:
        draws = jax.random.uniform(key, t.shape, jnp.float32, -1.0, 1.0)
    return draws.astype(dtype)


def cursor_key(stream_id: str) -> str:
    return f"h2d-cursor:{stream_id}"


def buffer_key(stream_id: str) -> str:
    return f"d2h-buffer:{stream_id}"


def count_key(stream_id: str) -> str:
    return f"d2h-count:{stream_id}"


@special("host_load")
def _lower_host_load(ctx: LoweringContext, env: Env, op: Op) -> None:
    if ctx.synthetic_data:
        env.values[op.outputs[0]] = synthetic_value(ctx.synthetic_data, op.outputs[0])
        return
    stream_id = op.attrs["stream_id"]
    buffer = ctx.h2d[stream_id]
    slots = buffer.shape[0]
    if slots == 1:
        value = buffer[0]
    else:
        cursor = ctx.fx[cursor_key(stream_id)]
        value = lax.dynamic_index_in_dim(buffer, cursor, 0, keepdims=False)
        ctx.fx[cursor_key(stream_id)] = (cursor + 1) % slots
    env.values[op.outputs[0]] = value


@special("host_store")
def _lower_host_store(ctx: LoweringContext, env: Env, op: Op) -> None:
    if ctx.synthetic_data:  # nothing goes to the host
        return
    stream_id = op.attrs["stream_id"]
    value = env.read(op.inputs[0])
    count = ctx.fx[count_key(stream_id)]
    slots = ctx.d2h_slots[stream_id]
    if slots == 1:
        ctx.fx[buffer_key(stream_id)] = value[None]
    else:
        buffer = ctx.fx[buffer_key(stream_id)]
        ctx.fx[buffer_key(stream_id)] = lax.dynamic_update_index_in_dim(
            buffer, value, count % slots, 0
        )
    ctx.fx[count_key(stream_id)] = count + 1
