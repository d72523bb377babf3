"""Variable-update ops: accumulators, optimizer updaters and weight updates.

The ``*_`` ops (and ``adam_var_update``) update ``t`` in place and return a new handle on
the same storage, so both ``t`` and the returned tensor see the new value. They never
broadcast: ``t`` and ``X`` have the same shape, but their dtypes may differ (mixed
precision; the arithmetic runs in float32 or wider and the result is cast to ``t``'s dtype;
the moving averages and Adam's bias correction instead round to a float16 moment's dtype
after every operation, as the IPU computed them in float16).

Scalar factors may be Python numbers (fixed when the program is built) or scalar tensors
(read at run time). None of these ops has a gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._op import core_error, define
from ..tensor import Tensor
from ._base import jnp, record, spec
from ._rounding import round_to

# Scalar factors: Python numbers become attributes, tensors become inputs ------------------


def _factors(**values: Any) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split scalar factors into tensor inputs and float attributes.

    ``attrs["tensor_args"]`` names the factors passed as tensors, in input order.
    """
    tensors = {k: v for k, v in values.items() if isinstance(v, Tensor)}
    attrs: dict[str, Any] = {
        k: None if v is None or k in tensors else float(v) for k, v in values.items()
    }
    attrs["tensor_args"] = tuple(tensors)
    return tensors, attrs


def _params(scalars: tuple, tensor_args: tuple[str, ...], floats: dict, dtype: Any) -> dict:
    """Factor values for a lowering, in the compute dtype: attributes, overridden by the
    tensor inputs. Like the IPU, ``1 - beta`` and the like are computed from the float32
    value of a float factor, not from the Python double."""
    values = {k: None if v is None else np.asarray(v, dtype) for k, v in floats.items()}
    values.update({k: s.reshape(()).astype(dtype) for k, s in zip(tensor_args, scalars)})
    return values


def _check_scalars(op: str, scalars: tuple) -> None:
    for s in scalars:
        if s.shape not in ((), (1,)):
            raise ValueError(
                f"{op}: scalar factors must have shape () or (1,), got a tensor of shape "
                f"{s.shape}. Reduce it first (e.g. ops.sum) or pass a Python float."
            )


def _check_same_shape(op: str, t: Any, x: Any) -> None:
    if t.shape != x.shape:
        raise core_error(
            f"{op} does not broadcast: t has shape {t.shape} and X has shape {x.shape}. "
            "Reshape or expand X to t's shape first."
        )


def _compute_dtype(*arrays: Any) -> Any:
    return jnp.result_type(jnp.float32, *(a.dtype for a in arrays))


def _name(t: Any) -> str:
    return t.name if isinstance(t, Tensor) else "t"


# Accumulate: t = rule(t, X, factor) --------------------------------------------------------

ACCUMULATE_RULES: dict[str, Any] = {
    "accumulate_": lambda t, x, f: t + f * x,
    "accumulate_square_": lambda t, x, f: t + f * x * x,
    "accumulate_mean_": lambda t, x, f: f / (f + 1) * t + 1 / (f + 1) * x,
    "accumulate_moving_average_": lambda t, x, f: f * t + (1 - f) * x,
    "accumulate_moving_average_square_": lambda t, x, f: f * t + (1 - f) * x * x,
}


def _accumulate_infer(t: Any, x: Any, *scalars: Any, **_: Any) -> list:
    _check_same_shape("Accumulate", t, x)
    _check_scalars("Accumulate", scalars)
    return [t]


def _accumulate_lowering(rule: Any) -> Any:
    def lower(t: Any, x: Any, *scalars: Any, tensor_args: tuple[str, ...], f: Any) -> Any:
        dt = _compute_dtype(t, x)
        factor = _params(scalars, tensor_args, {"f": f}, dt)["f"]
        # X is converted to the accumulator's dtype first (a float32 gradient into a float16
        # accumulator is rounded to float16), then combined at float32 or wider.
        return rule(t.astype(dt), _rounded(x, t.dtype).astype(dt), factor).astype(t.dtype)

    return lower


def _rounder(dtype: Any) -> Any:
    """Rounding to ``dtype`` of a value computed wider; nothing for float32 and wider, and
    for integer accumulators (their single rounding is the final cast)."""
    if not jnp.issubdtype(dtype, jnp.floating) or jnp.finfo(dtype).bits >= 32:
        return lambda a: a
    return lambda a: round_to(a, dtype)


