"""Shared benchmark helpers: timing, peak memory, running a variant in a fresh process."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def set_matmul_precision() -> None:
    """Make both sides of every comparison multiply float32 at one precision: IEEE float32
    by default, popxl's own default (hand-written JAX on a GPU would otherwise use
    TensorFloat-32); ``BENCH_MATMUL_PRECISION=tensorfloat32`` compares both at TF32.
    Called by each benchmark's entry point (a process-wide JAX setting)."""
    jax.config.update(
        "jax_default_matmul_precision", os.environ.get("BENCH_MATMUL_PRECISION", "highest")
    )


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn: Callable[[], Any], repeats: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean seconds per call of ``repeats`` calls."""
    fn()  # warm-up
    results = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        results.append((time.perf_counter() - start) / repeats)
    return statistics.median(results)


def compare(
    project: Callable[[], Any], reference: Callable[[], Any], repeats: int, rounds: int = 7
) -> tuple[float, float]:
    """Seconds per call of each, timed in alternating rounds (so load changes hit both);
    the fastest round of each (interference on a shared machine only adds time)."""
    project()
    reference()
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        for fn, out in ((project, a), (reference, b)):
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            out.append((time.perf_counter() - start) / repeats)
    return min(a), min(b)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child interpreter: this one's, the project first on its path."""
    path = [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **extra)


def run_variant(script: str, *args: str) -> dict[str, Any]:
    """Run ``script --variant ...`` in a fresh interpreter; it prints one JSON line last."""
    env = child_env()
    out = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(rows: list[tuple[str, float, float, str]]) -> None:
    """Print ``(name, project, reference, unit)`` rows with their ratio."""
    print(f"{'benchmark':44s} {'project':>12s} {'reference':>12s} {'ratio':>7s}")
    for name, project, reference, unit in rows:
        ratio = project / reference if reference else float("nan")
        print(f"{name:44s} {project:12.4g} {reference:12.4g} {ratio:7.3f}  {unit}")


def device_name() -> str:
    d = jax.devices()[0]
    return (
        f"{d.platform}:{getattr(d, 'device_kind', '')} x{len(jax.devices())}, {os.cpu_count()} CPUs"
    )


def first_and_median(call: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(first call s, median of the next ``calls`` in ms)."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times) * 1e3
