"""Tied weights (one parameter used by two modules) train as one parameter."""

from __future__ import annotations

import pytest
import torch

from ._compare import training_errors


class TiedLm(torch.nn.Module):
    """An embedding whose weight is also the output projection's, as in most language models."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.proj = torch.nn.Linear(8, 50, bias=False)
        self.proj.weight = self.emb.weight

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.proj(self.emb(x))
        return out, torch.nn.functional.cross_entropy(out.reshape(-1, 50), y.reshape(-1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_a_tied_weight_gets_the_gradient_of_both_uses():
    model = TiedLm()
    x, y = torch.randint(0, 50, (2, 5)), torch.randint(0, 50, (2, 5))
    loss_error, step_error = training_errors(model, (x, y))
    assert loss_error < 1e-5
    assert step_error < 1e-4
    assert model.proj.weight is model.emb.weight  # still tied on the host
