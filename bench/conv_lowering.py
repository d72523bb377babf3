"""Convolutions and pools on XLA:CPU: the old lowering against the new one, and eager torch.

*Old* is what ``popxl.ops.conv`` / ``max_pool`` lowered to before issue 38:
``lax.conv_general_dilated`` (float32 at ``Precision.HIGHEST``) and a max ``reduce_window``
(whose gradient is ``select_and_scatter``). *New* calls the lowering rules themselves
(``popxl.ops.conv._lower_conv``, ``popxl.ops.pool._lower_max_pool``), so it measures what
``popxl.ops`` programs and captured torch models run.

Cases: the convolution shapes of torchvision's ResNet-18 at batch 8 and 64x64, tutorial 8's
CNN (batch 16, 28x28), MobileNetV2-like depthwise convolutions, the pools of both networks,
and two whole networks written with either lowering: ResNet-18 (BatchNorm as its eval
affine) and tutorial 8's CNN (logits, forward and backward).

Each case is timed forward and forward + backward (gradients of every input except a
network's images), ``jax.jit``-ed with the options programs compile with
(``runtime/xla_options``: on several cores, convolutions on Eigen's kernel), ``block_until_ready``, median per-call time over rounds.
Old and new run in alternating rounds in one process, so load changes hit both; eager torch
(``torch.nn.functional``, its default 2 threads) runs afterwards in its own phase, never
interleaved with XLA calls. The machine's load (``uptime``) is printed with each phase:
with other work on the 2 cores, compare ratios, not absolute times. Values are checked to
agree before timing.

The first call (trace, lower, XLA compile) of each network's fwd+bwd is printed too.

Run: python bench/conv_lowering.py [--quick] [--only SUBSTRING] [--torch-threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from jax import lax  # noqa: E402

from popxl.ops.conv import _lower_conv  # noqa: E402
from popxl.ops.pool import _lower_average_pool, _lower_max_pool  # noqa: E402
from runtime.backend.forms import forms_of  # noqa: E402
from runtime.backend.xla_options import jit  # noqa: E402  (the options programs compile with)

HIGHEST = lax.Precision.HIGHEST

# ---- the two lowerings ----------------------------------------------------------------------


def old_conv(x: Any, w: Any, stride: int, pad: int, groups: int = 1) -> Any:
    n = x.ndim - 2
    return lax.conv_general_dilated(
        x, w, (stride,) * n, [(pad, pad)] * n, feature_group_count=groups, precision=HIGHEST
    )


def new_conv(x: Any, w: Any, stride: int, pad: int, groups: int = 1) -> Any:
    n = x.ndim - 2
    return _lower_conv(
        x,
        w,
        stride=(stride,) * n,
        padding=(pad,) * 2 * n,
        dilation=(1,) * n,
        groups=groups,
        pad_type="not_set",
    )


def old_max_pool(x: Any, k: int, s: int, p: int) -> Any:
    n = x.ndim - 2
    xp = jnp.pad(x, [(0, 0)] * 2 + [(p, p)] * n, constant_values=-jnp.inf)
    return lax.reduce_window(xp, -jnp.inf, lax.max, (1, 1) + (k,) * n, (1, 1) + (s,) * n, "VALID")


def new_max_pool(x: Any, k: int, s: int, p: int) -> Any:
    n = x.ndim - 2
    return _lower_max_pool(
        x,
        storage_order="row",
        kernel_size=(k,) * n,
        stride=(s,) * n,
        padding=(p,) * 2 * n,
        out_pads=(0,) * 2 * n,
        dilation=(1,) * n,
        in_dilations=(1,) * n,
        auto_pad="not_set",
        ceil_mode=False,
    )


def old_avg_pool(x: Any, k: int, s: int, p: int) -> Any:
    """The old average pool: windowed sums of the input and of ones (padding excluded)."""
    n = x.ndim - 2
    window, strides, pads = (1, 1) + (k,) * n, (1, 1) + (s,) * n, [(0, 0)] * 2 + [(p, p)] * n
    sums = lax.reduce_window(x, 0.0, lax.add, window, strides, pads)
    counts = lax.reduce_window(jnp.ones_like(x), 0.0, lax.add, window, strides, pads)
    return sums / counts


def new_avg_pool(x: Any, k: int, s: int, p: int) -> Any:
    n = x.ndim - 2
    return _lower_average_pool(
        x,
        kernel_size=(k,) * n,
        stride=(s,) * n,
        padding=(p,) * 2 * n,
        out_pads=(0,) * 2 * n,
        dilation=(1,) * n,
        in_dilations=(1,) * n,
        auto_pad="not_set",
        ceil_mode=False,
    )


LOWERINGS = {"old": (old_conv, old_max_pool), "new": (new_conv, new_max_pool)}
AVG_LOWERINGS = {"old": old_avg_pool, "new": new_avg_pool}
# Off the CPU, "new" keeps XLA's own kernels (cuDNN on a GPU); "cpu forms" measures there
# the forms the rules choose on the CPU (traced under ``runtime.backend.forms.forms_of("cpu")``).
CPU_FORMS = "cpu forms"
if jax.default_backend() != "cpu":
    LOWERINGS[CPU_FORMS] = LOWERINGS["new"]
    AVG_LOWERINGS[CPU_FORMS] = new_avg_pool


def forms(variant: str) -> Any:
    """The context the variant's functions are traced in."""
    return forms_of("cpu") if variant == CPU_FORMS else contextlib.nullcontext()


