"""Stream-creating host IO helpers: ``popxl_addons.ops.streams`` (also ``addons.host_load``)."""

from __future__ import annotations

from typing import Any

import numpy as np

import popxl
from popxl import ops


def host_load(
    t: Any, dtype: popxl.dtype, name: str
) -> tuple[np.ndarray, popxl.HostToDeviceStream, popxl.Tensor]:
    """Create an h2d stream ``<name>_stream`` shaped like host data ``t`` and load it.

    Returns:
        (``t`` converted to ``dtype``, the stream, the loaded tensor). For a float8 ``dtype``
        float data is converted with ``host_pow2scale_cast_to_fp8`` (float8 data, structured
        or ml_dtypes, is kept), giving PopXL's structured float8 array.
    """
    data = popxl.utils.to_numpy(t, dtype)
    stream = popxl.h2d_stream(data.shape, dtype, f"{name}_stream")
    return data, stream, ops.host_load(stream, name)


def host_store(t: popxl.Tensor) -> popxl.DeviceToHostStream:
    """Create a d2h stream ``<t.name>_stream`` and store ``t`` to it."""
    stream = popxl.d2h_stream(t.shape, t.dtype, f"{t.name}_stream")
    ops.host_store(stream, t)
    return stream


__all__ = ["host_load", "host_store"]
