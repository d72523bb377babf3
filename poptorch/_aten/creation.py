"""Tensor creation: full, zeros/ones, arange, linspace, eye, empty, scalar_tensor, tensor constants."""

from __future__ import annotations