def traced_in(variant: str, fn: Callable) -> Callable:
    """``fn`` (jitted), whose trace at its first call chooses the variant's forms."""

    def call(*args: Any) -> Any:
        with forms(variant):
            return fn(*args)

    return call


def torch_conv(x: Any, w: Any, stride: int, pad: int, groups: int = 1) -> Any:
    f = getattr(torch.nn.functional, f"conv{x.ndim - 2}d")
    return f(x, w, None, stride, pad, 1, groups)


def torch_max_pool(x: Any, k: int, s: int, p: int) -> Any:
    return getattr(torch.nn.functional, f"max_pool{x.ndim - 2}d")(x, k, s, p)


def torch_avg_pool(x: Any, k: int, s: int, p: int) -> Any:
    f = getattr(torch.nn.functional, f"avg_pool{x.ndim - 2}d")
    return f(x, k, s, p, count_include_pad=False)


# ---- cases ----------------------------------------------------------------------------------

# name: (batch, in channels, out channels, kernel, stride, pad, size, groups, grad of input)
CONVS = {
    "resnet18 conv1 3>64 k7 s2 @64": (8, 3, 64, 7, 2, 3, 64, 1, False),
    "resnet18 layer1 64>64 k3 @16": (8, 64, 64, 3, 1, 1, 16, 1, True),
    "resnet18 layer2 64>128 k3 s2 @16": (8, 64, 128, 3, 2, 1, 16, 1, True),
    "resnet18 layer2 128>128 k3 @8": (8, 128, 128, 3, 1, 1, 8, 1, True),
    "resnet18 downsample 64>128 k1 s2 @16": (8, 64, 128, 1, 2, 0, 16, 1, True),
    "resnet18 layer3 256>256 k3 @4": (8, 256, 256, 3, 1, 1, 4, 1, True),
    "resnet18 layer4 512>512 k3 @2": (8, 512, 512, 3, 1, 1, 2, 1, True),
    "tutorial8 conv1 1>16 k5 @28": (16, 1, 16, 5, 1, 0, 28, 1, False),
    "tutorial8 conv2 16>32 k5 @12": (16, 16, 32, 5, 1, 0, 12, 1, True),
    "depthwise 32 k3 @32": (8, 32, 32, 3, 1, 1, 32, 32, True),
    "depthwise 96 k3 s2 @32": (8, 96, 96, 3, 2, 1, 32, 96, True),
    "depthwise 144 k3 @16": (8, 144, 144, 3, 1, 1, 16, 144, True),
    "depthwise 576 k3 s2 @8": (8, 576, 576, 3, 2, 1, 8, 576, True),
    "depthwise 960 k3 @2": (8, 960, 960, 3, 1, 1, 2, 960, True),
    "grouped 128 g4 k3 @8": (8, 128, 128, 3, 1, 1, 8, 4, True),
    "3-D 64>64 k3 @8x16x16": (4, 64, 64, 3, 1, 1, (8, 16, 16), 1, True),
    "1-D 64>64 k3 @256": (8, 64, 64, 3, 1, 1, (256,), 1, True),
}
# name: (batch, channels, size, kernel, stride, pad)
POOLS = {
    "resnet18 max pool k3 s2 @32": (8, 64, 32, 3, 2, 1),
    "tutorial8 max pool 1 k2 @24": (16, 16, 24, 2, 2, 0),
    "tutorial8 max pool 2 k2 @8": (16, 32, 8, 2, 2, 0),
}


