"""Variable factories: recipes that create variables in the main graph later.

A module declares its state inside a subgraph with ``add_variable_input``: that creates a
graph input and a ``VariableFactory``. Calling ``init()`` on the factories in the main graph
creates the variables, which are then bound to the graph inputs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import numpy as np

import popxl
from popxl import ops

from .dot_tree import DotTree
from .named_replica_grouping import NamedReplicaGrouping
from .named_tensors import NamedTensors

CALLABLE_FAILED_MSG = "Passed callable via data_iter throws error."
NOT_DATA_MSG = (
    "data_iter must be a zero-argument callable returning arrays, or an iterable of arrays; "
    "got {value!r}."
)
NO_SHAPE_MSG = (
    "The data produced by data_iter must be an array with a .shape (e.g. np.zeros(()) rather "
    "than 0.0); got {value!r}."
)


class _Peekable:
    """An iterator whose next value can be looked at without consuming it."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._it = iterator
        self._peeked: list[Any] = []

    def peek(self) -> Any:
        if not self._peeked:
            self._peeked.append(next(self._it))
        return self._peeked[0]

    def __next__(self) -> Any:
        return self._peeked.pop() if self._peeked else next(self._it)

    def __iter__(self) -> _Peekable:
        return self


def _repeat_calls(fn: Callable[[], Any]) -> Iterator[Any]:
    while True:
        yield fn()


def _host_array(data: Any) -> np.ndarray:
    """Host data (arrays, torch tensors, even ones that require grad) as NumPy, through
    PopXL's one conversion, unconverted in dtype."""
    return popxl.utils.to_numpy(data, downcast=False, copy=False)


def _data_iterator(data_iter: Any) -> _Peekable:
    if callable(data_iter):
        try:
            data_iter()  # a smoke test, as popxl-addons does (it draws once more from RNGs)
        except Exception as err:
            raise ValueError(CALLABLE_FAILED_MSG) from err
        return _Peekable(_repeat_calls(data_iter))
    if isinstance(data_iter, Iterable):
        return _Peekable(iter(data_iter))
    raise ValueError(NOT_DATA_MSG.format(value=data_iter))


