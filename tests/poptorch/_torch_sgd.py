"""Training a torch model through poptorch side by side with the same steps in torch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

import poptorch


def assert_trains_as_torch(
    model: torch.nn.Module,
    reference: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    steps: int = 1,
    lr: float = 0.1,
) -> None:
    """``steps`` SGD steps of ``model`` (returning ``(output, loss)``) through a poptorch
    ``trainingModel`` give the losses and weights of the same steps of ``reference`` (a
    copy of the model run by torch)."""
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=lr))
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    for _ in range(steps):
        _, loss = pm(*inputs)
        optimizer.zero_grad()
        _, want = reference(*inputs)
        want.backward()
        optimizer.step()
        torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    for (name, got), expected in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=name)
