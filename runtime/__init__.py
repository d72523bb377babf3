"""Lowering PopXL IRs to JAX and running them (the engine behind ``popxl.Session``).

The stages, each a package:

* ``lowering/``: the interpreter: an IR's ops and graphs to JAX functions, calls and loops,
  repeated calls as scans (``runs``, ``stacks``), autodiff's pullbacks (``vjp``);
* ``backend/``: how XLA's backends are asked: the CPU's convolution and pool forms, sunk
  transposes, compiler options and workarounds, the host allocator and dispatch settings;
* ``devices/``: virtual IPUs on JAX devices (placement, per-IPU variable slots), device
  descriptions and memory reports;
* ``distributed/``: several processes: ``poprun``'s launcher, its environment, and
  ``jax.distributed``;
* ``session/``: the compiled step (``program``) and ``popxl.Session``, which runs it: host
  streams, variables on host and device, remote buffers, the executable cache.

Importing ``runtime`` changes nothing in the process; the host settings of
``backend.host_memory`` are taken when the first session is made.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Session"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from .session.session import Session  # noqa: PLC0415 (lazy: importing runtime is light)

        return Session
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
