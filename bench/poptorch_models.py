"""Real ``torch.nn`` models through ``poptorch`` vs the same math in JAX and in eager PyTorch.

Models: the CNN of tutorial 8 and a stack of ``nn.TransformerEncoderLayer(128, 4, 512)``.
For each, one call of ``poptorch.inferenceModel`` / ``trainingModel`` (SGD) is timed against
a hand-written ``jax.jit`` step computing the same thing from the same weights, and
against eager PyTorch on the same CPU, in one process (alternating rounds). Outputs are
checked to agree before timing.

``--compile`` measures build + compile (capture, IR, XLA) of the transformer at 12 and 48
layers, each in a fresh process; ``--torch-compile`` adds ``torch.compile``'s time to the
first forward + backward of the same stacks (about a minute each on 2 cores).

Run: python bench/poptorch_models.py [--quick] [--compile] [--torch-compile]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import poptorch  # noqa: E402
from bench._common import compare, peak_rss_mb, run_variant, set_matmul_precision  # noqa: E402

HIGHEST = jax.lax.Precision.HIGHEST


# ---- models ---------------------------------------------------------------------------------


class CNN(torch.nn.Module):
    """Tutorial 8's network: two conv/pool/relu blocks and a two-layer classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5)
        self.conv2 = torch.nn.Conv2d(16, 32, 5)
        self.fc1 = torch.nn.Linear(512, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(torch.nn.functional.max_pool2d(self.conv1(x), 2))
        x = torch.relu(torch.nn.functional.max_pool2d(self.conv2(x), 2))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class Encoder(torch.nn.Module):
    """``layers`` post-norm encoder layers (d_model 128, 4 heads, FFN 512), no dropout."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [
                torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
                for _ in range(layers)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class WithLoss(torch.nn.Module):
    """A model and a loss: the mean square of its output against a target."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> Any:
        out = self.model(x)
        return out, torch.nn.functional.mse_loss(out, target)


# ---- the same math in JAX ---------------------------------------------------------------------


def _conv(x: Any, w: Any, b: Any) -> Any:
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", precision=HIGHEST)
    return y + b[None, :, None, None]


def _pool(x: Any) -> Any:
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def cnn_jax(p: dict[str, Any], x: Any) -> Any:
    x = jax.nn.relu(_pool(_conv(x, p["conv1.weight"], p["conv1.bias"])))
    x = jax.nn.relu(_pool(_conv(x, p["conv2.weight"], p["conv2.bias"])))
    x = x.reshape(x.shape[0], -1)
    x = jax.nn.relu(jnp.dot(x, p["fc1.weight"].T, precision=HIGHEST) + p["fc1.bias"])
    return jnp.dot(x, p["fc2.weight"].T, precision=HIGHEST) + p["fc2.bias"]


def _linear(x: Any, w: Any, b: Any) -> Any:
    return jnp.dot(x, w.T, precision=HIGHEST) + b


def _layer_norm(x: Any, w: Any, b: Any) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * w + b


def encoder_layer_jax(p: dict[str, Any], x: Any) -> Any:
    batch, seq, d = x.shape
    heads = 4
    qkv = _linear(x, p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"])
    q, k, v = jnp.split(qkv, 3, axis=-1)

    def split(t: Any) -> Any:
        return t.reshape(batch, seq, heads, d // heads).transpose(0, 2, 1, 3)

    q, k, v = split(q), split(k), split(v)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=HIGHEST) / np.sqrt(d // heads)
    attn = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, -1), v, precision=HIGHEST)
    attn = attn.transpose(0, 2, 1, 3).reshape(batch, seq, d)
    attn = _linear(attn, p["self_attn.out_proj.weight"], p["self_attn.out_proj.bias"])
    x = _layer_norm(x + attn, p["norm1.weight"], p["norm1.bias"])
    ff = _linear(jax.nn.relu(_linear(x, p["linear1.weight"], p["linear1.bias"])),
                 p["linear2.weight"], p["linear2.bias"])
    return _layer_norm(x + ff, p["norm2.weight"], p["norm2.bias"])


def encoder_jax(p: dict[str, Any], x: Any) -> Any:
    """The stack as one scanned layer (what a JAX user writes for a deep stack)."""

    def body(h: Any, layer: dict[str, Any]) -> tuple[Any, None]:
        return encoder_layer_jax(layer, h), None

    out, _ = jax.lax.scan(body, x, p)
    return out


def jax_params(model: torch.nn.Module) -> dict[str, Any]:
    return {n: jnp.asarray(t.detach().numpy()) for n, t in model.state_dict().items()}


def stacked(model: Encoder) -> dict[str, Any]:
    per_layer = [jax_params(layer) for layer in model.layers]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)


# ---- measurements -----------------------------------------------------------------------------


