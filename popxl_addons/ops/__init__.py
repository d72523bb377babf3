"""Ops built from popxl ops: losses and host IO helpers."""

from .cross_entropy import cross_entropy as cross_entropy
from .cross_entropy import cross_entropy_with_grad as cross_entropy_with_grad
from .streams import host_load as host_load
from .streams import host_store as host_store

__all__ = ["cross_entropy", "cross_entropy_with_grad", "host_load", "host_store"]
