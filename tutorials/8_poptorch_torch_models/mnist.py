"""Tutorial 8: a real ``torch.nn`` CNN, captured into the explicit IR and run by poptorch.

PopTorch's introduction, with an ordinary PyTorch model: the CNN below is plain
``torch.nn``; ``poptorch.inferenceModel`` / ``poptorch.trainingModel`` capture its
``forward`` (``torch.export``, core ATen) into a ``popxl.Ir`` that this script prints, and
run it as one compiled step per call. The trained weights come back into the same
``torch.nn.Module``, so plain PyTorch can use them afterwards.

Run: python tutorials/8_poptorch_torch_models/mnist.py [--digits] [--epochs 3] [--print-program]
"""

from __future__ import annotations

import argparse

import torch

import poptorch
from tutorials.mnist_data import Batches, default_epochs, digits_as_mnist, get_mnist_data


class Network(torch.nn.Module):
    """Two convolution blocks and a classifier: 28x28 digits -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.block1 = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, kernel_size=5), torch.nn.MaxPool2d(2), torch.nn.ReLU()
        )
        self.block2 = torch.nn.Sequential(
            torch.nn.Conv2d(16, 32, kernel_size=5), torch.nn.MaxPool2d(2), torch.nn.ReLU()
        )
        self.classifier = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(32 * 4 * 4, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.block2(self.block1(x)))


class TrainingModelWithLoss(torch.nn.Module):
    """The network plus its loss, as PopTorch training models carry their loss."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        output = self.model(x)
        if labels is None:
            return output
        return output, self.loss(output, labels)


def as_dataset(batches: Batches) -> torch.utils.data.TensorDataset:
    images = torch.from_numpy(batches.images).float().unsqueeze(1)  # (n, 1, 28, 28)
    labels = torch.from_numpy(batches.labels).long()
    return torch.utils.data.TensorDataset(images, labels)


def show_inference_program(model: Network, dataset: torch.utils.data.Dataset) -> None:
    """Capture the untrained network for inference and print the program it became."""
    inference = poptorch.inferenceModel(model)
    images, _ = dataset[0]
    inference(images.unsqueeze(0))
    schedule = inference.print_schedule()
    forward = schedule[schedule.index("Graph : Network") :]
    print("The program inferenceModel captured (the network's graph):")
    print("\n".join(forward.splitlines()[:12]) + "\n    ...")
    inference.destroy()


def train(args: argparse.Namespace, dataset: torch.utils.data.Dataset, model: Network):
    opts = poptorch.Options().deviceIterations(args.device_iterations).randomSeed(args.seed)
    training_data = poptorch.DataLoader(
        opts, dataset, batch_size=args.batch_size, shuffle=True, drop_last=True
    )
    model_with_loss = TrainingModelWithLoss(model)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    poptorch_model = poptorch.trainingModel(model_with_loss, opts, optimizer)
    for epoch in range(1, args.epochs + 1):
        losses = []
        for images, labels in training_data:
            # Forward, loss, backward and SGD step for every micro-batch, on the device.
            _, loss = poptorch_model(images, labels)
            losses.append(float(loss))
        print(f"Epoch {epoch}/{args.epochs}: mean loss {sum(losses) / len(losses):.4f}")
    if args.print_program:
        print(poptorch_model.print_schedule())
    poptorch_model.detachFromDevice()
    return poptorch_model


def test(model: Network, dataset: torch.utils.data.Dataset, batch_size: int) -> float:
    """Accuracy of an inference model of the trained network (it reads the trained weights
    back from the device into ``model``)."""
    opts = poptorch.Options()
    inference = poptorch.inferenceModel(model.eval(), opts)
    loader = poptorch.DataLoader(opts, dataset, batch_size=batch_size, drop_last=True)
    correct = total = 0
    for images, labels in loader:
        predictions = inference(images).argmax(dim=1)
        correct += int((predictions == labels).sum())
        total += len(labels)
    result = 100.0 * correct / total
    print(f"Accuracy on test set: {result:0.2f}%")
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A torch.nn CNN trained through poptorch.")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--test-batch-size", type=int, default=40)
    parser.add_argument("--device-iterations", type=int, default=10)
    parser.add_argument(
        "--epochs", type=int, default=None, help="default: 1 on MNIST, 6 on the bundled digits"
    )
    parser.add_argument("--digits", action="store_true", help="use the bundled digits")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--print-program", action="store_true", help="print the training program")
    return parser.parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.digits:
        x_train, y_train, x_test, y_test = digits_as_mnist(seed=args.seed)
        training = Batches(x_train, y_train, args.batch_size, source="digits")
        testing = Batches(x_test, y_test, args.test_batch_size, source="digits")
        print("Using the bundled handwritten digits")
    else:
        training, testing = get_mnist_data(args.test_batch_size, args.batch_size, args.data_dir)
    args.epochs = args.epochs or default_epochs(training, mnist_epochs=1, digits_epochs=6)
    train_set, test_set = as_dataset(training), as_dataset(testing)
    model = Network()
    show_inference_program(model, train_set)
    train(args, train_set, model)
    return test(model, test_set, args.test_batch_size)


if __name__ == "__main__":
    main()
