"""Build + compile time of a GPT-2-small-sized training step, vs the same model in JAX.

12 layers, hidden 768, 12 heads, sequence 128, vocabulary 50257, micro-batch 1. The project
version is written with popxl_addons modules (one decoder-layer graph, outlined and bound to
12 sets of weights, as popxl applications do), differentiated with ``addons.autodiff`` and
updated with SGD. The reference is the same step in JAX, timed as
``jax.jit(step).lower(...).compile()``. Seconds; lower is better (target ratio <= 2).
Both variants first make the same random host weights (untimed, as data preparation), so the
timings measure the frameworks rather than NumPy's random number generator, and both
processes hold the weights in host memory.

Run: python bench/build_compile.py [--layers 12]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import device_name, peak_rss_mb, report, run_variant, set_matmul_precision  # noqa: E402

HIDDEN, HEADS, SEQ, VOCAB, BATCH, LR = 768, 12, 128, 50257, 1, 1e-4


def host_weights(layers: int) -> dict[str, np.ndarray]:
    """The model's weights, keyed like the project's variables."""
    rng = np.random.default_rng(0)

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    weights = {"wte": normal(VOCAB, HIDDEN), "wpe": normal(SEQ, HIDDEN)}
    weights.update(
        {"ln_f.weight": np.ones(HIDDEN, np.float32), "ln_f.bias": np.zeros(HIDDEN, np.float32)}
    )
    shapes = {
        "attn.qkv": (HIDDEN, 3 * HIDDEN), "attn.out": (HIDDEN, HIDDEN),
        "fc1": (HIDDEN, 4 * HIDDEN), "fc2": (4 * HIDDEN, HIDDEN),
    }  # fmt: skip
    for i in range(layers):
        for name, (a, b) in shapes.items():
            weights[f"h{i}.{name}.weight"] = normal(a, b)
            weights[f"h{i}.{name}.bias"] = np.zeros(b, np.float32)
        for ln in ("ln1", "ln2"):
            weights[f"h{i}.{ln}.weight"] = np.ones(HIDDEN, np.float32)
            weights[f"h{i}.{ln}.bias"] = np.zeros(HIDDEN, np.float32)
    return weights


def project(layers: int) -> dict:
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons

    weights = host_weights(layers)
    template = {k.split(".", 1)[1]: v for k, v in weights.items() if k.startswith("h0.")}

    class Linear(addons.Module):
        def __init__(self, out_features: int):
            super().__init__()
            self.out_features = out_features

        def build(self, x: popxl.Tensor) -> popxl.Tensor:
            scope = self._name_scope
            prefix = "attn." if scope in ("qkv", "out") else ""
            w = self.add_variable_input("weight", lambda: template[f"{prefix}{scope}.weight"])
            b = self.add_variable_input("bias", lambda: template[f"{prefix}{scope}.bias"])
            return x @ w + b

    class LayerNorm(addons.Module):
        def build(self, x: popxl.Tensor) -> popxl.Tensor:
            w = self.add_variable_input("weight", lambda: np.ones(x.shape[-1], np.float32))
            b = self.add_variable_input("bias", lambda: np.zeros(x.shape[-1], np.float32))
            return ops.layer_norm(x, w, b)

    class Attention(addons.Module):
        def __init__(self):
            super().__init__()
            self.qkv = Linear(3 * HIDDEN)
            self.out = Linear(HIDDEN)

        def build(self, x: popxl.Tensor, mask: popxl.Tensor) -> popxl.Tensor:
            q, k, v = ops.split(self.qkv(x), 3, axis=-1)

            def heads(t):
                return t.reshape((SEQ, HEADS, HIDDEN // HEADS)).transpose((1, 0, 2))

            scores = heads(q) @ heads(k).transpose((0, 2, 1))
            scores = scores * (1.0 / np.sqrt(HIDDEN // HEADS)) + mask
            z = ops.softmax(scores, axis=-1) @ heads(v)
            return self.out(z.transpose((1, 0, 2)).reshape((SEQ, HIDDEN)))

    class Decoder(addons.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2 = LayerNorm(), Attention(), LayerNorm()
            self.fc1, self.fc2 = Linear(4 * HIDDEN), Linear(HIDDEN)

        def build(self, x: popxl.Tensor, mask: popxl.Tensor) -> popxl.Tensor:
            x = x + self.attn(self.ln1(x), mask)
            return x + self.fc2(ops.gelu(self.fc1(self.ln2(x))))

    class GPT(addons.Module):
        def __init__(self):
            super().__init__()
            self.ln_f = LayerNorm()

        def build(self, tokens: popxl.Tensor, labels: popxl.Tensor):
            wte = self.add_variable_input("wte", lambda: weights["wte"])
            wpe = self.add_variable_input("wpe", lambda: weights["wpe"])
            mask = popxl.constant(np.triu(np.full((SEQ, SEQ), -1e4, np.float32), 1), name="mask")
            x = ops.gather(wte, tokens) + wpe
            facts, layer = Decoder().create_graph(x, mask)
            for i in range(layers):
                (x,) = layer.bind(self.add_variable_inputs(f"h{i}", facts)).call(x, mask)
            logits = self.ln_f(x) @ wte.T
            return logits

    start = time.perf_counter()
    ir = popxl.Ir()
    with ir.main_graph:
        token_stream = popxl.h2d_stream((SEQ,), popxl.int32, "tokens")
        label_stream = popxl.h2d_stream((SEQ,), popxl.int32, "labels")
        tokens, labels = ops.host_load(token_stream), ops.host_load(label_stream)
        facts, fwd = GPT().create_graph(tokens, labels)
        bwd = addons.autodiff(fwd, grads_required=fwd.args.tensors)
        variables = facts.init()
        assert set(variables.to_dict()) == set(weights)
        info = fwd.bind(variables).call_with_info(tokens, labels)
        loss, dlogits = addons.ops.cross_entropy_with_grad(info.outputs[0], labels)
        grads = bwd.call(dlogits, args=bwd.grad_graph_info.inputs_dict(info))
        for v, g in zip(fwd.args.tensors, grads):
            ops.scaled_add_(info.graph_to_parent(v), g, b=-LR)
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_stream, loss)
    built = time.perf_counter()
    popxl.Session(ir, "ipu_hw")
    compiled = time.perf_counter()
    return {"build_s": built - start, "compile_s": compiled - built, "peak_rss_mb": peak_rss_mb()}


def reference(layers: int) -> dict:
    import jax
    import jax.numpy as jnp

    def layer_norm(x, w, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * w + b

    def decoder(p, x, mask):
        h = layer_norm(x, p["ln1.w"], p["ln1.b"])
        q, k, v = jnp.split(h @ p["qkv.w"] + p["qkv.b"], 3, axis=-1)
        heads = lambda t: t.reshape(SEQ, HEADS, HIDDEN // HEADS).transpose(1, 0, 2)  # noqa: E731
        s = heads(q) @ heads(k).transpose(0, 2, 1) / np.sqrt(HIDDEN // HEADS) + mask
        z = (jax.nn.softmax(s, axis=-1) @ heads(v)).transpose(1, 0, 2).reshape(SEQ, HIDDEN)
        x = x + z @ p["out.w"] + p["out.b"]
        h = layer_norm(x, p["ln2.w"], p["ln2.b"])
        return (
            x + jax.nn.gelu(h @ p["fc1.w"] + p["fc1.b"], approximate=True) @ p["fc2.w"] + p["fc2.b"]
        )

    def loss_fn(params, tokens, labels):
        mask = jnp.triu(jnp.full((SEQ, SEQ), -1e4, jnp.float32), 1)
        x = params["wte"][tokens] + params["wpe"]
        for p in params["layers"]:
            x = decoder(p, x, mask)
        logits = layer_norm(x, params["ln_f.w"], params["ln_f.b"]) @ params["wte"].T
        probs = jax.nn.softmax(logits, -1)
        return -jnp.mean(jnp.log(jnp.take_along_axis(probs, labels[:, None], 1) + 1e-7))

    def step(params, tokens, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, labels)
        return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), loss

    weights = host_weights(layers)
    rename = {
        "attn.qkv": "qkv",
        "attn.out": "out",
        "fc1": "fc1",
        "fc2": "fc2",
        "ln1": "ln1",
        "ln2": "ln2",
    }
    params = {
        "wte": weights["wte"],
        "wpe": weights["wpe"],
        "ln_f.w": weights["ln_f.weight"],
        "ln_f.b": weights["ln_f.bias"],
    }
    params["layers"] = [
        {
            f"{short}.{p[0]}": weights[f"h{i}.{name}.{p}"]
            for name, short in rename.items()
            for p in ("weight", "bias")
        }
        for i in range(layers)
    ]
    ints = jax.ShapeDtypeStruct((SEQ,), jnp.int32)
    start = time.perf_counter()
    lowered = jax.jit(step, donate_argnums=(0,)).lower(params, ints, ints)
    traced = time.perf_counter()
    lowered.compile()
    compiled = time.perf_counter()
    return {"build_s": traced - start, "compile_s": compiled - traced, "peak_rss_mb": peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        fn = project if args.variant == "project" else reference
        print(json.dumps(fn(args.layers)))
        return
    p = run_variant(__file__, "--variant", "project", "--layers", str(args.layers))
    r = run_variant(__file__, "--variant", "jax", "--layers", str(args.layers))
    print(f"device: {device_name()}; layers: {args.layers}")
    report([
        ("IR build / JAX trace (s)", p["build_s"], r["build_s"], "s"),
        ("compile (s)", p["compile_s"], r["compile_s"], "s"),
        ("total (s)", p["build_s"] + p["compile_s"], r["build_s"] + r["compile_s"], "s"),
        ("peak RSS (MiB)", p["peak_rss_mb"], r["peak_rss_mb"], "MiB"),
    ])  # fmt: skip


if __name__ == "__main__":
    set_matmul_precision()
    main()
