"""Explicit weight copies of torch models (the host's values win in copyWeightsToDevice)
and what trainingModel needs to find a loss."""

from __future__ import annotations

import copy
import gc
import weakref

import numpy as np
import pytest
import torch

import poptorch
import popxl


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


def test_a_trained_model_dropped_by_its_user_frees_its_program_and_weights():
    """Nothing global keeps a wrapped model, its executor or its program alive: a process
    that trains model after model (a notebook, the zoo's tests) does not keep them all."""
    model = Regress()
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    pm(torch.randn(4), torch.randn(4))
    gone = [weakref.ref(model), weakref.ref(pm), weakref.ref(pm._session)]
    del model, pm
    gc.collect()
    assert [ref() for ref in gone] == [None, None, None]


def test_the_first_run_uploads_the_weights_once(monkeypatch):
    """The torch weights go to the session's host copy before it attaches, and attaching
    puts them on the device: one upload, not one of the Ir's copy and then the torch one."""
    puts: list[int] = []
    put = popxl.Session._put
    monkeypatch.setattr(popxl.Session, "_put", lambda s, a: puts.append(len(a)) or put(s, a))
    model = Regress()
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    pm(torch.randn(4), torch.randn(4))
    assert len(puts) == 1, puts


def test_the_program_reads_the_torch_weights_rather_than_copying_them():
    """The Ir's variables view the parameters' memory: the host holds each weight once
    (ResNet-18: 45 MiB less), and the weights stay the model's own."""
    model = Regress()
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    pm(torch.randn(4), torch.randn(4))
    var = pm._built.weights["linear.weight"]
    assert np.shares_memory(var._host_data, model.linear.weight.detach().numpy())
    assert not var._host_data.flags.writeable


class ConvNet(torch.nn.Module):
    """A convolution and a batch norm: in eval, work on weights alone that inference keeps
    between calls; in training, a loss."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 20, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm(self.conv(x)))
        return out.mean() if self.training else out


def test_inference_follows_weights_changed_on_the_host():
    torch.manual_seed(0)
    model = ConvNet().eval()
    x = torch.randn(2, 3, 8, 8)
    infer = poptorch.inferenceModel(model)
    torch.testing.assert_close(infer(x), model(x).detach(), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        model.conv.weight.mul_(-1.5)
        model.norm.running_var.add_(0.5)
    infer.copyWeightsToDevice()
    torch.testing.assert_close(infer(x), model(x).detach(), rtol=1e-4, atol=1e-5)


def test_inference_follows_weights_trained_by_the_training_model():
    """PopTorch's implicit copy from a training model to an inference model of the same
    model (its user guide's precompilation example)."""
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    train = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    model.eval()
    infer = poptorch.inferenceModel(model)
    before = infer(x)
    for _ in range(2):
        train(x)
    after = infer(x)
    torch.testing.assert_close(after, model(x).detach(), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(after, before)


def test_training_with_a_frozen_convolution_matches_eager():
    """Fine-tuning: the frozen convolution's weight is read-only state, so its layout is made
    once; the trained layers still learn as in eager torch."""
    torch.manual_seed(0)
    model = ConvNet()
    model.conv.requires_grad_(False)
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8)
    train = poptorch.trainingModel(
        model, optimizer=torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    )
    optimizer = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.5)
    for _ in range(3):
        loss = train(x)
        optimizer.zero_grad()
        expected = reference(x)
        expected.backward()
        optimizer.step()
        torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)
    train.copyWeightsToHost()
    torch.testing.assert_close(model.norm.weight, reference.norm.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.conv.weight, reference.conv.weight)


def test_a_checkpoint_of_a_trained_model_loads_with_torch_load_s_defaults(tmp_path):
    """The state dict of a model being trained (its buffers instrumented to copy the
    weights back when read) saves plain tensors: ``torch.load``'s default
    ``weights_only=True`` loads it, with the trained values (the CNN application's
    ``restore.py`` loads its checkpoints so)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor):
            out = self.net(x)
            return out, out.square().mean()

    wrapped = WithLoss()
    pm = poptorch.trainingModel(wrapped, optimizer=torch.optim.SGD(wrapped.parameters(), lr=0.1))
    for _ in range(2):
        pm(torch.randn(8, 4))
    path = tmp_path / "checkpoint.pt"
    torch.save({"model_state_dict": model.state_dict(), "epoch": 2}, path)
    loaded = torch.load(path)
    assert loaded["epoch"] == 2
    state = model.state_dict()
    assert int(loaded["model_state_dict"]["1.num_batches_tracked"]) == 2
    for name, value in loaded["model_state_dict"].items():
        assert type(value) is torch.Tensor, name
        torch.testing.assert_close(value, state[name].detach().clone(), msg=name)