def _spatial(size: Any) -> tuple[int, ...]:
    return tuple(size) if isinstance(size, tuple) else (size, size)


def conv_case(spec: tuple, rng: np.random.Generator) -> tuple:
    b, c, m, k, s, p, size, g, input_grad = spec
    sp = _spatial(size)
    x = rng.standard_normal((b, c, *sp)).astype(np.float32)
    w = (rng.standard_normal((m, c // g, *(k,) * len(sp))) / np.sqrt(c // g * k ** len(sp))).astype(
        np.float32
    )
    xla = {
        name: functools.partial(conv, stride=s, pad=p, groups=g)
        for name, (conv, _) in LOWERINGS.items()
    }
    return [x, w], (0, 1) if input_grad else (1,), xla, lambda x, w: torch_conv(x, w, s, p, g)


def pool_case(spec: tuple, rng: np.random.Generator) -> tuple:
    b, c, size, k, s, p = spec
    x = np.maximum(rng.standard_normal((b, c, size, size)), 0).astype(np.float32)  # ReLU'd
    xla = {name: functools.partial(pool, k=k, s=s, p=p) for name, (_, pool) in LOWERINGS.items()}
    return [x], (0,), xla, lambda x: torch_max_pool(x, k, s, p)


# name: (batch, channels, size, kernel, stride, pad)
AVG_POOLS = {
    "average pool k2 @16": (8, 64, 16, 2, 2, 0),
    "average pool k3 s1 p1 @16": (8, 64, 16, 3, 1, 1),
    "average pool k3 s2 p1 @32": (8, 64, 32, 3, 2, 1),
}


def avg_pool_case(spec: tuple, rng: np.random.Generator) -> tuple:
    b, c, size, k, s, p = spec
    x = rng.standard_normal((b, c, size, size)).astype(np.float32)
    xla = {name: functools.partial(pool, k=k, s=s, p=p) for name, pool in AVG_LOWERINGS.items()}
    return [x], (0,), xla, lambda x: torch_avg_pool(x, k, s, p)


# ---- networks -------------------------------------------------------------------------------


def resnet18_params(rng: np.random.Generator) -> tuple[dict, Any]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    params = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Conv2d | torch.nn.Linear):
            params[name + ".w"] = mod.weight.detach().numpy()
        if isinstance(mod, torch.nn.Linear):
            params[name + ".b"] = mod.bias.detach().numpy()
        if isinstance(mod, torch.nn.BatchNorm2d):
            scale = mod.weight / torch.sqrt(mod.running_var + mod.eps)
            params[name + ".scale"] = scale.detach().numpy()
            params[name + ".shift"] = (mod.bias - mod.running_mean * scale).detach().numpy()
    return params, model


def resnet18(conv: Callable, max_pool: Callable) -> Callable:
    def bn(x: Any, p: dict, name: str) -> Any:
        return x * p[name + ".scale"][:, None, None] + p[name + ".shift"][:, None, None]

    def block(x: Any, p: dict, name: str, stride: int) -> Any:
        y = jax.nn.relu(bn(conv(x, p[name + ".conv1.w"], stride, 1), p, name + ".bn1"))
        y = bn(conv(y, p[name + ".conv2.w"], 1, 1), p, name + ".bn2")
        if name + ".downsample.0.w" in p:
            x = bn(conv(x, p[name + ".downsample.0.w"], stride, 0), p, name + ".downsample.1")
        return jax.nn.relu(x + y)

    def forward(p: dict, x: Any) -> Any:
        x = jax.nn.relu(bn(conv(x, p["conv1.w"], 2, 3), p, "bn1"))
        x = max_pool(x, 3, 2, 1)
        for layer in range(1, 5):
            for i in range(2):
                stride = 2 if layer > 1 and i == 0 else 1
                x = block(x, p, f"layer{layer}.{i}", stride)
        return x.mean((2, 3)) @ p["fc.w"].T + p["fc.b"]

    return forward


def cnn(conv: Callable, max_pool: Callable) -> Callable:
    def forward(p: dict, x: Any) -> Any:
        x = jax.nn.relu(max_pool(conv(x, p["conv1"], 1, 0) + p["b1"][:, None, None], 2, 2, 0))
        x = jax.nn.relu(max_pool(conv(x, p["conv2"], 1, 0) + p["b2"][:, None, None], 2, 2, 0))
        x = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["fc1"].T + p["fc1b"])
        return x @ p["fc2"].T + p["fc2b"]

    return forward


