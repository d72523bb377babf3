"""Random sampling with PopTorch's seed semantics: rand/randn/randint and their ``_like``
forms, normal, uniform, bernoulli, exponential, multinomial, randperm and dropout.

Every random op draws from its own seed (``ctx.seed()``), split off the model's seed
variable, which ``Options.randomSeed`` sets: the same seed gives the same numbers run after
run, and each call of the model moves the seed on. The streams are ``jax.random``'s, not
torch's CPU generator's (nor the IPU's): only their distributions match, which is what
PopTorch promised. ``torch.manual_seed`` inside ``forward`` has no effect on them.

Dropout is active only in a training model (``trainingModel``) on a module in training mode,
as in PopTorch, where an inference session's dropout is the identity.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from torch.ops import aten

import popxl
from popxl import ops
from popxl.ops.random_seed import key

from .registry import NodeContext, lowering

_FLOATS = (popxl.float16, popxl.float32)


def _sample_dtype(ctx: NodeContext) -> popxl.dtype:
    """The dtype to sample in: the output's when it is a float, else float32."""
    return ctx.out_dtype if ctx.out_dtype in _FLOATS else popxl.float32


def _uniform(ctx: NodeContext, low: float = 0.0, high: float = 1.0) -> popxl.Tensor:
    sample = ops.random_uniform(ctx.seed(), ctx.out_shape, low, high, _sample_dtype(ctx))
    return ctx.tensor(sample, ctx.out_dtype)


def _normal(ctx: NodeContext, mean: float = 0.0, std: float = 1.0) -> popxl.Tensor:
    sample = ops.random_normal(ctx.seed(), ctx.out_shape, mean, std, _sample_dtype(ctx))
    return ctx.tensor(sample, ctx.out_dtype)


# Uniform and normal samples ------------------------------------------------------------------


@lowering(aten.rand.default, aten.rand_like.default)
def _lower_rand(ctx: NodeContext, *args: Any, **kw: Any) -> popxl.Tensor:
    return _uniform(ctx)


@lowering(aten.uniform.default)
def _lower_uniform(
    ctx: NodeContext, x: popxl.Tensor, low: float = 0.0, high: float = 1.0, **kw: Any
) -> popxl.Tensor:
    return _uniform(ctx, float(low), float(high))


@lowering(aten.randn.default, aten.randn_like.default)
def _lower_randn(ctx: NodeContext, *args: Any, **kw: Any) -> popxl.Tensor:
    return _normal(ctx)


@lowering(aten.normal.float_float)
def _lower_normal_float_float(
    ctx: NodeContext, mean: float, std: float, size: Any, **kw: Any
) -> popxl.Tensor:
    return _normal(ctx, float(mean), float(std))


@lowering(aten.normal_functional.default)
def _lower_normal_functional(
    ctx: NodeContext, x: popxl.Tensor, mean: float = 0.0, std: float = 1.0, **kw: Any
) -> popxl.Tensor:
    return _normal(ctx, float(mean), float(std))


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def _lower_normal_tensors(ctx: NodeContext, mean: Any, std: Any = 1.0, **kw: Any) -> Any:
    """``mean + std * N(0, 1)``, with ``mean`` and ``std`` broadcast to the output."""
    dtype = ctx.out_dtype
    sample = _normal(ctx)
    return ops.add(ctx.tensor(mean, dtype), ops.mul(ctx.tensor(std, dtype), sample))


# Integers ------------------------------------------------------------------------------------


def _randint(seed: Any, *, shape: tuple[int, ...], low: int, high: int, dtype: str) -> Any:
    sample = jax.random.randint(key(seed), shape, low, high, jnp.int32)
    return sample.astype(popxl.dtypes.dtype.from_name(dtype).as_numpy())


