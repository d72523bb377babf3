"""Tutorial 5: remote variables and replicated tensor sharding (RTS).

Data-parallel MNIST training whose Adam state lives in remote buffers (streaming memory),
sharded across the replicas, with large weights updated shard by shard.

Run: python tutorials/5_remote_variables_and_rts/mnist.py [--demo] [--data-parallel 4]
"""

from __future__ import annotations

import argparse

import numpy as np
from tqdm import tqdm

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.optimizers import AdamOptimizerStep
from popxl_addons.rts import reduce_replica_sharded_graph
from tutorials import load_tutorial
from tutorials.mnist_data import get_mnist_data

basics = load_tutorial("1_basic_concepts")
parallel = load_tutorial("3_data_parallelism")
Net = basics.Net


def demo_remote_variables() -> None:
    """A variable kept in a remote buffer: load it, use it, update it, store it back."""

    class Add(addons.Module):
        def build(self, x: popxl.Tensor) -> popxl.Tensor:
            w = self.add_variable_input("weight", lambda: np.ones(x.shape, np.float32), x.dtype)
            return x + w

    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(np.ones(5, np.float32), name="x")
        facts, graph = Add().create_graph(x)
        # Two entries: two independent sets of weights for the same graph.
        buffers = addons.named_variable_buffers(facts, entries=2, shard_over_dict=False)
        first, second = (
            facts.init_remote(buffers, 0, "first"),
            facts.init_remote(buffers, 1, "second"),
        )
        load, names = addons.load_remote_graph(buffers, entries=2)
        store = addons.store_remote_graph(buffers, entries=2)
        print(load.print_schedule())
        print(store.print_schedule())
        weights = addons.NamedTensors.pack(names, load.call(0))
        (y,) = graph.bind(weights).call(x)
        out = addons.ops.host_store(y)
        weights.weight += 1.0 / 3.0
        store.bind(weights).call(0)
    with popxl.Session(ir, "ipu_model") as session:
        print("out:", session.run()[out][0], "then", session.run()[out][0])
    print(
        "first.weight:",
        session.get_tensor_data(first.weight)[0],
        "second.weight:",
        session.get_tensor_data(second.weight)[0],
    )


def demo_replica_groupings() -> None:
    ir = popxl.Ir(replication=8)
    for stride, group_size in [(1, 4), (2, 2), (4, None), (1, 2), (2, 4)]:
        rg = ir.replica_grouping(stride=stride, group_size=group_size)
        print(f"{rg}: assignment {rg.assignment}, transpose {rg.transpose().assignment}")


def shard_groups(
    variables: addons.NamedTensors, group: popxl.ReplicaGrouping, threshold: int
) -> dict:
    """Which variables to shard: big enough and evenly divisible (sorted by key)."""
    size = group.group_size
    return {
        key: group
        for key, t in sorted(variables.to_dict().items())
        if t.nelms >= threshold and t.nelms % size == 0
    }


def train_program(
    micro_batch: int, accumulation: int, replicas: int, threshold: int, device: str, lr: float
):
    ir = popxl.Ir(replication=replicas)
    rg = ir.replica_grouping()
    with ir.main_graph:
        img_stream = popxl.h2d_stream((micro_batch, 28, 28), popxl.float32, "image")
        label_stream = popxl.h2d_stream((micro_batch,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")

        facts, fwd = Net().create_graph(popxl.TensorSpec((micro_batch, 28, 28), popxl.float32))
        accum_facts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        variables = facts.init()
        accumulated = accum_facts.init()
        sharded = shard_groups(variables, rg, threshold)

        with popxl.in_sequence(True):
            for _ in range(accumulation):
                images = ops.host_load(img_stream, "image")
                labels = ops.host_load(label_stream, "labels")
                fwd_info = fwd.bind(variables).call_with_info(images)
                loss, dlogits = addons.ops.cross_entropy_with_grad(fwd_info.outputs[0], labels)
                ops.host_store(loss_stream, loss)
                bwd.bind(accumulated).call(dlogits, args=bwd.grad_graph_info.inputs_dict(fwd_info))

            # Mean over replicas; sharded variables get only their shard of the gradient.
            groups = addons.NamedReplicaGrouping.from_dict(
                {k: sharded.get(k, ir.replica_grouping(group_size=1)) for k in variables.to_dict()}
            )
            reduce, names = reduce_replica_sharded_graph(
                accumulated.accum, "mean", shard_groups=groups, replica_group=rg
            )
            grads = addons.NamedTensors.pack(names, reduce.bind(accumulated.accum).call())

            adam = AdamOptimizerStep(cache=True)
            for key, var in variables.named_tensors.items():
                remote_step(adam, key, var, grads[key], sharded.get(key), lr)
            ops.var_updates.accumulator_scale_(accumulated.mean_accum_counter, 0.0)
    ir.num_host_transfers = accumulation
    return popxl.Session(ir, device), (img_stream, label_stream), variables, loss_stream


def remote_step(
    adam: AdamOptimizerStep, key: str, var: popxl.Tensor, grad: popxl.Tensor, group, lr: float
) -> None:
    """Load the optimiser state from streaming memory, update, store it back.

    A sharded variable is updated through its shard, then gathered back into the full
    variable on every replica.
    """
    target = ops.collectives.replica_sharded_slice(var, group=group) if group else var
    opt_facts, opt = adam.create_graph(target, target.spec, lr=lr, weight_decay=0.0)
    # Moments of a sharded variable are already shards; nothing else is sharded again.
    buffers = addons.named_variable_buffers(opt_facts, entries=1, shard_over_dict=False)
    opt_facts.init_remote(buffers, 0, prefix=f"{key}.adam")
    load, names = addons.load_remote_graph(buffers)
    state = addons.NamedTensors.pack(names, load.call(0))
    opt.bind(state).call(target, grad)
    addons.store_remote_graph(buffers).bind(state).call(0)
    if group:
        full = ops.collectives.replicated_all_gather(target, group=group)
        ops.var_updates.copy_var_update_(var, full)


def parse_args(argv=None) -> argparse.Namespace:
    description = "PopXL remote variables and RTS on MNIST."
    parser = parallel.parallel_parser(description, data_parallel=4, digits_epochs=40)
    parser.add_argument("--sharded-threshold", type=int, default=512)
    parser.add_argument(
        "--demo", action="store_true", help="show remote variables and replica groupings first"
    )
    return parser.parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)
    np.random.seed(args.seed)
    if args.demo:
        demo_remote_variables()
        demo_replica_groupings()
    mb, ga, dp = args.train_micro_batch_size, args.gradient_accumulation, args.data_parallel
    training_data, test_data = get_mnist_data(args.test_batch_size, mb * ga * dp, args.data_dir)
    epochs = args.epochs or (1 if training_data.source == "mnist" else 40)

    session, streams, variables, loss_stream = train_program(
        mb, ga, dp, args.sharded_threshold, args.device, args.lr
    )
    with session:
        for epoch in range(1, epochs + 1):
            print(f"Epoch {epoch}/{epochs}")
            bar = tqdm(parallel.global_batches(training_data, mb, ga, dp), total=len(training_data))
            for images, labels in bar:
                losses = session.run(dict(zip(streams, (images, labels))))[loss_stream]
                bar.set_description(f"Loss:{float(np.mean(losses)):0.4f}", refresh=False)
    accuracy = basics.test_trained(session, variables, args.test_batch_size, args.device, test_data)
    if args.throughput:  # after testing: it trains on dummy data
        parallel.evaluate_throughput(session, mb * ga * dp)
    return accuracy


if __name__ == "__main__":
    main()
