"""Data parallelism over instances: 2 instances x R replicas vs 1 instance x 2R replicas.

Tutorial 3's training step (the MNIST MLP, gradient accumulation over 4 micro-batches of 8
into running-mean accumulators, gradients all-reduced with ``replicated_all_reduce_(...,
"mean")``, then Adam) built with ``Ir(replication="popdist")`` and launched with
``poprun``, so both layouts run the same program through the same runtime path (a
``shard_map`` over one CPU device per replica); only the number of processes differs. A
third row runs the single instance with its replicas mapped by ``jax.vmap`` on one device
(``POPXL_REPLICATION=vmap``, the default when JAX has fewer devices than replicas).

The share spent in collectives is estimated per layout with a second program in the same
processes that does only the all-reduces of the step (the same tensors, shapes and mean),
timed alone: its time per step over the training step's.

Run: python bench/multi_instance.py [--replicas 1 2] (figures in bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import child_env, set_matmul_precision  # noqa: E402

MICRO_BATCH = 8
ACCUMULATION = 4
REPEATS = 10


def training_step():
    """Tutorial 3's step with popdist replication: (session, inputs, variables)."""
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons
    from tutorials import load_tutorial

    Net = load_tutorial("1_basic_concepts").Net
    Adam = load_tutorial("2_custom_optimiser").Adam
    ir = popxl.Ir(replication="popdist")
    with ir.main_graph:
        img_stream = popxl.h2d_stream((MICRO_BATCH, 28, 28), popxl.float32, "image")
        label_stream = popxl.h2d_stream((MICRO_BATCH,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        facts, fwd = Net().create_graph(popxl.TensorSpec((MICRO_BATCH, 28, 28), popxl.float32))
        accum_facts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        variables = facts.init()
        accumulated = accum_facts.init()
        bwd_bound = bwd.bind(accumulated)
        with popxl.in_sequence(True):
            for _ in range(ACCUMULATION):
                images = ops.host_load(img_stream, "image")
                labels = ops.host_load(label_stream, "labels")
                info = fwd.bind(variables).call_with_info(images)
                loss, dlogits = addons.ops.cross_entropy_with_grad(info.outputs[0], labels)
                ops.host_store(loss_stream, loss)
                bwd_bound.call(dlogits, args=bwd.grad_graph_info.inputs_dict(info))
            grads = accumulated.tensors[:-1]
            for g in grads:
                ops.collectives.replicated_all_reduce_(g, op="mean")
            for var, grad in zip(variables.tensors, grads):
                state_facts, opt = Adam(cache=True).create_graph(
                    var, var.spec, lr=1e-3, weight_decay=0.0, bias_correction=False
                )
                opt.bind(state_facts.init()).call(var, grad)
            ops.var_updates.accumulator_scale_(accumulated.mean_accum_counter, 0.0)
    ir.num_host_transfers = ACCUMULATION
    inputs = _inputs(ir, {img_stream: (0.0, 1.0), label_stream: (0, 10)})
    return popxl.Session(ir, "ipu_hw"), inputs, [v.shape for v in variables.tensors]


def collectives_only(shapes):
    """The step's all-reduces alone: one mean all-reduce per weight-shaped variable."""
    import popxl
    import popxl.ops as ops

    ir = popxl.Ir(replication="popdist")
    with ir.main_graph:
        for i, shape in enumerate(shapes):
            v = popxl.variable(np.ones(shape, np.float32), name=f"g{i}")
            ops.collectives.replicated_all_reduce_(v, op="mean")
    return popxl.Session(ir, "ipu_hw")


def _inputs(ir, streams):
    local = ir.instance_replication_factor
    lead = (ACCUMULATION,) + ((local,) if local > 1 else ())
    rng = np.random.default_rng(ir._pb_ir.getSessionOptions().globalReplicaOffset)
    out = {}
    for stream, (low, high) in streams.items():
        if stream.dtype.name == "int32":
            out[stream] = rng.integers(low, high, lead + stream.shape).astype(np.int32)
        else:
            out[stream] = rng.normal(size=lead + stream.shape).astype(np.float32)
    return out


def fastest(fn, repeats: int, rounds: int = 7) -> float:
    """Seconds per call: the fastest of ``rounds`` rounds (interference only adds time)."""
    fn()  # warm-up
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def worker() -> None:
    """One instance: time the training step and the collectives alone (instance 0 prints)."""
    import popdist

    session, inputs, shapes = training_step()
    with session:
        step = fastest(lambda: session.run(inputs), REPEATS)
    comms = collectives_only(shapes)
    with comms:
        # Block on the result, as a training step's host_store of the loss does.
        reduce = fastest(lambda: comms.run() or comms._state[0].block_until_ready(), REPEATS * 4)
    if popdist.getInstanceIndex() == 0:
        print(json.dumps({"step": step, "collectives": reduce}))


def launch(instances: int, replicas: int, mapping: str = "auto") -> dict:
    env = child_env(POPXL_REPLICATION=mapping)
    command = [
        *(sys.executable, "-m", "runtime.distributed.launcher"),
        *("--num-instances", str(instances), "--num-replicas", str(replicas)),
        *("--only-output-from-instance", "0"),
        *(sys.executable, os.path.abspath(__file__), "--worker"),
    ]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{command} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    print(f"{'layout':28s} {'s/step':>9s} {'all-reduce s':>13s} {'share':>6s}")
    for r in args.replicas:
        for instances, per_instance, mapping in (
            (2, r, "auto"),
            (1, 2 * r, "auto"),
            (1, 2 * r, "vmap"),
        ):
            got = launch(instances, instances * per_instance, mapping)
            share = got["collectives"] / got["step"]
            name = f"{instances} instance(s) x {per_instance} replicas"
            name += ", vmap" if mapping == "vmap" else ""
            print(f"{name:28s} {got['step']:9.4f} {got['collectives']:13.5f} {share:6.1%}")


if __name__ == "__main__":
    set_matmul_precision()
    main()
