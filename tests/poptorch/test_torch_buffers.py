"""Buffers of torch models: named buffer updates, forwards that remove or rebind a buffer,
and buffer updates under replication."""

from __future__ import annotations

import pytest
import torch

import poptorch


class Offsets(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.ones(3))
        self.register_buffer("b", torch.full((3,), 10.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b


def test_copy_named_buffers_copies_only_the_named_ones():
    opts = poptorch.Options().updatableNamedBuffers(["a"])
    model = Offsets()
    pm = poptorch.inferenceModel(model, opts)
    x = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(pm(x), x + 10)
    model.a.copy_(torch.tensor([2.0, 3.0, 4.0]))
    model.b.fill_(-1.0)  # not named: stays 10 on the device
    pm.copyNamedBuffersToDevice()
    torch.testing.assert_close(pm(x), x * torch.tensor([2.0, 3.0, 4.0]) + 10)
    pm.copyWeightsToDevice()  # everything
    torch.testing.assert_close(pm(x), x * torch.tensor([2.0, 3.0, 4.0]) - 1)


def test_copy_named_buffers_needs_names_that_exist():
    pm = poptorch.inferenceModel(Offsets())
    pm(torch.ones(3))
    with pytest.raises(poptorch.Error, match="none were named"):
        pm.copyNamedBuffersToDevice()
    bad = poptorch.inferenceModel(Offsets(), poptorch.Options().updatableNamedBuffers(["c"]))
    with pytest.raises(poptorch.Error, match=r"names \['c'\].*buffers are \['a', 'b'\]"):
        bad(torch.ones(3))


class Removes(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("y", torch.tensor([2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        del self._buffers["y"]
        return x + 1


class Rebinds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("y", torch.tensor([2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.y = x + 1
        return self.y


class UpdatesInPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("y", torch.tensor([2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.y += x.sum()
        return x * self.y


def test_forward_removing_a_buffer_is_refused_and_the_buffer_kept():
    model = Removes()
    with pytest.raises(poptorch.Error, match="Buffer y is removed from the model"):
        poptorch.inferenceModel(model)(torch.tensor([5.0]))
    torch.testing.assert_close(model.y, torch.tensor([2.0]))


def test_forward_rebinding_a_buffer_is_refused():
    with pytest.raises(poptorch.Error, match=r"reassigned.*self\.y\.copy_\(src\)"):
        poptorch.inferenceModel(Rebinds())(torch.tensor([5.0]))


def test_forward_updating_a_buffer_in_place_runs_like_torch():
    model, reference = UpdatesInPlace(), UpdatesInPlace()
    pm = poptorch.inferenceModel(model)
    for x in (torch.tensor([1.0, 2.0]), torch.tensor([0.5, -4.0])):
        torch.testing.assert_close(pm(x), reference(x))
    pm.copyWeightsToHost()
    torch.testing.assert_close(model.y, reference.y)


def test_replicas_refuse_buffer_updates_unless_broadcast_is_off():
    opts = poptorch.Options().replicationFactor(2)
    with pytest.raises(poptorch.Error, match=r"broadcastBuffers\(False\)"):
        poptorch.inferenceModel(UpdatesInPlace(), opts)(torch.ones(2, 3))
    pm = poptorch.inferenceModel(Offsets(), opts.clone())  # reads its buffers only: fine
    torch.testing.assert_close(pm(torch.ones(2, 3)), torch.full((2, 3), 11.0))
    opts = poptorch.Options().replicationFactor(2).broadcastBuffers(False)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    # Each replica adds its own sample's sum to its own copy of y.
    expected = torch.stack([x[0] * (2 + x[0].sum()), x[1] * (2 + x[1].sum())])
    torch.testing.assert_close(poptorch.inferenceModel(UpdatesInPlace(), opts)(x), expected)


class NormedRegression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(3)
        self.lin = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
        out = self.lin(self.norm(x))
        return out, torch.nn.functional.mse_loss(out, y)


def test_replicas_keep_their_own_batch_norm_statistics():
    """As under PopART's BatchNormalization: each replica updates the running statistics
    from its own micro-batch, the host reads replica 0's, and the gradients are averaged
    over the replicas (each normalising with its own batch's statistics)."""
    torch.manual_seed(0)
    model = NormedRegression()
    reference = NormedRegression()
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    opts = poptorch.Options().replicationFactor(2)  # broadcastBuffers stays on
    pm = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    pm(x, y)
    pm.copyWeightsToHost()

    halves = [reference(x[:4], y[:4])[1], reference(x[4:], y[4:])[1]]
    ((halves[0] + halves[1]) / 2).backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    replica0 = torch.nn.BatchNorm1d(3)
    replica0(x[:4])  # the running statistics replica 0 computed
    torch.testing.assert_close(model.norm.running_mean, replica0.running_mean)
    torch.testing.assert_close(model.norm.running_var, replica0.running_var)
    assert int(model.norm.num_batches_tracked) == 1
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


class CountsItsBias(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.register_buffer("seen", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.seen += self.lin.bias  # reads no input, but is not BatchNorm's: refused
        return self.lin(x)


def test_replicas_refuse_other_buffer_updates_even_without_input():
    opts = poptorch.Options().replicationFactor(2)
    with pytest.raises(poptorch.Error, match=r"broadcastBuffers\(False\)"):
        poptorch.inferenceModel(CountsItsBias(), opts)(torch.ones(2, 2))