def _int_bounds(args: tuple) -> tuple[int, int]:
    """(low, high) of a randint node: its leading ints are ``(high,)`` or ``(low, high)``
    (the size, a list, follows them)."""
    ints = [int(a) for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    return (0, ints[0]) if len(ints) == 1 else (ints[0], ints[1])


def _randint_record(ctx: NodeContext, low: int, high: int) -> popxl.Tensor:
    if not -(2**31) <= low < high <= 2**31:
        raise ValueError(
            f"randint: the range [{low}, {high}) is empty or not in int32 (PopTorch runs int64 "
            "as int32). Use low < high within int32."
        )
    return ctx.jax(
        "randint",
        _randint,
        ctx.seed(),
        nondiff=(0,),
        shape=ctx.out_shape,
        low=low,
        high=high,
        dtype=ctx.out_dtype.name,
    )


@lowering(aten.randint.default, aten.randint.low)
def _lower_randint(ctx: NodeContext, *args: Any, **kw: Any) -> popxl.Tensor:
    return _randint_record(ctx, *_int_bounds(args))


@lowering(aten.randint_like.default, aten.randint_like.low_dtype)
def _lower_randint_like(ctx: NodeContext, x: popxl.Tensor, *args: Any, **kw: Any) -> Any:
    return _randint_record(ctx, *_int_bounds(args))


def _randperm(seed: Any, *, n: int, dtype: str) -> Any:
    perm = jax.random.permutation(key(seed), n)
    return perm.astype(popxl.dtypes.dtype.from_name(dtype).as_numpy())


@lowering(aten.randperm.default)
def _lower_randperm(ctx: NodeContext, n: int, **kw: Any) -> popxl.Tensor:
    return ctx.jax(
        "randperm", _randperm, ctx.seed(), nondiff=(0,), n=int(n), dtype=ctx.out_dtype.name
    )


# Bernoulli, exponential, multinomial ---------------------------------------------------------


@lowering(aten.bernoulli.p)
def _lower_bernoulli_p(ctx: NodeContext, x: popxl.Tensor, p: float = 0.5, **kw: Any) -> Any:
    """1 with probability ``p``, else 0, in ``x``'s shape and dtype."""
    u = ops.random_uniform(ctx.seed(), ctx.out_shape, 0.0, 1.0, popxl.float32)
    return ctx.tensor(ops.greater(ctx.constant(float(p), popxl.float32), u), ctx.out_dtype)


def _exponential(seed: Any, *, shape: tuple[int, ...], rate: float, dtype: str) -> Any:
    sample = jax.random.exponential(key(seed), shape, jnp.float32) / rate
    return sample.astype(popxl.dtypes.dtype.from_name(dtype).as_numpy())


@lowering(aten.exponential.default)
def _lower_exponential(ctx: NodeContext, x: popxl.Tensor, lambd: float = 1.0, **kw: Any) -> Any:
    if not lambd > 0:
        raise ValueError(f"exponential_: lambd must be positive, got {lambd}.")
    return ctx.jax(
        "exponential",
        _exponential,
        ctx.seed(),
        nondiff=(0,),
        shape=ctx.out_shape,
        rate=float(lambd),
        dtype=ctx.out_dtype.name,
    )


def _multinomial(weights: Any, seed: Any, *, num_samples: int, replacement: bool) -> Any:
    """Category indices drawn in proportion to ``weights`` (rows are distributions): with
    replacement, independent categorical draws; without, the top ``num_samples`` of
    Gumbel-perturbed log-weights (sampling without replacement)."""
    logits = jnp.log(weights.astype(jnp.float32))
    batch = logits.shape[:-1]
    if replacement:
        draws = jax.random.categorical(key(seed), logits, shape=(num_samples, *batch))
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int32)
    gumbel = jax.random.gumbel(key(seed), logits.shape, jnp.float32)
    return jax.lax.top_k(logits + gumbel, num_samples)[1].astype(jnp.int32)


@lowering(aten.multinomial.default)
def _lower_multinomial(
    ctx: NodeContext, x: popxl.Tensor, num_samples: int, replacement: bool = False, **kw: Any
) -> popxl.Tensor:
    return ctx.jax(
        "multinomial",
        _multinomial,
        x,
        ctx.seed(),
        nondiff=(0, 1),
        num_samples=int(num_samples),
        replacement=bool(replacement),
    )


# Dropout -------------------------------------------------------------------------------------


def _native_dropout(x: Any, seed: Any, *, p: float) -> Any:
    keep = jax.random.bernoulli(key(seed), 1.0 - p, x.shape)
    scaled = x * jnp.asarray(1.0 / (1.0 - p), x.dtype)
    return jnp.where(keep, scaled, jnp.zeros_like(x)), keep


@lowering(aten.native_dropout.default)
def _lower_native_dropout(ctx: NodeContext, x: popxl.Tensor, p: float, train: Any) -> Any:
    """(output, keep mask). The identity (with an all-true mask) outside training, or for
    ``p == 0``; the input times zero for ``p == 1``."""
    p = float(p)
    if not (train and ctx.training) or p == 0.0:
        return ops.identity(x), ctx.constant(np.ones(x.shape, bool), popxl.bool)
    if p >= 1.0:
        # As torch: the input times zero, so the output still depends on the input (its
        # gradient is zero, not absent, and an infinity gives NaN).
        zero = ctx.constant(np.zeros((), np.float32), x.dtype)
        return ops.mul(x, zero), ctx.constant(np.zeros(x.shape, bool), popxl.bool)
    return ctx.jax("native_dropout", _native_dropout, x, ctx.seed(), nondiff=(1,), p=p)