def inference(name: str, model: torch.nn.Module, x: torch.Tensor, fn: Any, params: Any) -> dict:
    model.eval()
    pm = poptorch.inferenceModel(model)
    step = jax.jit(fn)
    ours = pm(x)
    ref = np.asarray(step(params, x.numpy()))
    with torch.no_grad():
        eager = model(x)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(ours.numpy(), eager.numpy(), rtol=2e-4, atol=2e-4)
    host = x.numpy()

    def jax_call() -> None:
        np.asarray(step(params, host))

    def eager_call() -> None:
        with torch.no_grad():
            model(x)

    t_pop, t_jax = compare(lambda: pm(x), jax_call, repeats=10)
    _, t_eager = compare(lambda: pm(x), eager_call, repeats=10)
    return {
        "benchmark": f"{name} inference, ms/call",
        "poptorch": t_pop * 1e3,
        "hand JAX": t_jax * 1e3,
        "eager torch": t_eager * 1e3,
        "JAX/poptorch": t_jax / t_pop,
        "eager/poptorch": t_eager / t_pop,
    }


def training(name: str, model: torch.nn.Module, x: torch.Tensor, fn: Any, params: Any) -> dict:
    """One SGD step (lr 0.01) on the mean square of the output against a fixed target."""
    torch.manual_seed(1)
    target = torch.randn_like(model(x)).detach()
    reference = WithLoss(_copy(model))
    wrapped = WithLoss(model)
    pm = poptorch.trainingModel(wrapped, optimizer=torch.optim.SGD(wrapped.parameters(), lr=0.01))

    def loss_fn(p: Any, xs: Any, ts: Any) -> Any:
        return jnp.mean((fn(p, xs) - ts) ** 2)

    @jax.jit
    def jax_step(p: Any, xs: Any, ts: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(p, xs, ts)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), loss

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.01)

    def eager_step() -> None:
        optimizer.zero_grad()
        _, loss = reference(x, target)
        loss.backward()
        optimizer.step()

    state = {"p": params}
    host_x, host_t = x.numpy(), target.numpy()

    def jax_call() -> None:
        state["p"], loss = jax_step(state["p"], host_x, host_t)
        float(loss)

    _, loss = pm(x, target)
    _, expected = reference(x, target)
    np.testing.assert_allclose(float(loss), float(expected.detach()), rtol=1e-4)
    t_pop, t_jax = compare(lambda: pm(x, target), jax_call, repeats=5)
    _, t_eager = compare(lambda: pm(x, target), eager_step, repeats=5)
    return {
        "benchmark": f"{name} SGD training step, ms/call",
        "poptorch": t_pop * 1e3,
        "hand JAX": t_jax * 1e3,
        "eager torch": t_eager * 1e3,
        "JAX/poptorch": t_jax / t_pop,
        "eager/poptorch": t_eager / t_pop,
        "peak RSS MiB (process)": peak_rss_mb(),
    }


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy  # noqa: PLC0415

    return copy.deepcopy(model)


def compile_time(layers: int, train: bool) -> dict:
    """Build + compile + first call of the stack (run in a fresh process)."""
    torch.manual_seed(0)
    model = Encoder(layers)
    x = torch.randn(8, 64, 128)
    start = time.perf_counter()
    if train:
        wrapped = WithLoss(model)
        pm = poptorch.trainingModel(wrapped, optimizer=torch.optim.SGD(wrapped.parameters(), lr=0.01))
        pm(x, torch.zeros(8, 64, 128))
    else:
        pm = poptorch.inferenceModel(model.eval())
        pm(x)
    return {"layers": layers, "train": train, "seconds": time.perf_counter() - start}


def torch_compile_time(layers: int) -> dict:
    """``torch.compile`` to the first forward + backward of the same stack (fresh process)."""
    torch.manual_seed(0)
    model = Encoder(layers)
    x = torch.randn(8, 64, 128)
    start = time.perf_counter()
    compiled = torch.compile(model)
    compiled(x).square().mean().backward()
    return {"layers": layers, "seconds": time.perf_counter() - start}


# ---- execution strategies on the torch transformer --------------------------------------------

STRATEGY_LAYERS = 4
STRATEGY_GA = 8
STRATEGIES = ("plain", "pipelined", "phased")


