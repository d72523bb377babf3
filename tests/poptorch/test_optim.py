"""poptorch.optim: each update rule against a NumPy reference (and torch.optim if present)."""

import numpy as np
import pytest

import poptorch
from poptorch import optim

from ._linear import Linear, data, grad, initial_w

STEPS, B = 4, 5


def run_model(optimizer, steps=STEPS, ga=1, options=None):
    """Train for ``steps`` optimiser steps in one call; return the weights."""
    opts = options or poptorch.Options()
    opts.deviceIterations(steps)
    opts.Training.gradientAccumulation(ga)
    model = poptorch.trainingModel(Linear(), opts, optimizer)
    x, t = data(steps * ga * B)
    model(x, t)
    return model, model.state_dict()["w"], x, t


def batches(x, t, steps):
    return zip(np.split(x, steps), np.split(t, steps))


# NumPy references of the update rules (torch.optim's documented algorithms) --------------


def ref_sgd(x, t, lr, momentum=0.0, dampening=0.0, wd=0.0, nesterov=False, max_norm=None):
    w, v = initial_w().astype(np.float64), None
    for xb, tb in batches(x, t, STEPS):
        g = grad(w, xb, tb)
        if max_norm is not None:
            g = g * min(1.0, max_norm / (np.linalg.norm(g) + 1e-6))
        g = g + wd * w
        if momentum:
            v = g if v is None else momentum * v + (1 - dampening) * g
            g = g + momentum * v if nesterov else v
        w = w - lr * g
    return w


