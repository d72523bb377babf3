"""Helpers for the layers' ``torch_mapping``: host arrays from torch tensors or arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

import popxl


def to_numpy(value: Any, dtype: popxl.dtype) -> np.ndarray:
    """``value`` (a torch tensor or parameter, or anything ``np.asarray`` takes) as a NumPy
    array of ``dtype``; torch tensors are detached and copied to the host first. Float8
    ``dtype``: float data converted with ``host_pow2scale_cast_to_fp8`` (PopXL's structured
    float8 form)."""
    return popxl.utils.to_numpy(value, dtype)


def has_bias(layer: Any) -> bool:
    """Whether a torch-like layer has a bias (``nn.Linear(bias=False)`` sets it to None)."""
    return getattr(layer, "bias", None) is not None


__all__ = ["to_numpy", "has_bias"]
