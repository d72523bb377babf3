"""The zoo's rule for ill-conditioned steps accepts float32 rounding and still catches a fault."""

from __future__ import annotations

import re

import pytest
import torch

import poptorch

from ._compare import assert_trains_as_eager, nudged


class Faulty(torch.nn.Module):
    """A conv/batch-norm classifier whose gradients grow by ``fault`` (3% say) on the device
    only, with the same forward values: the kind of fault a wrong derivative makes."""

    def __init__(self, fault: float) -> None:
        super().__init__()
        self.fault = fault
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.norm = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.norm(self.conv(x))).mean((2, 3))
        if poptorch.isRunningOnIpu():
            h = h + self.fault * (h - h.detach())  # the same value, a scaled gradient
        out = self.head(h)
        return out, torch.nn.functional.cross_entropy(out, y)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))


def test_nudged_weights_move_by_at_most_one_unit_in_the_last_place():
    model = torch.nn.Linear(50, 40)
    copied = nudged(model, seed=0)
    for p, q in zip(model.parameters(), copied.parameters()):
        up, down = torch.nextafter(p, p + 1), torch.nextafter(p, p - 1)
        assert bool(((q == p) | (q == up) | (q == down)).all())
        assert 0.5 < float((q != p).float().mean()) < 0.8  # about two thirds moved
    assert nudged(model, seed=0).weight.equal(copied.weight)  # deterministic per seed
    assert not nudged(model, seed=1).weight.equal(copied.weight)


def test_a_step_that_agrees_passes_at_once():
    steps = assert_trains_as_eager(Faulty(0.0), _inputs())
    assert len(steps) == 1 and steps[0].update_error < 1e-5


def test_a_gradient_three_percent_off_fails_from_every_nudged_copy():
    with pytest.raises(AssertionError) as failed:
        assert_trains_as_eager(Faulty(0.03), _inputs())
    # Each nudged copy's update is as far from float64's as the first (1.6%: the fault
    # scales the gradients of the convolution and the norm, not the head's).
    off = [float(e) for e in re.findall(r"update_error_float64=([0-9.e-]+)", str(failed.value))]
    assert len(off) == 3 and all(0.015 < e < 0.018 for e in off), off