def ref_adam(x, t, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, decoupled=False, correct=True):
    w = initial_w().astype(np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for step, (xb, tb) in enumerate(batches(x, t, STEPS), 1):
        g = grad(w, xb, tb)
        if wd and not decoupled:
            g = g + wd * w
        if wd and decoupled:
            w = w - lr * wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mh = m / (1 - b1**step) if correct else m
        vh = v / (1 - b2**step) if correct else v
        w = w - lr * mh / (np.sqrt(vh) + eps)
    return w


def ref_rmsprop(x, t, lr, alpha=0.99, eps=1e-8, momentum=0.0, centered=False, tf=False):
    w = initial_w().astype(np.float64)
    v, ga, buf = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    if tf:  # TensorFlow's variant starts the mean square at ones
        v = np.ones_like(w)
    for xb, tb in batches(x, t, STEPS):
        g = grad(w, xb, tb)
        v = alpha * v + (1 - alpha) * g * g
        avg = v
        if centered:
            ga = alpha * ga + (1 - alpha) * g
            avg = v - ga * ga
        denom = np.sqrt(avg + eps) if tf else np.sqrt(avg) + eps
        if momentum:
            buf = momentum * buf + g / denom
            w = w - lr * buf
        else:
            w = w - lr * g / denom
    return w


def ref_lamb(x, t, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.01, max_norm=65500.0, correct=True):
    w = initial_w().astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for step, (xb, tb) in enumerate(batches(x, t, STEPS), 1):
        g = grad(w, xb, tb)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mh = m / (1 - b1**step) if correct else m
        vh = v / (1 - b2**step) if correct else v
        r = mh / (np.sqrt(vh) + eps) + wd * w
        wn, rn = min(np.linalg.norm(w), max_norm), np.linalg.norm(r)
        ratio = wn / rn if wn > 0 and rn > 0 else 1.0
        w = w - lr * ratio * r
    return w


CASES = {
    "sgd": (lambda: optim.SGD(lr=0.1), lambda x, t: ref_sgd(x, t, 0.1)),
    "sgd_momentum_dampening_wd": (
        lambda: optim.SGD(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=0.1),
        lambda x, t: ref_sgd(x, t, 0.05, 0.9, 0.2, 0.1),
    ),
    "sgd_nesterov": (
        lambda: optim.SGD(lr=0.05, momentum=0.8, nesterov=True),
        lambda x, t: ref_sgd(x, t, 0.05, 0.8, nesterov=True),
    ),
    "sgd_velocity_scaling_combined": (
        lambda: optim.SGD(lr=0.05, momentum=0.9, velocity_scaling=8.0, use_combined_accum=True),
        lambda x, t: ref_sgd(x, t, 0.05, 0.9),
    ),
    "sgd_max_grad_norm": (
        lambda: optim.SGD(lr=0.1, max_grad_norm=0.05),
        lambda x, t: ref_sgd(x, t, 0.1, max_norm=0.05),
    ),
    "adam": (lambda: optim.Adam(lr=0.02), lambda x, t: ref_adam(x, t, 0.02)),
    "adam_l2": (
        lambda: optim.Adam(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
        lambda x, t: ref_adam(x, t, 0.02, 0.8, 0.99, 1e-6, 0.1),
    ),
    "adamw": (
        lambda: optim.AdamW(lr=0.02, weight_decay=0.1),
        lambda x, t: ref_adam(x, t, 0.02, wd=0.1, decoupled=True),
    ),
    "adamw_no_bias_correction": (
        lambda: optim.AdamW(lr=0.02, bias_correction=False),
        lambda x, t: ref_adam(x, t, 0.02, wd=0.01, decoupled=True, correct=False),
    ),
    "rmsprop": (lambda: optim.RMSprop(lr=0.01), lambda x, t: ref_rmsprop(x, t, 0.01)),
    "rmsprop_centered_momentum": (
        lambda: optim.RMSprop(lr=0.01, momentum=0.5, centered=True),
        lambda x, t: ref_rmsprop(x, t, 0.01, momentum=0.5, centered=True),
    ),
    "rmsprop_tf": (
        lambda: optim.RMSprop(lr=0.01, eps=1e-3, use_tf_variant=True),
        lambda x, t: ref_rmsprop(x, t, 0.01, eps=1e-3, tf=True),
    ),
    "lamb": (lambda: optim.LAMB(lr=0.01), lambda x, t: ref_lamb(x, t, 0.01)),
    "lamb_max_weight_norm": (
        lambda: optim.LAMB(lr=0.01, max_weight_norm=0.5, bias_correction=False),
        lambda x, t: ref_lamb(x, t, 0.01, max_norm=0.5, correct=False),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_rule_matches_numpy(case):
    make, reference = CASES[case]
    _, w, x, t = run_model(make())
    expected = reference(x, t)
    assert np.abs(expected - initial_w()).max() > 1e-3
    np.testing.assert_allclose(w, expected, rtol=2e-5, atol=2e-6)


def test_loss_scaling_leaves_training_unchanged():
    _, plain, *_ = run_model(optim.SGD(lr=0.1, momentum=0.5))
    _, scaled, *_ = run_model(optim.SGD(lr=0.1, momentum=0.5, loss_scaling=1024.0))
    np.testing.assert_allclose(scaled, plain, rtol=1e-5, atol=1e-7)


def test_sum_reduction_over_accumulation():
    """ReductionType.Sum: the step uses the sum of the micro-batch gradients."""
    opts = poptorch.Options()
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    model, w, x, t = run_model(optim.SGD(lr=0.05), steps=1, ga=3, options=opts)
    g = sum(grad(initial_w(), xb, tb) for xb, tb in zip(np.split(x, 3), np.split(t, 3)))
    np.testing.assert_allclose(w, initial_w() - 0.05 * g, rtol=1e-5, atol=1e-6)


def test_float16_accumulators_and_moments():
    opt = optim.Adam(
        lr=0.02,
        accum_type="float16",
        first_order_momentum_accum_type=np.float16,
        second_order_momentum_accum_type="float32",
    )
    model, w, x, t = run_model(opt)
    assert model.ir is not None
    state = opt.state_dict()["state"]["w"]
    assert state["exp_avg"].dtype == np.float16 and state["exp_avg_sq"].dtype == np.float32
    np.testing.assert_allclose(w, ref_adam(x, t, 0.02), rtol=2e-3, atol=2e-3)


def test_set_optimizer_changes_variable_attributes_without_recompiling():
    model, *_ = run_model(optim.SGD(lr=0.1))
    program = model._session._program
    before = model.state_dict()["w"]
    model.setOptimizer(optim.SGD(lr=0.0))
    x, t = data(STEPS * B, seed=1)
    model(x, t)
    assert model._session._program is program
    np.testing.assert_array_equal(model.state_dict()["w"], before)  # lr 0: no change


def test_changing_a_constant_attribute_is_an_error():
    model, *_ = run_model(optim.SGD(lr=0.1))
    with pytest.raises(ValueError, match="Attribute 'momentum' of SGD was constant"):
        model.setOptimizer(optim.SGD(lr=0.1, momentum=0.9))


def test_marking_as_variable_allows_changing_it():
    opt = optim.SGD(lr=0.1)
    opt.variable_attrs.markAsVariable("momentum")
    model, *_ = run_model(opt)
    model.setOptimizer(optim.SGD(lr=0.1, momentum=0.9))
    assert model.options.device_iterations == STEPS


def test_other_optimizer_type_is_an_error():
    model, *_ = run_model(optim.SGD(lr=0.1))
    with pytest.raises(ValueError, match="model was compiled with a SGD"):
        model.setOptimizer(optim.Adam(lr=0.1))


def test_variable_attributes_follow_poptorch_rules():
    """Listing 4.16: passed attributes are variable, defaults constant, lr always variable."""
    opt = optim.SGD(lr=0.01, momentum=0.0, use_combined_accum=False)
    assert not opt.variable_attrs.isConstant("lr")
    assert not opt.variable_attrs.isConstant("momentum")
    assert opt.variable_attrs.isConstant("loss_scaling")
    opt = optim.SGD(lr=0.01, use_combined_accum=False)
    assert opt.variable_attrs.isConstant("momentum")
    opt = optim.SGD(lr=0.01, loss_scaling=2.0, use_combined_accum=False)
    assert not opt.variable_attrs.isConstant("loss_scaling")
    with pytest.raises(ValueError, match="no attribute 'betas'"):
        opt.variable_attrs.markAsVariable("betas")


def test_optimizer_state_can_be_read_and_restored():
    """Listing 4.18: state_dict after training, load_state_dict into a new model."""
    opt = optim.Adam(lr=0.02)
    model, w, x, t = run_model(opt)
    saved = opt.state_dict()
    assert saved["step"] == STEPS
    assert set(saved["state"]["w"]) == {"exp_avg", "exp_avg_sq"}
    # PopTorch's layout too: state tensors and variable hyper-parameters by PopART's names.
    np.testing.assert_array_equal(saved["ipu_state"]["Accl1___w"], saved["state"]["w"]["exp_avg"])
    assert saved["ipu_param"]["learningRate___specific___w"] == np.float32(0.02)
    # Continue training in the original model, and in a fresh one restored from state.
    x2, t2 = data(STEPS * B, seed=3)
    model(x2, t2)
    new_opt = optim.Adam(lr=0.02)
    new_opt.load_state_dict(saved)
    opts = poptorch.Options().deviceIterations(STEPS)
    fresh = poptorch.trainingModel(Linear(), opts, new_opt)
    fresh.compile(x2, t2)
    fresh.load_state_dict({"w": w})
    fresh(x2, t2)
    np.testing.assert_allclose(fresh.state_dict()["w"], model.state_dict()["w"], rtol=1e-6)


def test_parameter_groups_use_their_own_hyper_parameters():
    groups = [{"params": ["w"], "lr": 0.0}]
    _, w, *_ = run_model(optim.SGD(groups, lr=0.1))
    np.testing.assert_array_equal(w, initial_w())
    with pytest.raises(ValueError, match="matches no weight"):
        run_model(optim.SGD([{"params": ["nothing.*"]}], lr=0.1))


def test_amsgrad_is_refused():
    """As PopTorch: accepted by the constructor, refused when a model is built with it."""
    opt = optim.Adam(lr=0.1, amsgrad=True)
    with pytest.raises(ValueError, match="amsgrad=True"):
        poptorch.trainingModel(Linear(), poptorch.Options(), opt)


@pytest.mark.parametrize(
    "name, ours, kwargs",
    [
        ("SGD", optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
        ("Adam", optim.Adam, {"lr": 0.02, "weight_decay": 0.01}),
        ("AdamW", optim.AdamW, {"lr": 0.02, "weight_decay": 0.05}),
        ("RMSprop", optim.RMSprop, {"lr": 0.01, "momentum": 0.3, "centered": True}),
    ],
)
def test_matches_torch_optim(name, ours, kwargs):
    torch = pytest.importorskip("torch")
    _, w, x, t = run_model(ours(**kwargs))
    param = torch.nn.Parameter(torch.tensor(initial_w()))
    reference = getattr(torch.optim, name)([param], **kwargs)
    for xb, tb in batches(x, t, STEPS):
        reference.zero_grad()
        y = torch.tensor(xb) @ param
        loss = ((y - torch.tensor(tb)) ** 2).mean()
        loss.backward()
        reference.step()
    np.testing.assert_allclose(w, param.detach().numpy(), rtol=2e-5, atol=2e-6)
