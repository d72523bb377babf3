"""Ops built from popxl ops: losses and host IO helpers."""

from .cross_entropy import cross_entropy as cross_entropy
from .cross_entropy import cross_entropy_with_grad as cross_entropy_with_grad
from .fp8_amax_scale import fp8_amax_scale as fp8_amax_scale
from .host_io import host_load as host_load
from .host_io import host_store as host_store

__all__ = ["cross_entropy", "cross_entropy_with_grad", "fp8_amax_scale", "host_load", "host_store"]
