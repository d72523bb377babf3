"""Tutorial 2: a custom Adam optimiser as an addons Module, with graph caching.

Run: python tutorials/2_custom_optimiser/mnist.py [--epochs N] [--lr 1e-3]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np
from tqdm import tqdm

import popxl
import popxl.ops as ops
import popxl_addons as addons
from tutorials import load_tutorial
from tutorials.mnist_data import default_epochs, get_mnist_data

# The model, test program and evaluation loop are tutorial 1's.
basics = load_tutorial("1_basic_concepts")
Net = basics.Net


class Adam(addons.Module):
    """Adam on one variable. Its state (moments, step) are variables passed by reference.

    ``lr`` may be a float (baked into the graph) or a ``TensorSpec`` (a graph input, so it
    can change between steps without recompiling). With ``cache=True`` one graph serves
    every variable with the same shape, dtype and hyper-parameters.
    """

    @popxl.in_sequence()  # the ops are in place: keep them in program order
    def build(
        self,
        var: popxl.TensorByRef,
        grad: popxl.Tensor,
        *,
        lr: float | popxl.Tensor,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-5,
        weight_decay: float = 0.0,
        first_order_dtype: popxl.dtype = popxl.float16,
        bias_correction: bool = True,
    ) -> None:
        first_order = self.add_variable_input(
            "first_order", partial(np.zeros, var.shape), first_order_dtype, by_ref=True
        )
        ops.var_updates.accumulate_moving_average_(first_order, grad, f=beta1)
        second_order = self.add_variable_input(
            "second_order", partial(np.zeros, var.shape), popxl.float32, by_ref=True
        )
        ops.var_updates.accumulate_moving_average_square_(second_order, grad, f=beta2)
        step = None
        if bias_correction:
            step = self.add_variable_input(
                "step", partial(np.zeros, ()), popxl.float32, by_ref=True
            )
        updater = ops.var_updates.adam_updater(
            first_order,
            second_order,
            weight=var,
            weight_decay=weight_decay,
            time_step=step,
            beta1=beta1,
            beta2=beta2,
            epsilon=eps,
        )
        ops.scaled_add_(var, updater, b=-lr)


def optimiser_step(
    variables: addons.NamedTensors, grads: dict, optimiser: Adam, learning_rate: float
) -> None:
    """One Adam update per variable; variables of equal shape share one cached graph."""
    for name, var in variables.named_tensors.items():
        facts, graph = optimiser.create_graph(
            var, var.spec, lr=learning_rate, weight_decay=0.0, bias_correction=False
        )
        state = facts.init(prefix=f"{name}.adam")
        graph.bind(state).call(var, grads[var])


def train_program(batch_size: int, device: str, learning_rate: float):
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((batch_size, 28, 28), popxl.float32, "image")
        label_stream = popxl.h2d_stream((batch_size,), popxl.int32, "labels")
        images = ops.host_load(img_stream)
        labels = ops.host_load(label_stream, "labels")

        facts, fwd_graph = Net().create_graph(images)
        bwd_graph = addons.autodiff(fwd_graph)
        variables = facts.init()

        fwd_info = fwd_graph.bind(variables).call_with_info(images)
        loss, dlogits = addons.ops.cross_entropy_with_grad(fwd_info.outputs[0], labels)
        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)

        bwd_info = bwd_graph.call_with_info(
            dlogits, args=bwd_graph.grad_graph_info.inputs_dict(fwd_info)
        )
        grads = bwd_graph.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(fwd_info, bwd_info)
        optimiser_step(variables, grads, Adam(cache=True), learning_rate)
    ir.num_host_transfers = 1
    return popxl.Session(ir, device), [img_stream, label_stream], variables, loss_stream


def demo_single_variable() -> None:
    """Show the optimiser graphs and one update of a single variable."""
    ir = popxl.Ir()
    with ir.main_graph:
        var = popxl.variable(np.ones((2, 2)), popxl.float32, name="var")
        grad = popxl.constant(0.1 * np.ones((2, 2)), popxl.float32, name="grad")
        adam = Adam(cache=True)
        facts, graph = adam.create_graph(var, var.spec, lr=1e-3)
        print(graph.print_schedule())
        state = facts.init()
        graph.bind(state).call(var, grad)
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
    for name, value in zip(state.named_tensors, session.get_tensors_data(state.tensors).values()):
        print(f"{name}: {value.ravel()[0]}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PopXL custom optimiser: MNIST with Adam.")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--test-batch-size", type=int, default=80)
    parser.add_argument(
        "--epochs", type=int, default=None, help="default: 1 on MNIST, 8 on the bundled digits"
    )
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--device", default="ipu_hw", choices=["ipu_hw", "ipu_model", "cpu"])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--demo", action="store_true", help="also show the single-variable demo")
    return parser.parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)
    np.random.seed(args.seed)
    if args.demo:
        demo_single_variable()
    training_data, test_data = get_mnist_data(args.test_batch_size, args.batch_size, args.data_dir)
    epochs = args.epochs or default_epochs(training_data)

    session, streams, variables, loss_stream = train_program(args.batch_size, args.device, args.lr)
    with session:
        for epoch in range(1, epochs + 1):
            print(f"Epoch {epoch}/{epochs}")
            bar = tqdm(training_data, total=len(training_data))
            start = time.perf_counter()
            for step, (images, labels) in enumerate(bar, 1):
                loss = float(session.run(dict(zip(streams, [images, labels])))[loss_stream])
                bar.set_description(f"Loss:{loss:0.4f}", refresh=False)
                bar.set_postfix(
                    samples_per_s=f"{step * len(labels) / (time.perf_counter() - start):.0f}",
                    refresh=False,
                )
    return basics.test_trained(session, variables, args.test_batch_size, args.device, test_data)


if __name__ == "__main__":
    main()
