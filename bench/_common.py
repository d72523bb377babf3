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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def run_variant(script: str, *args: str) -> dict[str, Any]:
    """Run ``script --variant ...`` in a fresh interpreter; it prints one JSON line last."""
    env = dict(os.environ, PYTHONPATH=ROOT)
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
    import jax  # noqa: PLC0415

    d = jax.devices()[0]
    return (
        f"{d.platform}:{getattr(d, 'device_kind', '')} x{len(jax.devices())}, {os.cpu_count()} CPUs"
    )
