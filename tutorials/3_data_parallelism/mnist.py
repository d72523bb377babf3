"""Tutorial 3: data parallelism (replicas) and gradient accumulation.

Run: python tutorials/3_data_parallelism/mnist.py [--data-parallel 2] [--gradient-accumulation 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tqdm import tqdm

import popxl
import popxl.ops as ops
import popxl_addons as addons
from tutorials import load_tutorial
from tutorials.mnist_data import get_mnist_data

basics = load_tutorial("1_basic_concepts")
Adam = load_tutorial("2_custom_optimiser").Adam
Net = basics.Net


def train_program(micro_batch: int, accumulation: int, replicas: int, device: str, lr: float):
    """One optimiser step per run: ``accumulation`` micro-batches per replica, gradients
    averaged over micro-batches (accumulators) and over replicas (all-reduce), then Adam."""
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((micro_batch, 28, 28), popxl.float32, "image")
        label_stream = popxl.h2d_stream((micro_batch,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")

        facts, fwd = Net().create_graph(popxl.TensorSpec((micro_batch, 28, 28), popxl.float32))
        if accumulation > 1:
            accum_facts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        else:
            bwd = addons.autodiff(fwd, grads_required=fwd.args.tensors)
        variables = facts.init()
        grads = None
        if accumulation > 1:
            accumulated = accum_facts.init()
            bwd_bound = bwd.bind(accumulated)
        else:
            bwd_bound = bwd.bind()

        # Every host_load below is one host transfer: ir.num_host_transfers = accumulation.
        with popxl.in_sequence(True):
            for _ in range(accumulation):
                images = ops.host_load(img_stream, "image")
                labels = ops.host_load(label_stream, "labels")
                fwd_info = fwd.bind(variables).call_with_info(images)
                loss, dlogits = addons.ops.cross_entropy_with_grad(fwd_info.outputs[0], labels)
                ops.host_store(loss_stream, loss)
                grads = bwd_bound.call(dlogits, args=bwd.grad_graph_info.inputs_dict(fwd_info))
            if accumulation > 1:
                # The accumulators hold running means; `.tensors[:-1]` drops the counter
                # (accumulators are named accum.*, which sorts before mean_accum_counter).
                grads = accumulated.tensors[:-1]
            for g in grads:
                if replicas > 1:
                    ops.collectives.replicated_all_reduce_(g, op="mean")
            adam = Adam(cache=True)
            for var, grad in zip(variables.tensors, grads):
                state_facts, opt = adam.create_graph(
                    var, var.spec, lr=lr, weight_decay=0.0, bias_correction=False
                )
                opt.bind(state_facts.init()).call(var, grad)
            if accumulation > 1:
                ops.var_updates.accumulator_scale_(accumulated.mean_accum_counter, 0.0)
    ir.num_host_transfers = accumulation
    return popxl.Session(ir, device), (img_stream, label_stream), variables, loss_stream


def global_batches(batches, micro_batch: int, accumulation: int, replicas: int):
    """Reshape global batches to the host layout ``(GA, DP, micro_batch, ...)`` (size-1 dims
    dropped, as the session expects)."""
    for images, labels in batches:
        shape = (accumulation, replicas, micro_batch)
        keep = tuple(d for d in shape[:2] if d > 1) + (micro_batch,)
        yield images.reshape(keep + images.shape[1:]), labels.reshape(keep)


def evaluate_throughput(session, samples_per_step: int, runs: int = 5) -> float:
    """Time ``runs`` steps on all-ones inputs; print and return samples per second."""
    nht, replicas = session.ir.num_host_transfers, session.ir.replication_factor
    lead = tuple(d for d in (nht, replicas) if d > 1)
    inputs = {s: np.ones(lead + s.shape, s.dtype.as_numpy()) for s in session.expected_inputs()}
    with session:
        session.run(inputs)  # warm-up
        start = time.perf_counter()
        for _ in range(runs):
            session.run(inputs)
        duration = (time.perf_counter() - start) / runs
    throughput = samples_per_step / duration
    print(f"Mean duration: {duration:.4f} s Throughput: {throughput:.1f} samples/s")
    return throughput


def parallel_parser(
    description: str, data_parallel: int, digits_epochs: int
) -> argparse.ArgumentParser:
    """The command-line flags of the replicated tutorials."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--train-micro-batch-size", type=int, default=8)
    parser.add_argument("--gradient-accumulation", type=int, default=4)
    parser.add_argument("--data-parallel", type=int, default=data_parallel)
    parser.add_argument("--test-batch-size", type=int, default=80)
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help=f"default: 1 on MNIST, {digits_epochs} on the bundled digits",
    )
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--device", default="ipu_hw", choices=["ipu_hw", "ipu_model", "cpu"])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--throughput", action="store_true", help="also measure training throughput"
    )
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    description = "PopXL data parallelism and gradient accumulation on MNIST."
    return parallel_parser(description, data_parallel=2, digits_epochs=30).parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)
    np.random.seed(args.seed)
    mb, ga, dp = args.train_micro_batch_size, args.gradient_accumulation, args.data_parallel
    global_batch = mb * ga * dp
    print(
        f"global batch = micro batch {mb} x gradient accumulation {ga} x data parallel {dp} = {global_batch}"
    )
    training_data, test_data = get_mnist_data(args.test_batch_size, global_batch, args.data_dir)
    epochs = args.epochs or (1 if training_data.source == "mnist" else 30)

    session, streams, variables, loss_stream = train_program(mb, ga, dp, args.device, args.lr)
    with session:
        for epoch in range(1, epochs + 1):
            print(f"Epoch {epoch}/{epochs}")
            bar = tqdm(global_batches(training_data, mb, ga, dp), total=len(training_data))
            for images, labels in bar:
                losses = session.run(dict(zip(streams, (images, labels))))[loss_stream]
                bar.set_description(f"Loss:{float(np.mean(losses)):0.4f}", refresh=False)
    accuracy = basics.test_trained(session, variables, args.test_batch_size, args.device, test_data)
    if args.throughput:  # after testing: it trains on dummy data
        evaluate_throughput(session, global_batch)
    return accuracy


if __name__ == "__main__":
    main()
