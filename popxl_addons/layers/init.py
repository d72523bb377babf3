"""Weight initialisers written with NumPy only (no SciPy dependency)."""

from __future__ import annotations

from typing import Any

import numpy as np


def truncated_normal(
    shape: int | tuple[int, ...], std: float = 0.02, rng: Any = np.random
) -> np.ndarray:
    """Samples of ``N(0, std**2)`` truncated to ``[-2 std, 2 std]``, as float64.

    The distribution of ``scipy.stats.truncnorm.rvs(-2, 2, loc=0, scale=std)``, drawn by
    rejection sampling from ``rng.standard_normal``: out-of-range draws are redrawn until
    none remain. The values (not the draws) therefore differ from SciPy's, but
    ``np.random.seed`` (or a seeded ``np.random.Generator`` passed as ``rng``) makes them
    reproducible.

    Args:
        shape: the output shape.
        std: the standard deviation of the untruncated normal (the ``scale``).
        rng: ``np.random`` (the global RNG) or a ``np.random.Generator``/``RandomState``.

    Returns:
        A float64 array of ``shape``.

    >>> import numpy as np
    >>> x = truncated_normal((1000,), std=0.5, rng=np.random.default_rng(0))
    >>> bool(np.all(np.abs(x) <= 1.0))
    True
    """
    samples = np.asarray(rng.standard_normal(shape), dtype=np.float64)
    flat = samples.reshape(-1)
    bad = np.flatnonzero(np.abs(flat) > 2.0)
    while bad.size:
        flat[bad] = rng.standard_normal(bad.size)
        bad = bad[np.abs(flat[bad]) > 2.0]
    return flat.reshape(samples.shape) * std


__all__ = ["truncated_normal"]
