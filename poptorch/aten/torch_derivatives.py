"""JAX functions with torch's derivatives where JAX's own differ.

They differ only at special points: zero (``abs``, whose derivative is ``sign``), the origin (``atan2``, ``hypot``), a zero base or exponent
(``pow``), a zero ``x`` (``xlogy``, ``xlog1py``, ``entr``, ``copysign``), the ends of
``logit``'s domain, ties (``fmax``, ``fmin``). Each function's value is
torch's (``xlogy`` of a NaN ``y`` is NaN, as torch's; JAX's is 0 where ``x`` is 0) and its
derivative is the formula of torch's autograd (``derivatives.yaml``), so a model that meets
one of these points trains as it does in eager torch. The random-program campaign found the
first (``atan2(0, 0)``: JAX's derivative is NaN, torch's 0).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from popxl.ops.elementwise import jax_abs as abs  # noqa: A004, F401 (derivative sign(x))


def _safe_reciprocal(x: Any) -> Any:
    """``1 / x``, 0 where ``x`` is 0 (and its own derivative finite there)."""
    zero = x == 0
    return jnp.where(zero, 0, 1 / jnp.where(zero, 1, x))


@jax.custom_jvp
def atan2(y: Any, x: Any) -> Any:
    return jnp.arctan2(y, x)


@atan2.defjvp
def _atan2_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    # (x dy - y dx) / (x^2 + y^2), the reciprocal 0 at the origin (JAX's: 0/0).
    (y, x), (dy, dx) = primals, tangents
    recip = _safe_reciprocal(x * x + y * y)
    return jnp.arctan2(y, x), dy * (x * recip) - dx * (y * recip)


@jax.custom_jvp
def hypot(x: Any, y: Any) -> Any:
    return jnp.hypot(x, y)


@hypot.defjvp
def _hypot_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    # (x dx + y dy) / hypot(x, y): NaN at the origin, as torch's (JAX's is 1/2 there).
    (x, y), (dx, dy) = primals, tangents
    h = jnp.hypot(x, y)
    return h, dx * (x / h) + dy * (y / h)


@jax.custom_jvp
def power(x: Any, y: Any) -> Any:
    return jnp.power(x, y)


@power.defjvp
def _power_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    # Base: y x^(y-1), 0 where y is 0 (JAX's: 0 * 0^-1, NaN at x = 0). Exponent: x^y log x,
    # 0 where x is 0 and y >= 0.
    (x, y), (dx, dy) = primals, tangents
    out = jnp.power(x, y)
    d_base = jnp.where(y == 0, 0, y * jnp.power(x, y - 1))
    no_log = (x == 0) & (y >= 0)
    d_exponent = jnp.where(no_log, 0, out * jnp.log(jnp.where(no_log, 1, x)))
    return out, dx * d_base + dy * d_exponent


def _ordered_pick(x: Any, y: Any, dx: Any, dy: Any, x_wins: Any, y_wins: Any) -> Any:
    # torch's rule for maximum-like ops: the winner's derivative, half each at a tie, and
    # both in full when the two are unordered (a NaN).
    tie = x == y
    unordered = ~(x_wins | y_wins | tie)
    return jnp.where(
        tie,
        (dx + dy) / 2,
        jnp.where(x_wins, dx, jnp.where(y_wins, dy, jnp.where(unordered, dx + dy, 0))),
    )


def _picking(forward: Any, wins: Any) -> Any:
    """``forward(x, y)`` (a maximum- or minimum-like op) with torch's derivative:
    ``wins(a, b)`` tells where ``a``'s value is taken over ``b``'s."""

    @jax.custom_jvp
    def op(x: Any, y: Any) -> Any:
        return forward(x, y)

    @op.defjvp
    def _jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
        (x, y), (dx, dy) = primals, tangents
        return forward(x, y), _ordered_pick(x, y, dx, dy, wins(x, y), wins(y, x))

    return op


# torch.maximum and torch.minimum: a NaN wins the value, and torch gives both sides the
# whole gradient there (JAX's rule splits it); fmax and fmin: the number wins.
maximum = _picking(jnp.maximum, jnp.greater)
minimum = _picking(jnp.minimum, jnp.less)
fmax = _picking(jnp.fmax, jnp.greater)
fmin = _picking(jnp.fmin, jnp.less)


@jax.custom_jvp
def copysign(x: Any, y: Any) -> Any:
    return jnp.copysign(x, y)


@copysign.defjvp
def _copysign_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    # x: copysign(x, y) / x, 0 where x is 0 (JAX's: the sign's ratio, -1 there); y: none.
    (x, y), (dx, _) = primals, tangents
    out = jnp.copysign(x, y)
    zero = x == 0
    return out, dx * jnp.where(zero, 0, out / jnp.where(zero, 1, x))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def logit(x: Any, eps: float | None) -> Any:
    z = x if eps is None else jnp.clip(x, eps, 1 - eps)
    return jnp.log(z / (1 - z))


@logit.defjvp
def _logit_jvp(eps: float | None, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    # 1 / (x (1 - x)): infinite at 0 and 1 without eps (JAX's: NaN), 0 outside [eps, 1 - eps].
    (x,), (dx,) = primals, tangents
    slope = 1 / (x * (1 - x))
    if eps is not None:
        slope = jnp.where((x < eps) | (x > 1 - eps), 0, slope)
    return logit(x, eps), dx * slope


def _x_times_log(log: Callable[[Any], Any], shift: int) -> Any:
    """``x * log(y)`` (``log`` is ``log`` with ``shift`` 0, ``log1p`` with 1) as torch has it.

    Its value is 0 where ``x`` is 0 and NaN where ``y`` is; its derivative in ``x`` is
    ``log(y)``, 0 where ``x`` is 0 and ``y`` is at or below the domain's end ``-shift``
    (JAX's: ``0 * log 0`` = NaN), and in ``y`` it is ``x / (y + shift)``.
    """
    neutral = 1 - shift  # log(neutral) == 0

    def value(x: Any, y: Any) -> Any:
        safe_y = jnp.where(x == 0, neutral, y)
        return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0, x * log(safe_y)))

    @jax.custom_jvp
    def x_times_log(x: Any, y: Any) -> Any:
        return value(x, y)

    @x_times_log.defjvp
    def _jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
        (x, y), (dx, dy) = primals, tangents
        masked = (x == 0) & (y <= -shift)
        d_x = jnp.where(masked, 0, log(jnp.where(masked, neutral, y)))
        return value(x, y), dx * d_x + dy * (x / (y + shift))

    return x_times_log


xlogy = _x_times_log(jnp.log, 0)
xlog1py = _x_times_log(jnp.log1p, 1)


def _entr_value(x: Any) -> Any:
    safe = jnp.where(x > 0, x, 1)
    inner = jnp.where(x == 0, 0, -jnp.inf).astype(x.dtype)
    return jnp.where(jnp.isnan(x), x, jnp.where(x > 0, -safe * jnp.log(safe), inner))


@jax.custom_jvp
def entr(x: Any) -> Any:
    return _entr_value(x)


@entr.defjvp
def _entr_jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    # -(1 + log x): +inf at 0 and NaN below, as torch's (its decomposition's: 0 * inf = NaN).
    (x,), (dx,) = primals, tangents
    return _entr_value(x), dx * -(1 + jnp.log(x))


def sinc(x: Any) -> Any:
    """``sin(pi x) / (pi x)``, 1 at 0, with derivative 0 there as torch's (``jnp.sinc``
    has it; torch's decomposition to ``where`` and ``sin`` would give 0 * NaN)."""
    return jnp.sinc(x)


@functools.cache
def clamp_ties_pass_through() -> bool:
    """Whether the installed torch's ``clamp`` passes the gradient at a value equal to a
    number bound through to the input (older releases) or gives it to nothing (newer)."""
    import torch  # noqa: PLC0415 (poptorch's front end; only reached while capturing)

    x = torch.zeros(1, requires_grad=True)
    torch.clamp(x, 0.0, 1.0).sum().backward()
    return x.grad is not None and bool(x.grad[0] == 1.0)


def clamp_min0(v: Any) -> Any:
    """``max(v, 0)`` as torch's ``clamp_min(v, 0)`` in composite losses (margin ranking,
    hinge and cosine embedding, triplet): NaN stays NaN, and the derivative at 0 follows
    ``clamp_ties_pass_through`` (``jnp.maximum`` would split it in halves)."""
    if clamp_ties_pass_through():
        return jnp.where(v < 0, 0, v)
    return jnp.where(v <= 0, 0, v)


def hinge(v: Any) -> Any:
    """``max(v, 0)`` with derivative 0 at 0, the rule of torch's native margin losses."""
    return jnp.where(v <= 0, 0, v)