class VariableFactory:
    """How to make one kind of variable: its data source, dtype, name and grouping.

    Args:
        data_iter: a zero-argument callable returning host arrays (called once as a smoke
            test and once to peek at the shape), or an iterable of arrays.
        dtype: the variable dtype (default: the data's).
        name: the graph-input / variable name.
        by_ref: make the graph input pass-by-reference.
        replica_grouping: replicas sharing one value (default: all replicas).
        shard_over: shard the variable over this many replicas (replicated tensor sharding).
    """

    def __init__(
        self,
        data_iter: Any,
        dtype: popxl.dtype | None = None,
        name: str | None = None,
        by_ref: bool = False,
        replica_grouping: popxl.ReplicaGrouping | None = None,
        shard_over: int = 1,
    ) -> None:
        self.data_iter = _data_iterator(data_iter)
        first = self.data_iter.peek()
        if not hasattr(first, "shape"):
            raise ValueError(NO_SHAPE_MSG.format(value=first))
        self.name = name
        self.by_ref = by_ref
        self.replica_grouping = replica_grouping or popxl.gcg().ir.replica_grouping()
        self.dtype = dtype or popxl.dtype.as_dtype(_host_array(first).dtype)
        self.replica_sharded = shard_over > 1
        self.shard_over = shard_over
        full = tuple(first.shape)
        if self.replica_sharded:
            if shard_over > self.replica_grouping.group_size:
                raise ValueError(
                    f"shard_over={shard_over} exceeds the group size "
                    f"{self.replica_grouping.group_size} of {self.replica_grouping}."
                )
            self.meta_shape: tuple[int, ...] = full
            self.shape: tuple[int, ...] = (math.prod(full) // shard_over,)
        else:
            self.meta_shape = ()
            self.shape = full

    def create_input(self, prefix: str | None = None) -> popxl.Tensor:
        """A graph input of this factory's spec in the current graph."""
        name = self.name if prefix is None else f"{prefix}.{self.name}"
        return popxl.graph_input(
            self.shape, self.dtype, name, by_ref=self.by_ref, meta_shape=self.meta_shape
        )

    def next_data(self, empty: bool = False) -> np.ndarray:
        """The next host value (stacked per group when the grouping has several groups)."""
        full_shape = self.meta_shape or self.shape
        groups = self.replica_grouping.num_groups
        if empty:
            shape = (groups, *full_shape) if groups > 1 else full_shape
            return np.empty(shape, self.dtype.as_numpy())
        if groups > 1:
            return np.stack([_host_array(next(self.data_iter)) for _ in range(groups)])
        return _host_array(next(self.data_iter))

    def next_memmap(
        self, memmap_dir: str, name: str, empty: bool = False, read_only_if_exists: bool = False
    ) -> np.memmap:
        """``<memmap_dir>/<name>.npy`` as a memmap, created (and filled) if missing."""
        path = os.path.join(memmap_dir, f"{name}.npy")
        if os.path.exists(path):
            return np.lib.format.open_memmap(path, mode="r" if read_only_if_exists else "r+")
        os.makedirs(memmap_dir, exist_ok=True)
        data = self.next_data(empty)
        mm = np.lib.format.open_memmap(
            path, mode="w+", dtype=self.dtype.as_numpy(), shape=data.shape
        )
        if not empty:
            mm[...] = data
            mm.flush()
        return mm

    def create_tensor(
        self,
        name: str | None = None,
        empty: bool = False,
        memmap_dir: str | None = None,
        read_only_if_exists: bool = False,
    ) -> popxl.Tensor:
        """A main-graph variable initialised with the next value (a sharded variable's shard
        handle for replica-sharded factories)."""
        name = name or self.name
        if memmap_dir is not None:
            data: Any = self.next_memmap(memmap_dir, name or "t", empty, read_only_if_exists)
        else:
            data = self.next_data(empty)
        if self.replica_sharded:
            _, shard = popxl.replica_sharded_variable(
                data,
                self.dtype,
                name,
                replica_grouping=self.replica_grouping,
                shard_over=self.shard_over,
            )
            return shard
        return popxl.variable(data, self.dtype, name, replica_grouping=self.replica_grouping)

    def create_remote_tensor(
        self,
        buffer: popxl.RemoteBuffer,
        entry: int,
        name: str | None = None,
        empty: bool = False,
        memmap_dir: str | None = None,
        read_only_if_exists: bool = False,
    ) -> popxl.Variable:
        """A remote variable in slot ``entry`` of ``buffer`` (replica-sharded when the buffer
        has a meta-shape)."""
        name = name or self.name
        if memmap_dir is not None:
            data: Any = self.next_memmap(memmap_dir, name or "t", empty, read_only_if_exists)
        else:
            data = self.next_data(empty)
        make = popxl.remote_replica_sharded_variable if buffer.meta_shape else popxl.remote_variable
        return make(data, buffer, entry, self.dtype, name, replica_grouping=self.replica_grouping)


class NamedVariableFactories(DotTree[VariableFactory]):
    """A DotTree of factories, e.g. everything a module's graph needs bound."""

    def init(
        self,
        prefix: str | None = None,
        empty: bool = False,
        memmap_dir: str | None = None,
        read_only_if_exists: bool = False,
    ) -> NamedTensors:
        """Create every variable in the main graph, in sorted key order, named
        ``<prefix>.<key>`` (or ``<key>``)."""
        created = {}
        for key, factory in sorted(self.to_dict().items()):
            name = f"{prefix}.{key}" if prefix else key
            created[key] = factory.create_tensor(name, empty, memmap_dir, read_only_if_exists)
        return NamedTensors.from_dict(created)

    def init_remote(
        self,
        buffers: Any,
        entry: int = 0,
        prefix: str | None = None,
        empty: bool = False,
        memmap_dir: str | None = None,
        read_only_if_exists: bool = False,
    ) -> NamedTensors:
        """Create remote variables in ``buffers`` (a NamedRemoteBuffers with the same keys)."""
        buffer_map = buffers.to_dict()
        created = {}
        for key, factory in sorted(self.to_dict().items()):
            name = f"{prefix}.{key}" if prefix else key
            created[key] = factory.create_remote_tensor(
                buffer_map[key], entry, name, empty, memmap_dir, read_only_if_exists
            )
        return NamedTensors.from_dict(created)

    def _init_with(self, init_type: Literal["zero", "undef"]) -> NamedTensors:
        return NamedTensors.from_dict(
            {
                key: ops.init(f.shape, f.dtype, key, init_type, f.meta_shape)
                for key, f in self.to_dict().items()
            }
        )

    def init_zero(self) -> NamedTensors:
        """Zero tensors in the current graph (any graph), in insertion order."""
        return self._init_with("zero")

    def init_undef(self) -> NamedTensors:
        """Uninitialised tensors in the current graph, in insertion order."""
        return self._init_with("undef")

    @property
    def replica_groupings(self) -> NamedReplicaGrouping:
        return NamedReplicaGrouping.from_dict(
            {k: f.replica_grouping for k, f in self.to_dict().items()}
        )


def add_variable_input(
    name: str,
    data_iter: Any,
    dtype: popxl.dtype | None = None,
    by_ref: bool = False,
    replica_grouping: popxl.ReplicaGrouping | None = None,
) -> tuple[popxl.Tensor, VariableFactory]:
    """A graph input of the current graph plus the factory that makes its variable."""
    factory = VariableFactory(data_iter, dtype, name, by_ref, replica_grouping)
    return factory.create_input(), factory


def add_replica_sharded_variable_input(
    name: str,
    data_iter: Any,
    dtype: popxl.dtype | None = None,
    by_ref: bool = False,
    replica_grouping: popxl.ReplicaGrouping | None = None,
    shard_over: int | None = None,
) -> tuple[popxl.Tensor, VariableFactory]:
    """Like ``add_variable_input`` for a replica-sharded variable: the input is the flat
    shard (meta-shape = full shape); the factory initialises the full tensor."""
    group = replica_grouping or popxl.gcg().ir.replica_grouping()
    factory = VariableFactory(
        data_iter, dtype, name, by_ref, replica_grouping, shard_over or group.group_size
    )
    return factory.create_input(), factory


__all__ = [
    "VariableFactory",
    "NamedVariableFactories",
    "add_variable_input",
    "add_replica_sharded_variable_input",
]
