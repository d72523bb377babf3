"""Helpers of ``poptorch.DataLoader``: batch structures, NumPy collation, each process's
share of a dataset, and combining a batch sampler's batches.

Batches travel between processes (``AsynchronousDataAccessor``) and are concatenated
(batch samplers, rebatching) as flat lists of leaves plus a *spec* that rebuilds the
structure. The spec is made of plain tuples so that it pickles: the worker process sends
it to the host once, with the first batch.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..capture.arguments import _PARSERS
from ..errors import Error

# Leaf kinds: how a leaf travels as a torch tensor and how the host gives it back.
TORCH, NUMPY, NUMPY_SCALAR, PYTHON, CONST = "torch", "numpy", "numpy_scalar", "python", "const"

LEAF_MSG = (
    "A batch field of type {t} cannot be transferred between processes: batches may hold "
    "torch tensors, NumPy arrays and numbers (or containers of them); other values must be "
    "the same in every batch (here it changed from {a!r} to {b!r})."
)


# ---- batch structures -------------------------------------------------------------------


def flatten(batch: Any) -> tuple[list[Any], Any]:
    """``batch`` as (leaves, spec): tensors and arrays in a deterministic order, the spec
    describing the containers (tuples, lists, named tuples, mappings, types registered with
    ``poptorch.registerCustomArgParser``) and each leaf's kind."""
    leaves: list[Any] = []
    spec = _flatten_into(batch, leaves)
    return leaves, spec


