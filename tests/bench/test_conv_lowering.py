"""bench/conv_lowering.py: its networks, written with the new lowering rules, compute what
torch computes: torchvision's ResNet-18 (eval) and tutorial 8's CNN, logits and the
convolution weights' gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bench import conv_lowering as bench


def _close(got, want, tol=2e-4):
    scale = np.abs(want).max() + 1e-6
    np.testing.assert_allclose(np.asarray(got) / scale, np.asarray(want) / scale, atol=tol)


def test_resnet18_with_the_new_lowering_matches_torchvision(rng):
    params, model = bench.resnet18_params(rng)
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    forward = bench.resnet18(bench.new_conv, bench.new_max_pool)
    cot = rng.standard_normal((2, model.fc.out_features)).astype(np.float32)

    @jax.jit  # as programs run it (op by op the network takes several times longer)
    def logits_and_grads(p, images, cotangent):
        logits, pullback = jax.vjp(lambda q: forward(q, images), p)
        return logits, pullback(cotangent)[0]

    logits, grads = logits_and_grads(params, jnp.asarray(x), jnp.asarray(cot))
    want = model(torch.tensor(x))
    (want * torch.tensor(cot)).sum().backward()
    _close(logits, want.detach().numpy())
    for name in ("conv1", "layer1.0.conv1", "layer4.1.conv2", "layer3.0.downsample.0"):
        _close(grads[name + ".w"], model.get_submodule(name).weight.grad.numpy())


def test_tutorial8_cnn_with_the_new_lowering_matches_torch(rng):
    shapes = {"conv1": (16, 1, 5, 5), "b1": (16,), "conv2": (32, 16, 5, 5), "b2": (32,)}
    shapes |= {"fc1": (64, 512), "fc1b": (64,), "fc2": (10, 64), "fc2b": (10,)}
    params = {k: (rng.standard_normal(s) * 0.1).astype(np.float32) for k, s in shapes.items()}
    images = np.maximum(rng.standard_normal((4, 1, 28, 28)), 0).astype(np.float32)
    forward = bench.cnn(bench.new_conv, bench.new_max_pool)
    loss = lambda p: jnp.sum(forward(p, jnp.asarray(images)) ** 2)  # noqa: E731
    grads = jax.jit(jax.grad(loss))(params)
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    (bench.cnn_torch(tparams, torch.tensor(images)) ** 2).sum().backward()
    for name in ("conv1", "conv2", "b1"):
        _close(grads[name], tparams[name].grad.numpy())
