"""Optimisers of torch models: N training steps of ``trainingModel`` give the weights N steps
of ``torch.optim`` give the same model on the CPU.

Each case trains a small ``torch.nn`` model for a few optimiser steps in one call
(``deviceIterations``), with a ``poptorch.optim`` or ``torch.optim`` optimiser, and compares
every parameter with the same model trained by ``torch.optim`` (gradient clipping by
``torch.nn.utils.clip_grad_norm_``; LAMB by its own ``step``, which runs on the host).
"""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import poptorch  # noqa: E402

B, STEPS = 4, 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x, t):
        y = self.fc2(torch.tanh(self.fc1(x)))
        return y, torch.nn.functional.mse_loss(y, t)


def _data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randn(n, 3, generator=g)


def _options(steps=STEPS, ga=1):
    opts = poptorch.Options().deviceIterations(steps)
    opts.Training.gradientAccumulation(ga)
    return opts


def _cpu_steps(model, optimizer, x, t, steps, max_norm=None, scheduler=None):
    for xb, tb in zip(x.chunk(steps), t.chunk(steps)):
        optimizer.zero_grad()
        _, loss = model(xb, tb)
        loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()


def _assert_same(ipu_model, cpu_model, rtol=1e-4, atol=1e-5):
    moved = False
    for (name, a), (_, b) in zip(ipu_model.named_parameters(), cpu_model.named_parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol, atol, err_msg=name)
        moved |= not torch.equal(a, b)
    return moved


def _train(make_ipu, make_cpu, steps=STEPS, ga=1, max_norm=None, seed=0):
    """Train with ``make_ipu(params)`` on the device and ``make_cpu(params)`` on the host;
    return both models after checking they agree."""
    torch.manual_seed(seed)
    model = Net()
    reference = copy.deepcopy(model)
    start = copy.deepcopy(model)
    training = poptorch.trainingModel(model, _options(steps, ga), make_ipu(model))
    x, t = _data(steps * ga * B)
    training(x, t)
    _cpu_steps(reference, make_cpu(reference), x, t, steps, max_norm)
    _assert_same(model, reference)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), start.parameters()))
    return model, reference, training


def _groups(model, **second):
    return [
        {"params": model.fc1.parameters()},
        {"params": model.fc2.parameters(), **second},
    ]


