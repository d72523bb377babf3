"""A PopTorch training script as users write it for ``poprun``: ``popdist.poptorch.Options``,
a ``poptorch.DataLoader`` and ``trainingModel``. Saves its weights and the losses it got to
``<out>/instance<i>.npz`` (or ``<out>/single.npz`` when run alone with ``--replicas R``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

import popdist
import popdist.poptorch
import poptorch

SAMPLES, FEATURES, MICRO_BATCH = 16, 6, 2


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(FEATURES, 8)
        self.norm = torch.nn.BatchNorm1d(8)  # running statistics: buffers the forward updates
        self.fc2 = torch.nn.Linear(8, 3)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
        out = self.fc2(torch.relu(self.norm(self.fc1(x))))
        return out, self.loss(out, y)


def main(out: Path, replicas: int | None) -> None:
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    ys = rng.integers(0, 3, SAMPLES)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(xs), torch.from_numpy(ys))
    if replicas is None:
        opts = popdist.poptorch.Options()
    else:
        opts = poptorch.Options().replicationFactor(replicas)
    opts.Training.gradientAccumulation(2)  # one device iteration: one update per call
    model = Net()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    training = poptorch.trainingModel(model, opts, optimizer)
    loader = poptorch.DataLoader(opts, dataset, batch_size=MICRO_BATCH)
    losses = []
    for _ in range(2):  # epochs
        for x, y in loader:
            _, loss = training(x, y)
            losses.append(loss.detach().numpy().reshape(-1))
    training.copyWeightsToHost()
    name = "single" if replicas is not None else f"instance{popdist.getInstanceIndex()}"
    arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    np.savez(out / f"{name}.npz", losses=np.array(losses), **arrays)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
