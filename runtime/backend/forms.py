"""Which backend's forms the lowering rules choose for convolutions, pools and fusions.

On XLA:CPU, convolutions run channels-last as matmuls over shifted slices, pools as
reshapes and maxima of strided slices, and a few values are computed once into their own
buffers (``runtime/conv_forms``, ``runtime/pool_forms``, ``runtime/xla_workarounds``):
each form was measured faster than XLA:CPU's own kernels. On other backends (a GPU, where
cuDNN serves convolutions) the rules keep XLA's own ops.

``forms_of("cpu")`` makes the rules traced inside it choose the CPU's forms on any backend,
so that one can be measured against the other on a GPU (``bench/conv_lowering.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

_CHOSEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("forms_of", default=None)


def cpu_forms() -> bool:
    """Whether the lowering rules traced now take the CPU's forms."""
    return (_CHOSEN.get() or jax.default_backend()) == "cpu"


@contextlib.contextmanager
def forms_of(backend: str) -> Iterator[None]:
    """Lower with the forms chosen for ``backend`` ("cpu", "gpu", ...) while inside."""
    token = _CHOSEN.set(backend)
    try:
        yield
    finally:
        _CHOSEN.reset(token)
