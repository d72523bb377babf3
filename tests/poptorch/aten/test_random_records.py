"""Random records' seed semantics and dropout in training (see ``_aten/random.py``).

Values cannot be compared with torch's (the streams differ), so these check what PopTorch
promised: ``Options.randomSeed`` makes runs repeatable, every call and every random op draws
fresh numbers, and dropout's forward mask is the one its gradient uses.
"""

from __future__ import annotations

import torch

import poptorch


class _Draws(torch.nn.Module):
    def forward(self, x):
        return torch.rand(4, 5) + x, torch.randn(4, 5) + x


def _run(seed: int | None, calls: int = 1) -> list:
    opts = poptorch.Options()
    if seed is not None:
        opts.randomSeed(seed)
    model = poptorch.inferenceModel(_Draws(), opts)
    return [model(torch.zeros(1)) for _ in range(calls)]


def test_same_seed_same_numbers():
    (a_u, a_n), = _run(7)
    (b_u, b_n), = _run(7)
    assert torch.equal(a_u, b_u) and torch.equal(a_n, b_n)


def test_seeds_calls_and_ops_differ():
    (first, second) = _run(7, calls=2)
    other, = _run(8)
    assert not torch.equal(first[0], second[0])  # each call moves the seed on
    assert not torch.equal(first[0], other[0])  # another seed, other numbers
    assert not torch.equal(first[0], first[1])  # each op has its own stream


class _DropoutModel(torch.nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.offset = torch.nn.Parameter(torch.zeros(200, 50))
        self.dropout = torch.nn.Dropout(p)

    def forward(self, x, w):
        out = self.dropout(x + self.offset)
        return out, poptorch.identity_loss((out * w).sum(), reduction="sum")


def test_dropout_training_ratio_and_gradient():
    p = 0.8
    model = _DropoutModel(p)
    x, w = torch.ones(200, 50), torch.randn(200, 50)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    training = poptorch.trainingModel(model, poptorch.Options().randomSeed(3), optimizer)
    out, _ = training(x, w)
    training.copyWeightsToHost()
    kept = out != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.02
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / (1 - p)))
    # One SGD step with lr 1: offset = -d(loss)/d(offset) = -w * mask / (1 - p).
    expected = -(w * kept) / (1 - p)
    torch.testing.assert_close(model.offset.detach(), expected, rtol=1e-5, atol=1e-5)


def test_dropout_is_identity_in_inference_models():
    model = _DropoutModel(0.5)  # a module in training mode, run by an inference model
    x, w = torch.randn(200, 50), torch.randn(200, 50)
    out, _ = poptorch.inferenceModel(model)(x, w)
    torch.testing.assert_close(out, x)


def test_dropout_p1_drops_everything_in_training():
    model = _DropoutModel(1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    out, _ = poptorch.trainingModel(model, optimizer=optimizer)(torch.ones(200, 50), torch.ones(200, 50))
    assert torch.equal(out, torch.zeros(200, 50))


def test_dropout_p1_weights_get_a_zero_gradient_as_in_torch():
    # torch multiplies by zero, so the weight has a (zero) gradient and weight decay applies.
    def step(run):
        model = _DropoutModel(1.0)
        with torch.no_grad():
            model.offset.fill_(1.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0, weight_decay=0.1)
        run(model, optimizer)
        return model.offset.detach()

    def eager(model, optimizer):
        model(torch.ones(200, 50), torch.ones(200, 50))[1].backward()
        optimizer.step()

    def ipu(model, optimizer):
        training = poptorch.trainingModel(model, optimizer=optimizer)
        training(torch.ones(200, 50), torch.ones(200, 50))
        training.copyWeightsToHost()

    expected = step(eager)
    torch.testing.assert_close(expected, torch.full((200, 50), 0.9))
    torch.testing.assert_close(step(ipu), expected)