def _rounded(x: Any, dtype: Any) -> Any:
    """``x`` rounded to ``dtype`` (a float16 accumulator rounds a float32 gradient)."""
    if x.dtype == jnp.float32 and jnp.issubdtype(dtype, jnp.floating):
        return round_to(x, dtype)
    return x.astype(dtype)


def _moving_average_lowering(square: bool) -> Any:
    """The IPU's moving averages: the whole expression ran in the accumulator's dtype,
    factors included (``f`` and ``1 - f``, the latter taken at float32 first), and a float16
    accumulator rounded after every operation (PopART's AccumulateOpx). Those roundings
    matter to Adam: ``adam_updater`` divides by the same rounded ``1 - beta1``."""

    def lower(t: Any, x: Any, *scalars: Any, tensor_args: tuple[str, ...], f: Any) -> Any:
        r = _rounder(t.dtype)
        dt = _compute_dtype(t, x)
        factor = _params(scalars, tensor_args, {"f": f}, dt)["f"]
        a, b = r(factor.astype(dt)), r((1 - factor).astype(dt))
        x = r(x.astype(dt))
        new = r(b * x)
        if square:
            new = r(new * x)
        return (r(a * t.astype(dt)) + new).astype(t.dtype)

    return lower


INPLACE = {"modifies": ((0, 0),), "alias_outputs": ((0, 0),), "grad": "none"}

LOWERINGS = {key: _accumulate_lowering(rule) for key, rule in ACCUMULATE_RULES.items()}
LOWERINGS["accumulate_moving_average_"] = _moving_average_lowering(square=False)
LOWERINGS["accumulate_moving_average_square_"] = _moving_average_lowering(square=True)
OPS = {
    key: define(key, "Accumulate", _accumulate_infer, lower, **INPLACE)
    for key, lower in LOWERINGS.items()
}


def _accumulate(key: str, out: str, t: Tensor, X: Tensor, f: Any) -> Tensor:
    tensors, attrs = _factors(f=f)
    return record(OPS[key], {"t": t, "X": X, **tensors}, attrs, [f"{out}__{_name(t)}"])[0]


def accumulate_(t: Tensor, X: Tensor, f: float | Tensor | None = None) -> Tensor:
    """``t += X`` (``f`` None) or ``t += f * X``, in place.

    Args:
        t: the accumulator, updated in place.
        X: the value to add, same shape as ``t`` (its dtype may differ).
        f: optional scale: a Python number or a scalar tensor.

    Returns:
        A handle on the updated ``t`` (``accumulate__<t.name>``).
    """
    return _accumulate("accumulate_", "accumulate", t, X, 1.0 if f is None else f)


def accumulate_square_(t: Tensor, X: Tensor, f: float | Tensor = 1.0) -> Tensor:
    """``t += f * X**2``, in place. Returns a handle on ``t`` (``accumulate_square__<t>``)."""
    return _accumulate("accumulate_square_", "accumulate_square", t, X, f)


def accumulate_mean_(t: Tensor, X: Tensor, step: float | Tensor) -> Tensor:
    """Running mean, in place: ``t = step/(step+1) * t + 1/(step+1) * X``.

    Args:
        t: the mean of the ``step`` values seen so far; updated in place.
        X: the new value.
        step: how many values ``t`` already averages (a number or a scalar tensor, usually a
            counter incremented after each call). With ``step == 0``, ``t`` becomes ``X``.

    Returns:
        A handle on the updated ``t`` (``accumulate_mean__<t.name>``).
    """
    return _accumulate("accumulate_mean_", "accumulate_mean", t, X, step)


def accumulate_moving_average_(t: Tensor, X: Tensor, f: float | Tensor) -> Tensor:
    """Exponential moving average, in place: ``t = f * t + (1 - f) * X``.

    Returns a handle on ``t`` (``accumulate_moving_avg__<t.name>``).
    """
    return _accumulate("accumulate_moving_average_", "accumulate_moving_avg", t, X, f)


def accumulate_moving_average_square_(t: Tensor, X: Tensor, f: float | Tensor) -> Tensor:
    """Moving average of squares, in place: ``t = f * t + (1 - f) * X**2``.

    Returns a handle on ``t`` (``accumulate_moving_avg_square__<t.name>``).
    """
    key, out = "accumulate_moving_average_square_", "accumulate_moving_avg_square"
    return _accumulate(key, out, t, X, f)


# Scaling, zeroing, copying -----------------------------------------------------------------


