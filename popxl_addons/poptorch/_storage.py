"""Where the program keeps weights, optimiser state and accumulators (TensorLocations).

A tensor class whose ``TensorLocationSettings`` say ``useOnChipStorage(False)`` is kept in a
remote buffer (streaming memory) when it has at least ``minElementsForOffChip`` elements:
the program ``remote_load``s it where it is used and ``remote_store``s it after an update.
Everything else is an ordinary (on-chip) variable.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import popxl
from popxl import ops

from .options import TensorLocationSettings


def is_off_chip(settings: TensorLocationSettings, shape: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` goes to streaming memory under ``settings``."""
    return settings.on_chip is False and math.prod(shape) >= settings.min_elements_off_chip


def place(
    data: np.ndarray,
    dtype: popxl.dtype,
    name: str,
    grouping: popxl.ReplicaGrouping,
    settings: TensorLocationSettings,
) -> popxl.Variable:
    """A variable holding ``data`` (one value per replica group), on or off chip."""
    shape = data.shape[1:] if grouping.num_groups > 1 else data.shape
    if not is_off_chip(settings, shape):
        return popxl.variable(data, dtype, name, replica_grouping=grouping)
    buffer = popxl.remote_buffer(shape, dtype, 1)
    return popxl.remote_variable(data, buffer, 0, dtype, name, replica_grouping=grouping)


def _buffer(var: popxl.Variable) -> Any:
    return getattr(var, "_remote_buffer", None)


def read(var: popxl.Variable) -> popxl.Tensor:
    """The variable itself, or its value loaded from streaming memory."""
    buffer = _buffer(var)
    return var if buffer is None else ops.remote_load(buffer, 0, f"{var.name}_loaded")


def write(var: popxl.Variable, loaded: popxl.Tensor, value: popxl.Tensor) -> None:
    """Set ``var`` (read as ``loaded``) to ``value``."""
    buffer = _buffer(var)
    if buffer is None:
        ops.var_updates.copy_var_update_(var, value)
        return
    if value.dtype != var.dtype:
        value = ops.cast(value, var.dtype)
    ops.remote_store(buffer, 0, value)


def flush(var: popxl.Variable, loaded: popxl.Tensor) -> None:
    """Store ``loaded`` (updated in place) back to streaming memory if ``var`` lives there."""
    buffer = _buffer(var)
    if buffer is not None:
        ops.remote_store(buffer, 0, loaded)
