"""A training step with a custom op vs the same math inline and vs hand-written ``jax.jit``.

The model is ``Linear(W, 2W) -> LeakyRelu -> Linear(2W, W)`` with a mean-squared-error loss,
trained by ``poptorch.trainingModel`` with SGD. Three versions of one step, timed in one
process in alternating rounds:

* **custom op**: the activation is ``poptorch.custom_op`` of a ``popxl.custom_ops``
  registration (a JAX function with a hand-written ``vjp``, as tutorial 9's LeakyRelu);
* **inline**: the same activation as ``torch.nn.functional.leaky_relu`` (popxl's built-in
  ops);
* **hand JAX**: a ``jax.jit`` step of ``jax.value_and_grad`` with the same activation
  (a ``lax.scan`` of such steps for ``deviceIterations`` > 1).

Losses are checked to agree before timing. Ratios are reference / custom op (≥ 1: the custom
op is as fast); the issue's target is ≥ 0.95.

Run: python bench/custom_op.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import poptorch  # noqa: E402
from bench._common import compare, set_matmul_precision  # noqa: E402
from popxl import custom_ops  # noqa: E402

HIGHEST = jax.lax.Precision.HIGHEST
DOMAIN = "bench.custom_op"
ALPHA = 0.1
LR = 0.01


def _leaky(x: Any, *, alpha: float) -> Any:
    return jnp.where(x >= 0, x, alpha * x)


def _leaky_vjp(inputs: tuple, output: Any, grad: Any, *, alpha: float) -> Any:
    return jnp.where(inputs[0] >= 0, grad, alpha * grad)


class Mlp(torch.nn.Module):
    def __init__(self, width: int, custom: bool) -> None:
        super().__init__()
        self.custom = custom
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.fc2 = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> Any:
        h = self.fc1(x)
        if self.custom:
            (h,) = poptorch.custom_op([h], "LeakyRelu", DOMAIN, 1, [h], {"alpha": ALPHA})
        else:
            h = torch.nn.functional.leaky_relu(h, ALPHA)
        out = self.fc2(h)
        return out, torch.nn.functional.mse_loss(out, target)


def _jax_step(params: dict[str, Any], x: Any, t: Any) -> tuple[dict[str, Any], Any]:
    def loss_fn(p: dict[str, Any]) -> Any:
        h = jnp.dot(x, p["fc1.weight"].T, precision=HIGHEST) + p["fc1.bias"]
        h = _leaky(h, alpha=ALPHA)
        out = jnp.dot(h, p["fc2.weight"].T, precision=HIGHEST) + p["fc2.bias"]
        return jnp.mean((out - t) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda w, g: w - LR * g, params, grads), loss


def _jax_loop(params: dict[str, Any], xs: Any, ts: Any) -> tuple[dict[str, Any], Any]:
    """One SGD step per micro-batch (``lax.scan``), as ``deviceIterations`` runs them."""

    def body(p: dict[str, Any], xt: tuple[Any, Any]) -> tuple[dict[str, Any], Any]:
        return _jax_step(p, *xt)

    params, losses = jax.lax.scan(body, params, (xs, ts))
    return params, losses[-1]


def training_step(width: int, batch: int, repeats: int, iterations: int = 1) -> dict:
    torch.manual_seed(0)
    custom = Mlp(width, custom=True)
    inline = copy.deepcopy(custom)
    inline.custom = False
    params = {n: jnp.asarray(t.detach().numpy()) for n, t in custom.state_dict().items()}
    x, target = torch.randn(batch * iterations, width), torch.randn(batch * iterations, width)
    opts = poptorch.Options().deviceIterations(iterations)
    pm_custom = poptorch.trainingModel(
        custom, opts, optimizer=torch.optim.SGD(custom.parameters(), lr=LR)
    )
    pm_inline = poptorch.trainingModel(
        inline, opts, optimizer=torch.optim.SGD(inline.parameters(), lr=LR)
    )
    step = jax.jit(_jax_loop)
    state = {"p": params}
    host_x = x.numpy().reshape(iterations, batch, width)
    host_t = target.numpy().reshape(iterations, batch, width)

    def jax_call() -> float:
        state["p"], loss = step(state["p"], host_x, host_t)
        return float(loss)

    losses = [float(pm_custom(x, target)[1]), float(pm_inline(x, target)[1]), jax_call()]
    np.testing.assert_allclose(losses, losses[0], rtol=1e-5)
    t_custom, t_inline = compare(
        lambda: pm_custom(x, target), lambda: pm_inline(x, target), repeats
    )
    _, t_jax = compare(lambda: pm_custom(x, target), jax_call, repeats)
    return {
        "benchmark": f"MLP {width}-{2 * width}-{width} SGD, batch {batch} x DI {iterations}, "
        "ms/call",
        "custom op": t_custom * 1e3,
        "inline": t_inline * 1e3,
        "hand JAX": t_jax * 1e3,
        "inline/custom": t_inline / t_custom,
        "JAX/custom": t_jax / t_custom,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one small size, fewer repeats")
    args = parser.parse_args(argv)
    set_matmul_precision()
    torch.set_num_threads(os.cpu_count() or 1)
    custom_ops.register(
        "LeakyRelu", _leaky, domain=DOMAIN, attributes={"alpha": 0.01}, vjp=_leaky_vjp
    )
    sizes = [(128, 32, 1)] if args.quick else [(128, 32, 1), (128, 32, 10), (512, 128, 1)]
    for width, batch, iterations in sizes:
        repeats = 10 if args.quick else 20
        print(json.dumps(training_step(width, batch, repeats, iterations)))


if __name__ == "__main__":
    main()