# (name, device optimiser, host reference, max_grad_norm)
CASES = [
    ("sgd", lambda m: poptorch.optim.SGD(m.parameters(), lr=0.1),
     lambda m: torch.optim.SGD(m.parameters(), lr=0.1), None),
    ("sgd_momentum_dampening_wd",
     lambda m: poptorch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, dampening=0.3,
                                  weight_decay=0.01),
     lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, dampening=0.3,
                               weight_decay=0.01), None),
    ("sgd_nesterov",
     lambda m: poptorch.optim.SGD(m.parameters(), lr=0.05, momentum=0.8, nesterov=True),
     lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.8, nesterov=True), None),
    ("sgd_combined_velocity_scaling",
     lambda m: poptorch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, use_combined_accum=True,
                                  velocity_scaling=16.0, loss_scaling=8.0),
     lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), None),
    ("sgd_maximize",
     lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5, maximize=True),
     lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5, maximize=True), None),
    ("sgd_loss_scaling_max_grad_norm",
     lambda m: poptorch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5, loss_scaling=64.0,
                                  max_grad_norm=0.05),
     lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5), 0.05),
    ("adam", lambda m: poptorch.optim.Adam(m.parameters(), lr=0.02),
     lambda m: torch.optim.Adam(m.parameters(), lr=0.02), None),
    ("adam_betas_eps_wd",
     lambda m: poptorch.optim.Adam(m.parameters(), lr=0.02, betas=(0.8, 0.95), eps=1e-6,
                                   weight_decay=0.1, loss_scaling=32.0),
     lambda m: torch.optim.Adam(m.parameters(), lr=0.02, betas=(0.8, 0.95), eps=1e-6,
                                weight_decay=0.1), None),
    ("adam_max_grad_norm",
     lambda m: poptorch.optim.Adam(m.parameters(), lr=0.02, max_grad_norm=0.01),
     lambda m: torch.optim.Adam(m.parameters(), lr=0.02), 0.01),
    ("adamw", lambda m: poptorch.optim.AdamW(m.parameters(), lr=0.02, weight_decay=0.2),
     lambda m: torch.optim.AdamW(m.parameters(), lr=0.02, weight_decay=0.2), None),
    ("adamw_maximize",
     lambda m: torch.optim.AdamW(m.parameters(), lr=0.02, maximize=True),
     lambda m: torch.optim.AdamW(m.parameters(), lr=0.02, maximize=True), None),
    ("rmsprop", lambda m: poptorch.optim.RMSprop(m.parameters(), lr=0.01),
     lambda m: torch.optim.RMSprop(m.parameters(), lr=0.01), None),
    ("rmsprop_centered_momentum_wd",
     lambda m: poptorch.optim.RMSprop(m.parameters(), lr=0.01, alpha=0.9, momentum=0.5,
                                      centered=True, weight_decay=0.05),
     lambda m: torch.optim.RMSprop(m.parameters(), lr=0.01, alpha=0.9, momentum=0.5,
                                   centered=True, weight_decay=0.05), None),
    ("lamb", lambda m: poptorch.optim.LAMB(m.parameters(), lr=0.02),
     lambda m: poptorch.optim.LAMB(m.parameters(), lr=0.02), None),
    ("lamb_no_bias_max_weight_norm",
     lambda m: poptorch.optim.LAMB(m.parameters(), lr=0.02, bias_correction=False,
                                   max_weight_norm=0.5),
     lambda m: poptorch.optim.LAMB(m.parameters(), lr=0.02, bias_correction=False,
                                   max_weight_norm=0.5), None),
    ("param_groups_sgd",
     lambda m: poptorch.optim.SGD(_groups(m, lr=0.3, momentum=0.9), lr=0.05),
     lambda m: torch.optim.SGD(_groups(m, lr=0.3, momentum=0.9), lr=0.05), None),
    ("param_groups_adam",
     lambda m: poptorch.optim.Adam(_groups(m, lr=0.001, weight_decay=0.5), lr=0.03),
     lambda m: torch.optim.Adam(_groups(m, lr=0.001, weight_decay=0.5), lr=0.03), None),
]
TORCH_CASES = [
    ("torch_sgd", lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9,
                                            weight_decay=0.01)),
    ("torch_adam", lambda m: torch.optim.Adam(m.parameters(), lr=0.01, weight_decay=0.01)),
    ("torch_adamw", lambda m: torch.optim.AdamW(m.parameters(), lr=0.01)),
    ("torch_rmsprop", lambda m: torch.optim.RMSprop(m.parameters(), lr=0.01, momentum=0.3)),
]


@pytest.mark.parametrize("name, make_ipu, make_cpu, max_norm", CASES, ids=[c[0] for c in CASES])
def test_poptorch_optimizer_matches_torch(name, make_ipu, make_cpu, max_norm):
    _train(make_ipu, make_cpu, max_norm=max_norm)


@pytest.mark.parametrize("name, make", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_torch_optimizer_matches_torch(name, make):
    _train(make, make)


@pytest.mark.skipif(
    "decoupled_weight_decay" not in torch.optim.Adam.__init__.__code__.co_varnames,
    reason="this torch's Adam has no decoupled_weight_decay",
)
def test_adam_with_decoupled_weight_decay_is_adamw():
    def make(m):
        return torch.optim.Adam(m.parameters(), lr=0.02, weight_decay=0.3,
                                decoupled_weight_decay=True)

    _train(make, make)


def test_gradient_accumulation_matches_the_mean_gradient():
    """gradientAccumulation(2), Mean reduction: each step uses the mean gradient of its two
    micro-batches, i.e. torch's gradient of the mean loss over both."""
    _train(
        lambda m: poptorch.optim.Adam(m.parameters(), lr=0.02),
        lambda m: torch.optim.Adam(m.parameters(), lr=0.02),
        ga=2,
    )
    _train(
        lambda m: poptorch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, loss_scaling=4.0),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        ga=2,
    )


