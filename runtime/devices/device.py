"""Which JAX device a session runs on, and the IPU facts the device types model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax


@dataclass(frozen=True)
class IpuModel:
    """The Mk2 IPU that ``ipu_model`` and ``ipu_hw`` stand for (memory reporting and limits)."""

    tiles: int = 1472
    memory_bytes: int = 900 * 1024 * 1024


MK2 = IpuModel()


def select_device(device_desc: str) -> jax.Device:
    """JAX's default device for every ``device_desc``: a GPU when one is present.

    ``"cpu"``, ``"ipu_model"`` and ``"ipu_hw"`` all run through JAX on its default backend,
    so programs behave the same everywhere; pin a backend with ``JAX_PLATFORMS``.
    """
    del device_desc
    return jax.devices()[0]


DEVICE_TYPES = ("ipu_hw", "ipu_model", "cpu")
_next_id = iter(range(1 << 30))


class DeviceInfo:
    """A device a session runs on, with PopART's ``DeviceInfo`` interface.

    ``type`` is the device type (``"ipu_hw"``, ``"ipu_model"`` or ``"cpu"``), ``numIpus`` the
    IPUs it models and ``isAttached`` whether a session holds it: ``attach()`` /
    ``tryAttachUntilTimeout()`` and ``detach()`` change that, and ``with device:`` detaches
    on exit. A session compiled for one type (and number of IPUs) refuses to run on another,
    as Poplar refused to load an executable built for a different target.

    >>> d = DeviceInfo("ipu_model", 2)
    >>> d.attach(), d.isAttached, d.numIpus
    (True, True, 2)
    """

    def __init__(self, device_type: str, num_ipus: int = 1, tiles_per_ipu: int = MK2.tiles):
        if device_type not in DEVICE_TYPES:
            raise ValueError(
                f"Incorrect device type provided: {device_type}, must be one of: "
                "`ipu_hw`, `ipu_model`, `cpu`"
            )
        self.type = device_type
        self.numIpus = num_ipus
        self.tilesPerIPU = tiles_per_ipu
        self.id = next(_next_id)
        self.version = "ipu2"
        self.isAttached = False

    @property
    def jax_device(self) -> jax.Device:
        return select_device(self.type)

    def attach(self) -> bool:
        self.isAttached = True
        return True

    def tryAttachUntilTimeout(self) -> bool:  # noqa: N802 (PopART's name)
        return self.attach()

    def detach(self) -> None:
        self.isAttached = False

    def __enter__(self) -> DeviceInfo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        return f"DeviceInfo(type={self.type!r}, numIpus={self.numIpus}, id={self.id})"


def ipus_needed(replicas: int, ipus_per_replica: int = 1) -> int:
    """IPUs a program needs, rounded up to a power of two as PopXL did."""
    return 1 << max(0, math.ceil(math.log2(replicas * ipus_per_replica)))


def check_compatible(compiled_for: str, ipus: int, device: DeviceInfo) -> None:
    """Raise if ``device`` cannot run a program compiled for ``compiled_for`` and ``ipus``."""
    if device.type != compiled_for or device.numIpus != ipus:
        raise RuntimeError(
            f"The session was compiled for a {compiled_for} device with {ipus} IPU(s) but was "
            f"given {device!r}. An executable only runs on the target it was compiled for: "
            f"pass a {compiled_for} device with {ipus} IPU(s) (popxl.utils._to_device_info("
            f"{compiled_for!r}, {ipus})), or create a new Session for this device."
        )


NO_IO_TILES_MSG = (
    "No IO tile graph for index {ipu}: op {op} is placed on IO tiles (`popxl.io_tiles()`), "
    "but the session options reserve none. Reserve some before creating the Session, e.g. "
    "`ir._pb_ir.getSessionOptions().numIOTiles = 32` (an even number, at least 32)."
)


def check_io_tiles(ir: Any, tiles_per_ipu: int) -> None:
    """PopART's rules for ``numIOTiles``: 0, or an even number >= 32 below the tiles per IPU;
    ops may sit on IO tiles only when some are reserved."""
    num = ir.session_options.numIOTiles
    if num > 0 and (num < 32 or num % 2):
        raise ValueError(
            f"{num} is an invalid number of IO tiles. Number of IO tiles must be an even "
            "number and >= 32."
        )
    if num >= tiles_per_ipu:
        raise ValueError(f"Tiles per IPU {tiles_per_ipu} should exceed number of IO tiles {num}.")
    if num == 0:
        for graph in ir._graphs.values():
            for op in graph._ops:
                if op.tile_set == "io":
                    raise ValueError(NO_IO_TILES_MSG.format(ipu=op.ipu or 0, op=op))
