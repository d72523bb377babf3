"""Small helpers: timing, an indexable OrderedDict, validated weight dicts."""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import time
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import numpy as np

import popxl

logger = logging.getLogger("popxl_addons")


@contextlib.contextmanager
def timer(title: str | None = None, log_to_wandb: bool = True) -> Iterator[None]:
    """Log how long the block took (in minutes) at INFO level."""
    start = time.perf_counter()
    yield
    minutes = (time.perf_counter() - start) / 60
    logger.info("%s: %.3f mins", title or "Duration", minutes)


class OrderedDict(collections.OrderedDict):
    """``collections.OrderedDict`` with ``idx(i)``: the i-th value."""

    def idx(self, i: int) -> Any:
        return list(self.values())[i]


class WeightsDict(MutableMapping):
    """``{Variable: host array}`` that checks each array's dtype and host shape on insert."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._data: dict[popxl.Variable, np.ndarray] = {}
        self.update(dict(*args, **kwargs))

    def __setitem__(self, key: popxl.Variable, value: np.ndarray) -> None:
        value = popxl.utils.to_numpy(value, downcast=False, copy=False)
        if value.dtype != key.dtype.as_numpy():
            raise ValueError(
                f"{key.id}: dtype {value.dtype} does not match the variable's {key.dtype}."
            )
        if value.shape != key.shape_on_host:
            raise ValueError(
                f"{key.id}: shape {value.shape} does not match the variable's host shape {key.shape_on_host}."
            )
        self._data[key] = value

    def __getitem__(self, key: popxl.Variable) -> np.ndarray:
        return self._data[key]

    def __delitem__(self, key: popxl.Variable) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[popxl.Variable]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def overrides(cls: type, base: type, method: str) -> bool:
    """Whether ``cls`` overrides ``base.method``."""
    return getattr(cls, method) is not getattr(base, method)


def duplicate_items(items: Iterable[Any]) -> list[Any]:
    """Items that occur more than once, in first-seen order."""
    seen: dict[Any, int] = {}
    for item in items:
        seen[item] = seen.get(item, 0) + 1
    return [item for item, n in seen.items() if n > 1]


def suffix_graph_name(name: str, suffix: str) -> str:
    """``Foo_subgraph(3)`` + ``bwd`` → ``Foo_bwd``."""
    return re.sub(r"_subgraph\(\d+\)$", "", name) + f"_{suffix}"


def null_context() -> contextlib.nullcontext:
    return contextlib.nullcontext()


__all__ = ["timer", "OrderedDict", "WeightsDict"]
