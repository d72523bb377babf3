"""Run-time value checks: PopXL's Poplar-side assertions, reported after a run.

Some PopXL ops asserted on device that a run-time value was valid: the pow2-scaled float8
ops (``pow2scale_cast_to_fp8``, ``pow2scale_cast_from_fp8``, ``matmul_pow2scaled``,
``conv_pow2scaled``, ``conv_transpose_pow2scaled``) raised a Poplar application runtime
error when their ``log2_scale`` held a value outside ``[-32, 32)`` and the session option
``throwIfLog2ScaleTensorNotInRange`` was on (PopART's default).

Here an op that can fail a check has ``special="log2_scale_checked"``: it lowers as usual
and, when the check is enabled for the program, records in the effect state (``ctx.fx``,
threaded through calls, loops and branches) whether any execution saw a bad value and
the last such value. The step returns these per replica; when one failed, the step keeps
the previous state and the session raises :class:`popxl.errors.Error`. Programs without
such ops, or with the option off, carry no check at all.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from popxl._op import Op
from popxl.errors import Error, InternalError
from popxl.graph import Graph
from popxl.ir import Ir

from .core import Env, LoweringContext, apply_results, special

LOG2_SCALE = "log2_scale"
LOG2_SCALE_RANGE = (-32, 32)
_FAILED_KEY = "check:{name}:failed"
_VALUE_KEY = "check:{name}:value"

LOG2_SCALE_MSG = (
    "Log2 scale is not in the range [{lo}, {hi}). A pow2-scaled float8 op "
    "(pow2scale_cast_to_fp8, pow2scale_cast_from_fp8, matmul_pow2scaled, conv_pow2scaled or "
    "conv_transpose_pow2scaled) read log2_scale = {value} at run time. Keep the scale in "
    "[{lo}, {hi}), or set ir._pb_ir.getSessionOptions().throwIfLog2ScaleTensorNotInRange = "
    "False before creating the Session to apply any scale unchecked. The run was undone: "
    "variables, remote buffers and outputs are as before it."
)


def program_checks(ir: Ir, graphs: list[Graph]) -> tuple[str, ...]:
    """The checks a program over ``graphs`` must carry (part of its compiled identity)."""
    if not ir.session_options.throwIfLog2ScaleTensorNotInRange:
        return ()
    for graph in graphs:
        if any(op.opdef.special == "log2_scale_checked" for op in graph._ops):
            return (LOG2_SCALE,)
    return ()


def start(ctx: LoweringContext, checks: tuple[str, ...]) -> None:
    """Add the checks' effect state to ``ctx.fx`` (before any op is lowered)."""
    for name in checks:
        ctx.fx[_FAILED_KEY.format(name=name)] = jnp.zeros((), jnp.int32)
        ctx.fx[_VALUE_KEY.format(name=name)] = jnp.zeros((), jnp.int32)


def reports(ctx: LoweringContext, checks: tuple[str, ...]) -> tuple[Any, ...]:
    """Per check, this replica's ``(failed, value)`` int32 scalars."""
    out: list[Any] = []
    for name in checks:
        out += [ctx.fx[_FAILED_KEY.format(name=name)], ctx.fx[_VALUE_KEY.format(name=name)]]
    return tuple(out)


def any_failed(ctx: LoweringContext, checks: tuple[str, ...]) -> Any:
    """Whether a check failed on any replica (the same value on every replica)."""
    failed = jnp.zeros((), jnp.int32)
    for name in checks:
        failed = jnp.maximum(failed, ctx.fx[_FAILED_KEY.format(name=name)])
    if ctx.axis_name is not None:
        failed = lax.pmax(failed, ctx.axis_name)
    return failed > 0


def keep_on_failure(failed: Any, old: tuple, new: tuple) -> tuple:
    """``old`` where a check failed, else ``new`` (a failed run changes no state)."""
    return tuple(jnp.where(failed, o, n) for o, n in zip(old, new))


def raise_if_failed(checks: tuple[str, ...], values: tuple[Any, ...]) -> None:
    """Raise the first failed check's error from the step's per-replica reports."""
    for k, name in enumerate(checks):
        failed = np.asarray(values[2 * k]).reshape(-1)
        if failed.any():
            value = int(np.asarray(values[2 * k + 1]).reshape(-1)[int(np.argmax(failed))])
            lo, hi = LOG2_SCALE_RANGE
            raise Error(LOG2_SCALE_MSG.format(lo=lo, hi=hi, value=value), type=name)


@special("log2_scale_checked")
def _lower_log2_scale_checked(ctx: LoweringContext, env: Env, op: Op) -> None:
    """A pow2-scaled op (its last input is ``log2_scale``), checked when enabled."""
    if op.opdef.lower is None:
        raise InternalError(f"{op.opdef.key} has no lowering", op, op.graph)
    apply_results(env, op, op.opdef.lower(*(env.read(t) for t in op.inputs), **op.attrs))
    failed_key = _FAILED_KEY.format(name=LOG2_SCALE)
    if failed_key not in ctx.fx:
        return
    scale = env.read(op.inputs[-1]).reshape(()).astype(jnp.int32)
    lo, hi = LOG2_SCALE_RANGE
    bad = (scale < lo) | (scale >= hi)
    value_key = _VALUE_KEY.format(name=LOG2_SCALE)
    ctx.fx[failed_key] = jnp.maximum(ctx.fx[failed_key], bad.astype(jnp.int32))
    ctx.fx[value_key] = jnp.where(bad, scale, ctx.fx[value_key])
