"""The host allocator keeps freed buffers for the next step (``runtime/host_memory``)."""

from __future__ import annotations

import ctypes
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys

import pytest

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
# Where the kernel backs every large mapping with huge pages, glibc's defaults fault little.
HUGE_PAGES_ALWAYS = os.path.exists(THP) and "[always]" in pathlib.Path(THP).read_text()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _faults_of_second_fill(mib: int) -> int:
    """Minor page faults while filling ``mib`` MiB that ``malloc`` gave after a block of
    the same size was filled and freed (as XLA:CPU's buffers are; numpy's own arrays ask
    for huge pages, which hide the faults)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    size = mib << 20
    first = libc.malloc(size)
    ctypes.memset(first, 1, size)
    libc.free(first)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = libc.malloc(size)
    ctypes.memset(second, 1, size)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    libc.free(second)
    return after - before


def _run(code: str, **env: str) -> str:
    """``code``'s standard output in a fresh interpreter (the allocator is per process)."""
    full = {**os.environ, "PYTHONPATH": ROOT, **env}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, check=True
    )
    return done.stdout.strip()


PROBE = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from test_host_memory import _faults_of_second_fill
from runtime.backend import host_memory
kept = host_memory.keep_freed_memory()
print(kept, _faults_of_second_fill(64))
"""


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's; elsewhere nothing changes")
def test_freed_buffers_are_reused_without_page_faults() -> None:
    # 64 MiB is 16,384 pages: glibc's defaults map them afresh (and fault each one in) on
    # every allocation; kept, the second block reuses the first one's pages.
    kept, faults = _run(PROBE).split()
    assert kept == "True"
    assert int(faults) < 1_000
    default, faults = _run(PROBE, POPXL_HOST_MALLOC="default").split()
    assert default == "False"
    if not HUGE_PAGES_ALWAYS:
        assert int(faults) > 8_000


STEP = """
import resource
from runtime.backend import host_memory
host_memory.take_host_settings()
import jax, jax.numpy as jnp
double = jax.jit(lambda x: x * 2)
x = jnp.ones(80 << 18, jnp.float32)  # 80 MiB: above a thread arena's 64 MiB heaps
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    double(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(host_memory.dispatch_inline(), *faults)
"""


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's; elsewhere nothing changes")
def test_steps_run_inline_and_reuse_their_output_buffers() -> None:
    # Dispatched asynchronously, XLA's client thread maps each call's 80 MiB output afresh
    # (20,480 pages, most calls); inline, the calling thread's heap keeps it for the next
    # call once the heap has grown around it (after one to four calls here), so most of
    # the sixteen calls fault no page in.
    inline, *faults = _run(STEP).split()
    assert inline == "True"
    assert statistics.median(map(int, faults)) < 1_000, faults
    inline, *_ = _run(STEP, POPXL_CPU_DISPATCH="async").split()
    assert inline == "False"


def test_a_users_own_dispatch_setting_wins() -> None:
    code = (
        "import jax; from runtime.backend import host_memory; host_memory.take_host_settings(); "
        "print(host_memory.dispatch_inline(), jax.config.read('jax_cpu_enable_async_dispatch'))"
    )
    assert _run(code) == "True False"
    assert _run(code, JAX_CPU_ENABLE_ASYNC_DISPATCH="1") == "False True"
    assert _run(code, POPXL_CPU_DISPATCH="async") == "False True"


def test_a_session_sets_both_up() -> None:
    code = """
import numpy as np
import popxl
ir = popxl.Ir()
with ir.main_graph:
    x = popxl.variable(np.ones(2, np.float32))
    popxl.ops.host_store(popxl.d2h_stream((2,), popxl.float32), x + 1)
with popxl.Session(ir, "ipu_model"):
    pass
from runtime.backend import host_memory
print(host_memory.keep_freed_memory(), host_memory.dispatch_inline())
"""
    assert _run(code) == f"{GLIBC} True"


def test_importing_changes_no_process_setting() -> None:
    # The settings are taken by the first session, not by an import: a program that only
    # imports popxl, runtime and popxl_addons (and builds an IR) keeps JAX's and glibc's own.
    code = """
import jax, numpy as np
import popxl, popxl_addons, runtime
from runtime.backend import host_memory
ir = popxl.Ir()
with ir.main_graph:
    popxl.variable(np.ones(2, np.float32))
taken = host_memory.keep_freed_memory.cache_info().currsize + host_memory.dispatch_inline.cache_info().currsize
print(taken, jax.config.read("jax_cpu_enable_async_dispatch"))
"""
    assert _run(code) == "0 True"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("POPXL_HOST_MALLOC", "POPXL_HOST_MALLOC must be keep or default, got 'off'"),
        ("POPXL_CPU_DISPATCH", "POPXL_CPU_DISPATCH must be inline or async, got 'off'"),
    ],
)
def test_a_bad_setting_is_named(name: str, message: str) -> None:
    code = "from runtime.backend import host_memory; host_memory.take_host_settings()"
    with pytest.raises(subprocess.CalledProcessError) as raised:
        _run(code, **{name: "off"})
    assert message in raised.value.stderr


TRIM = """
import ctypes
from runtime.backend import host_memory
host_memory.take_host_settings()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20

# Many small blocks (a compiler's way), all freed: glibc keeps them under the raised threshold.
blocks = [libc.malloc(4096) for _ in range(40_000)]
for b in blocks:
    ctypes.memset(b, 1, 4096)
for b in blocks:
    libc.free(b)
held = rss_mib()
host_memory.return_freed_memory()
print(held - rss_mib())
"""


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's; elsewhere nothing changes")
def test_memory_freed_after_a_compilation_goes_back_to_the_kernel() -> None:
    # 160 MiB of small blocks, freed and held; returned, the resident size drops by most of it.
    assert int(_run(TRIM)) > 100
    # With the allocator left alone there is nothing held to return.
    assert int(_run(TRIM, POPXL_HOST_MALLOC="default")) < 20


def test_a_session_returns_freed_memory_after_compiling(monkeypatch) -> None:
    import numpy as np

    import popxl
    from runtime.backend import host_memory

    calls = []
    monkeypatch.setattr(host_memory, "return_freed_memory", lambda: calls.append(1))
    ir = popxl.Ir()
    with ir.main_graph:
        # A program no other test compiles (an identical one would reuse its executable).
        x = popxl.variable(np.ones((5, 11), np.float32))
        popxl.ops.host_store(popxl.d2h_stream((11, 5), popxl.float32), x.transpose() * 3.25)
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
    assert calls == [1]