def _strategy_model(kind: str) -> tuple[torch.nn.Module, Any]:
    """The encoder with its loss, from the same seed, marked for ``kind``: ``pipelined``
    puts the second half of the layers on IPU 1 (two stages); ``phased`` runs each half
    as one phase of ``SerialPhasedExecution`` with the weights off chip (remote buffers,
    loaded for their phase), as PopTorch's phased examples do."""
    torch.manual_seed(0)
    model = WithLoss(Encoder(STRATEGY_LAYERS))
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(STRATEGY_GA)
    half = model.model.layers[STRATEGY_LAYERS // 2]
    if kind == "pipelined":
        poptorch.BeginBlock(half, ipu_id=1)
        opts.setExecutionStrategy(poptorch.PipelinedExecution())
    elif kind == "phased":
        poptorch.BeginBlock(model.model.layers[0], "0", ipu_id=0)
        poptorch.BeginBlock(half, "1", ipu_id=0)
        opts.setExecutionStrategy(poptorch.SerialPhasedExecution("0", "1"))
        opts.TensorLocations.setWeightLocation(
            poptorch.TensorLocationSettings().useOnChipStorage(False)
        )
    return model, opts


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def strategies(micro: int, rounds: int) -> list[dict]:
    """Each strategy's training step (SGD, ``STRATEGY_GA`` micro-batches of ``micro``
    sequences per call) against the plain run's, as ``bench/strategies.py`` compares
    popxl programs: samples/s and CPU time per step (alternating rounds), the largest
    per-device peak of ``memory_report()``, and the weights after one step."""
    x = torch.randn(STRATEGY_GA * micro, 64, 128)
    target = torch.randn_like(x)
    models, weights, peaks = {}, {}, {}
    for kind in STRATEGIES:
        model, opts = _strategy_model(kind)
        pm = poptorch.trainingModel(
            model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.01)
        )
        pm(x, target)
        weights[kind] = {n: p.detach().clone() for n, p in model.named_parameters()}
        peaks[kind] = max(m.device_peak for m in pm._session.memory_report().ipus)
        models[kind] = pm
    for kind in STRATEGIES[1:]:
        for name, value in weights[kind].items():
            np.testing.assert_allclose(value, weights["plain"][name], rtol=2e-3, atol=2e-5)
    wall: dict[str, list[float]] = {k: [] for k in STRATEGIES}
    cpu: dict[str, list[float]] = {k: [] for k in STRATEGIES}
    for _ in range(rounds):
        for kind, pm in models.items():
            start, used = time.perf_counter(), _cpu_seconds()
            for _ in range(3):
                pm(x, target)
            wall[kind].append((time.perf_counter() - start) / 3)
            cpu[kind].append((_cpu_seconds() - used) / 3)
    samples = STRATEGY_GA * micro
    base = {"wall": min(wall["plain"]), "cpu": min(cpu["plain"]), "peak": peaks["plain"]}
    return [
        {
            "benchmark": f"{STRATEGY_LAYERS}-layer transformer training, {kind}",
            "samples/s": samples / min(wall[kind]),
            "x plain": base["wall"] / min(wall[kind]),
            "CPU ms/step": min(cpu[kind]) * 1e3,
            "CPU x plain": min(cpu[kind]) / base["cpu"],
            "device peak MB": peaks[kind] / 1e6,
            "peak x plain": peaks[kind] / base["peak"],
        }
        for kind in STRATEGIES
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller inputs")
    parser.add_argument("--compile", action="store_true", help="build+compile at 12 and 48 layers")
    parser.add_argument("--torch-compile", action="store_true", help="torch.compile beside it")
    parser.add_argument(
        "--strategies", action="store_true", help="only pipelined and phased against plain"
    )
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    set_matmul_precision()
    torch.set_num_threads(os.cpu_count() or 1)
    if args.variant:
        kind, layers, train = args.variant.split(":")
        fn = torch_compile_time if kind == "torch" else compile_time
        result = fn(int(layers)) if kind == "torch" else fn(int(layers), train == "1")
        print(json.dumps(result))
        return
    batch = 16 if args.quick else 64
    if args.strategies:
        for row in strategies(micro=2 if args.quick else 8, rounds=3 if args.quick else 5):
            print(json.dumps(row))
        return
    torch.manual_seed(0)
    cnn = CNN()
    image = torch.randn(batch, 1, 28, 28)
    encoder = Encoder(12)
    tokens = torch.randn(batch // 8, 64, 128)
    rows = [
        inference(f"CNN (batch {batch})", cnn, image, cnn_jax, jax_params(cnn)),
        inference("12-layer transformer", encoder, tokens, encoder_jax, stacked(encoder)),
        training(f"CNN (batch {batch})", cnn, image, cnn_jax, jax_params(cnn)),
        training("12-layer transformer", encoder, tokens, encoder_jax, stacked(encoder)),
    ]
    for row in rows:
        print(json.dumps(row))
    if args.compile or args.torch_compile:
        script = os.path.abspath(__file__)
        for train in ("0", "1") if args.compile else ():
            times = {n: run_variant(script, "--variant", f"ours:{n}:{train}")["seconds"] for n in (12, 48)}
            print(json.dumps({"benchmark": f"poptorch build+compile, {'training' if train == '1' else 'inference'}",
                              "12 layers s": times[12], "48 layers s": times[48],
                              "48/12": times[48] / times[12]}))
        if args.torch_compile:
            times = {n: run_variant(script, "--variant", f"torch:{n}:1")["seconds"] for n in (12, 48)}
            print(json.dumps({"benchmark": "torch.compile to first forward+backward",
                              "12 layers s": times[12], "48 layers s": times[48],
                              "48/12": times[48] / times[12]}))


if __name__ == "__main__":
    main()
