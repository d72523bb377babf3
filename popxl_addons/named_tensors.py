"""``NamedTensors``: a DotTree of popxl tensors (and ``NamedTensorData`` of host arrays)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import popxl
from popxl import ops

from .dot_tree import DotTree

TensorMap = Mapping[popxl.Tensor, popxl.Tensor]


class NamedTensorData(DotTree[np.ndarray]):
    """A DotTree of host arrays (e.g. ``TaskSession.get_named_tensors_data``)."""


class NamedTensors(DotTree[popxl.Tensor]):
    """A DotTree of tensors, e.g. a module's variables or a graph's named inputs."""

    @property
    def tensors(self) -> tuple[popxl.Tensor, ...]:
        """All tensors, sorted by ``Tensor.name`` (not by key)."""
        return tuple(sorted(self.to_dict().values(), key=lambda t: t.name))

    @property
    def named_tensors(self) -> dict[str, popxl.Tensor]:
        """``{flat key: tensor}`` in insertion order."""
        return dict(self.to_dict())

    def remap(self, mapping: TensorMap) -> NamedTensors:
        """A copy with every tensor replaced by ``mapping[tensor]``."""
        new = type(self)()
        for key, value in self._map.items():
            new._map[key] = (
                value.remap(mapping) if isinstance(value, NamedTensors) else mapping[value]
            )
        return new


def print_named_tensors(named_tensors: NamedTensors) -> NamedTensors:
    """``ops.print_tensor`` on every tensor, titled with its key."""
    return NamedTensors.from_dict(
        {key: ops.print_tensor(t, key) for key, t in named_tensors.to_dict().items()}
    )


__all__ = ["NamedTensors", "NamedTensorData", "TensorMap", "print_named_tensors"]
