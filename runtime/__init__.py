"""Lowering PopXL IRs to JAX and running them (the engine behind ``popxl.Session``)."""

from . import host_memory

host_memory.dispatch_inline()  # before JAX makes its CPU client
host_memory.keep_freed_memory()

from .session import Session as Session  # noqa: E402

__all__ = ["Session"]