def test_lr_scheduler_and_set_optimizer_follow_torch():
    """An LR scheduler on a poptorch optimiser; setOptimizer after each step of it."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, 0.5)
    training = poptorch.trainingModel(model, _options(1), opt)
    cpu_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.5)
    cpu_scheduler = torch.optim.lr_scheduler.ExponentialLR(cpu_opt, 0.5)
    program = None
    for epoch in range(3):
        x, t = _data(B, seed=epoch)
        training(x, t)
        program = program or training._session._program
        _cpu_steps(reference, cpu_opt, x, t, 1)
        scheduler.step()
        cpu_scheduler.step()
        training.setOptimizer(opt)
    assert training._session._program is program  # no recompilation
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0125)
    _assert_same(model, reference)


def test_state_dict_resumes_training():
    """Train, save the optimiser state (PopTorch's layout), restore it into a new model and
    optimiser: training continues exactly as without the interruption."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    opt = poptorch.optim.Adam(model.parameters(), lr=0.02)
    training = poptorch.trainingModel(model, _options(2), opt)
    x, t = _data(2 * B)
    training(x, t)
    saved = opt.state_dict()
    assert set(saved["ipu_state"]) >= {"Accl1___fc1.weight", "Accl2___fc2.bias"}
    assert saved["ipu_param"]["learningRate___specific___fc1.weight"] == pytest.approx(0.02)
    training.destroy()

    restored = copy.deepcopy(model)
    new_opt = poptorch.optim.Adam(restored.parameters(), lr=0.02)
    new_opt.load_state_dict(saved)
    resumed = poptorch.trainingModel(restored, _options(2), new_opt)
    x2, t2 = _data(2 * B, seed=1)
    resumed(x2, t2)

    cpu_opt = torch.optim.Adam(reference.parameters(), lr=0.02)
    _cpu_steps(reference, cpu_opt, torch.cat([x, x2]), torch.cat([t, t2]), 4)
    _assert_same(restored, reference)


def test_changing_a_constant_is_an_error_and_a_variable_is_not():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # momentum left at 0: a constant
    training = poptorch.trainingModel(model, _options(1), opt)
    training(*_data(B))
    opt.param_groups[0]["lr"] = 0.05  # lr: always variable
    training.setOptimizer(opt)
    opt.param_groups[0]["momentum"] = 0.9
    with pytest.raises(ValueError, match="'momentum' of SGD was constant"):
        training.setOptimizer(opt)
    clipped = poptorch.optim.SGD(model.parameters(), lr=0.1, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="max_grad_norm was inf .* part of the program"):
        training.setOptimizer(clipped)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda m: poptorch.optim.Adam(m.parameters(), amsgrad=True), ValueError, "amsgrad"),
        (lambda m: torch.optim.AdamW(m.parameters(), amsgrad=True), ValueError, "amsgrad"),
        (lambda m: torch.optim.Adagrad(m.parameters()), TypeError, "Unsupported optimizer"),
        (lambda m: torch.optim.SGD(Net().parameters()), ValueError, "not a parameter of the model"),
    ],
    ids=["adam_amsgrad", "adamw_amsgrad", "adagrad", "foreign_parameter"],
)
def test_unsupported_settings_are_refused(make, error, match):
    model = Net()
    with pytest.raises(error, match=match):
        poptorch.trainingModel(model, _options(1), make(model))


def test_poptorch_optimizers_are_torch_optimizers():
    model = Net()
    for cls in (poptorch.optim.SGD, poptorch.optim.Adam, poptorch.optim.AdamW,
                poptorch.optim.RMSprop, poptorch.optim.LAMB):
        opt = cls(model.parameters(), lr=0.01)
        assert isinstance(opt, torch.optim.Optimizer)
        state = opt.state_dict()
        assert state["ipu_state"] is None and state["ipu_param"] is None
        assert "param_groups" in state
        opt.zero_grad()
    assert poptorch.optim.SGD.__bases__[1] is torch.optim.SGD
    with pytest.raises(RuntimeError, match="Only IPU optimizer states"):
        poptorch.optim.Adam(model.parameters()).load_state_dict(
            torch.optim.Adam(model.parameters()).state_dict()
        )


def test_only_subclasses_of_supported_optimizers_are_warned_about(caplog):
    """An unsupported optimiser is refused without the subclass warning; a user's subclass
    of a supported one runs, with it (its own step() is not what the device runs)."""

    class MySGD(torch.optim.SGD):
        pass

    model = Net()
    with caplog.at_level("WARNING"), pytest.raises(TypeError, match="Unsupported optimizer"):
        poptorch.trainingModel(model, _options(1), torch.optim.NAdam(model.parameters()))
    assert "subclass" not in caplog.text
    training = poptorch.trainingModel(model, _options(1), MySGD(model.parameters(), lr=0.1))
    with caplog.at_level("WARNING"):
        training(*_data(training.options.device_iterations * 2))
    assert "Optimizer `MySGD` is a subclass" in caplog.text
