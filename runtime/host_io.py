"""Lowering of host streams.

A host-to-device stream's buffer holds ``slots`` transfers (at least
``num_host_transfers``); each executed ``host_load`` reads the slot at the stream's cursor
and advances it, wrapping around. A device-to-host stream has ``num_host_transfers`` slots
and a count of executed stores; each ``host_store`` writes slot ``count % slots``.
"""

from __future__ import annotations

from jax import lax

from popxl._op import Op

from .lowering import Env, LoweringContext, special


def cursor_key(stream_id: str) -> str:
    return f"h2d-cursor:{stream_id}"


def buffer_key(stream_id: str) -> str:
    return f"d2h-buffer:{stream_id}"


def count_key(stream_id: str) -> str:
    return f"d2h-count:{stream_id}"


@special("host_load")
def _lower_host_load(ctx: LoweringContext, env: Env, op: Op) -> None:
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
