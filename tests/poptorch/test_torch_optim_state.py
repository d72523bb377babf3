"""Optimiser state across detachFromDevice / attachToDevice of torch models."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import poptorch  # noqa: E402

from .test_torch_optim import B, Net, _cpu_steps, _data, _options  # noqa: E402


def test_detach_keeps_the_optimiser_state_on_the_host(caplog):
    """Detaching reads a poptorch.optim optimiser's state once (later reads while detached
    use it); after re-attaching and training, reads see the new state."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    opt = poptorch.optim.Adam(model.parameters(), lr=0.02)
    training = poptorch.trainingModel(model, _options(1), opt)
    cpu_opt = torch.optim.Adam(reference.parameters(), lr=0.02)
    x, t = _data(B)

    def first_moment():
        return np.asarray(opt.state_dict()["ipu_state"]["Accl1___fc1.weight"])

    def cpu_first_moment():
        return cpu_opt.state[reference.fc1.weight]["exp_avg"].numpy()

    training(x, t)
    _cpu_steps(reference, cpu_opt, x, t, 1)
    with caplog.at_level("DEBUG", logger="poptorch::python"):
        training.detachFromDevice()
        assert "Writing optimiser state tensors from IPU to host." in caplog.text
        caplog.clear()
        np.testing.assert_allclose(first_moment(), cpu_first_moment(), rtol=1e-5, atol=1e-7)
        assert "Using cached optimiser state dict" in caplog.text
    training.attachToDevice()
    training(x, t)
    _cpu_steps(reference, cpu_opt, x, t, 1)
    np.testing.assert_allclose(first_moment(), cpu_first_moment(), rtol=1e-5, atol=1e-7)


def test_detach_then_attach_keeps_training_where_it_was():
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    training = poptorch.trainingModel(
        model, _options(1), poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    )
    cpu_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    x, t = _data(B)
    for _ in range(2):
        training(x, t)
        _cpu_steps(reference, cpu_opt, x, t, 1)
        training.detachFromDevice()  # weights and momentum come to the host
        training.attachToDevice()  # and go back
    training(x, t)
    _cpu_steps(reference, cpu_opt, x, t, 1)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
