"""Which JAX device a session runs on, and the IPU facts the device types model."""

from __future__ import annotations

from dataclasses import dataclass

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
