"""Tutorial 9, torch.library: PyTorch custom operators lowered to the registered ops.

A model may already call its own ``torch.library`` operators (with a CPU implementation,
a fake for shape propagation and an autograd formula). ``poptorch.lower_torch_op`` tells
the capture to record such an operator as one of the registered custom ops: the model is
captured whole, without a graph break, and the device runs the JAX implementation while
plain PyTorch keeps running the torch one.

Run: python tutorials/9_custom_ops/torch_library_ops.py [--steps 5]
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from typing import Any

import torch

import poptorch
from tutorials import load_tutorial

acme = load_tutorial("9_custom_ops", "acme_ops.py")

# The torch operators (namespace ``acme``), implemented with torch operations. -------------


@torch.library.custom_op("acme::leaky_relu", mutates_args=())
def leaky_relu(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.where(x >= 0, x, alpha * x)


@leaky_relu.register_fake
def _(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)


def _leaky_relu_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    (x,) = ctx.saved_tensors
    return torch.where(x >= 0, grad, ctx.alpha * grad), None


def _leaky_relu_context(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.alpha = inputs[1]


leaky_relu.register_autograd(_leaky_relu_backward, setup_context=_leaky_relu_context)


@torch.library.custom_op("acme::cube", mutates_args=())
def cube(x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cubed = x * x * x
    return cubed + bias, cubed.clone()


@cube.register_fake
def _(x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = torch.broadcast_shapes(x.shape, bias.shape)
    return x.new_empty(shape), torch.empty_like(x)


def _cube_backward(ctx: Any, g_sum: torch.Tensor, g_cube: torch.Tensor) -> tuple:
    x, bias = ctx.saved_tensors
    g_bias = g_sum.sum_to_size(bias.shape)
    return 3 * x * x * (g_sum + g_cube), g_bias


def _cube_context(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.save_for_backward(*inputs)


cube.register_autograd(_cube_backward, setup_context=_cube_context)

# ``str[]`` arguments need a schema written out (``custom_op`` cannot infer them).
_LIB = torch.library.Library("acme", "FRAGMENT")
_LIB.define(
    "many_attribute_op(Tensor x, float float_one, float float_minus_two, int int_zero, "
    "int int_minus_five, float[] floats_one_two_three, float[] floats_minus_one_two_three, "
    "int[] ints_one_two_three, int[] ints_minus_one_two_three, str a_string, str[] strs) "
    "-> Tensor"
)


def _many_attribute_op(x: torch.Tensor, *values: Any) -> torch.Tensor:
    attrs = dict(zip(acme.MANY_ATTRIBUTE_KINDS, values))
    return x * attrs["float_one"] + acme.attribute_checksum(attrs)


def _many_attribute_op_fake(x: torch.Tensor, *values: Any) -> torch.Tensor:
    return torch.empty_like(x)


def _many_attribute_op_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    return (grad * ctx.float_one,) + (None,) * len(acme.MANY_ATTRIBUTE_KINDS)


def _many_attribute_op_context(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.float_one = inputs[1]


torch.library.impl("acme::many_attribute_op", "CompositeExplicitAutograd", lib=_LIB)(
    _many_attribute_op
)
torch.library.register_fake("acme::many_attribute_op", _many_attribute_op_fake, lib=_LIB)
torch.library.register_autograd(
    "acme::many_attribute_op",
    _many_attribute_op_backward,
    setup_context=_many_attribute_op_context,
    lib=_LIB,
)

# Lowered to the registered ops: arguments that are not tensors become the attributes of
# the same names.
poptorch.lower_torch_op(torch.ops.acme.leaky_relu, acme.LEAKY_RELU)
poptorch.lower_torch_op(torch.ops.acme.cube, acme.CUBE)
poptorch.lower_torch_op(torch.ops.acme.many_attribute_op, acme.MANY_ATTRIBUTE_OP)


class Network(torch.nn.Module):
    """``Linear -> acme::cube -> acme::leaky_relu -> acme::many_attribute_op -> Linear``,
    with a mean-squared-error loss when given a target."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.bias = torch.nn.Parameter(torch.full((8,), 0.1))
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None):
        total, cubed = torch.ops.acme.cube(self.fc1(x), self.bias)
        h = torch.ops.acme.leaky_relu(total - 0.5 * cubed, 0.1)
        h = torch.ops.acme.many_attribute_op(h, *acme.MANY_ATTRIBUTES.values())
        out = self.fc2(h)
        if target is None:
            return out
        return out, torch.nn.functional.mse_loss(out, target)


def train_both(steps: int, lr: float = 0.05, seed: int = 0):
    """Train ``Network`` with ``poptorch.trainingModel`` and a copy with plain PyTorch (the
    torch implementations and autograd formulas). Returns models, loss curves and the
    training program's schedule."""
    torch.manual_seed(seed)
    model = Network()
    reference = copy.deepcopy(model)
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
    schedule = training.print_schedule()
    training.destroy()
    return model, reference, losses, reference_losses, schedule


def main(argv: Sequence[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = Network()
    x = torch.randn(3, 4)
    inference = poptorch.inferenceModel(model)
    difference = (inference(x) - model(x)).abs().max().item()
    print(f"inference: largest difference from plain PyTorch {difference:.2e}")
    forward = inference.print_schedule()
    print(
        "\n".join(
            line
            for line in forward.splitlines()
            if any(f"{op}." in line for op in ("Cube", "LeakyRelu", "ManyAttributeOp"))
        )
    )
    inference.destroy()

    _, _, losses, reference_losses, _ = train_both(args.steps)
    print(f"poptorch losses {[round(v, 5) for v in losses]}")
    print(f"torch losses    {[round(v, 5) for v in reference_losses]}")
    return losses


if __name__ == "__main__":
    main()
