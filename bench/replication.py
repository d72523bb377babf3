"""Data-parallel training on one device: R replicas vs one replica with an R-times batch.

The MNIST MLP step (gelu MLP 784-512-512-512-10, cross-entropy, SGD) with ``Ir(replication=R)``,
micro-batch 8 per replica and gradients averaged with ``replicated_all_reduce_(..., "mean")``,
against the same program with one replica and batch ``8 R``. Seconds per step; the target
ratio (replicated / single) is <= 1.2.

Also tutorial 3's program (gradient accumulation over 4 micro-batches into running-mean
accumulators, all-reduced in place, then Adam) with R replicas against one replica with an
R-times micro-batch.

Both are timed in this process in alternating rounds; peak resident memory is measured with
each variant alone in a fresh process. Run: python bench/replication.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import (  # noqa: E402
    compare,
    device_name,
    peak_rss_mb,
    report,
    run_variant,
    set_matmul_precision,
    timed,
)

MICRO_BATCH = 8
ACCUMULATION = 4


def step_runner(replicas: int, batch: int):
    """An entered session and a function running one training step."""
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons
    from tutorials import load_tutorial

    Net = load_tutorial("1_basic_concepts").Net
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((batch, 28, 28), popxl.float32, "image")
        label_stream = popxl.h2d_stream((batch,), popxl.int32, "labels")
        x, y = ops.host_load(img_stream), ops.host_load(label_stream)
        facts, fwd = Net().create_graph(x)
        bwd = addons.autodiff(fwd, grads_required=fwd.args.tensors)
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(x)
        loss, dx = addons.ops.cross_entropy_with_grad(info.outputs[0], y)
        grads = bwd.call(dx, args=bwd.grad_graph_info.inputs_dict(info))
        for var, g in zip(variables.tensors, grads):
            if replicas > 1:
                ops.collectives.replicated_all_reduce_(g, "mean")
            ops.scaled_add_(var, g, b=-0.05)
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_stream, loss)
    lead = (replicas,) if replicas > 1 else ()
    rng = np.random.default_rng(0)
    inputs = {
        img_stream: rng.normal(size=lead + (batch, 28, 28)).astype(np.float32),
        label_stream: rng.integers(0, 10, lead + (batch,)).astype(np.int32),
    }
    session = popxl.Session(ir, "ipu_hw")
    session.__enter__()
    return session, lambda: np.asarray(session.run(inputs)[loss_stream]).sum()


def accumulation_runner(replicas: int, micro_batch: int):
    """Tutorial 3's training step (gradient accumulation, all-reduce, Adam): an entered
    session and a function running one step."""
    from tutorials import load_tutorial

    tutorial = load_tutorial("3_data_parallelism")
    session, (images, labels), _, loss = tutorial.train_program(
        micro_batch, ACCUMULATION, replicas, "ipu_hw", 1e-3
    )
    lead = (ACCUMULATION,) + ((replicas,) if replicas > 1 else ())
    rng = np.random.default_rng(0)
    inputs = {
        images: rng.normal(size=lead + images.shape).astype(np.float32),
        labels: rng.integers(0, 10, lead + labels.shape).astype(np.int32),
    }
    session.__enter__()
    return session, lambda: np.asarray(session.run(inputs)[loss]).sum()


def compare_replicated(runner, replicas: int, repeats: int) -> tuple[float, float]:
    """Seconds per step of ``runner``'s program with R replicas and with one replica at an
    R-times (micro-)batch."""
    replicated_session, replicated = runner(replicas, MICRO_BATCH)
    single_session, single = runner(1, MICRO_BATCH * replicas)
    seconds = compare(replicated, single, repeats)
    replicated_session.__exit__(None, None, None)
    single_session.__exit__(None, None, None)
    return seconds


def variant(replicas: int, batch: int) -> None:
    """Run one variant alone (for its peak memory)."""
    session, run = step_runner(replicas, batch)
    seconds = timed(run, 50)
    session.__exit__(None, None, None)
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_rss_mb()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        variant(*args.variant)
        return
    rows = []
    for replicas in (1, 2, 4):
        r, s = compare_replicated(step_runner, replicas, 50)
        name = f"step, R={replicas} x batch {MICRO_BATCH} vs 1 x batch {MICRO_BATCH * replicas}"
        rows.append((name, r, s, "s"))
    for replicas in (2, 4):
        r, s = compare_replicated(accumulation_runner, replicas, 20)
        name = f"GA {ACCUMULATION} + Adam, R={replicas} vs 1 x micro-batch {MICRO_BATCH * replicas}"
        rows.append((name, r, s, "s"))
    for replicas in (2, 4):
        replicated = run_variant(__file__, "--variant", str(replicas), str(MICRO_BATCH))
        single = run_variant(__file__, "--variant", "1", str(MICRO_BATCH * replicas))
        name = f"peak RSS, R={replicas} vs 1 x batch {MICRO_BATCH * replicas}"
        rows.append((name, replicated["peak_rss_mb"], single["peak_rss_mb"], "MiB"))
    print(f"device: {device_name()}")
    report(rows)


if __name__ == "__main__":
    set_matmul_precision()
    main()
