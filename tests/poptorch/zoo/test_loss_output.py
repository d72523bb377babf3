"""Which output a training model trains on, for outputs shaped like transformers'."""

from __future__ import annotations

import pytest
import torch

from ._compare import training_errors


class LossFirst(torch.nn.Module):
    """Returns ``(loss, logits, window)`` as a transformers decoder with a sliding-window
    cache does: the last output is an integer scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("window", torch.tensor(4096))

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        out = self.fc(x)
        return torch.nn.functional.cross_entropy(out, y), out, self.window


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_an_integer_last_output_is_not_taken_for_the_loss():
    model = LossFirst()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    loss_error, step_error = training_errors(model, (x, y), loss_of=lambda out: out[0])
    assert loss_error < 1e-6
    assert step_error < 1e-5
