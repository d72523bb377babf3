"""Where a step's buffers come from on the host: each call's, reused by the next.

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

That covers blocks the main thread allocates. Other threads' glibc arenas are heaps of at
most 64 MiB, and a larger block there is mapped afresh whatever the thresholds:
EfficientNet-B0's SGD step, dispatched asynchronously (JAX's default on the CPU: the step
runs on a thread of XLA's client), still took 23,000 faults (90 MiB) and 84-94 ms of
kernel time per call. Run inline on the calling thread (``jax_cpu_enable_async_dispatch``
off), it took one fault and 3 ms, and the step went 141 -> 122 and 165 -> 91 ms (two
pairs of processes, alternated). One arena for every thread (``M_ARENA_MAX``) removed the
faults too but made the steps slower (MobileNetV2 82 -> 120 ms), the threads contending
for it. The runtime's calls wait for their results anyway (a run returns its outputs as
host arrays), so on the CPU, steps are dispatched inline unless ``POPXL_CPU_DISPATCH=async``
or the user has set ``JAX_CPU_ENABLE_ASYNC_DISPATCH``. JAX takes the setting when it makes
its CPU client, so the runtime sets it when the first session is made, before the session
asks JAX for its devices (a process that already ran JAX computations keeps what it has).
With the trim threshold raised, the memory XLA's compiler frees is kept too, though no step
reuses it: ResNet-18's SGD step (batch 8, 64 x 64) left 158 MiB freed but held after its
compilation, and the process's peak went from 1,263 MiB to 1,451 as the first runs then
allocated beside it (2026-11-29). So after each compilation the runtime returns freed memory
to the kernel (``malloc_trim``: about a millisecond), and the runs' buffers are kept from then
on. Importing ``runtime``, ``popxl`` or ``poptorch`` changes neither setting: a library that
changed its host process when imported would surprise the program around it. Computations over several devices stay
asynchronous (JAX's rule): their devices' parts run on threads of their own.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

# mallopt's parameters (malloc.h) and the value set for both.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP_BELOW = 1 << 30


def _choice(name: str, options: tuple[str, str]) -> str:
    """The environment's setting ``name``: the first of ``options`` (the default) or the
    second."""
    value = os.environ.get(name, options[0])
    if value not in options:
        raise ValueError(f"{name} must be {options[0]} or {options[1]}, got {value!r}.")
    return value


def take_host_settings() -> None:
    """Take both settings for this process (once; each later call does nothing): called when
    the first ``popxl.Session`` is made."""
    dispatch_inline()
    keep_freed_memory()


@functools.cache
def dispatch_inline() -> bool:
    """Have JAX run CPU computations on the calling thread unless the user chose otherwise
    (once per process); whether the runtime set it so."""
    import jax  # noqa: PLC0415

    inline = (
        _choice("POPXL_CPU_DISPATCH", ("inline", "async")) == "inline"
        and "JAX_CPU_ENABLE_ASYNC_DISPATCH" not in os.environ
        and not _backends_made()
    )
    if inline:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    return inline


def _backends_made() -> bool:
    """Whether JAX has made its clients (after which the setting no longer applies)."""
    try:
        from jax._src import xla_bridge  # noqa: PLC0415 (no public way to ask)

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return False


@functools.cache
def keep_freed_memory() -> bool:
    """Have glibc keep freed memory for reuse (once per process); whether it now does.

    Taken when the first session is made. ``POPXL_HOST_MALLOC`` is ``keep`` (the default)
    or ``default`` (leave the allocator alone)."""
    return _choice("POPXL_HOST_MALLOC", ("keep", "default")) == "keep" and _glibc_keeps()


def return_freed_memory() -> None:
    """Give the memory glibc holds freed back to the kernel, where the runtime raised the
    trim threshold (after a compilation, whose freed memory no step reuses)."""
    if keep_freed_memory.cache_info().currsize and keep_freed_memory():
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
        if trim is not None:
            trim.argtypes = (ctypes.c_size_t,)
            trim(0)


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
