"""Random ops: uniform and normal samples, dropout, and seed splitting.

Every random op takes a device seed (uint32, shape ``(2,)``) and is a pure function of it:
the seed's two words are the data of a ``jax.random`` threefry key. The same seed always
gives the same numbers, in a run, across runs and across sessions. The streams are not
bit-identical to the IPU's (which are hardware-specific); only their distribution and
scaling match.

Dropout is always active (there is no train/eval switch): elements are zeroed with
probability ``p`` and the kept ones scaled by ``1 / (1 - p)``. Its gradient is the vjp of
the same pure function of ``(t, seed)``, so the backward pass reuses the forward mask.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import dtypes
from .._op import core_error, define
from ..dtypes import dtype as DType
from ..tensor import Tensor, constant
from ._base import jax, jnp, record, spec
from .random_seed import check_seed, create_random_seed, key

# Sampling --------------------------------------------------------------------------------


def _sample_infer(seed: Any, *, shape: tuple[int, ...], dtype: DType, **_: Any) -> list:
    return [spec(shape, dtype)]


def _random_uniform(
    seed: Any, *, shape: tuple[int, ...], dtype: DType, low: float, high: float
) -> Any:
    return jax.random.uniform(key(seed), shape, dtype.as_numpy(), minval=low, maxval=high)


def _random_normal(
    seed: Any, *, shape: tuple[int, ...], dtype: DType, mean: float, std: float
) -> Any:
    sample = jax.random.normal(key(seed), shape, jnp.float32)
    return (mean + std * sample).astype(dtype.as_numpy())


RANDOM_UNIFORM = define(
    "random_uniform", "RandomUniform", _sample_infer, _random_uniform, grad="none"
)
RANDOM_NORMAL = define("random_normal", "RandomNormal", _sample_infer, _random_normal, grad="none")


def _sample_attrs(seed_tensor: Tensor, shape: Iterable[int], dtype: DType) -> dict[str, Any]:
    check_seed(seed_tensor, "seed_tensor")
    if dtype not in (dtypes.float16, dtypes.float32):
        raise ValueError(f"Random samples must be float16 or float32, got dtype {dtype}.")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"Invalid shape {dims} for random samples: dimensions must be >= 0.")
    return {"shape": dims, "dtype": dtype}


def random_uniform(
    seed_tensor: Tensor,
    shape: Iterable[int],
    low: float = 0.0,
    high: float = 1.0,
    dtype: DType = dtypes.float32,
) -> Tensor:
    """Samples from the uniform distribution on ``[low, high)``.

    Args:
        seed_tensor: the device seed, uint32 of shape ``(2,)``; equal seeds give equal samples.
        shape: shape of the output.
        low, high: the interval.
        dtype: ``float32`` (default) or ``float16``.

    Returns:
        A new tensor of ``shape`` and ``dtype`` (``random_uniform_out``).

    Raises:
        ValueError: a bad seed, dtype or shape.
    """
    attrs = _sample_attrs(seed_tensor, shape, dtype) | {"low": float(low), "high": float(high)}
    return record(RANDOM_UNIFORM, {"seed_tensor": seed_tensor}, attrs, ["random_uniform_out"])[0]


def random_normal(
    seed_tensor: Tensor,
    shape: Iterable[int],
    mean: float = 0.0,
    std: float = 1.0,
    dtype: DType = dtypes.float32,
) -> Tensor:
    """Samples from the normal distribution ``N(mean, std**2)``.

    Args:
        seed_tensor: the device seed, uint32 of shape ``(2,)``; equal seeds give equal samples.
        shape: shape of the output.
        mean, std: the distribution's mean and standard deviation.
        dtype: ``float32`` (default) or ``float16`` (sampled in float32, then cast).

    Returns:
        A new tensor of ``shape`` and ``dtype`` (``random_normal_out``).

    Raises:
        ValueError: a bad seed, dtype or shape.
    """
    attrs = _sample_attrs(seed_tensor, shape, dtype) | {"mean": float(mean), "std": float(std)}
    return record(RANDOM_NORMAL, {"seed_tensor": seed_tensor}, attrs, ["random_normal_out"])[0]


# Dropout ---------------------------------------------------------------------------------


def _dropout_infer(t: Any, seed: Any, **_: Any) -> list:
    return [t]


def _masked(t: Any, keep: Any, ratio: float) -> Any:
    scale = jnp.asarray(1.0 / (1.0 - ratio), t.dtype)
    return jnp.where(keep, t * scale, jnp.zeros_like(t))


def _dropout(t: Any, seed: Any, *, ratio: float) -> Any:
    keep = jax.random.bernoulli(key(seed), 1.0 - ratio, t.shape)
    return _masked(t, keep, ratio)


def _shaped_dropout(t: Any, seed: Any, *, ratio: float, shape: tuple[int, ...]) -> Any:
    keep = jax.random.bernoulli(key(seed), 1.0 - ratio, shape)
    return _masked(t, keep, ratio)


DROPOUT = define("dropout", "Dropout", _dropout_infer, _dropout, nondiff_inputs=(1,))
SHAPED_DROPOUT = define(
    "shaped_dropout", "ShapedDropout", _dropout_infer, _shaped_dropout, nondiff_inputs=(1,)
)


def _check_ratio(ratio: float, what: str) -> float:
    ratio = float(ratio)
    if not 0.0 <= ratio < 1.0:
        raise core_error(
            f"Dropout {what} {ratio} is not valid: use a probability in the interval [0, 1)."
        )
    return ratio


def dropout(t: Tensor, seed_tensor: Tensor, p: float) -> Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by
    ``1 / (1 - p)``.

    Always active: there is no train/eval switch, call it only where dropout is wanted.
    The mask is a pure function of the seed, so the gradient reuses the forward mask.

    Args:
        t: the input tensor (float).
        seed_tensor: the device seed, uint32 of shape ``(2,)``.
        p: the probability of dropping an element, in ``[0, 1)``.

    Returns:
        A new tensor like ``t`` (``dropout_out``).

    Raises:
        ValueError: a bad seed.
        PopXLException: ``p`` outside ``[0, 1)``.

    See also: ``torch.nn.functional.dropout``.
    """
    check_seed(seed_tensor, "seed_tensor")
    attrs = {"ratio": _check_ratio(p, "probability p")}
    return record(DROPOUT, {"t": t, "seed_tensor": seed_tensor}, attrs, ["dropout_out"])[0]


