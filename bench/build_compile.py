"""Time to first step of a GPT training program, by how the program is written, vs JAX.

The project program comes from ``bench/_gpt_program.py``: one decoder-layer graph bound to
each layer's weights and called per layer, ``addons.autodiff``, the loss from
``addons.ops.cross_entropy_with_grad``, then the optimizer, in one of its patterns
(``--pattern``: per-variable Adam graphs cached by shape, per-layer Adam graphs, inline SGD
or Adam, gradient accumulation, recomputation, pipelining, phased execution, replication).
Timed: IR build + ``popxl.Session`` (lowering and XLA compilation) + writing the weights
(``write_variables_data``) + the first ``session.run``. The reference is the same step in
JAX with ``lax.scan`` over stacked layers: ``jax.jit(step).lower(...).compile()`` and its
first call. Each variant runs in a fresh process; also printed: the CPU seconds the process
used (all threads; the machine's load does not change it) and the compiled step's kernel
count. Hidden 128, 4 heads, sequence 64, vocabulary 1024, micro-batch 1.

Run: python bench/build_compile.py [--pattern NAME|all] [--layers 12,48]
The default pattern is the slowest to compile (``pipelined``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import _gpt_program as gpt  # noqa: E402
from bench._common import device_name, run_variant, set_matmul_precision  # noqa: E402
from bench.transformer_step import kernel_counts  # noqa: E402

WORST = "pipelined"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def project(pattern: str, layers: int) -> dict:
    import popxl

    cfg = gpt.config(pattern, layers)
    tokens, labels = gpt.make_batches(cfg)
    start, cpu = time.perf_counter(), _cpu()
    program = gpt.Program(cfg)
    built = time.perf_counter()
    session = program.session()
    compiled = time.perf_counter()
    with session:
        program.run(session, tokens, labels)
    done = time.perf_counter()
    used = _cpu() - cpu
    kernels = sum(kernel_counts(session._compiled().as_text()).values())
    del popxl
    return {"build_s": built - start, "compile_s": compiled - built, "run_s": done - compiled,
            "cpu_s": used, "kernels": kernels}  # fmt: skip


def reference(pattern: str, layers: int) -> dict:
    cfg = gpt.config(pattern, layers)
    tokens, labels = gpt.make_batches(cfg)
    start, cpu = time.perf_counter(), _cpu()
    ref = gpt.Reference(cfg)
    lowered = ref.fn.lower(ref.state, tokens, labels)
    built = time.perf_counter()
    compiled = lowered.compile()
    done_compile = time.perf_counter()
    ref.state, losses = compiled(ref.state, tokens, labels)
    losses.block_until_ready()
    done = time.perf_counter()
    return {"build_s": built - start, "compile_s": done_compile - built, "run_s": done - done_compile,
            "cpu_s": _cpu() - cpu, "kernels": sum(kernel_counts(compiled.as_text()).values())}  # fmt: skip


def total(figures: dict) -> float:
    return figures["build_s"] + figures["compile_s"] + figures["run_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pattern", default=WORST, choices=[*gpt.PATTERNS, "all"])
    parser.add_argument("--layers", default="12,48", help="comma-separated layer counts")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    layer_counts = [int(n) for n in args.layers.split(",")]
    if args.variant:
        fn = project if args.variant == "project" else reference
        print(json.dumps(fn(args.pattern, layer_counts[0])))
        return
    patterns = gpt.PATTERNS if args.pattern == "all" else (args.pattern,)
    print(f"device: {device_name()}; load average {os.getloadavg()[0]:.1f}")
    head = f"{'pattern':18s} {'layers':>6s} {'build':>6s} {'compile':>7s} {'run':>5s} {'total':>6s}"
    print(
        f"{head} {'jax':>6s} {'ratio':>6s} {'cpu':>5s} {'jax cpu':>7s} {'kernels':>7s} {'jax':>5s}"
    )
    for pattern in patterns:
        for layers in layer_counts:
            common = ["--pattern", pattern, "--layers", str(layers)]
            p = run_variant(__file__, "--variant", "project", *common)
            r = run_variant(__file__, "--variant", "jax", *common)
            print(
                f"{pattern:18s} {layers:6d} {p['build_s']:6.2f} {p['compile_s']:7.2f} "
                f"{p['run_s']:5.2f} {total(p):6.2f} {total(r):6.2f} {total(p) / total(r):6.2f} "
                f"{p['cpu_s']:5.1f} {r['cpu_s']:7.1f} {p['kernels']:7d} {r['kernels']:5d}",
                flush=True,
            )


if __name__ == "__main__":
    set_matmul_precision()
    main()