def _scale_infer(t: Any, *scalars: Any, **_: Any) -> list:
    _check_scalars("AccumulatorScale", scalars)
    return [t]


def _accumulator_scale(t: Any, *scalars: Any, tensor_args: tuple[str, ...], f: Any) -> Any:
    if f == 0.0:  # a constant 0 fills with zeros, so inf/NaN entries are cleared too
        return jnp.zeros_like(t)
    dt = _compute_dtype(t)
    return (t.astype(dt) * _params(scalars, tensor_args, {"f": f}, dt)["f"]).astype(t.dtype)


OPS["accumulator_scale_"] = define(
    "accumulator_scale_", "AccumulatorScale", _scale_infer, _accumulator_scale, **INPLACE
)


def accumulator_scale_(t: Tensor, f: float | Tensor) -> Tensor:
    """``t *= f``, in place; a Python ``f == 0`` fills ``t`` with zeros (even inf/NaN).

    Returns a handle on ``t`` (``accumulator_scale__<t.name>``).
    """
    tensors, attrs = _factors(f=f)
    name = f"accumulator_scale__{_name(t)}"
    return record(OPS["accumulator_scale_"], {"t": t, **tensors}, attrs, [name])[0]


def accumulator_zero_(t: Tensor) -> Tensor:
    """``t = 0``, in place: ``accumulator_scale_(t, 0.0)``, as in PopXL.

    Returns a handle on ``t`` (``accumulator_scale__<t.name>``).
    """
    return accumulator_scale_(t, 0.0)


def _copy_infer(t: Any, x: Any) -> list:
    _check_same_shape("CopyVarUpdate", t, x)
    return [t]


OPS["copy_var_update_"] = define(
    "copy_var_update_", "CopyVarUpdate", _copy_infer, lambda t, x: x.astype(t.dtype), **INPLACE
)


def copy_var_update_(t: Tensor, X: Tensor) -> Tensor:
    """``t = X``, in place (``X`` is cast to ``t``'s dtype).

    Returns a handle on ``t`` (``updated__<t.name>``).
    """
    return record(OPS["copy_var_update_"], {"t": t, "X": X}, {}, [f"updated__{_name(t)}"])[0]


# Sparse accumulate -------------------------------------------------------------------------


def _sparse_infer(t: Any, x: Any, indices: Any, *rest: Any, axis: int, **attrs: Any) -> list:
    if not indices.dtype.is_int:
        raise core_error(f"SparseAccumulate: indices must be integers, got {indices.dtype.name}.")
    expected = t.shape[:axis] + indices.shape + t.shape[axis + 1 :]
    if x.shape != expected:
        raise core_error(
            f"SparseAccumulate: X has shape {x.shape}, expected {expected}: t's shape "
            f"{t.shape} with axis {axis} replaced by the indices' shape {indices.shape} (the "
            "shape of ops.gather(t, indices, axis))."
        )
    _check_scalars("SparseAccumulate", rest[: len(attrs["tensor_args"])])
    return [t]


def _sparse_accumulate(
    t: Any, x: Any, indices: Any, *rest: Any, axis: int, tensor_args: tuple[str, ...], f: Any
) -> Any:
    dt = _compute_dtype(t, x)
    factor = _params(rest[: len(tensor_args)], tensor_args, {"f": f}, dt)["f"]
    k = indices.ndim
    rows = jnp.moveaxis(x.astype(dt), tuple(range(axis, axis + k)), tuple(range(k)))
    rows = rows.reshape((-1, *t.shape[:axis], *t.shape[axis + 1 :]))
    index = indices.reshape(-1).astype(jnp.int32)
    index = jnp.where(index < 0, t.shape[axis], index)  # negative: out of range, ignored
    acc = jnp.moveaxis(t.astype(dt), axis, 0).at[index].add(factor * rows, mode="drop")
    return jnp.moveaxis(acc, 0, axis).astype(t.dtype)


OPS["sparse_accumulate_"] = define(
    "sparse_accumulate_", "SparseAccumulate", _sparse_infer, _sparse_accumulate, **INPLACE
)


