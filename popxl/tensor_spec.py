"""``TensorSpec``: the shape, dtype and meta-shape of a tensor, without a tensor."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .dtypes import dtype as DType


class TensorSpec(Mapping):
    """Shape and dtype of a tensor (and, for replica-sharded tensors, its full shape).

    A ``Mapping`` with keys ``shape``, ``dtype`` and ``meta_shape``, so
    ``popxl.graph_input(**spec, name="w")`` works.

    >>> import popxl
    >>> popxl.TensorSpec((1, 2), popxl.int32)
    TensorSpec(shape=(1, 2), dtype=popxl.dtypes.int32, meta_shape=())
    """

    __slots__ = ("shape", "dtype", "meta_shape")

    def __init__(self, shape: tuple[int, ...], dtype: DType, meta_shape: tuple[int, ...] = ()):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.meta_shape = tuple(int(d) for d in meta_shape)

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "dtype": self.dtype, "meta_shape": self.meta_shape}

    def to_tuple(self) -> tuple[tuple[int, ...], DType, tuple[int, ...]]:
        return (self.shape, self.dtype, self.meta_shape)

    def __getitem__(self, key: str) -> Any:
        if key not in TensorSpec.__slots__:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(TensorSpec.__slots__)

    def __len__(self) -> int:
        return 3

    def __hash__(self) -> int:
        return hash(self.to_tuple())

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype!r}, meta_shape={self.meta_shape})"


__all__ = ["TensorSpec"]
