"""``InputStreams`` / ``OutputStreams``: named collections of host streams."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import popxl

from .utils import OrderedDict


class _Streams(OrderedDict):
    _make: Any = None

    def __init__(self, **streams: tuple[tuple[int, ...], popxl.dtype]) -> None:
        super().__init__()
        for name, (shape, dtype) in streams.items():
            self[name] = type(self)._make(shape, dtype, name)

    @classmethod
    def from_streams(cls, streams: Iterable[Any]) -> _Streams:
        """A collection keyed by each stream's ``tensor_id``."""
        new = cls()
        for s in streams:
            OrderedDict.__setitem__(new, s.tensor_id, s)
        return new

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return OrderedDict.__getitem__(self, key)
        except KeyError:
            raise AttributeError(
                f"No stream '{key}'. Available keys: {list(self.keys())}"
            ) from None

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            return self.idx(key)
        if isinstance(key, slice):
            return list(self.values())[key]
        try:
            return OrderedDict.__getitem__(self, key)
        except KeyError:
            raise KeyError(f"No stream '{key}'. Available keys: {list(self.keys())}") from None

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.values()))


class InputStreams(_Streams):
    """Host-to-device streams by name: ``InputStreams(x=((8, 28, 28), popxl.float32))``."""

    _make = staticmethod(popxl.h2d_stream)


class OutputStreams(_Streams):
    """Device-to-host streams by name: ``OutputStreams(loss=((), popxl.float32))``."""

    _make = staticmethod(popxl.d2h_stream)


__all__ = ["InputStreams", "OutputStreams"]
