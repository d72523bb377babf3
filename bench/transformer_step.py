"""GPT-style decoder training step: popxl_addons, built as applications build it, vs JAX.

The project program: one decoder-layer graph created once and called per layer; gradient
graphs from ``autodiff_with_accumulation`` (one per part: embedding, layer, head), called
per layer in reverse; gradient accumulation over ``GA`` micro-batches per step (one
``session.run``, ``num_host_transfers = GA``); then Adam through ``ops.var_updates``
(``AdamOptimizerStep``), one optimizer graph per layer, called per layer. The LM head is
untied from the token embedding. ``--dtype float16``: activations and matmuls in float16,
weights, gradients, accumulators and Adam state in float32 (master weights), the loss
computed in float32.

The reference: the same math in JAX, ``jax.value_and_grad`` per micro-batch over a
``lax.scan`` of the layers on stacked weights, gradients averaged over the micro-batches,
Adam on the stacked state, the whole step one ``jax.jit`` with the state donated.

Figures: seconds per step, tokens per second (GA x micro-batch x sequence per step), both
timed in alternating rounds in this process; peak resident memory in separate processes;
``--compile``: build + compile seconds of the project program at 12, 24 and 48 layers.

Run: python bench/transformer_step.py [--size cpu|gpt2] [--dtype float32|float16|both]
    [--pattern NAME|all] [--layers N] [--hidden N] [--seq N] [--rounds 7] [--repeats 3] [--no-memory] [--hlo] [--compile]
``--hlo``: compare the two compiled steps without timing them (XLA kernel counts by kind,
copies, dynamic slices and updates, and XLA's memory analysis), which a loaded machine
cannot disturb. The load average is printed with the timings.

``--pattern``: the program above is pattern ``apps`` (the default, float32 and float16).
The other patterns are ``bench/_gpt_program``'s (float32 and float16 with float32 master
weights, as ``--dtype`` says; ``--hlo`` compares them in float32: per-variable Adam graphs
cached by shape, per-layer Adam graphs, inline SGD and Adam updates, gradient accumulation,
recomputation, pipelining, phased execution, replication), each timed against its own
hand-written reference at this size; ``all`` runs every pattern and names the worst. Each
pattern row also gives the ratio of CPU time (the process's, all threads) per step, which
other processes on a shared machine disturb far less than wall time, and with ``--hlo`` the
kernels XLA runs per step (instructions outside fusions, each loop body counted once per
iteration): more kernels, or more copies, than the reference is a shortfall a quiet machine
or a GPU will show, whatever the wall-clock noise of the moment.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import (  # noqa: E402
    compare,
    device_name,
    peak_rss_mb,
    report,
    run_variant,
    set_matmul_precision,
)
from bench._gpt_program import (  # noqa: E402  (the same weights as the patterns' programs)
    LAYER_KEYS,
    initial_weights,
    reference_params,
)


@dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    micro_batch: int
    ga: int = 4
    dtype: str = "float32"
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-5

    @property
    def tokens_per_step(self) -> int:
        return self.ga * self.micro_batch * self.seq


SIZES = {
    "cpu": Config(layers=4, hidden=128, heads=4, seq=64, vocab=512, micro_batch=2),
    "gpt2": Config(layers=12, hidden=768, heads=12, seq=1024, vocab=50257, micro_batch=1),
    "tiny": Config(layers=3, hidden=16, heads=2, seq=8, vocab=32, micro_batch=2, ga=2),
}


def make_batches(cfg: Config, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and labels of one step: ``(ga, micro_batch, seq)`` int32 each."""
    rng = np.random.default_rng(seed)
    shape = (cfg.ga, cfg.micro_batch, cfg.seq)
    tokens = rng.integers(0, cfg.vocab, shape).astype(np.int32)
    return tokens, np.roll(tokens, -1, axis=-1)


# The project ------------------------------------------------------------------------------


