"""Automatic loss scaling: skipped steps on overflow, backoff and growth of the scale."""

import numpy as np

import poptorch
from poptorch import optim

from ._linear import Linear, data, grad, initial_w

B = 5


def _model(optimizer, interval):
    opts = poptorch.Options()
    opts.Training.setAutomaticLossScaling(True, growth_interval=interval)
    return poptorch.trainingModel(Linear(), opts, optimizer)


def test_inf_batch_is_skipped_and_the_scale_backs_off_then_grows():
    """growth_interval 2, scale 4: finite, finite (-> 8), inf (skip, -> 4), finite, finite
    (-> 8). The weights are plain SGD over the four finite batches."""
    opt = optim.SGD(lr=0.1, loss_scaling=4.0)
    model = _model(opt, interval=2)
    x, t = data(5 * B)
    x[2 * B + 1, 0] = np.inf
    scales, goods, w = [], [], initial_w().astype(np.float64)
    for i in range(5):
        xb, tb = x[i * B : (i + 1) * B], t[i * B : (i + 1) * B]
        model(xb, tb)
        state = opt.state_dict()
        scales.append(state["loss_scaling"])
        goods.append(state["good_steps"])
        if i != 2:
            w = w - 0.1 * grad(w, xb.astype(np.float64), tb)
    assert scales == [4.0, 8.0, 4.0, 4.0, 8.0]
    assert goods == [1, 0, 0, 1, 0]
    assert opt.state_dict()["step"] == 4
    np.testing.assert_allclose(model.state_dict()["w"], w, rtol=1e-5, atol=1e-6)


def test_float16_overflow_halves_until_the_gradients_fit():
    """Accumulating in float16 with scale 2^20: a step overflows while
    scale * max|g| > 65504 (float16's largest value). Each overflow skips the step (the
    momentum buffer and step count stay untouched) and halves the scale; the first step
    that fits is the first real SGD step (momentum buffer = g)."""
    x, t = data(B, seed=3)
    g = grad(initial_w().astype(np.float64), x.astype(np.float64), t)
    top = np.abs(g).max()
    skips = next(k for k in range(21) if top * 2.0 ** (20 - k) < 65000)
    assert skips >= 3  # the test exercises several backoffs
    opt = optim.SGD(lr=0.1, momentum=0.9, loss_scaling=2.0**20, accum_type="float16")
    model = _model(opt, interval=1000)
    for _ in range(skips):
        model(x, t)
        assert opt.state_dict()["step"] == 0
        np.testing.assert_array_equal(opt.state_dict()["state"]["w"]["momentum_buffer"], 0.0)
        np.testing.assert_array_equal(model.state_dict()["w"], initial_w())
    model(x, t)
    state = opt.state_dict()
    assert state["loss_scaling"] == 2.0 ** (20 - skips) and state["step"] == 1
    np.testing.assert_allclose(state["state"]["w"]["momentum_buffer"], g, rtol=2e-3, atol=1e-4)
    np.testing.assert_allclose(model.state_dict()["w"], initial_w() - 0.1 * g, rtol=2e-3, atol=1e-4)


def test_one_call_of_many_device_iterations_adapts_every_step():
    """deviceIterations 3, growth_interval 1, scale 4, the middle batch overflowing:
    finite (-> 8), inf (skipped, -> 4), finite (-> 8). Adam's weights equal those of a
    plain model trained on the two finite batches."""
    opts = poptorch.Options().deviceIterations(3)
    opts.Training.setAutomaticLossScaling(True, growth_interval=1)
    opt = optim.Adam(lr=0.01, loss_scaling=4.0)
    model = poptorch.trainingModel(Linear(), opts, opt)
    x, t = data(3 * B)
    x[B, 2] = -np.inf
    model(x, t)
    state = opt.state_dict()
    assert state["loss_scaling"] == 8.0 and state["step"] == 2
    plain_opt = optim.Adam(lr=0.01)
    plain = poptorch.trainingModel(Linear(), poptorch.Options().deviceIterations(2), plain_opt)
    keep = np.r_[0:B, 2 * B : 3 * B]
    plain(x[keep], t[keep])
    np.testing.assert_allclose(
        model.state_dict()["w"], plain.state_dict()["w"], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        state["state"]["w"]["exp_avg"], plain_opt.state_dict()["state"]["w"]["exp_avg"], rtol=1e-5
    )


def test_set_optimizer_keeps_the_running_scale():
    """setOptimizer changes the learning rate but not the scale automatic loss scaling owns."""
    opt = optim.SGD(lr=0.1, loss_scaling=4.0)
    model = _model(opt, interval=1)
    x, t = data(B)
    model(x, t)
    second = optim.SGD(lr=0.05, loss_scaling=4.0)
    model.setOptimizer(second)
    model(x, t)
    assert second.state_dict()["loss_scaling"] == 16.0