def sparse_accumulate_(
    t: Tensor,
    X: Tensor,
    indices: Tensor,
    axis: int = 0,
    f: float | Tensor | None = None,
    W: Tensor | None = None,
) -> Tensor:
    """Scatter-add, in place: ``t[..., indices[i], ...] += f * X[..., i, ...]`` along ``axis``.

    The inverse of ``ops.gather(t, indices, axis)``: ``X`` has the gather's output shape,
    ``t.shape[:axis] + indices.shape + t.shape[axis+1:]``. Repeated indices accumulate;
    out-of-range (and negative) indices are ignored, as on the IPU.

    Args:
        t: the accumulator, updated in place.
        X: the slices to add.
        indices: integer positions along ``axis`` of ``t``.
        axis: the axis of ``t`` that ``indices`` index.
        f: optional scale (number or scalar tensor); default 1.
        W: the tensor ``t`` accumulates gradients for; on the IPU it only chooses the tile
            layout. It is recorded as an input but does not change the result.

    Returns:
        A handle on the updated ``t`` (``sparse_accumulate__<t.name>``).
    """
    tensors, attrs = _factors(f=1.0 if f is None else f)
    if isinstance(t, Tensor):
        attrs["axis"] = _axis(axis, t.rank)
    inputs = {"t": t, "X": X, "indices": indices, **tensors}
    if W is not None:
        inputs["W"] = W
    name = f"sparse_accumulate__{_name(t)}"
    return record(OPS["sparse_accumulate_"], inputs, attrs, [name])[0]


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"sparse_accumulate_: axis {axis} is out of range for rank {rank}.")
    return axis % rank


# Optimizer updaters ------------------------------------------------------------------------


def _updater_infer(
    m: Any, v: Any, *rest: Any, with_step: bool, with_weight: bool, **_: Any
) -> list:
    if m.shape != v.shape:
        raise core_error(
            f"AdamUpdater: the first-order ({m.shape}) and second-order ({v.shape}) "
            "accumulators must have the same shape."
        )
    rest_list = list(rest)
    if with_step:
        _check_scalars("AdamUpdater time_step", (rest_list.pop(0),))
    weight = rest_list.pop(0) if with_weight else None
    if weight is not None and weight.shape != m.shape:
        raise core_error(
            f"AdamUpdater: the weight's shape {weight.shape} differs from the accumulators' "
            f"{m.shape}."
        )
    _check_scalars("AdamUpdater", tuple(rest_list))
    return [spec(m.shape, (m if weight is None else weight).dtype, m.meta_shape)]


def _updater(
    m: Any,
    v: Any,
    *rest: Any,
    mode: str,
    with_step: bool,
    with_weight: bool,
    tensor_args: tuple[str, ...],
    **floats: Any,
) -> Any:
    rest_list = list(rest)
    step = rest_list.pop(0) if with_step else None
    weight = rest_list.pop(0) if with_weight else None
    dt = _compute_dtype(m, v, *([weight] if weight is not None else []))
    p = _params(tuple(rest_list), tensor_args, floats, dt)
    m_dtype, round_m, round_v = m.dtype, _rounder(m.dtype), _rounder(v.dtype)
    m, v = m.astype(dt), v.astype(dt)
    if step is not None:
        step = step + jnp.ones((), step.dtype)  # incremented before use
        t = step.reshape(()).astype(dt)
        # As PopART's AdamUpdaterOpx: each bias correction in its moment's dtype.
        m = round_m(m / round_m(1 - p["beta1"] ** t))
        if mode != "adamax":
            v = round_v(v / round_v(1 - p["beta2"] ** t))
    denominator = v if mode == "adamax" else jnp.sqrt(v)
    updater = m / (denominator + p["epsilon"])
    if weight is not None and p["weight_decay"] is not None:
        updater = updater + p["weight_decay"] * weight.astype(dt)
    updater = updater.astype(m_dtype if weight is None else weight.dtype)
    return updater if step is None else (updater, step)


ADAM_UPDATER = define("adam_updater", "AdamUpdater", _updater_infer, _updater, grad="none")
# With a time step, the op also writes ``time_step + 1`` back into its input 2.
ADAM_UPDATER_STEP = define(
    "adam_updater_step", "AdamUpdater", _updater_infer, _updater, modifies=((2, 1),), grad="none"
)


