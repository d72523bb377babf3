"""MNIST training step: the seed tutorial's program vs the same step in hand-written JAX.

Modes: one ``session.run`` per step (loss read back each step) vs a jitted step; 100 steps per
run (``repeat_graph`` + ``num_host_transfers = 100``) vs ``lax.scan``; and batch-80 inference.
Throughputs are steps (or batches) per second, measured in this process in alternating
rounds; ratio = project / reference (higher is better, target >= 0.95). Peak memory is
measured in separate processes, one per variant.

Run: python bench/mnist_step.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

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

BATCH, TEST_BATCH, LR, STEPS = 8, 80, 0.05, 100
SIZES = [(784, 512), (512, 512), (512, 512), (512, 10)]


def make_data(n_batches: int, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(n_batches, batch, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, (n_batches, batch)).astype(np.int32)
    return images, labels


def initial_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = {}
    for i, (a, b) in enumerate(SIZES, 1):
        weights[f"fc{i}.weight"] = rng.normal(0, 0.02, (a, b)).astype(np.float32)
        weights[f"fc{i}.bias"] = np.zeros(b, np.float32)
    return weights


# The project: the seed's program -------------------------------------------------------


def project_programs(steps_per_run: int, test: bool):
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons
    from popxl_addons.transforms.repeat_graph import repeat_graph

    class Linear(addons.Module):
        def __init__(self, out_features: int):
            super().__init__()
            self.out_features = out_features

        def build(self, x):
            w = self.add_variable_input(
                "weight",
                partial(np.random.normal, 0, 0.02, (x.shape[-1], self.out_features)),
                x.dtype,
            )
            b = self.add_variable_input("bias", partial(np.zeros, self.out_features), x.dtype)
            return x @ w + b

    class Net(addons.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3, self.fc4 = (
                Linear(512),
                Linear(512),
                Linear(512),
                Linear(10),
            )

        def build(self, x):
            x = x.reshape((-1, 28 * 28))
            x = ops.gelu(self.fc1(x))
            x = ops.gelu(self.fc2(x))
            x = ops.gelu(self.fc3(x))
            return self.fc4(x)

    ir = popxl.Ir()
    with ir.main_graph:
        if test:
            img_stream = popxl.h2d_stream((TEST_BATCH, 28, 28), popxl.float32, "image")
            x = ops.host_load(img_stream)
            facts, graph = Net().create_graph(x)
            variables = facts.init()
            (out,) = graph.bind(variables).call(x)
            out_stream = popxl.d2h_stream(out.shape, out.dtype, "out")
            ops.host_store(out_stream, out)
            streams = [img_stream]
        else:
            img_stream = popxl.h2d_stream((BATCH, 28, 28), popxl.float32, "image")
            label_stream = popxl.h2d_stream((BATCH,), popxl.int32, "labels")
            x = ops.host_load(img_stream)
            labels = ops.host_load(label_stream, "labels")
            facts, fwd = Net().create_graph(x)
            bwd = addons.autodiff(fwd)
            variables = facts.init()
            info = fwd.bind(variables).call_with_info(x)
            loss, dx = addons.ops.cross_entropy_with_grad(info.outputs[0], labels)
            out_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
            ops.host_store(out_stream, loss)
            bwd_info = bwd.call_with_info(dx, args=bwd.grad_graph_info.inputs_dict(info))
            grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, bwd_info)
            for t in variables.tensors:
                ops.scaled_add_(t, grads[t], b=-LR)
            streams = [img_stream, label_stream]
    if steps_per_run > 1:
        repeat_graph(ir.main_graph, steps_per_run)
    ir.num_host_transfers = steps_per_run
    session = popxl.Session(ir, "ipu_hw")
    weights = initial_weights()
    session.write_variables_data({variables[k]: v for k, v in weights.items()})
    return session, streams, out_stream


REPEATS = {"step": 200, "scan": 3, "infer": 200}
WORK = {"step": 1, "scan": STEPS, "infer": 1}


def project_runner(mode: str):
    """A session (entered) and a function running one unit of work; the caller exits it."""
    if mode == "step":
        session, streams, loss_stream = project_programs(1, test=False)
        images, labels = make_data(1, BATCH)
        inputs = {streams[0]: images[0], streams[1]: labels[0]}
        return session, lambda: float(session.run(inputs)[loss_stream])
    if mode == "scan":
        session, streams, loss_stream = project_programs(STEPS, test=False)
        images, labels = make_data(STEPS, BATCH)
        inputs = {streams[0]: images, streams[1]: labels}
        return session, lambda: session.run(inputs)[loss_stream].sum()
    session, streams, out_stream = project_programs(1, test=True)
    images, _ = make_data(1, TEST_BATCH)
    return session, lambda: session.run({streams[0]: images[0]})[out_stream].sum()


# The reference: the same computations written directly in JAX -------------------------------


def forward(params, x):
    import jax

    x = x.reshape((-1, 784))
    for i in range(1, 4):
        x = jax.nn.gelu(x @ params[f"fc{i}.weight"] + params[f"fc{i}.bias"], approximate=True)
    return x @ params["fc4.weight"] + params["fc4.bias"]


def loss_fn(params, x, y):
    import jax
    import jax.numpy as jnp

    probs = jax.nn.softmax(forward(params, x), axis=-1)
    picked = jnp.take_along_axis(probs, y[:, None], axis=1)[:, 0]
    return -jnp.mean(jnp.log(picked + 1e-7))


def sgd_step(params, x, y):
    import jax

    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), loss


def reference_runner(mode: str):
    import jax

    params = {k: jax.device_put(v) for k, v in initial_weights().items()}
    if mode == "step":
        step = jax.jit(sgd_step, donate_argnums=(0,))
        images, labels = make_data(1, BATCH)
        state = {"p": params}

        def run():
            state["p"], loss = step(state["p"], images[0], labels[0])
            return float(loss)

        return run
    if mode == "scan":

        def many(params, xs, ys):
            def body(p, xy):
                return sgd_step(p, *xy)

            return jax.lax.scan(body, params, (xs, ys))

        run_many = jax.jit(many, donate_argnums=(0,))
        images, labels = make_data(STEPS, BATCH)
        state = {"p": params}

        def run():
            state["p"], losses = run_many(state["p"], images, labels)
            return np.asarray(losses).sum()

        return run
    infer = jax.jit(forward)
    images, _ = make_data(1, TEST_BATCH)
    return lambda: np.asarray(infer(params, images[0])).sum()


def variant(impl: str, mode: str) -> None:
    """Run one variant alone (for its peak memory)."""
    if impl == "project":
        session, run = project_runner(mode)
        with session:
            seconds = timed(run, REPEATS[mode])
    else:
        seconds = timed(reference_runner(mode), REPEATS[mode])
    print(json.dumps({"per_s": WORK[mode] / seconds, "peak_rss_mb": peak_rss_mb()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", nargs=2, metavar=("IMPL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        variant(*args.variant)
        return
    rows, memory = [], []
    names = {
        "step": "train step/s (1 step per run)",
        "scan": "train step/s (100 steps per run)",
        "infer": "inference batches/s (batch 80)",
    }
    for mode in ("step", "scan", "infer"):
        session, project = project_runner(mode)
        with session:
            p, r = compare(project, reference_runner(mode), REPEATS[mode])
        rows.append((names[mode], WORK[mode] / p, WORK[mode] / r, "/s"))
    for mode in ("step", "scan", "infer"):
        project = run_variant(__file__, "--variant", "project", mode)
        reference = run_variant(__file__, "--variant", "jax", mode)
        memory.append(
            (f"peak RSS, {mode}", project["peak_rss_mb"], reference["peak_rss_mb"], "MiB")
        )
    print(f"device: {device_name()}")
    report(rows + memory)


if __name__ == "__main__":
    set_matmul_precision()
    main()
