"""A call's large outputs are the run's own buffers, handed to torch without a host copy
(``runtime.session.stream_io.taken_over``): each is writable, belongs to that call alone,
and outlives the calls and training steps after it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import poptorch
from runtime.session import stream_io


@pytest.fixture(params=["taken_over", "copied"], autouse=True)
def _output_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output taken over by torch, or the default (the small ones here copied)."""
    if request.param == "taken_over":
        monkeypatch.setattr(stream_io, "TAKEN_OVER_BYTES", 0)


class Outputs(torch.nn.Module):
    """Outputs of every kind a buffer could be shared by: a computed value, the input passed
    through, a weight as it is, two results of the same value, and an integer result."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor):
        y = self.linear(x)
        return y, x, self.linear.weight, y * 1.0, y.argmax(-1)


def _calls(pm: poptorch.PoplarExecutor, x: torch.Tensor, n: int) -> list:
    return [pm(x) for _ in range(n)]


def test_each_call_s_outputs_are_its_own_writable_tensors():
    torch.manual_seed(0)
    model = Outputs().eval()
    x = torch.randn(2, 4)
    expected = model(x)
    pm = poptorch.inferenceModel(model)
    first, second = _calls(pm, x, 2)
    for got, want in zip(first, expected):  # (PopTorch's integer results are 32-bit)
        torch.testing.assert_close(got, want.detach(), check_dtype=False)
    pointers = [t.untyped_storage().data_ptr() for t in (*first, *second)]
    assert len(set(pointers)) == len(pointers), "outputs share memory"
    assert x.untyped_storage().data_ptr() not in pointers
    assert model.linear.weight.untyped_storage().data_ptr() not in pointers
    for t in first:
        t.fill_(7)  # writes land in that call's tensors only
    third = pm(x)
    for got, again, want in zip(second, third, expected):
        torch.testing.assert_close(got, want.detach(), check_dtype=False)
        torch.testing.assert_close(again, want.detach(), check_dtype=False)
    assert torch.equal(model.linear.weight, expected[2])
    assert torch.equal(x, expected[1])


def test_outputs_of_a_training_step_outlive_the_steps_after_it():
    torch.manual_seed(0)

    class Trained(Outputs):
        def forward(self, x: torch.Tensor):  # type: ignore[override]
            y, _, weight, _, _ = super().forward(x)
            return weight, y, torch.nn.functional.mse_loss(y, torch.ones_like(y))

    model = Trained()
    reference = Trained()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    outputs, expected = [], []
    for _ in range(3):
        outputs.append(pm(x))
        optimizer.zero_grad()
        weight, y, loss = reference(x)
        expected.append((weight.detach().clone(), y.detach(), loss.detach()))
        loss.backward()
        optimizer.step()
    # the weights each step read, though later steps updated them in their donated buffers
    for got, want in zip(outputs, expected):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    assert not np.shares_memory(outputs[0][0].numpy(), outputs[1][0].numpy())
