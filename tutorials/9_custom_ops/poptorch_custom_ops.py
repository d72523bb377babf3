"""Tutorial 9, PopTorch: ``poptorch.custom_op`` in inference and training models.

PopTorch's guide (listings 4.23-4.26) loaded a compiled PopART library with ``ctypes`` and
called its ops by name, domain and version. The same calls work here once the ops are
registered (``acme_ops.py`` is imported instead of a library being loaded):

* ``BasicNetwork``: the Cube op with two outputs in an ``inferenceModel`` (listing 4.24);
* ``LeakyReluModel``: an attribute passed as a dictionary (listing 4.25);
* ``ManyAttributesModel``: every attribute kind of Table 4.1 (listing 4.26);
* ``Regressor``: a ``torch.nn`` model with a custom op between two layers, trained by a
  ``trainingModel`` next to the same model written with torch operations.

Run: python tutorials/9_custom_ops/poptorch_custom_ops.py [--steps 5]
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence

import torch

import poptorch
from tutorials import load_tutorial

acme = load_tutorial("9_custom_ops", "acme_ops.py")


class BasicNetwork(torch.nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor):
        x, y = poptorch.custom_op([x, bias], "Cube", "com.acme", 1, example_outputs=[x, x])
        return x, y


class LeakyReluModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = poptorch.custom_op(
            [x], "LeakyRelu", "com.acme", 1, example_outputs=[x], attributes={"alpha": 0.02}
        )
        return x[0]


class ManyAttributesModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = poptorch.custom_op(
            [x],
            "ManyAttributeOp",
            "test.poptorch",
            1,
            example_outputs=[x],
            attributes=dict(acme.MANY_ATTRIBUTES),
        )
        return x[0]


def apply_op(op: str, h: torch.Tensor, bias: torch.Tensor, in_torch: bool) -> torch.Tensor:
    """One of the tutorial's ops on ``h``: the custom op, or (``in_torch``) the same math in
    torch operations, as a reference."""
    if op == "Cube":
        if in_torch:
            total, cubed = h**3 + bias, h**3
        else:
            total, cubed = poptorch.custom_op([h, bias], "Cube", "com.acme", 1, [h, h])
        return total + cubed
    if op == "LeakyRelu":
        if in_torch:
            return torch.nn.functional.leaky_relu(h, 0.1)
        return poptorch.custom_op([h], "LeakyRelu", "com.acme", 1, [h], {"alpha": 0.1})[0]
    if op == "ManyAttributeOp":
        if in_torch:
            return h * 1.0 + acme.attribute_checksum(acme.MANY_ATTRIBUTES)
        attrs = dict(acme.MANY_ATTRIBUTES)
        return poptorch.custom_op([h], op, "test.poptorch", 1, [h], attrs)[0]
    raise ValueError(f"no op {op!r} in this tutorial; use Cube, LeakyRelu or ManyAttributeOp")


class Regressor(torch.nn.Module):
    """``Linear -> custom op -> Linear`` with a mean-squared-error loss."""

    def __init__(self, op: str, in_torch: bool = False) -> None:
        super().__init__()
        self.op, self.in_torch = op, in_torch
        self.fc1 = torch.nn.Linear(4, 8)
        self.bias = torch.nn.Parameter(torch.full((8,), 0.1))
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None):
        h = apply_op(self.op, self.fc1(x), self.bias, self.in_torch)
        out = self.fc2(h)
        if target is None:
            return out
        return out, torch.nn.functional.mse_loss(out, target)


def train_both(op: str, steps: int, lr: float = 0.05, seed: int = 0):
    """Train ``Regressor(op)`` with ``poptorch.trainingModel`` and a copy written in torch
    operations with ``torch.optim.SGD``. Returns both models and both loss curves."""
    torch.manual_seed(seed)
    model = Regressor(op)
    reference = copy.deepcopy(model)
    reference.in_torch = True
    x, target = torch.randn(16, 4), torch.randn(16, 2)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=lr))
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    losses, reference_losses = [], []
    for _ in range(steps):
        losses.append(float(training(x, target)[1]))
        optimizer.zero_grad()
        loss = reference(x, target)[1]
        loss.backward()
        optimizer.step()
        reference_losses.append(float(loss.detach()))
    training.destroy()
    return model, reference, losses, reference_losses


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per op")
    args = parser.parse_args(argv)

    x, bias = torch.full((1, 8), 2.0), torch.full((1, 8), 4.0)
    total, cubed = poptorch.inferenceModel(BasicNetwork())(x, bias)
    print("Cube:", total[0, 0].item(), cubed[0, 0].item())
    leaky = poptorch.inferenceModel(LeakyReluModel())
    print("LeakyRelu:", leaky(torch.tensor([-1.0, 0.0, 2.0])).tolist())
    many = poptorch.inferenceModel(ManyAttributesModel())
    print("ManyAttributeOp:", many(torch.zeros(2)).tolist())
    print(
        next(
            line.strip()
            for line in many.print_schedule().splitlines()
            if "ManyAttributeOp." in line
        )
    )

    curves = {}
    for op in ("Cube", "LeakyRelu", "ManyAttributeOp"):
        _, _, losses, reference_losses = train_both(op, args.steps)
        print(f"{op}: poptorch losses {[round(v, 5) for v in losses]}")
        print(f"{op}: torch losses    {[round(v, 5) for v in reference_losses]}")
        curves[op] = losses
    return curves


if __name__ == "__main__":
    main()
