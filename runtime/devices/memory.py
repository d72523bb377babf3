"""Memory reports: what a program keeps on each virtual IPU and in streaming memory.

``Session.memory_report()`` returns a ``MemoryReport`` with one ``IpuMemory`` per virtual IPU:

* ``variables``: bytes of on-chip variables placed on that IPU (per replica; the IPU of a
  variable is the one whose ops write it, else read it, else 0; when placed, the IPU that
  owns it, ``runtime.ipu_slots``);
* ``resident``: bytes of on-chip variables held by the device running that IPU. When the
  IPUs are placed on several devices each device holds only its IPU's variables, plus
  padding where the IPUs' variables do not pair up by size (``runtime.ipu_slots``); on one
  device, every variable of the program;
* ``remote``: bytes of the remote buffers that IPU loads from or stores to (streaming
  memory; per replica, all entries);
* ``device_peak``: the compiled step's peak on the device running that IPU, from XLA's
  memory analysis: arguments + outputs - donated (aliased) buffers + temporaries. When the
  IPUs are placed on several devices, each device runs the same SPMD program, so each
  reports the same figure;
* ``chip_peak``: ``device_peak`` less the remote buffers that device holds: what an IPU,
  whose remote buffers live off chip, would need. This is the figure phased execution and
  pipelining lower.

``MemoryReport.devices`` counts the devices one replica's IPUs run on (a replicated program
placed on an ``(replicas, ipus)`` device mesh reports ``ipus``; every figure is per replica,
and so per device).

``ipu_model`` and ``ipu_hw`` model a Mk2 IPU (about 900 MB); ``MemoryReport.fits`` says
whether every IPU's ``chip_peak`` fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from popxl._op import Op
from popxl.graph import Graph
from popxl.remote_buffer import RemoteBuffer
from popxl.tensor import Tensor, Variable

from .device import MK2
from .ipu_slots import SlotLayout


@dataclass(frozen=True)
class IpuMemory:
    """Bytes one virtual IPU uses (see the module docstring)."""

    ipu: int
    variables: int
    remote: int
    device_peak: int
    chip_peak: int
    resident: int = 0


@dataclass(frozen=True)
class MemoryReport:
    """Per-IPU memory of a compiled program, with XLA's raw analysis."""

    ipus: tuple[IpuMemory, ...]
    devices: int
    xla: dict[str, int] = field(default_factory=dict)
    capacity: int = MK2.memory_bytes

    def __getitem__(self, ipu: int) -> IpuMemory:
        return self.ipus[ipu]

    @property
    def fits(self) -> bool:
        return all(m.chip_peak <= self.capacity for m in self.ipus)

    def __str__(self) -> str:
        lines = [
            f"{'IPU':>4} {'variables':>12} {'resident':>12} {'remote':>12} {'device peak':>12} "
            f"{'chip peak':>12}"
        ]
        for m in self.ipus:
            lines.append(
                f"{m.ipu:>4} {m.variables:>12,} {m.resident:>12,} {m.remote:>12,} "
                f"{m.device_peak:>12,} {m.chip_peak:>12,}"
            )
        where = f"{self.devices} devices" if self.devices > 1 else "one device"
        lines.append(f"(bytes per replica; {where}; XLA: {self.xla})")
        return "\n".join(lines)


def nbytes(shape: Iterable[int], dtype: Any) -> int:
    return math.prod(shape) * dtype.as_numpy().itemsize


def _ops(graphs: Iterable[Graph]) -> Iterable[Op]:
    for g in graphs:
        yield from g._ops


def variable_ipus(variables: Iterable[Variable]) -> dict[Variable, int]:
    """Each variable's IPU: that of the first op that writes it, else reads it, else 0
    (looking through calls and loops into the ops of the called graphs)."""
    return {v: tensor_ipu(v) for v in variables}


def tensor_ipu(t: Tensor) -> int:
    read: int | None = None
    for op, index in _uses(t, set()):
        ipu = _input_ipu(op, index)
        if index in op.modified_input_indices():
            return ipu
        read = ipu if read is None else read
    return read or 0


def _uses(t: Tensor, seen: set[Tensor]) -> Iterable[tuple[Op, int]]:
    """(op, input index) for every non-control op reading ``t``, through subgraph inputs."""
    if t in seen:
        return
    seen.add(t)
    for op in t._consumers:
        for index, x in enumerate(op.inputs):
            if x is not t:
                continue
            if op.opdef.special in ("call", "repeat"):
                graph = op.attrs["graphs"][0]
                if index < len(graph._inputs):
                    yield from _uses(graph._inputs[index], seen)
            else:
                yield op, index


def _input_ipu(op: Op, index: int) -> int:
    source = op.attrs.get("source")
    if op.opdef.key == "ipu_copy" and source is not None:
        return int(source)
    return op.ipu or 0


def buffer_ipus(graphs: Iterable[Graph], buffers: Iterable[RemoteBuffer]) -> dict[int, int]:
    """Each remote buffer's IPU (by buffer id): that of the first op loading or storing it."""
    found: dict[int, int] = {}
    for op in _ops(graphs):
        if op.opdef.special in ("remote_load", "remote_store"):
            found.setdefault(op.attrs["buffer_id"], op.ipu or 0)
    return {b.remote_buffer_id: found.get(b.remote_buffer_id, 0) for b in buffers}


def xla_sizes(compiled: Any) -> dict[str, int]:
    """The fields of XLA's memory analysis that make up the peak."""
    analysis = compiled.memory_analysis()
    names = ("argument", "output", "alias", "temp", "generated_code")
    return {n: int(getattr(analysis, f"{n}_size_in_bytes", 0) or 0) for n in names}


def memory_report(
    graphs: list[Graph],
    variables: list[Variable],
    buffers: list[RemoteBuffer],
    ipus: int,
    devices: int,
    compiled: Any,
    slots: SlotLayout | None = None,
) -> MemoryReport:
    """Build the report of a program (see the module docstring); ``slots``: the variable
    layout of a placed program."""
    sizes = xla_sizes(compiled)
    peak = sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]
    buf_ipu = buffer_ipus(graphs, buffers)
    per_buf = [0] * ipus
    if slots is not None:
        per_var = slots.owned_bytes()
        resident = [slots.resident_bytes()] * ipus
    else:
        var_ipu = variable_ipus(variables)
        per_var = [0] * ipus
        for v in variables:
            per_var[min(var_ipu[v], ipus - 1)] += nbytes(v.shape, v.dtype)
        resident = [sum(per_var)] * ipus
    for b in buffers:
        size = b.entries * nbytes(b.tensor_shape, b.tensor_dtype)
        per_buf[min(buf_ipu[b.remote_buffer_id], ipus - 1)] += size
    total_remote = sum(per_buf)
    rows = []
    for k in range(ipus):
        # Every device holds all remote buffers (they are kept valid everywhere).
        held = total_remote
        rows.append(IpuMemory(k, per_var[k], per_buf[k], peak, max(peak - held, 0), resident[k]))
    return MemoryReport(tuple(rows), devices, sizes)


__all__ = ["IpuMemory", "MemoryReport", "memory_report"]
