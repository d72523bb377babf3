"""Per-IPU variable storage for placed programs: each device holds only its IPU's variables.

A placed step (``runtime.placement``) is one SPMD program over ``N`` devices, so every state
array has the same shape on every device. To keep each variable only on its owner IPU's
device, variables of the same dtype and element count owned by *different* IPUs share one
*slot*: an array of shape ``(N, size)`` whose row ``k`` (held by device ``k``) is the
variable IPU ``k`` owns, or padding when IPU ``k`` owns none in that slot. A pipeline whose
stages hold layers of equal shapes then stores ``1/N`` of its variables per device; a
variable with no partner of its size costs its size on every device (the padding rows).
``bench/strategies.py``'s MLP (2026-11-22): per device 0.73x (2 IPUs) and 0.49x (4 IPUs) of
the plain run's variables; its 2-IPU split is uneven (two 1024x1024 layers on IPU 0).

Inside the step each member is read from its row (a reshape of the device's block, so no
copy), homed on its owner, and written back by selecting, per device, the new value of the
member that device owns.

>>> import numpy as np
>>> layout = SlotLayout.build(2, [((4, 8), np.float32), ((32,), np.float32), ((3,), np.float32)],
...                           [0, 1, 1])
>>> layout.slots
((0, 1), (None, 2))
>>> layout.resident_bytes(), layout.owned_bytes()
(140, [128, 140])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Shape = tuple[int, ...]


@dataclass(frozen=True)
class SlotLayout:
    """Which variable (state entry) each device holds in each slot.

    Attributes:
        ipus: devices (virtual IPUs) in the mesh.
        shapes: per entry, (shape, numpy dtype).
        owners: per entry, the IPU whose device holds it.
        slots: per slot, per IPU, the entry held there (``None``: padding).
    """

    ipus: int
    shapes: tuple[tuple[Shape, Any], ...]
    owners: tuple[int, ...]
    slots: tuple[tuple[int | None, ...], ...]

    @staticmethod
    def build(ipus: int, shapes: Sequence[tuple[Shape, Any]], owners: Sequence[int]) -> SlotLayout:
        """Pair entries of one dtype and element count across IPUs, in entry order."""
        buckets: dict[tuple[str, int], list[list[int]]] = {}
        for i, ((shape, dtype), owner) in enumerate(zip(shapes, owners)):
            key = (np.dtype(dtype).str, math.prod(shape))
            buckets.setdefault(key, [[] for _ in range(ipus)])[owner].append(i)
        slots: list[tuple[int | None, ...]] = []
        for queues in buckets.values():
            for j in range(max(len(q) for q in queues)):
                slots.append(tuple(q[j] if j < len(q) else None for q in queues))
        slots.sort(key=lambda s: min(i for i in s if i is not None))
        norm = tuple((tuple(s), np.dtype(d)) for s, d in shapes)
        return SlotLayout(ipus, norm, tuple(owners), tuple(slots))

    # Sizes -------------------------------------------------------------------------------

    def slot_shape(self, slot: int) -> tuple[Shape, Any]:
        """(shape, dtype) of one slot's array: ``(ipus, size)``."""
        shape, dtype = self.shapes[self._first(slot)]
        return (self.ipus, math.prod(shape)), dtype

    def _first(self, slot: int) -> int:
        return next(i for i in self.slots[slot] if i is not None)

    def resident_bytes(self) -> int:
        """Bytes of variable slots each device holds (its variables and padding)."""
        total = 0
        for k in range(len(self.slots)):
            (_, size), dtype = self.slot_shape(k)
            total += size * dtype.itemsize
        return total

    def owned_bytes(self) -> list[int]:
        """Per IPU, bytes of the variables it owns."""
        out = [0] * self.ipus
        for (shape, dtype), owner in zip(self.shapes, self.owners):
            out[owner] += math.prod(shape) * dtype.itemsize
        return out

    # Host side ---------------------------------------------------------------------------

    def pack(self, values: Sequence[Any], lead: Shape = ()) -> list[np.ndarray]:
        """Per-entry host arrays → per-slot ``(*lead, ipus, size)`` arrays (padding is
        zeros). ``lead``: leading axes every entry has, e.g. ``(replicas,)``."""
        out = []
        for k, members in enumerate(self.slots):
            (_, size), dtype = self.slot_shape(k)
            slot = np.zeros((*lead, self.ipus, size), dtype)
            for ipu, i in enumerate(members):
                if i is not None:
                    slot[..., ipu, :] = np.asarray(values[i], dtype).reshape(*lead, size)
            out.append(slot)
        return out

    def unpack(self, slots: Sequence[Any], lead: Shape = ()) -> list[Any]:
        """Per-slot arrays → per-entry arrays (each from its owner's row), with the
        leading axes ``lead`` of ``pack``."""
        out: list[Any] = [None] * len(self.shapes)
        for members, value in zip(self.slots, slots):
            for ipu, i in enumerate(members):
                if i is not None:
                    out[i] = value[..., ipu, :].reshape((*lead, *self.shapes[i][0]))
        return out

    def where(self, entry: int) -> tuple[int, int]:
        """(slot, row) holding ``entry``."""
        for k, members in enumerate(self.slots):
            for ipu, i in enumerate(members):
                if i == entry:
                    return k, ipu
        raise KeyError(entry)

    # Inside the placed step (one device's blocks) ---------------------------------------

    def read(self, blocks: Sequence[Any]) -> list[Any]:
        """This device's slot blocks ``(1, size)`` → one traced value per entry (a distinct
        array per member, so each can have its own home)."""
        out: list[Any] = [None] * len(self.shapes)
        for members, block in zip(self.slots, blocks):
            for i in members:
                if i is not None:
                    out[i] = block[0].reshape(self.shapes[i][0])
        return out

    def write(self, values: Sequence[Any], index: Any) -> list[Any]:
        """New per-entry values → this device's slot blocks: the row of the member this
        device (``index``) owns."""
        import jax.numpy as jnp  # noqa: PLC0415

        out = []
        for members in self.slots:
            present = [(ipu, i) for ipu, i in enumerate(members) if i is not None]
            row = values[present[-1][1]].reshape(-1)
            for ipu, i in reversed(present[:-1]):
                row = jnp.where(index == ipu, values[i].reshape(-1), row)
            out.append(row[None])
        return out


__all__ = ["SlotLayout"]
