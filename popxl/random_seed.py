"""Random seeds: ``create_seeds`` and 64-bit ↔ two-uint32 helpers."""

from __future__ import annotations

import numpy as np

MAX_UINT64 = 2**64 - 1


def uint64_to_two_uint32(num: int) -> tuple[int, int]:
    """Split a 64-bit unsigned integer into ``(high, low)`` 32-bit halves."""
    if not 0 <= num <= MAX_UINT64:
        raise ValueError(f"{num} is not a valid uint64 (0 <= num <= {MAX_UINT64}).")
    return num >> 32, num & 0xFFFFFFFF


def two_uint32_to_uint64(a: int, b: int) -> int:
    """Join ``(high, low)`` 32-bit halves into one 64-bit integer."""
    for v in (a, b):
        if not 0 <= v <= 0xFFFFFFFF:
            raise ValueError(f"{v} is not a valid uint32.")
    return (a << 32) | b


def create_seeds(
    seed: int,
    offset: int = 0,
    batches_per_step: int = 1,
    gradient_accumulation_factor: int = 1,
    replicas: int = 1,
) -> np.ndarray:
    """Deterministic device seeds: uint32 pairs of shape ``(bps, gaf, replicas, 2)`` with
    size-1 dimensions squeezed (``(2,)`` by default).

    >>> create_seeds(0).shape, create_seeds(0, replicas=4).shape
    ((2,), (4, 2))
    """
    rng = np.random.default_rng(seed + offset)
    n = batches_per_step * gradient_accumulation_factor * replicas
    values = rng.integers(0, MAX_UINT64, size=n, dtype=np.uint64, endpoint=True)
    pairs = np.stack([values >> np.uint64(32), values & np.uint64(0xFFFFFFFF)], axis=-1)
    shape = (batches_per_step, gradient_accumulation_factor, replicas, 2)
    dims = tuple(d for d in shape[:-1] if d != 1) + (2,)
    return pairs.astype(np.uint32).reshape(dims)


__all__ = ["create_seeds", "uint64_to_two_uint32", "two_uint32_to_uint64", "MAX_UINT64"]