def cnn_torch(p: dict, x: Any) -> Any:
    f = torch.nn.functional
    x = f.relu(f.max_pool2d(f.conv2d(x, p["conv1"], p["b1"]), 2))
    x = f.relu(f.max_pool2d(f.conv2d(x, p["conv2"], p["b2"]), 2))
    return f.linear(f.relu(f.linear(x.flatten(1), p["fc1"], p["fc1b"])), p["fc2"], p["fc2b"])


NETWORKS = ("ResNet-18 (BN eval affine)", "tutorial 8 CNN")


def network_cases(rng: np.random.Generator, torch_device: str = "cpu") -> dict:
    params, model = resnet18_params(rng)
    model.to(torch_device)
    x = rng.standard_normal((8, 3, 64, 64)).astype(np.float32)
    resnet = {name: resnet18(*lower) for name, lower in LOWERINGS.items()}
    shapes = {"conv1": (16, 1, 5, 5), "b1": (16,), "conv2": (32, 16, 5, 5), "b2": (32,)}
    shapes |= {"fc1": (64, 512), "fc1b": (64,), "fc2": (10, 64), "fc2b": (10,)}
    cnn_params = {k: (rng.standard_normal(s) * 0.1).astype(np.float32) for k, s in shapes.items()}
    images = rng.standard_normal((16, 1, 28, 28)).astype(np.float32)
    return {
        NETWORKS[0]: (
            [params, x],
            (0,),
            resnet,
            lambda p, x: model(x),
        ),
        NETWORKS[1]: (
            [cnn_params, images],
            (0,),
            {name: cnn(*lower) for name, lower in LOWERINGS.items()},
            cnn_torch,
        ),
    }


# ---- timing ---------------------------------------------------------------------------------


def load() -> str:
    return os.getloadavg().__repr__()


