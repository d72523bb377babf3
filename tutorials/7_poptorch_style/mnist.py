"""Tutorial 7: PopTorch's training loop on the explicit IR.

The loop of PopTorch's introduction (a DataLoader feeding deviceIterations batches per
call, a training wrapper, a momentum loss, and a smaller learning rate set with
setOptimizer once the loss is low), written with ``poptorch`` around a
popxl_addons ``Module``; then the program it built is printed, and an inference model of
the same module (which shares the trained weights) is tested.

Run: python tutorials/7_poptorch_style/mnist.py [--digits] [--epochs 3] [--print-program]
"""

from __future__ import annotations

import argparse

import numpy as np

import poptorch
import popxl
import popxl_addons as addons
from popxl_addons.ops.cross_entropy import cross_entropy
from tutorials import load_tutorial
from tutorials.mnist_data import Batches, accuracy, default_epochs, digits_as_mnist, get_mnist_data

Net = load_tutorial("1_basic_concepts").Net


class Digits:
    """A map-style dataset of (image, label) samples."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.images[i], self.labels[i]


class ClassifierWithLoss(addons.Module):
    """The network and its loss in one module, as PopTorch models carry their loss."""

    def __init__(self):
        super().__init__()
        self.net = Net()

    def build(self, images: popxl.Tensor, labels: popxl.Tensor):
        logits = self.net(images)
        losses = cross_entropy(logits, labels, reduction="none")
        return logits, poptorch.identity_loss(losses, reduction="mean")


def train(args: argparse.Namespace, dataset: Digits, model: ClassifierWithLoss):
    """The seed's loop: returns the training executor."""
    opts = poptorch.Options().deviceIterations(10).randomSeed(args.seed)
    training_data = poptorch.DataLoader(
        options=opts, dataset=dataset, batch_size=args.batch_size, shuffle=True, drop_last=True
    )
    optimizer = poptorch.optim.AdamW(lr=args.lr)
    poptorch_model = poptorch.trainingModel(model, options=opts, optimizer=optimizer)
    momentum_loss = None
    switched = False
    for epoch in range(1, args.epochs + 1):
        for batch, target in training_data:
            # Forward, loss, backward and update of 10 batches in one call on the device.
            _, loss = poptorch_model(batch, target)
            if momentum_loss is None:
                momentum_loss = loss
            else:
                momentum_loss = momentum_loss * 0.95 + loss * 0.05
            # The optimizer can be updated with setOptimizer (no recompilation).
            if momentum_loss < args.switch_loss:
                poptorch_model.setOptimizer(poptorch.optim.AdamW(lr=args.lr / 10))
                if not switched:
                    print(f"momentum loss {float(momentum_loss):.3f}: lr now {args.lr / 10:g}")
                    switched = True
        print(f"Epoch {epoch}/{args.epochs}: momentum loss {float(momentum_loss):.4f}")
    return poptorch_model


def test(model: ClassifierWithLoss, images: np.ndarray, labels: np.ndarray, batch: int) -> float:
    """Accuracy of an inference model of the same module (it shares the trained weights)."""
    opts = poptorch.Options()
    inference = poptorch.inferenceModel(model, opts)
    loader = poptorch.DataLoader(opts, Digits(images, labels), batch_size=batch)
    correct = []
    for x, y in loader:
        logits, _ = inference(x, y)
        correct.append(accuracy(logits, y) * len(y))
    result = sum(correct) / (len(loader) * batch)
    print(f"Accuracy on test set: {result:0.2f}%")
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PopTorch-style training on the explicit IR.")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--test-batch-size", type=int, default=40)
    parser.add_argument(
        "--epochs", type=int, default=None, help="default: 1 on MNIST, 5 on the bundled digits"
    )
    parser.add_argument("--digits", action="store_true", help="use the bundled digits")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--switch-loss", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--print-program", action="store_true", help="print the whole program")
    return parser.parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)
    if args.digits:
        x_train, y_train, x_test, y_test = digits_as_mnist(seed=args.seed)
        training = Batches(x_train, y_train, args.batch_size, source="digits")
        testing = Batches(x_test, y_test, args.test_batch_size, source="digits")
    else:
        training, testing = get_mnist_data(args.test_batch_size, args.batch_size, args.data_dir)
    args.epochs = args.epochs or default_epochs(training, mnist_epochs=1, digits_epochs=5)
    model = ClassifierWithLoss()
    poptorch_model = train(args, Digits(training.images, training.labels), model)
    schedule = poptorch_model.print_schedule()
    print("The program trainingModel built (main graph):")
    print(schedule if args.print_program else schedule.split("\nGraph")[0])
    return test(model, testing.images, testing.labels, args.test_batch_size)


if __name__ == "__main__":
    main()