def _record_updater(
    mode: str,
    acc_first_order: Tensor,
    acc_second_order: Tensor,
    weight: Tensor | None,
    time_step: Tensor | None,
    **factors: Any,
) -> Tensor:
    weight_decay = factors["weight_decay"]
    if not isinstance(weight_decay, Tensor) and float(weight_decay or 0.0) == 0.0:
        factors["weight_decay"] = None  # no decay term at all (not even 0 * weight)
    elif weight is None:
        raise ValueError(
            f"{mode}_updater: weight decay {weight_decay} needs the weight: pass weight=..."
        )
    tensors, attrs = _factors(**factors)
    attrs.update(mode=mode, with_step=time_step is not None, with_weight=weight is not None)
    inputs = {"acc_first_order": acc_first_order, "acc_second_order": acc_second_order}
    inputs |= {"time_step": time_step} if time_step is not None else {}
    inputs |= {"weight": weight} if weight is not None else {}
    opdef = ADAM_UPDATER_STEP if time_step is not None else ADAM_UPDATER
    return record(opdef, inputs | tensors, attrs, ["Updater"])[0]


UPDATER_DOC = """

    With ``time_step`` (bias correction) the accumulators are corrected as
    ``m̂ = m / (1 - beta1**t)`` and ``v̂ = v / (1 - beta2**t)``, where ``t`` is ``time_step``
    **after** it has been incremented in place by 1. Without it, ``m̂ = m`` and ``v̂ = v``.
    With ``weight_decay`` (needs ``weight``) the updater adds ``weight_decay * weight``
    (decoupled, AdamW style). The accumulators themselves are not changed.

    Args:
        acc_first_order: ``m``, the first-order moment.
        acc_second_order: ``v``, the second-order moment (same shape as ``m``).
        weight: the weight; only needed for weight decay.
        time_step: scalar step counter, incremented in place by 1 before use.
        weight_decay, beta1, beta2, epsilon: Python numbers or scalar tensors.

    Returns:
        The updater, shaped like ``m`` with the weight's dtype (``m``'s without a weight),
        named ``Updater``.

    Raises:
        ValueError: ``time_step`` without ``beta1`` and ``beta2``, or a non-zero weight
            decay without ``weight``.
"""


def _adam_like_updater(
    mode: str,
    m: Tensor,
    v: Tensor,
    weight: Tensor | None,
    time_step: Tensor | None,
    weight_decay: float | Tensor | None,
    beta1: float | Tensor | None,
    beta2: float | Tensor | None,
    epsilon: float | Tensor,
) -> Tensor:
    if time_step is not None and (beta1 is None or beta2 is None):
        raise ValueError(
            f"{mode}_updater: bias correction (time_step given) needs both beta1 and beta2."
        )
    factors = dict(weight_decay=weight_decay, beta1=beta1, beta2=beta2, epsilon=epsilon)
    return _record_updater(mode, m, v, weight, time_step, **factors)


def adam_updater(
    acc_first_order: Tensor,
    acc_second_order: Tensor,
    weight: Tensor | None = None,
    time_step: Tensor | None = None,
    weight_decay: float | Tensor | None = None,
    beta1: float | Tensor | None = None,
    beta2: float | Tensor | None = None,
    epsilon: float | Tensor = 1e-07,
) -> Tensor:
    """The Adam updater term ``m̂ / (sqrt(v̂) + epsilon) [+ weight_decay * weight]``."""
    return _adam_like_updater(
        "adam",
        acc_first_order,
        acc_second_order,
        weight,
        time_step,
        weight_decay,
        beta1,
        beta2,
        epsilon,
    )


def lamb_updater(
    acc_first_order: Tensor,
    acc_second_order: Tensor,
    weight: Tensor | None = None,
    time_step: Tensor | None = None,
    weight_decay: float | Tensor | None = None,
    beta1: float | Tensor | None = None,
    beta2: float | Tensor | None = None,
    epsilon: float | Tensor = 1e-07,
) -> Tensor:
    """The LAMB updater term: the same formula as ``adam_updater``.

    LAMB's trust ratio is applied afterwards, by ``adam_var_update`` with the squared norms
    of the weight and of this updater (``ops.lamb_square``)."""
    return _adam_like_updater(
        "lamb",
        acc_first_order,
        acc_second_order,
        weight,
        time_step,
        weight_decay,
        beta1,
        beta2,
        epsilon,
    )