def _repeats(fn: Callable, most: int, budget: float = 0.25) -> int:
    """Calls per round: ``most``, fewer where a call is slow (a round within ``budget`` s)."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return max(1, min(most, int(budget / (time.perf_counter() - start))))


def alternate(fns: dict[str, Callable], repeats: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in alternating rounds."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        jax.block_until_ready(fn())
    counts = {k: _repeats(fn, repeats) for k, fn in fns.items()}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(counts[name]):
                out = fn()
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - start) / counts[name])
    return {k: statistics.median(v) for k, v in times.items()}


def _loss(f: Callable, cot: Any) -> Callable:
    return lambda *a: jnp.vdot(f(*a), cot)


def time_xla(args: list, wrt: tuple, xla: dict, repeats: int, rounds: int) -> dict:
    args = [jax.tree.map(jnp.asarray, a) for a in args]
    outs = {k: traced_in(k, f)(*args) for k, f in xla.items()}
    for out in outs.values():
        np.testing.assert_allclose(out, outs["old"], rtol=2e-3, atol=2e-3)
    cot = jnp.asarray(np.random.default_rng(1).standard_normal(outs["old"].shape), jnp.float32)
    fns = {}
    for name, f in xla.items():
        fwd = traced_in(name, jit(f))
        grad = traced_in(name, jit(jax.grad(_loss(f, cot), wrt)))
        fns[name + " fwd"] = lambda fwd=fwd: fwd(*args)
        fns[name + " fwd+bwd"] = lambda grad=grad: grad(*args)
    g_old = fns["old fwd+bwd"]()
    for name in xla:
        for a, b in zip(jax.tree.leaves(g_old), jax.tree.leaves(fns[name + " fwd+bwd"]())):
            scale = float(jnp.max(jnp.abs(a))) + 1e-6
            np.testing.assert_allclose(np.asarray(b) / scale, np.asarray(a) / scale, atol=2e-3)
    return alternate(fns, repeats, rounds)


def compile_seconds(variant: str, f: Callable, inputs: list, wrt: tuple) -> float:
    args = [jax.tree.map(jnp.asarray, a) for a in inputs]
    start = time.perf_counter()
    with forms(variant):
        jit(jax.grad(lambda *a: jnp.sum(f(*a)), wrt)).lower(*args).compile()
    return time.perf_counter() - start


def time_torch(
    args: list, wrt: tuple, f: Callable, repeats: int, rounds: int, device: str = "cpu"
) -> dict:
    def tensor(a: Any, grad: bool) -> Any:
        return torch.tensor(a, requires_grad=grad, device=device)

    sync = torch.cuda.synchronize if device.startswith("cuda") else lambda: None

    def fwd() -> Any:
        with torch.no_grad():
            return f(*targs)

    def fwd_bwd() -> Any:
        out = f(*targs)
        out.backward(cot)
        return out

    targs = [
        {k: tensor(v, i in wrt) for k, v in a.items()}
        if isinstance(a, dict)
        else tensor(a, i in wrt)
        for i, a in enumerate(args)
    ]
    cot = torch.tensor(
        np.random.default_rng(1).standard_normal(fwd().shape), dtype=torch.float32, device=device
    )
    times: dict[str, list[float]] = {"torch fwd": [], "torch fwd+bwd": []}
    for fn in (fwd, fwd_bwd):
        fn()
    counts = {fn: _repeats(fn, repeats) for fn in (fwd, fwd_bwd)}
    for _ in range(rounds):
        for name, fn in (("torch fwd", fwd), ("torch fwd+bwd", fwd_bwd)):
            start = time.perf_counter()
            for _ in range(counts[fn]):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / counts[fn])
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and rounds")
    parser.add_argument("--only", default="", help="cases whose name contains this")
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--torch-device", default="cpu", help="eager torch's device (cuda)")
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    repeats, rounds = (3, 3) if args.quick else (10, 5)
    rng = np.random.default_rng(0)
    cases = {name: conv_case(spec, rng) for name, spec in CONVS.items()}
    cases |= {name: pool_case(spec, rng) for name, spec in POOLS.items()}
    cases |= {name: avg_pool_case(spec, rng) for name, spec in AVG_POOLS.items()}
    cases |= network_cases(rng, args.torch_device)
    cases = {k: v for k, v in cases.items() if args.only in k}

    print(f"first call of the networks' fwd+bwd (trace, lower, compile), load {load()}")
    for name, (inputs, wrt, xla, _) in cases.items():
        if name in NETWORKS:
            seconds = {k: compile_seconds(k, f, inputs, wrt) for k, f in xla.items()}
            print(f"  {name}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    print(f"XLA phase, load {load()}", flush=True)
    results = {}
    for name, (inputs, wrt, xla, _) in cases.items():
        results[name] = time_xla(inputs, wrt, xla, repeats, rounds)
        print(
            f"  {name}: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in results[name].items()),
            flush=True,
        )
    print(f"torch phase ({torch.get_num_threads()} threads), load {load()}", flush=True)
    for name, (inputs, wrt, _, f) in cases.items():
        results[name] |= time_torch(inputs, wrt, f, repeats, rounds, args.torch_device)
    print(f"done, load {load()}\n")

    variants = [*LOWERINGS, "torch"]
    heads = [f"{v} {d}" for d in ("fwd", "f+b") for v in variants]
    print(f"device {jax.devices()[0].device_kind}, torch on {args.torch_device}; ms per call")
    print(f"| case | {' | '.join(heads)} | new/old f+b | torch/new f+b |")
    print("|---|" + "---|" * (len(heads) + 2))
    for name, r in results.items():
        ms = [r[f"{v} {d}"] * 1e3 for d in ("fwd", "fwd+bwd") for v in variants]
        speedup = r["old fwd+bwd"] / r["new fwd+bwd"]
        vs_torch = r["torch fwd+bwd"] / r["new fwd+bwd"]
        cells = " | ".join(f"{v:.2f}" for v in ms)
        print(f"| {name} | {cells} | {speedup:.2f}x | {vs_torch:.2f}x |")


if __name__ == "__main__":
    main()
