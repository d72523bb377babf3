"""The host allocator, set up for steps that allocate and free the same large buffers each call.

XLA:CPU allocates a step's temporary and output buffers with ``malloc`` on every call and
frees them when the call ends. glibc serves an allocation above its mmap threshold (which
it moves, up to 32 MiB) from fresh pages mapped for it and unmaps them again on ``free``,
and it trims freed memory at the top of its heap back to the kernel. So every call of a
step whose buffers are large touched their pages anew: ResNet-18's SGD step (batch 8,
64 x 64) took 10,500 page faults (41 MiB) and 40 ms of kernel time per call over the two
cores of the 2026-11-28 host.

With both thresholds raised to 1 GiB the freed buffers stay in the process and the next
call reuses them: 1,100 faults and 3-6 ms of kernel time per call, and the step went
122-137 -> 100-114 ms (three pairs of processes, alternated; each pair faster). Programs
that already reuse their buffers (the 12-layer encoder's, about 300 faults per call) are
unchanged. The cost is that the process keeps the memory its largest step needed, as
allocators built for servers (jemalloc, tcmalloc) do.

``POPXL_HOST_MALLOC=default`` leaves glibc's settings alone; elsewhere than glibc (macOS,
musl) nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
import platform

# mallopt's parameters (malloc.h) and the value set for both.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP_BELOW = 1 << 30

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory for reuse (once per process); whether it now does.

    Called before the runtime builds its first program. ``POPXL_HOST_MALLOC`` is
    ``keep`` (the default) or ``default`` (leave the allocator alone)."""
    global _done
    if _done is not None:
        return _done
    choice = os.environ.get("POPXL_HOST_MALLOC", "keep")
    if choice not in ("keep", "default"):
        raise ValueError(f"POPXL_HOST_MALLOC must be keep or default, got {choice!r}.")
    _done = choice == "keep" and _glibc_keeps()
    return _done


def _glibc_keeps() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # The trim threshold first: a raised mmap threshold alone leaves freed blocks at the top
    # of the heap to be trimmed away.
    return bool(mallopt(M_TRIM_THRESHOLD, KEEP_BELOW)) and bool(
        mallopt(M_MMAP_THRESHOLD, KEEP_BELOW)
    )