def adamax_updater(
    acc_first_order: Tensor,
    acc_second_order: Tensor,
    weight: Tensor | None = None,
    time_step: Tensor | None = None,
    weight_decay: float | Tensor | None = None,
    beta1: float | Tensor = 0.9,
    epsilon: float | Tensor = 1e-07,
) -> Tensor:
    """The AdaMax updater term ``m̂ / (v + epsilon) [+ weight_decay * weight]``.

    ``v`` is the infinity-norm accumulator (not bias corrected); ``time_step`` is required
    and incremented in place by 1 before ``m̂ = m / (1 - beta1**t)`` is computed."""
    if time_step is None:
        raise ValueError("adamax_updater: time_step is required (AdaMax is bias corrected).")
    if beta1 is None:
        raise ValueError("adamax_updater: bias correction needs beta1.")
    factors = dict(weight_decay=weight_decay, beta1=beta1, beta2=None, epsilon=epsilon)
    return _record_updater(
        "adamax", acc_first_order, acc_second_order, weight, time_step, **factors
    )


adam_updater.__doc__ = (adam_updater.__doc__ or "") + UPDATER_DOC
lamb_updater.__doc__ = (lamb_updater.__doc__ or "") + UPDATER_DOC


# LAMB / Adam weight update -----------------------------------------------------------------


def _var_update_infer(t: Any, x: Any, r1: Any, r2: Any, *scalars: Any, **_: Any) -> list:
    _check_same_shape("AdamVarUpdate", t, x)
    _check_scalars("AdamVarUpdate", (r1, r2, *scalars))
    return [t]


def _adam_var_update(
    t: Any, x: Any, r1: Any, r2: Any, *scalars: Any, tensor_args: tuple[str, ...], **floats: Any
) -> Any:
    dt = _compute_dtype(t, x)
    p = _params(scalars, tensor_args, floats, dt)
    r1, r2 = r1.reshape(()).astype(dt), r2.reshape(()).astype(dt)
    mwn = jnp.asarray(p["max_weight_norm"], dt)
    ratio = jnp.minimum(jnp.sqrt(r1), mwn) / jnp.sqrt(r2)
    ratio = jnp.where((r1 == 0) | (r2 == 0) | (mwn == 0), jnp.ones((), dt), ratio)
    return (t.astype(dt) - p["learning_rate"] * ratio * x.astype(dt)).astype(t.dtype)


OPS["adam_var_update"] = define(
    "adam_var_update", "AdamVarUpdate", _var_update_infer, _adam_var_update, **INPLACE
)


def adam_var_update(
    t: Tensor,
    x: Tensor,
    r1: Tensor,
    r2: Tensor,
    learning_rate: float | Tensor | None = None,
    max_weight_norm: float | Tensor | None = None,
) -> Tensor:
    """The (LAMB) weight update ``t -= learning_rate * ratio * x``, **in place**.

    Although its name has no trailing underscore, this updates ``t`` in place (it is a
    variable-update op) and returns a handle on it. ``r1`` and ``r2`` are the *squared* L2
    norms of the weight and of the updater ``x`` (e.g. from ``ops.lamb_square``);
    ``ratio = min(sqrt(r1), max_weight_norm) / sqrt(r2)``, and 1 when ``r1``, ``r2`` or
    ``max_weight_norm`` is 0. With ``r1 = r2`` and a large ``max_weight_norm`` this is a
    plain Adam step.

    Args:
        t: the weight, updated in place.
        x: the updater (e.g. from ``lamb_updater``), same shape as ``t``.
        r1, r2: scalar squared norms (runtime tensors).
        learning_rate, max_weight_norm: Python numbers or scalar tensors. Both are required:
            upstream PopXL passes an uninitialised value when they are None, which makes the
            result unspecified, so this raises instead.

    Returns:
        A handle on the updated ``t`` (``adam_var_update_out``).

    Raises:
        ValueError: ``learning_rate`` or ``max_weight_norm`` is None.
    """
    for name, value in (("learning_rate", learning_rate), ("max_weight_norm", max_weight_norm)):
        if value is None:
            raise ValueError(
                f"adam_var_update: {name} is None. Pass a number or a scalar tensor; the "
                "original left the value uninitialised, so there is no meaningful default."
            )
    tensors, attrs = _factors(learning_rate=learning_rate, max_weight_norm=max_weight_norm)
    inputs = {"t": t, "x": x, "r1": r1, "r2": r2, **tensors}
    return record(OPS["adam_var_update"], inputs, attrs, ["adam_var_update_out"])[0]


__all__ = [
    "accumulate_",
    "accumulate_square_",
    "accumulate_mean_",
    "accumulate_moving_average_",
    "accumulate_moving_average_square_",
    "accumulator_scale_",
    "accumulator_zero_",
    "sparse_accumulate_",
    "copy_var_update_",
    "adam_updater",
    "lamb_updater",
    "adamax_updater",
    "adam_var_update",
]