class ProjectStep:
    """The popxl_addons program, its session and handles."""

    def __init__(self, cfg: Config, weights: dict[str, np.ndarray] | None = None):
        start = time.perf_counter()
        self.cfg = cfg
        self.weights = initial_weights(cfg) if weights is None else weights
        self._build()
        self.build_s = time.perf_counter() - start
        import popxl

        start = time.perf_counter()
        self.session = popxl.Session(self.ir, "ipu_hw")
        self.compile_s = time.perf_counter() - start

    def _build(self) -> None:  # noqa: PLR0915 (one program, read top to bottom)
        import popxl
        import popxl.ops as ops
        import popxl_addons as addons
        from popxl_addons.named_tensors import NamedTensors
        from popxl_addons.optimizers.adam import AdamOptimizerStep
        from popxl_addons.variable_factory import NamedVariableFactories

        cfg = self.cfg
        compute = popxl.float16 if cfg.dtype == "float16" else popxl.float32
        H, heads, S, B = cfg.hidden, cfg.heads, cfg.seq, cfg.micro_batch
        weights = self.weights
        layer0 = {k[3:]: v for k, v in weights.items() if k.startswith("h0.")}

        def cast(t: popxl.Tensor) -> popxl.Tensor:
            return t if t.dtype == compute else ops.cast(t, compute)

        class Linear(addons.Module):
            def __init__(self, out_features: int, key: str):
                super().__init__()
                self.out_features, self.key = out_features, key

            def build(self, x: popxl.Tensor) -> popxl.Tensor:
                w = self.add_variable_input("weight", lambda: layer0[f"{self.key}.weight"])
                b = self.add_variable_input("bias", lambda: layer0[f"{self.key}.bias"])
                return x @ cast(w) + cast(b)

        class LayerNorm(addons.Module):
            def build(self, x: popxl.Tensor) -> popxl.Tensor:
                w = self.add_variable_input("weight", lambda: np.ones(H, np.float32))
                b = self.add_variable_input("bias", lambda: np.zeros(H, np.float32))
                return ops.layer_norm(x, cast(w), cast(b))

        class Attention(addons.Module):
            def __init__(self):
                super().__init__()
                self.qkv = Linear(3 * H, "attn.qkv")
                self.out = Linear(H, "attn.out")

            def build(self, x: popxl.Tensor, mask: popxl.Tensor) -> popxl.Tensor:
                q, k, v = ops.split(self.qkv(x), 3, axis=-1)

                def split_heads(t: popxl.Tensor) -> popxl.Tensor:
                    return t.reshape((B, S, heads, H // heads)).transpose((0, 2, 1, 3))

                scores = split_heads(q) @ split_heads(k).transpose((0, 1, 3, 2))
                scores = scores * (1.0 / np.sqrt(H // heads)) + mask
                z = ops.softmax(scores, axis=-1) @ split_heads(v)
                return self.out(z.transpose((0, 2, 1, 3)).reshape((B * S, H)))

        class Decoder(addons.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.attn, self.ln2 = LayerNorm(), Attention(), LayerNorm()
                self.fc1, self.fc2 = Linear(4 * H, "fc1"), Linear(H, "fc2")

            def build(self, x: popxl.Tensor, mask: popxl.Tensor) -> popxl.Tensor:
                x = x + self.attn(self.ln1(x), mask)
                return x + self.fc2(ops.gelu(self.fc1(self.ln2(x))))

        class Embedding(addons.Module):
            def build(self, tokens: popxl.Tensor) -> popxl.Tensor:
                wte = self.add_variable_input("wte", lambda: weights["wte"])
                wpe = self.add_variable_input("wpe", lambda: weights["wpe"])
                return cast((ops.gather(wte, tokens) + wpe).reshape((B * S, H)))

        class Head(addons.Module):
            def __init__(self):
                super().__init__()
                self.ln_f = LayerNorm()

            def build(self, x: popxl.Tensor) -> popxl.Tensor:
                w = self.add_variable_input("weight", lambda: weights["head.weight"])
                return ops.cast(self.ln_f(x) @ cast(w), popxl.float32)

        adam_kwargs = dict(
            lr=cfg.lr, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps, weight_decay=0.0,
            first_order_dtype=popxl.float32,
        )  # fmt: skip

        class PartAdam(addons.Module):
            """Adam for every weight of one part (a layer, the embedding...), then a reset of
            its gradient accumulators' counter: weights, accumulators and counter are by-ref
            inputs ``w<j>``, ``g<j>`` and ``counter``; the Adam state is the graph's own."""

            def __init__(self, shapes: list[tuple[int, ...]]):
                super().__init__()
                self.shapes = shapes
                for j in range(len(shapes)):
                    setattr(self, f"adam{j}", AdamOptimizerStep())

            def build(self) -> None:
                counter = self.add_variable_input(
                    "counter", lambda: np.zeros((), np.float32), by_ref=True
                )
                for j, shape in enumerate(self.shapes):
                    zeros = lambda shape=shape: np.zeros(shape, np.float32)  # noqa: E731
                    w = self.add_variable_input(f"w{j}", zeros, by_ref=True)
                    g = self.add_variable_input(f"g{j}", zeros, by_ref=True)
                    getattr(self, f"adam{j}")(w, g, **adam_kwargs)
                ops.var_updates.copy_var_update_(counter, popxl.constant(0.0, popxl.float32))

        def optimizer(part_vars: NamedTensors) -> tuple:
            """The part's optimizer graph and the factories of its own (Adam) state."""
            shapes = [t.shape for t in part_vars.to_dict().values()]
            facts, graph = PartAdam(shapes).create_graph()
            own = {k: f for k, f in facts.to_dict().items() if k.startswith("adam")}
            return graph, NamedVariableFactories.from_dict(own)

        def bind_optimizer(graph, state, part_vars, accums):
            named = dict(state.to_dict())
            accum = accums.to_dict()
            named["counter"] = accum["mean_accum_counter"]
            for j, (key, t) in enumerate(part_vars.to_dict().items()):
                named[f"w{j}"] = t
                named[f"g{j}"] = accum[f"accum.{key}"]
            return graph.bind(NamedTensors.from_dict(named))

        ir = popxl.Ir()
        ir.num_host_transfers = cfg.ga
        with ir.main_graph:
            tok_stream = popxl.h2d_stream((B, S), popxl.int32, "tokens")
            lab_stream = popxl.h2d_stream((B, S), popxl.int32, "labels")
            self.loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
            self.streams = (tok_stream, lab_stream)
            mask_np = np.triu(np.full((S, S), -1e4, np.float32), 1)
            mask = popxl.constant(mask_np.astype(compute.as_numpy()), name="mask")  # for tracing
            x_spec = popxl.TensorSpec((B * S, H), compute)

            emb_facts, emb = Embedding().create_graph(popxl.TensorSpec((B, S), popxl.int32))
            layer_facts, layer = Decoder().create_graph(x_spec, mask)
            head_facts, head = Head().create_graph(x_spec)
            parts = {}
            for name, facts, graph, grads_required in (
                ("emb", emb_facts, emb, []),
                ("layer", layer_facts, layer, [layer.graph.inputs[0]]),
                ("head", head_facts, head, [head.graph.inputs[0]]),
            ):
                accum_facts, bwd = addons.autodiff_with_accumulation(
                    graph, graph.args.tensors, grads_required=grads_required
                )
                parts[name] = (facts, graph, accum_facts, bwd)

            def make_vars(name: str, prefix: str) -> tuple:
                facts, _, accum_facts, _ = parts[name]
                return facts.init(prefix), accum_facts.init(f"{prefix}.grad")

            emb_vars, emb_acc = make_vars("emb", "emb")
            layer_vars, layer_acc = zip(*(make_vars("layer", f"h{i}") for i in range(cfg.layers)))
            head_vars, head_acc = make_vars("head", "head")
            self.variables = {"emb": emb_vars, "layers": layer_vars, "head": head_vars}

            def micro_batch(emb_vars, emb_acc, layer_vars, layer_acc, head_vars, head_acc):
                """Load a micro-batch, forward, loss, backward into the accumulators."""
                mask = popxl.constant(mask_np.astype(compute.as_numpy()), name="mask")
                tokens, labels = ops.host_load(tok_stream), ops.host_load(lab_stream)
                emb_info = emb.bind(emb_vars).call_with_info(tokens)
                x = emb_info.outputs[0]
                infos = []
                for i in range(cfg.layers):
                    infos.append(layer.bind(layer_vars[i]).call_with_info(x, mask))
                    x = infos[-1].outputs[0]
                head_info = head.bind(head_vars).call_with_info(x)
                loss, dlogits = addons.ops.cross_entropy_with_grad(
                    head_info.outputs[0], labels.reshape((B * S,))
                )
                ops.host_store(self.loss_stream, loss)
                _, _, _, head_bwd = parts["head"]
                (dx,) = head_bwd.bind(head_acc).call(
                    dlogits, args=head_bwd.grad_graph_info.inputs_dict(head_info)
                )
                _, _, _, layer_bwd = parts["layer"]
                for i in reversed(range(cfg.layers)):
                    (dx,) = layer_bwd.bind(layer_acc[i]).call(
                        dx, args=layer_bwd.grad_graph_info.inputs_dict(infos[i])
                    )
                _, _, _, emb_bwd = parts["emb"]
                emb_bwd.bind(emb_acc).call(dx, args=emb_bwd.grad_graph_info.inputs_dict(emb_info))

            # The micro-batch as one graph, called GA times: weights are its inputs,
            # accumulators its by-ref inputs.
            groups = [
                (emb_vars, False), (emb_acc, True), *((v, False) for v in layer_vars),
                *((a, True) for a in layer_acc), (head_vars, False), (head_acc, True),
            ]  # fmt: skip
            micro = ir.create_empty_graph("micro_batch")
            with micro:
                inner = [
                    NamedTensors.from_dict({
                        k: popxl.graph_input(t.shape, t.dtype, by_ref=by_ref)
                        for k, t in named.to_dict().items()
                    })
                    for named, by_ref in groups
                ]  # fmt: skip
                n = cfg.layers
                micro_batch(inner[0], inner[1], inner[2 : 2 + n], inner[2 + n : 2 + 2 * n],
                            inner[-2], inner[-1])  # fmt: skip
            outer = [t for named, _ in groups for t in named.to_dict().values()]
            for _ in range(cfg.ga):
                ops.call(micro, *outer)

            for part_vars, accums in ((emb_vars, emb_acc), (head_vars, head_acc)):
                graph, state_facts = optimizer(part_vars)
                bind_optimizer(graph, state_facts.init(), part_vars, accums).call()
            graph, state_facts = optimizer(layer_vars[0])
            states = [state_facts.init(f"h{i}.adam") for i in range(cfg.layers)]
            for i in range(cfg.layers):
                bind_optimizer(graph, states[i], layer_vars[i], layer_acc[i]).call()
        self.ir = ir
        # Every layer starts from its own weights (the factories made copies of layer 0's).
        self.initial = {}
        for i, named in enumerate(layer_vars):
            for key, t in named.to_dict().items():
                self.initial[t] = weights[f"h{i}.{key}"]
        for prefix, named in (("", emb_vars), ("", head_vars)):
            for key, t in named.to_dict().items():
                name = key if prefix == "" and key in weights else f"head.{key}"
                self.initial[t] = weights[name if name in weights else key]

    def __enter__(self) -> ProjectStep:
        self.session.write_variables_data(self.initial)
        self.session.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.session.__exit__(*exc)

    def step(self, tokens: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """One optimizer step; the micro-batch losses."""
        if self.cfg.ga == 1:  # PopXL's layout has no transfers axis then
            tokens, labels = tokens[0], labels[0]
        out = self.session.run(dict(zip(self.streams, (tokens, labels))))
        return out[self.loss_stream].reshape(self.cfg.ga)

    def layer_weights(self) -> dict[str, np.ndarray]:
        """Layer weights keyed like ``initial_weights`` (host copies, after the runs)."""
        result = {}
        for i, named in enumerate(self.variables["layers"]):
            data = self.session.get_tensors_data(named.tensors)
            for key, t in named.to_dict().items():
                result[f"h{i}.{key}"] = data[t]
        return result


# The reference ----------------------------------------------------------------------------


def reference_step_fn(cfg: Config):
    """``step(state, tokens, labels) -> (state, losses)``, jitted with the state donated."""
    import jax
    import jax.numpy as jnp

    compute = jnp.float16 if cfg.dtype == "float16" else jnp.float32
    H, heads, S, B = cfg.hidden, cfg.heads, cfg.seq, cfg.micro_batch

    def mm(a, b):
        """PopXL's matmul: float16 operands, float32 partials (its default)."""
        if compute == jnp.float16:
            return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(compute)
        return a @ b

    def layer_norm(x, w, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * w + b

    def decoder(x, p, mask):
        p = jax.tree_util.tree_map(lambda a: a.astype(compute), p)
        h = layer_norm(x, p["ln1.weight"], p["ln1.bias"])
        q, k, v = jnp.split(mm(h, p["attn.qkv.weight"]) + p["attn.qkv.bias"], 3, axis=-1)

        def split_heads(t):
            return t.reshape(B, S, heads, H // heads).transpose(0, 2, 1, 3)

        s = mm(split_heads(q), split_heads(k).transpose(0, 1, 3, 2))
        s = s * jnp.asarray(1.0 / np.sqrt(H // heads), compute) + mask
        z = mm(jax.nn.softmax(s, axis=-1), split_heads(v))
        z = z.transpose(0, 2, 1, 3).reshape(B, S, H)
        x = x + mm(z, p["attn.out.weight"]) + p["attn.out.bias"]
        h = layer_norm(x, p["ln2.weight"], p["ln2.bias"])
        h = jax.nn.gelu(mm(h, p["fc1.weight"]) + p["fc1.bias"], approximate=True)
        return x + mm(h, p["fc2.weight"]) + p["fc2.bias"]

    def loss_fn(params, tokens, labels):
        mask = jnp.triu(jnp.full((S, S), -1e4, jnp.float32), 1).astype(compute)
        x = (params["wte"][tokens] + params["wpe"]).astype(compute)
        x, _ = jax.lax.scan(lambda c, p: (decoder(c, p, mask), None), x, params["layers"])
        h = layer_norm(
            x, params["ln_f.weight"].astype(compute), params["ln_f.bias"].astype(compute)
        )
        logits = mm(h, params["head.weight"].astype(compute)).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))

    grad_fn = jax.value_and_grad(loss_fn)

    def step(state, tokens, labels):
        params, m, v, t = state
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)

        def micro(acc, batch):
            loss, grads = grad_fn(params, *batch)
            return jax.tree_util.tree_map(jnp.add, acc, grads), loss

        total, losses = jax.lax.scan(micro, zeros, (tokens, labels))
        t = t + 1.0
        b1, b2 = cfg.beta1, cfg.beta2

        def adam(p, g, m_, v_):
            g = g / cfg.ga
            m_ = b1 * m_ + (1 - b1) * g
            v_ = b2 * v_ + (1 - b2) * g * g
            m_hat = m_ / (1 - b1**t)
            v_hat = v_ / (1 - b2**t)
            return p - cfg.lr * (m_hat / (jnp.sqrt(v_hat) + cfg.eps)), m_, v_

        out = jax.tree_util.tree_map(adam, params, total, m, v)

        def pick(k):
            return jax.tree_util.tree_map(
                lambda o: o[k], out, is_leaf=lambda o: isinstance(o, tuple)
            )

        return (pick(0), pick(1), pick(2), t), losses

    return jax.jit(step, donate_argnums=(0,))


class ReferenceStep:
    def __init__(self, cfg: Config, weights: dict[str, np.ndarray] | None = None):
        import jax
        import jax.numpy as jnp

        self.cfg = cfg
        params = reference_params(cfg, initial_weights(cfg) if weights is None else weights)
        zeros = jax.tree_util.tree_map(lambda a: np.zeros_like(a), params)
        self.state = jax.device_put((params, zeros, zeros, jnp.zeros((), jnp.float32)))
        self.fn = reference_step_fn(cfg)

    def step(self, tokens: np.ndarray, labels: np.ndarray) -> np.ndarray:
        self.state, losses = self.fn(self.state, tokens, labels)
        return np.asarray(losses)

    def layer_weights(self) -> dict[str, np.ndarray]:
        layers = self.state[0]["layers"]
        return {
            f"h{i}.{key}": np.asarray(layers[key][i])
            for key in LAYER_KEYS
            for i in range(self.cfg.layers)
        }


# Measurement ------------------------------------------------------------------------------


def variant(impl: str, cfg: Config) -> dict:
    """One implementation alone: seconds per step and peak memory (a fresh process)."""
    tokens, labels = make_batches(cfg)
    if impl == "project":
        program = ProjectStep(cfg)
        with program:
            seconds, _ = compare(lambda: program.step(tokens, labels), lambda: None, 3, 3)
    else:
        ref = ReferenceStep(cfg)
        seconds, _ = compare(lambda: ref.step(tokens, labels), lambda: None, 3, 3)
    return {"step_s": seconds, "peak_rss_mb": peak_rss_mb()}


def time_both(cfg: Config, repeats: int, rounds: int = 7) -> tuple[float, float]:
    """Seconds per step of the project and the reference, in alternating rounds."""
    tokens, labels = make_batches(cfg)
    program, ref = ProjectStep(cfg), ReferenceStep(cfg)
    with program:
        return compare(
            lambda: program.step(tokens, labels), lambda: ref.step(tokens, labels), repeats, rounds
        )


def compare_clocks(
    project: Callable[[], Any], reference: Callable[[], Any], repeats: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """``compare``, measuring wall and CPU seconds per step (fastest round of each):
    ``{"wall": (project, reference), "cpu": (project, reference)}``."""
    project()
    reference()
    best = {clock: [float("inf"), float("inf")] for clock in ("wall", "cpu")}
    for _ in range(rounds):
        for k, fn in enumerate((project, reference)):
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(repeats):
                fn()
            best["wall"][k] = min(best["wall"][k], (time.perf_counter() - wall) / repeats)
            best["cpu"][k] = min(best["cpu"][k], (time.process_time() - cpu) / repeats)
    return {clock: (p, r) for clock, (p, r) in best.items()}


# Patterns: bench/_gpt_program's spellings of the same model ----------------------------------

APPS = "apps"  # this file's program (float16 too)


def pattern_config(pattern: str, cfg: Config) -> Any:
    """``bench/_gpt_program``'s configuration of ``pattern`` at this size (its own GA)."""
    from bench import _gpt_program as gpt  # noqa: PLC0415

    return gpt.config(
        pattern, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, seq=cfg.seq,
        vocab=cfg.vocab, micro_batch=cfg.micro_batch, dtype=cfg.dtype,
    )  # fmt: skip


class PatternPair:
    """One pattern's project program and hand-written reference, both ready to step."""

    def __init__(self, pattern: str, cfg: Config):
        from bench import _gpt_program as gpt  # noqa: PLC0415

        self.cfg = pattern_config(pattern, cfg)
        self.program = gpt.Program(self.cfg)
        self.session = self.program.session()
        self.reference = gpt.Reference(self.cfg)
        self.tokens, self.labels = gpt.make_batches(self.cfg)

    def project_step(self) -> Any:
        return self.program.run(self.session, self.tokens, self.labels)

    def reference_step(self) -> Any:
        return self.reference.run(self.tokens, self.labels)

    def compiled(self) -> dict[str, Any]:
        ref = self.reference
        return {
            "project": self.session._compiled(),
            "reference": ref.fn.lower(ref.state, self.tokens, self.labels).compile(),
        }


def time_pattern(
    pattern: str, cfg: Config, repeats: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds per step of ``pattern`` and its reference, alternating."""
    pair = PatternPair(pattern, cfg)
    with pair.session:
        return compare_clocks(pair.project_step, pair.reference_step, repeats, rounds)


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*? ([\w\-]+)\(")
_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant"}


def kernel_counts(hlo: str) -> collections.Counter:
    """Instructions of the compiled module outside fused computations (what runs as a
    kernel or a loop), by opcode; parameters, tuples, bitcasts and constants left out."""
    counts: collections.Counter = collections.Counter()
    fused = False
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            fused = "fused" in line.split("(")[0] or "wrapped" in line.split("(")[0]
            continue
        match = None if fused else _INSTRUCTION.match(line)
        if match and match.group(1) not in _FREE:
            counts[match.group(1)] += 1
    return counts


_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) ")
_WHILE = re.compile(r"\bwhile\(.*\bbody=%?([\w.\-]+)")
_CALLED = re.compile(r"\b(?:to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def kernels_per_step(hlo: str) -> collections.Counter:
    """The kernels one step runs, by opcode: instructions outside fusions (as
    ``kernel_counts``), each loop body's counted once per iteration of its loop (XLA's known
    trip count; 1 where unknown), called computations and both branches once."""
    bodies: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            match = _COMPUTATION.match(line)
            current = bodies.setdefault(match.group(2), []) if match else None
            if match and match.group(1):
                entry = match.group(2)
        elif current is not None and _INSTRUCTION.match(line):
            current.append(line)
    counts: collections.Counter = collections.Counter()

    def walk(name: str, times: int) -> None:
        for line in bodies.get(name, []):
            op = _INSTRUCTION.match(line).group(1)  # type: ignore[union-attr]
            if op not in _FREE:
                counts[op] += times
            loop = _WHILE.search(line) if op == "while" else None
            if loop:
                trips = _TRIPS.search(line)
                walk(loop.group(1), times * (int(trips.group(1)) if trips else 1))
            elif op in ("call", "conditional"):
                called = _CALLED.findall(line)
                for group in _BRANCHES.findall(line):
                    called += [c.strip().lstrip("%") for c in group.split(",")]
                for c in called:
                    walk(c, times)

    walk(entry, 1)
    return counts


def compiled_pair(cfg: Config) -> dict[str, Any]:
    """This file's program and its reference, compiled (not run)."""
    program, ref = ProjectStep(cfg), ReferenceStep(cfg)
    tokens, labels = make_batches(cfg)
    return {
        "project": program.session._compiled(),
        "reference": ref.fn.lower(ref.state, tokens, labels).compile(),
    }


def pattern_hlo_rows(patterns: list[str], cfg: Config) -> None:
    """Kernels per step (total, copies) and XLA temporaries of every pattern vs its
    reference: the structural comparison no machine load disturbs."""
    print(f"{'pattern':18s} {'kernels/step':>14s} {'ratio':>6s} {'copies/step':>12s} "
          f"{'temp MB':>12s}")  # fmt: skip
    for pattern in patterns:
        try:
            compiled = (
                compiled_pair(cfg) if pattern == APPS else PatternPair(pattern, cfg).compiled()
            )
        except Exception as exc:  # a pattern the program cannot build yet: say so, go on
            print(f"{pattern:18s} failed: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        p, r = (kernels_per_step(c.as_text()) for c in compiled.values())
        tp, tr = (c.memory_analysis().temp_size_in_bytes / 1e6 for c in compiled.values())
        total_p, total_r = sum(p.values()), sum(r.values())
        print(f"{pattern:18s} {total_p:6d} /{total_r:6d} {total_p / total_r:6.2f} "
              f"{p['copy']:5d} /{r['copy']:5d} {tp:5.1f} /{tr:5.1f}")  # fmt: skip


def hlo_report(cfg: Config) -> None:
    """Kernel counts and memory analysis of both compiled steps (no timing)."""
    compiled = compiled_pair(cfg)
    counts = {k: kernel_counts(c.as_text()) for k, c in compiled.items()}
    kinds = sorted(set().union(*counts.values()), key=lambda k: -counts["reference"][k])
    per_step = [sum(kernels_per_step(c.as_text()).values()) for c in compiled.values()]
    print(f"{cfg.dtype}: kernels per step (loop bodies once per iteration): "
          f"project {per_step[0]}, reference {per_step[1]}")  # fmt: skip
    print(f"{cfg.dtype}: kernels by kind (outside fusions)")
    print(f"{'kind':24s} {'project':>8s} {'reference':>10s}")
    for kind in ["total", *kinds]:
        p, r = (sum(c.values()) if kind == "total" else c[kind] for c in counts.values())
        print(f"{kind:24s} {p:8d} {r:10d}")
    print(f"{'memory (MB)':24s} {'project':>8s} {'reference':>10s}")
    analyses = {k: c.memory_analysis() for k, c in compiled.items()}
    for field in ("argument", "output", "alias", "temp"):
        p, r = (getattr(a, f"{field}_size_in_bytes") / 1e6 for a in analyses.values())
        print(f"{field:24s} {p:8.2f} {r:10.2f}")


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def build_compile(cfg: Config) -> dict:
    program = ProjectStep(cfg)
    return {"build_s": program.build_s, "compile_s": program.compile_s}


def time_patterns(patterns: list[str], cfg: Config, repeats: int, rounds: int) -> None:
    """Speed of every pattern against its own reference (reference seconds / project
    seconds per step: >= 1 is as fast), wall clock and CPU time; then the worst."""
    print(f"{'pattern':18s} {'ms/step':>16s} {'speed (wall)':>12s} {'speed (CPU)':>12s}  load")
    speeds = {}
    for pattern in patterns:
        try:
            clocks = time_pattern(pattern, cfg, repeats, rounds)
        except Exception as exc:  # a pattern the program cannot build yet: say so, go on
            print(f"{pattern:18s} failed: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        (p, r), (cp, cr) = clocks["wall"], clocks["cpu"]
        speeds[pattern] = (r / p, cr / cp)
        print(f"{pattern:18s} {p * 1e3:7.1f} /{r * 1e3:7.1f} {r / p:12.3f} {cr / cp:12.3f}  "
              f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    if speeds:
        worst = min(speeds, key=lambda k: speeds[k][0])
        print(f"worst pattern (wall): {worst}, {speeds[worst][0]:.3f} of the reference's speed "
              f"(CPU time: {speeds[worst][1]:.3f})")  # fmt: skip


def main() -> None:  # noqa: PLR0912 (one flag per branch)
    from bench._gpt_program import PATTERNS  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--pattern", choices=[APPS, *PATTERNS, "all"], default="all",
        help=f"{APPS}: this file's program; all: it and every _gpt_program pattern",
    )  # fmt: skip
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--dtype", choices=["float32", "float16", "both"], default="both")
    parser.add_argument("--layers", type=int, help="override the size's layer count")
    parser.add_argument("--hidden", type=int, help="override the size's hidden width")
    parser.add_argument("--seq", type=int, help="override the size's sequence length")
    parser.add_argument("--compile", action="store_true", help="build + compile at 12/24/48 layers")
    parser.add_argument("--repeats", type=int, default=3, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=7, help="alternating timed rounds")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS processes")
    parser.add_argument("--hlo", action="store_true", help="compare compiled steps, no timing")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--what", default="step", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cfg = SIZES[args.size]
    overrides = {k: getattr(args, k) for k in ("layers", "hidden", "seq") if getattr(args, k)}
    cfg = replace(cfg, **overrides)
    if args.variant:
        cfg = replace(cfg, dtype=args.dtype)
        fn = build_compile if args.what == "compile" else (lambda c: variant(args.variant, c))
        print(json.dumps(fn(cfg)))
        return
    print(f"device: {device_name()}; {cfg}")
    dtypes = ["float32", "float16"] if args.dtype == "both" else [args.dtype]
    patterns = [] if args.pattern == APPS else list(PATTERNS)
    if args.pattern not in (APPS, "all"):
        patterns = [args.pattern]
    apps = args.pattern in (APPS, "all")
    if args.hlo:
        for dtype in dtypes if apps else []:
            hlo_report(replace(cfg, dtype=dtype))
        if patterns:
            print("float32 patterns, project / reference:")
            pattern_hlo_rows(([APPS] if apps else []) + patterns, cfg)
        return
    for dtype in dtypes if patterns else []:
        print(f"{dtype} patterns at this size, {args.rounds} alternating rounds, {load()}")
        time_patterns(patterns, replace(cfg, dtype=dtype), args.repeats, args.rounds)
    rows = []
    for dtype in dtypes if apps else []:
        c = replace(cfg, dtype=dtype)
        print(f"{dtype}: timing, {load()}")
        p, r = time_both(c, args.repeats, args.rounds)
        print(f"{dtype}: timed, {load()}")
        rows.append((f"{dtype} s/step", p, r, "s"))
        rows.append((f"{dtype} tokens/s", c.tokens_per_step / p, c.tokens_per_step / r, "/s"))
        if args.no_memory:
            continue
        common = ["--size", args.size, "--dtype", dtype, "--layers", str(c.layers)]
        common += ["--hidden", str(c.hidden), "--seq", str(c.seq)]
        mp = run_variant(__file__, "--variant", "project", *common)
        mr = run_variant(__file__, "--variant", "jax", *common)
        rows.append((f"{dtype} peak RSS (MiB)", mp["peak_rss_mb"], mr["peak_rss_mb"], "MiB"))
    if rows:
        report(rows)
    if args.compile:
        figures = {}
        for layers in (12, 24, 48):
            common = ["--size", args.size, "--dtype", dtypes[0], "--layers", str(layers)]
            figures[layers] = run_variant(
                __file__, "--variant", "project", "--what", "compile", *common
            )
        base = figures[12]["build_s"] + figures[12]["compile_s"]
        print(
            f"{'layers':>6s} {'build s':>8s} {'compile s':>9s} {'total':>7s} {'/ 12 layers':>11s}"
        )
        for layers, f in figures.items():
            total = f["build_s"] + f["compile_s"]
            print(
                f"{layers:6d} {f['build_s']:8.2f} {f['compile_s']:9.2f} {total:7.2f} {total / base:11.2f}"
            )


if __name__ == "__main__":
    set_matmul_precision()
    main()