def shaped_dropout(t: Tensor, seed_tensor: Tensor, shape: Iterable[int], ratio: float) -> Tensor:
    """Dropout with a mask of ``shape`` broadcast (NumPy rules) over ``t``.

    E.g. a mask of shape ``(n, 1)`` on a ``(n, m)`` tensor drops whole rows. Kept elements
    are scaled by ``1 / (1 - ratio)``; always active.

    Args:
        t: the input tensor (float).
        seed_tensor: the device seed, uint32 of shape ``(2,)``.
        shape: the mask's shape; it must broadcast to ``t.shape``.
        ratio: the probability of dropping a mask element, in ``[0, 1)``.

    Returns:
        A new tensor like ``t`` (``shapeddropout_out``).

    Raises:
        ValueError: a bad seed.
        PopXLException: ``ratio`` outside ``[0, 1)``, or ``shape`` does not broadcast to ``t``.
    """
    check_seed(seed_tensor, "seed_tensor")
    dims = tuple(int(d) for d in shape)
    if isinstance(t, Tensor) and not _broadcasts_to(dims, t.shape):
        raise core_error(
            f"ShapedDropout: the mask shape {dims} does not broadcast to the input shape "
            f"{t.shape}. Use a shape whose dimensions equal the input's or are 1."
        )
    attrs = {"ratio": _check_ratio(ratio, "ratio"), "shape": dims}
    return record(
        SHAPED_DROPOUT, {"t": t, "seed_tensor": seed_tensor}, attrs, ["shapeddropout_out"]
    )[0]


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(shape, target)) == target
    except ValueError:
        return False


# Seeds -----------------------------------------------------------------------------------


def split_random_seed(seed: Tensor, n: int = 2) -> tuple[Tensor, ...]:
    """``n`` independent seeds derived from ``seed``.

    Seed ``i`` is ``create_random_seed(seed, constant(i, uint32))``: deterministic, and
    distinct for each ``i``. Use one per random op so their streams are independent.

    Args:
        seed: a uint32 tensor of shape ``(2,)``.
        n: how many seeds to make.

    Returns:
        A tuple of ``n`` seeds (``modified_seed``), each uint32 of shape ``(2,)``.

    Raises:
        ValueError: ``seed`` is not uint32 of shape ``(2,)``.
    """
    check_seed(seed)
    return tuple(create_random_seed(seed, constant(i, dtypes.uint32)) for i in range(n))
