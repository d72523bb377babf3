"""Convolution weights kept between steps in the layout their kernels use
(``runtime.backend.stored_layouts``): the values users see, write and train stay torch's."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch
from runtime.backend.forms import cpu_forms

pytestmark = pytest.mark.skipif(not cpu_forms(), reason="the CPU's convolution forms only")


class Convs(torch.nn.Module):
    """Two convolutions wide and roomy enough for XLA's own kernel (channels-last)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.second = torch.nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


class WithLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = Convs()

    def forward(self, x: torch.Tensor):
        out = self.convs(x)
        return out, out.square().mean()


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6, msg=name)


def test_a_training_step_keeps_weights_in_the_kernels_layout_and_trains_as_torch():
    torch.manual_seed(0)
    model = WithLoss()
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 16, 16)

    def optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

    training = poptorch.trainingModel(model, optimizer=optimizer(model))
    eager = optimizer(reference)

    def eager_step() -> torch.Tensor:
        eager.zero_grad()
        out, loss = reference(x)
        loss.backward()
        eager.step()
        return loss.detach()

    for _ in range(3):
        _, loss = training(x)
        torch.testing.assert_close(loss, eager_step(), rtol=1e-4, atol=1e-6)
    program = training._session._program
    layouts = {program.variables[e[0]].name: p for e, p in zip(program.entries, program.layouts)}
    # the weights as the forward's kernel reads them (kernel, in, out); the momenta as
    # the weight gradient's kernel makes them (in, kernel, out)
    assert layouts["convs.first.weight"] == layouts["convs.second.weight"] == (2, 3, 1, 0)
    assert layouts["Accl___convs.second.weight"] == (1, 2, 3, 0)
    training.copyWeightsToHost()
    _assert_same_weights(model, reference)

    # a write from the host lands in the stored layout, and training goes on from it
    with torch.no_grad():
        for m in (model, reference):
            m.convs.second.weight.mul_(0.5)
    training.copyWeightsToDevice()
    for _ in range(2):
        _, loss = training(x)
        torch.testing.assert_close(loss, eager_step(), rtol=1e-4, atol=1e-6)
    assert training._session._program is program
    training.copyWeightsToHost()
    _assert_same_weights(model, reference)


def test_an_inference_program_reads_weights_kept_in_the_kernels_layout():
    torch.manual_seed(1)
    model = Convs().eval()
    x = torch.randn(1, 3, 16, 16)
    inference = poptorch.inferenceModel(model)
    torch.testing.assert_close(inference(x), model(x), rtol=1e-4, atol=1e-5)
    program = inference._session._program
    assert [p for p in program.layouts if p is not None] == [(2, 3, 1, 0)] * 2

    with torch.no_grad():
        model.first.weight.neg_()
    inference.copyWeightsToDevice()
    torch.testing.assert_close(inference(x), model(x), rtol=1e-4, atol=1e-5)


def test_gradient_accumulation_keeps_the_layouts_through_its_loop_and_trains_as_torch():
    """The accumulation loop's ``scan`` takes the weights and carries the accumulators in
    the stored layouts (``transpose_sinking``'s scan rule)."""
    torch.manual_seed(2)
    model = WithLoss()
    reference = copy.deepcopy(model)
    x = torch.randn(8, 3, 16, 16)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    )
    eager = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        training(x)
        eager.zero_grad()
        for micro in x.split(2):  # 4 micro-batches of 2, their mean
            (reference(micro)[1] / 4).backward()
        eager.step()
    program = training._session._program
    layouts = {program.variables[e[0]].name: p for e, p in zip(program.entries, program.layouts)}
    assert layouts["convs.second.weight"] == (2, 3, 1, 0)
    assert layouts["accum.convs.second.weight"] == (1, 2, 3, 0)  # the loop's carry
    training.copyWeightsToHost()
    _assert_same_weights(model, reference)
