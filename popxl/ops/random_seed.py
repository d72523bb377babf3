"""Device random seeds: ``create_random_seed`` derives a new seed from a seed and a modifier.

A device seed is a uint32 tensor of shape ``(2,)``: the two words of a threefry key. The
random ops turn it into a ``jax.random`` key, so a seed fully determines their streams.
"""

from __future__ import annotations

from typing import Any

from .. import dtypes
from .._op import core_error, define
from ..tensor import Tensor
from ._base import jax, record

SEED_MSG = (
    "Seed tensor `{name}` must be a uint32 tensor of shape (2,), got {dtype} with shape "
    "{shape}. Create one with popxl.create_seeds / an h2d_stream((2,), popxl.uint32), or "
    "derive one with ops.split_random_seed."
)


def check_seed(t: Tensor, name: str = "seed") -> None:
    """Raise ``ValueError`` unless ``t`` is a device seed (uint32, shape ``(2,)``)."""
    if isinstance(t, Tensor) and (t.dtype is not dtypes.uint32 or t.shape != (2,)):
        raise ValueError(SEED_MSG.format(name=name, dtype=t.dtype.name, shape=t.shape))


def key(seed: Any) -> Any:
    """The ``jax.random`` key whose data is the two uint32 words of ``seed``."""
    return jax.random.wrap_key_data(seed.astype("uint32"), impl="threefry2x32")


def _modify_infer(seed: Any, modifier: Any) -> list:
    if modifier.dtype is not dtypes.uint32 or modifier.shape not in ((), (1,)):
        raise core_error(
            f"ModifyRandomSeed: the modifier must be a uint32 scalar, got {modifier.dtype.name} "
            f"with shape {modifier.shape}. Use popxl.constant(i, popxl.uint32)."
        )
    return [seed]


def _modify_random_seed(seed: Any, modifier: Any) -> Any:
    new_key = jax.random.fold_in(key(seed), modifier.reshape(()))
    return jax.random.key_data(new_key)


MODIFY_RANDOM_SEED = define(
    "create_random_seed", "ModifyRandomSeed", _modify_infer, _modify_random_seed, grad="none"
)


def create_random_seed(seed: Tensor, modifier: Tensor) -> Tensor:
    """A new seed derived from ``seed`` and a uint32 scalar ``modifier``.

    Distinct modifiers give independent streams (the key is ``jax.random.fold_in``-ed with
    the modifier); the same seed and modifier always give the same new seed.

    Args:
        seed: a uint32 tensor of shape ``(2,)``.
        modifier: a uint32 scalar tensor.

    Returns:
        The modified seed, uint32 of shape ``(2,)``, named ``modified_seed``.

    Raises:
        ValueError: ``seed`` is not uint32 of shape ``(2,)``.
        PopXLException: ``modifier`` is not a uint32 scalar.
    """
    check_seed(seed)
    return record(MODIFY_RANDOM_SEED, {"seed": seed, "modifier": modifier}, {}, ["modified_seed"])[
        0
    ]