def _flatten_into(obj: Any, leaves: list[Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return ("leaf", TORCH)
    if isinstance(obj, np.ndarray):
        leaves.append(obj)
        return ("leaf", NUMPY)
    if isinstance(obj, np.generic):
        leaves.append(obj)
        return ("leaf", NUMPY_SCALAR)
    if isinstance(obj, (bool, numbers.Number)) and not isinstance(obj, complex):
        leaves.append(obj)
        return ("leaf", PYTHON)
    parser = _PARSERS.get(type(obj))
    if parser is not None:
        tensors = list(parser.yieldTensors(obj))
        leaves.extend(tensors)
        # A template holding empty tensors, as the parser rebuilds from an original object.
        template = parser.reconstruct(obj, iter([t.new_empty(0) for t in tensors]))
        return ("custom", type(obj), template, len(tensors))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return ("named", type(obj), [_flatten_into(v, leaves) for v in obj])
    if isinstance(obj, (tuple, list)):
        return ("seq", type(obj), [_flatten_into(v, leaves) for v in obj])
    if isinstance(obj, Mapping):
        keys = list(obj.keys())
        return ("map", type(obj), keys, [_flatten_into(obj[k], leaves) for k in keys])
    leaves.append(obj)
    return ("leaf", CONST)


def unflatten(spec: Any, leaves: Iterable[Any]) -> Any:
    """The structure ``spec`` describes, holding ``leaves`` (in ``flatten``'s order)."""
    return _build(spec, iter(leaves))


def _build(spec: Any, leaves: Iterator[Any]) -> Any:
    tag = spec[0]
    if tag == "leaf":
        return next(leaves)
    if tag == "custom":
        _, cls, template, count = spec
        return _PARSERS[cls].reconstruct(template, iter([next(leaves) for _ in range(count)]))
    if tag == "named":
        return spec[1](*[_build(s, leaves) for s in spec[2]])
    if tag == "seq":
        values = [_build(s, leaves) for s in spec[2]]
        return values if spec[1] is list else _sequence(spec[1], values)
    _, cls, keys, specs = spec
    entries = {k: _build(s, leaves) for k, s in zip(keys, specs)}
    return entries if cls is dict else _mapping(cls, entries)


def _sequence(cls: type, values: list[Any]) -> Any:
    try:
        return cls(values)
    except TypeError:
        return tuple(values)


def _mapping(cls: type, values: dict[Any, Any]) -> Any:
    try:
        return cls(values)
    except TypeError:
        return values


def leaf_kinds(spec: Any) -> list[str]:
    """The kind of every leaf of ``spec``, in order."""
    tag = spec[0]
    if tag == "leaf":
        return [spec[1]]
    if tag == "custom":
        return [TORCH] * spec[3]
    children = spec[3] if tag == "map" else spec[2]
    return [k for s in children for k in leaf_kinds(s)]


def as_tensor(leaf: Any, kind: str) -> torch.Tensor:
    """A leaf as a torch tensor (how it travels between processes)."""
    if kind == TORCH:
        return leaf
    if kind in (NUMPY, NUMPY_SCALAR):
        array = np.ascontiguousarray(leaf)
        try:
            return torch.from_numpy(array)
        except TypeError as error:
            raise Error(
                f"A batch field of NumPy dtype {array.dtype} has no torch dtype, so it cannot "
                "be transferred between processes; cast it in the dataset."
            ) from error
    return torch.tensor(leaf)


def from_tensor(tensor: torch.Tensor, kind: str) -> Any:
    """The host's copy of a leaf that travelled as ``tensor``."""
    if kind == TORCH:
        return tensor.clone()
    if kind == NUMPY:
        return tensor.numpy().copy()
    if kind == NUMPY_SCALAR:
        return tensor.numpy()[()]
    return tensor.item()


# ---- collation --------------------------------------------------------------------------


def collate(samples: list[Any]) -> Any:
    """Stack samples field by field, keeping their kind: torch tensors -> one tensor,
    NumPy arrays and numbers -> one NumPy array, tuples/lists/dicts -> the same containers
    of stacked fields. (The default for datasets that are not ``torch.utils.data``
    datasets, so that the popxl_addons front end gets NumPy batches.) Samples holding a
    torch tensor are collated as torch collates them (numbers become tensors too), since
    they feed a torch model."""
    leaves, _ = flatten(samples[0])
    if any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return torch.utils.data.default_collate(samples)
    return _collate_fields(samples)


def _collate_fields(samples: list[Any]) -> Any:
    first = samples[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(samples)
    if isinstance(first, (np.ndarray, np.generic, numbers.Number)):
        return np.stack([np.asarray(s) for s in samples])
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_collate_fields([s[i] for s in samples]) for i in range(len(first))))
    if isinstance(first, (tuple, list)):
        return tuple(_collate_fields([s[i] for s in samples]) for i in range(len(first)))
    if isinstance(first, Mapping):
        return {k: _collate_fields([s[k] for s in samples]) for k in first}
    return list(samples)


def concat_leaves(parts: list[Any]) -> Any:
    """Concatenate one field of several batches along the batch dimension."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    return first


def combine_batches(batches: Iterator[Any], count: int, drop_last: bool) -> Iterator[Any]:
    """Concatenate every ``count`` consecutive batches (a batch sampler's micro-batches)
    into one combined batch; a short final group is kept unless ``drop_last``."""
    group: list[Any] = []
    for batch in batches:
        group.append(batch)
        if len(group) == count:
            yield _concat_batches(group)
            group = []
    if group and not drop_last:
        yield _concat_batches(group)


def _concat_batches(group: list[Any]) -> Any:
    flat = [flatten(b) for b in group]
    spec = flat[0][1]
    columns = zip(*(leaves for leaves, _ in flat))
    return unflatten(spec, [concat_leaves(list(c)) for c in columns])


# ---- datasets ---------------------------------------------------------------------------


def is_map_style(dataset: Any) -> bool:
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return False
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


class ProcessShare:
    """One process's share of a map-style dataset (``Options.Distributed``).

    Every process takes one contiguous block: process 0 the first, process 1 the next...
    With ``drop_last`` each block is a whole number of combined batches, the same for every
    process (they must run the same number of steps); otherwise the samples are spread as
    evenly as possible. Shuffling permutes the whole dataset with a generator seeded by
    ``Options.randomSeed``, so every process draws the same permutation and the blocks stay
    disjoint; ``next_epoch`` draws the next permutation and, every other epoch, shifts the
    blocks by the samples left over so that those are used too.
    """

    def __init__(
        self, dataset: Any, pid: int, count: int, seed: int | None, combined: int, drop_last: bool
    ) -> None:
        total = len(dataset)
        if drop_last:
            per_process = combined * (total // (combined * count))
            self._base = pid * per_process
            self._length = per_process
            self._leftover = total - per_process * count
        else:
            sizes = [total // count + (total % count > p) for p in range(count)]
            self._base = sum(sizes[:pid])
            self._length = sizes[pid]
            self._leftover = 0
        self._offset = self._base
        self._dataset = dataset
        self._seed = seed
        self._rng_state: torch.Tensor | None = None
        # Shared memory: persistent DataLoader workers see each epoch's permutation.
        self._order: torch.Tensor | None = None

    def next_epoch(self) -> None:
        """Draw the next global permutation and alternate the blocks' offset."""
        generator = torch.Generator()
        if self._rng_state is None:
            generator.manual_seed(self._seed or 0)
        else:
            generator.set_state(self._rng_state)
        order = torch.randperm(len(self._dataset), generator=generator)
        if self._order is None:
            self._order = order.share_memory_()
        else:
            self._order.copy_(order)
        self._rng_state = generator.get_state()
        shifted = self._offset != self._base
        self._offset = self._base if shifted else self._base + self._leftover

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self._length:
            raise IndexError(f"index {index} out of range for {self._length} samples")
        position = index + self._offset
        if self._order is not None:
            position = int(self._order[position])
        return self._dataset[position]


class PlainIterable(torch.utils.data.IterableDataset):
    """An iterable that is not a ``torch.utils.data.IterableDataset`` (a generator, a
    stream object): it is dealt out sample by sample, first to the processes
    (``Options.Distributed``), then to the DataLoader's worker processes, so that no sample
    is loaded twice."""

    def __init__(self, source: Iterable[Any], pid: int, count: int) -> None:
        self.source, self.pid, self.count = source, pid, count

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = 0
        for index, sample in enumerate(self.source):
            if index % self.count != self.pid:
                continue
            if mine % workers == worker:
                yield sample
            mine += 1
