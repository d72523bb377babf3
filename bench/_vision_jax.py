"""torchvision's ResNet-18 written by hand in JAX, for ``poptorch_zoo.py``'s ``jax`` side.

Written as a JAX user would write it: ``lax.conv_general_dilated`` in NHWC (the input
transposed once), BatchNorm with batch statistics in training and running ones in
inference, the running statistics updated as torch updates them (momentum 0.1, unbiased
variance), cross entropy and a plain SGD update, one ``jax.jit`` per step. The parameters
are the torch model's own, so both sides compute the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_EPS = 1e-5
_MOMENTUM = 0.1


def params_of(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trained parameters, BatchNorm running statistics) by torch's names; convolution
    weights in HWIO."""
    params, stats = {}, {}
    for name, value in model.state_dict().items():
        array = value.detach().numpy()
        if name.endswith(("running_mean", "running_var")):
            stats[name] = jnp.asarray(array)
        elif name.endswith("num_batches_tracked"):
            continue
        elif array.ndim == 4:
            params[name] = jnp.asarray(np.transpose(array, (2, 3, 1, 0)))
        else:
            params[name] = jnp.asarray(array)
    return params, stats


def _conv(x: Any, w: Any, stride: int, pad: int) -> Any:
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), [(pad, pad)] * 2, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _resnet18(train: bool) -> Callable:
    def bn(x: Any, p: dict, stats: dict, new: dict, name: str) -> Any:
        if train:
            mean = jnp.mean(x, axis=(0, 1, 2))
            var = jnp.var(x, axis=(0, 1, 2))
            count = x.size // x.shape[-1]
            for key, value in (("running_mean", mean), ("running_var", var * count / (count - 1))):
                old = stats[f"{name}.{key}"]
                new[f"{name}.{key}"] = (1 - _MOMENTUM) * old + _MOMENTUM * value
        else:
            mean, var = stats[f"{name}.running_mean"], stats[f"{name}.running_var"]
        scale = p[f"{name}.weight"] * jax.lax.rsqrt(var + _EPS)
        return (x - mean) * scale + p[f"{name}.bias"]

    def forward(p: dict, stats: dict, x: Any) -> tuple[Any, dict]:
        new: dict[str, Any] = {}
        h = jnp.transpose(x, (0, 2, 3, 1))
        h = jax.nn.relu(bn(_conv(h, p["conv1.weight"], 2, 3), p, stats, new, "bn1"))
        h = jax.lax.reduce_window(
            h, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), [(0, 0), (1, 1), (1, 1), (0, 0)]
        )
        for layer in range(1, 5):
            for block in range(2):
                name = f"layer{layer}.{block}"
                stride = 2 if layer > 1 and block == 0 else 1
                out = _conv(h, p[f"{name}.conv1.weight"], stride, 1)
                out = jax.nn.relu(bn(out, p, stats, new, f"{name}.bn1"))
                out = bn(_conv(out, p[f"{name}.conv2.weight"], 1, 1), p, stats, new, f"{name}.bn2")
                if f"{name}.downsample.0.weight" in p:
                    h = _conv(h, p[f"{name}.downsample.0.weight"], stride, 0)
                    h = bn(h, p, stats, new, f"{name}.downsample.1")
                h = jax.nn.relu(out + h)
        h = jnp.mean(h, axis=(1, 2))
        return h @ p["fc.weight"].T + p["fc.bias"], new

    return forward


def resnet18_inference(model: Any) -> Callable[[Any], Any]:
    """A call of the model in eval mode: ``call(images)`` gives the logits."""
    params, stats = params_of(model)
    forward = jax.jit(lambda p, s, x: _resnet18(False)(p, s, x)[0])
    return lambda x: forward(params, stats, x)


def resnet18_training(model: Any, lr: float = 0.01) -> Callable[[Any, Any], Any]:
    """One SGD step of cross entropy per call: ``step(images, labels)`` gives the loss and
    keeps the updated parameters and running statistics."""
    params, stats = params_of(model)
    forward = _resnet18(True)

    def loss_fn(p: dict, s: dict, x: Any, labels: Any) -> tuple[Any, dict]:
        logits, new = forward(p, s, x)
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
        return -jnp.mean(picked), new

    @jax.jit
    def step(p: dict, s: dict, x: Any, labels: Any) -> tuple[dict, dict, Any]:
        (loss, new), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, s, x, labels)
        return jax.tree.map(lambda w, g: w - lr * g, p, grads), new, loss

    state = {"p": params, "s": stats}

    def call(x: Any, labels: Any) -> Any:
        state["p"], state["s"], loss = step(state["p"], state["s"], x, labels)
        return loss

    return call


MODELS = {"resnet18": (resnet18_inference, resnet18_training)}
