"""Tutorial 1: PopXL + popxl_addons basic concepts, ending with MNIST training.

Run: python tutorials/1_basic_concepts/mnist.py [--epochs 1] [--batch-size 8] [--lr 0.05]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from functools import partial

import numpy as np
from tqdm import tqdm

import popxl
import popxl.ops as ops
import popxl_addons as addons
from tutorials.mnist_data import accuracy, default_epochs, get_mnist_data


class Linear(addons.Module):
    """``y = x @ weight + bias``; the weight and bias are variables made by factories."""

    def __init__(self, out_features: int, bias: bool = True):
        super().__init__()
        self.out_features = out_features
        self.bias = bias

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        weight = self.add_variable_input(
            "weight", partial(np.random.normal, 0, 0.02, (x.shape[-1], self.out_features)), x.dtype
        )
        y = x @ weight
        if self.bias:
            bias = self.add_variable_input("bias", partial(np.zeros, y.shape[-1]), x.dtype)
            y = y + bias
        return y


class Net(addons.Module):
    """784 → 512 → 512 → 512 → 10 with GELU. Submodules are inlined into one graph."""

    def __init__(self):
        super().__init__()
        self.fc1 = Linear(512)
        self.fc2 = Linear(512)
        self.fc3 = Linear(512)
        self.fc4 = Linear(10)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        x = x.reshape((-1, 28 * 28))
        x = ops.gelu(self.fc1(x))
        x = ops.gelu(self.fc2(x))
        x = ops.gelu(self.fc3(x))
        return self.fc4(x)


def train_program(batch_size: int, device: str, learning_rate: float):
    """One SGD step per ``session.run``: load a batch, forward, loss, backward, update."""
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((batch_size, 28, 28), popxl.float32, "image")
        label_stream = popxl.h2d_stream((batch_size,), popxl.int32, "labels")
        images = ops.host_load(img_stream)
        labels = ops.host_load(label_stream, "labels")

        facts, fwd_graph = Net().create_graph(images)
        bwd_graph = addons.autodiff(fwd_graph)  # adds activations as forward outputs
        variables = facts.init()

        fwd_info = fwd_graph.bind(variables).call_with_info(images)
        logits = fwd_info.outputs[0]
        loss, dlogits = addons.ops.cross_entropy_with_grad(logits, labels)
        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)

        activations = bwd_graph.grad_graph_info.inputs_dict(fwd_info)
        bwd_info = bwd_graph.call_with_info(dlogits, args=activations)
        grads = bwd_graph.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(fwd_info, bwd_info)
        for variable in variables.tensors:
            ops.scaled_add_(variable, grads[variable], b=-learning_rate)

    ir.num_host_transfers = 1
    return popxl.Session(ir, device), [img_stream, label_stream], variables, loss_stream


def test_program(test_batch_size: int, device: str):
    """Inference only: the same Net with its own variables (weights copied in later)."""
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        in_stream = popxl.h2d_stream((test_batch_size, 28, 28), popxl.float32, "image")
        images = ops.host_load(in_stream)
        facts, graph = Net().create_graph(images)
        variables = facts.init()
        (outputs,) = graph.bind(variables).call(images)
        out_stream = popxl.d2h_stream(outputs.shape, outputs.dtype, "outputs")
        ops.host_store(out_stream, outputs)
    ir.num_host_transfers = 1
    return popxl.Session(ir, device), [in_stream], variables, out_stream


def train(session, input_streams, loss_stream, training_data, epochs: int) -> float:
    loss = float("nan")
    with session:
        for epoch in range(1, epochs + 1):
            print(f"Epoch {epoch}/{epochs}")
            bar = tqdm(training_data, total=len(training_data))
            start = time.perf_counter()
            for step, (images, labels) in enumerate(bar, 1):
                inputs: Mapping[popxl.HostToDeviceStream, np.ndarray] = dict(
                    zip(input_streams, [images, labels])
                )
                loss = float(session.run(inputs)[loss_stream])
                samples_per_s = step * len(labels) / (time.perf_counter() - start)
                bar.set_description(f"Loss:{loss:0.4f}", refresh=False)
                bar.set_postfix(samples_per_s=f"{samples_per_s:.0f}", refresh=False)
    return loss


def evaluate(session, input_streams, out_stream, test_data) -> float:
    total = 0.0
    with session:
        for images, labels in tqdm(test_data, total=len(test_data)):
            output = session.run(dict(zip(input_streams, [images])))
            total += accuracy(output[out_stream], labels)
    return total / len(test_data)


def test_trained(
    train_session, train_variables, test_batch_size: int, device: str, test_data
) -> float:
    """Copy the trained weights into a fresh test program and report its accuracy."""
    trained = train_session.get_tensors_data(train_variables.tensors)
    test_session, test_streams, test_variables, out_stream = test_program(test_batch_size, device)
    # Copy the weights across by name: {train variable: test variable} for matching keys.
    train_to_test = train_variables.to_mapping(test_variables)
    test_session.write_variables_data(
        {test: trained[tr].copy() for tr, test in train_to_test.items()}
    )
    test_accuracy = evaluate(test_session, test_streams, out_stream, test_data)
    print(f"Accuracy on test set: {test_accuracy:0.2f}%")
    return test_accuracy


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PopXL basic concepts: train an MLP on MNIST.")
    parser.add_argument("--batch-size", type=int, default=8, help="training batch size")
    parser.add_argument("--test-batch-size", type=int, default=80, help="test batch size")
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="training epochs (default: 1 on MNIST, 8 on the bundled digits)",
    )
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--device", default="ipu_hw", choices=["ipu_hw", "ipu_model", "cpu"])
    parser.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)
    np.random.seed(args.seed)
    training_data, test_data = get_mnist_data(args.test_batch_size, args.batch_size, args.data_dir)
    epochs = args.epochs or default_epochs(training_data)

    train_session, train_streams, train_variables, loss_stream = train_program(
        args.batch_size, args.device, args.lr
    )
    train(train_session, train_streams, loss_stream, training_data, epochs)
    return test_trained(
        train_session, train_variables, args.test_batch_size, args.device, test_data
    )


if __name__ == "__main__":
    main()
