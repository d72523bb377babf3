"""Lowering PopXL IRs to JAX and running them (the engine behind ``popxl.Session``)."""

from .session import Session as Session

__all__ = ["Session"]
