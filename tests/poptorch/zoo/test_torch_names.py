"""Submodule names that are not Python identifiers (torchvision's RegNet: ``block1-0``)."""

from __future__ import annotations

import pytest
import torch

import poptorch

from ._compare import inference_error, training_errors


class Dashed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = torch.nn.Sequential()
        self.stages.add_module("block1-0", torch.nn.Linear(4, 8))
        self.stages.add_module("1-1 relu", torch.nn.ReLU())
        self.stages.add_module("block1-2", torch.nn.Linear(8, 3))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        out = self.stages(x)
        return out if y is None else (out, torch.nn.functional.mse_loss(out, y))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_a_model_with_dashed_names_runs_and_prints_torch_names():
    model = Dashed()
    x = torch.randn(5, 4)
    assert inference_error(model, (x,)) < 1e-6
    compiled = poptorch.inferenceModel(model)
    compiled(x)
    assert "stages.block1-0.weight" in compiled.print_schedule()
    assert "stages.block1-0.weight" in model.state_dict()


def test_a_model_with_dashed_names_trains():
    loss_error, step_error = training_errors(Dashed(), (torch.randn(5, 4), torch.randn(5, 3)))
    assert loss_error < 1e-5
    assert step_error < 1e-4
