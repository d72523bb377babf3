"""Explicit weight copies of torch models (the host's values win in copyWeightsToDevice)
and what trainingModel needs to find a loss."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch


class Regress(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor):
        out = self.linear(x)
        return out, torch.nn.functional.mse_loss(out, target)


def test_copy_weights_to_device_overwrites_unread_trained_weights():
    torch.manual_seed(0)
    model = Regress()
    untrained = copy.deepcopy(model)
    x, target = torch.randn(4), torch.randn(4)
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(5):
        trained_out, _ = pm(x, target)
    pm.copyWeightsToDevice()  # the host copy was never read: it still holds the start
    pm.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.0))
    out, loss = pm(x, target)
    expected, expected_loss = untrained(x, target)
    torch.testing.assert_close(out, expected.detach())
    torch.testing.assert_close(loss, expected_loss.detach())
    assert not torch.allclose(out, trained_out)
    torch.testing.assert_close(model.linear.weight, untrained.linear.weight)


def test_copy_weights_to_device_after_reading_keeps_the_trained_weights():
    torch.manual_seed(0)
    model = Regress()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, target = torch.randn(4), torch.randn(4)
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(3):
        pm(x, target)
        ref_opt.zero_grad()
        reference(x, target)[1].backward()
        ref_opt.step()
    torch.testing.assert_close(model.linear.weight, reference.linear.weight)  # copies back
    pm.copyWeightsToDevice()
    pm.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.0))
    out, _ = pm(x, target)
    torch.testing.assert_close(out, reference(x, target)[0].detach())


def test_training_model_without_a_loss_is_refused():
    class NoLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) * 2

    pm = poptorch.trainingModel(NoLoss())
    with pytest.raises(poptorch.Error, match=r"Couldn't find a loss in graph.*shape \(2, 4\)"):
        pm(torch.randn(2, 4))
