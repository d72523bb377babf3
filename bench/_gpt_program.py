"""A GPT training step written the popxl-addons way, in the patterns real programs use, and
the same step hand-written in JAX (``lax.scan`` over stacked layers).

Every pattern builds one decoder-layer graph, bound to ``layers`` sets of weights and called
once per layer, gradients from ``addons.autodiff`` (or ``autodiff_with_accumulation``), the
loss from ``addons.ops.cross_entropy_with_grad``, then an optimizer step. The patterns
differ in how the optimizer is spelled and in the execution strategy:

==================  ==========================================================================
per-variable-adam   whole-model autodiff; ``AdamOptimizerStep(cache=True)``: one graph per
                    variable shape, called for every variable in variable order
per-layer-adam      whole-model autodiff; one Adam graph per part (embedding, layer, head),
                    the layer's bound to each layer's weights and called per layer
inline-sgd          whole-model autodiff; ``ops.scaled_add_(var, grad, b=-lr)`` per variable
inline-adam         whole-model autodiff; Adam written inline with ``ops.var_updates`` per
                    variable
grad-accum          per-part gradient graphs with accumulation (``autodiff_with_accumulation``)
                    called per layer; ``ga`` micro-batches in ``ops.repeat``; per-variable Adam
recompute           as grad-accum with one micro-batch, the layer's gradient graph
                    recomputing its forward (``recompute_graph``)
pipelined           as grad-accum, forward and backward split over 2 IPUs in
                    ``pipelined_execution(ga)``
phased              one micro-batch; each layer's weights in remote buffers (one entry per
                    layer), loaded for its forward and backward phases, updated (per-variable
                    Adam) and stored back
replicated          per-variable-adam on 2 replicas, gradients mean-all-reduced per variable
==================  ==========================================================================

All patterns compute the same update as ``reference_step`` for their configuration (Adam or
SGD, ``ga`` micro-batches averaged, ``replicas`` replicas averaged). With ``dtype="float16"``
the weights stay float32 (master weights, optimizer state and updates) and every part casts
them to float16 where it uses them: activations and matmuls are float16 (float32 partials,
PopXL's default), the logits are cast to float32 for the loss.

Used by ``bench/build_compile.py`` (time to first step) and ``bench/transformer_step.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

PATTERNS = (
    "per-variable-adam",
    "per-layer-adam",
    "inline-sgd",
    "inline-adam",
    "grad-accum",
    "recompute",
    "pipelined",
    "phased",
    "replicated",
)
LAYER_KEYS = {  # name: shape as a function of the hidden size (the layer graph's order)
    "ln1.weight": lambda h: (h,), "ln1.bias": lambda h: (h,),
    "attn.qkv.weight": lambda h: (h, 3 * h), "attn.qkv.bias": lambda h: (3 * h,),
    "attn.out.weight": lambda h: (h, h), "attn.out.bias": lambda h: (h,),
    "ln2.weight": lambda h: (h,), "ln2.bias": lambda h: (h,),
    "fc1.weight": lambda h: (h, 4 * h), "fc1.bias": lambda h: (4 * h,),
    "fc2.weight": lambda h: (4 * h, h), "fc2.bias": lambda h: (h,),
}  # fmt: skip


@dataclass(frozen=True)
class Config:
    layers: int = 12
    hidden: int = 128
    heads: int = 4
    seq: int = 64
    vocab: int = 1024
    micro_batch: int = 1
    pattern: str = "per-variable-adam"
    ga: int = 1
    replicas: int = 1
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-5
    dtype: str = "float32"  # the compute type; weights are float32 either way

    @property
    def optimizer(self) -> str:
        return "sgd" if self.pattern == "inline-sgd" else "adam"

    @property
    def recompute(self) -> bool:
        return self.pattern == "recompute"


def config(pattern: str, layers: int = 12, **overrides: Any) -> Config:
    """The configuration of ``pattern`` (micro-batches and replicas it needs)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    extra: dict[str, Any] = {}
    if pattern == "grad-accum":
        extra["ga"] = 4
    if pattern == "pipelined":  # popxl-addons asks for at least twice the 3 stages
        extra["ga"] = 6
    if pattern == "replicated":
        extra["replicas"] = 2
    return replace(Config(layers=layers, pattern=pattern), **{**extra, **overrides})


def initial_weights(cfg: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Every weight: ``wte``, ``wpe``, ``ln_f.weight``, ``ln_f.bias``, ``head.weight`` and
    ``h{i}.<layer key>``."""
    rng = np.random.default_rng(seed)
    h = cfg.hidden

    def init(key: str, shape: tuple[int, ...]) -> np.ndarray:
        if key.endswith("bias"):
            return np.zeros(shape, np.float32)
        if "ln" in key.split(".")[-2:][0]:
            return np.ones(shape, np.float32)
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    weights = {
        "wte": init("wte.w", (cfg.vocab, h)),
        "wpe": init("wpe.w", (cfg.seq, h)),
        "ln_f.weight": init("ln_f.weight", (h,)),
        "ln_f.bias": init("ln_f.bias", (h,)),
        "head.weight": init("head.weight", (h, cfg.vocab)),
    }
    for i in range(cfg.layers):
        for key, shape in LAYER_KEYS.items():
            weights[f"h{i}.{key}"] = init(key, shape(h))
    return weights


def make_batches(cfg: Config, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and labels of one step: ``(ga, replicas, micro_batch, seq)`` int32 each."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab, (cfg.ga, cfg.replicas, cfg.micro_batch, cfg.seq))
    tokens = tokens.astype(np.int32)
    return tokens, np.roll(tokens, -1, axis=-1)


# The popxl-addons program -----------------------------------------------------------------


class Program:
    """The IR of one pattern, its streams and its variables keyed like ``initial_weights``.

    ``session()`` makes the session and writes the initial weights
    (``write_variables_data``); ``run(session, tokens, labels)`` runs one step and returns the
    micro-batch losses ``(ga, replicas)``; ``weights(session)`` reads the weights back.
    """

    def __init__(self, cfg: Config, weights: dict[str, np.ndarray] | None = None):
        self.cfg = cfg
        self.initial = initial_weights(cfg) if weights is None else weights
        self.named: dict[str, Any] = {}  # key -> Variable
        self.remote: dict[str, tuple[Any, int]] = {}  # key -> (remote variable, entry)
        _build(self)

    def session(self) -> Any:
        import popxl

        session = popxl.Session(self.ir, "ipu_hw")
        session.write_variables_data({v: self.initial[k] for k, v in self.named.items()})
        return session

    def run(self, session: Any, tokens: np.ndarray, labels: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        shape = (cfg.micro_batch, cfg.seq)
        lead = (cfg.ga,) if cfg.ga > 1 else ()
        lead += (cfg.replicas,) if cfg.replicas > 1 else ()
        feed = {s: a.reshape(*lead, *shape) for s, a in zip(self.streams, (tokens, labels))}
        out = session.run(feed)[self.loss_stream]
        return np.asarray(out).reshape(cfg.ga, cfg.replicas)

    def weights(self, session: Any) -> dict[str, np.ndarray]:
        data = session.get_tensors_data(list(self.named.values()))
        return {k: np.asarray(data[v]) for k, v in self.named.items()}


def _modules(cfg: Config) -> dict[str, Any]:
    """The model's popxl_addons modules (classes made per call: they close over ``cfg``)."""
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons

    H, heads, S, B = cfg.hidden, cfg.heads, cfg.seq, cfg.micro_batch
    compute = _compute_dtype(cfg)

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def cast(t: popxl.Tensor) -> popxl.Tensor:
        return t if t.dtype == compute else ops.cast(t, compute)

    class Linear(addons.Module):
        def __init__(self, out_features: int):
            super().__init__()
            self.out_features = out_features

        def build(self, x: popxl.Tensor) -> popxl.Tensor:
            w = self.add_variable_input("weight", partial(zeros, x.shape[-1], self.out_features))
            b = self.add_variable_input("bias", partial(zeros, self.out_features))
            return x @ cast(w) + cast(b)

    class LayerNorm(addons.Module):
        def build(self, x: popxl.Tensor) -> popxl.Tensor:
            w = self.add_variable_input("weight", partial(np.ones, (H,), np.float32))
            b = self.add_variable_input("bias", partial(zeros, H))
            return ops.layer_norm(x, cast(w), cast(b))

    class Attention(addons.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = Linear(3 * H), Linear(H)

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
            self.fc1, self.fc2 = Linear(4 * H), Linear(H)

        def build(self, x: popxl.Tensor, mask: popxl.Tensor) -> popxl.Tensor:
            x = x + self.attn(self.ln1(x), mask)
            return x + self.fc2(ops.gelu(self.fc1(self.ln2(x))))

    class Embedding(addons.Module):
        def build(self, tokens: popxl.Tensor) -> popxl.Tensor:
            wte = self.add_variable_input("wte", partial(zeros, cfg.vocab, H))
            wpe = self.add_variable_input("wpe", partial(zeros, S, H))
            return cast((ops.gather(wte, tokens) + wpe).reshape((B * S, H)))

    class Head(addons.Module):
        def __init__(self):
            super().__init__()
            self.ln_f = LayerNorm()

        def build(self, x: popxl.Tensor) -> popxl.Tensor:
            w = self.add_variable_input("weight", partial(zeros, H, cfg.vocab))
            logits = self.ln_f(x) @ cast(w)
            return logits if logits.dtype == popxl.float32 else ops.cast(logits, popxl.float32)

    class GPT(addons.Module):
        """The whole model as one graph; the layers are calls of one bound layer graph."""

        def __init__(self):
            super().__init__()
            self.embedding, self.head = Embedding(), Head()

        def build(self, tokens: popxl.Tensor) -> popxl.Tensor:
            mask = popxl.constant(_mask(S), compute, name="mask")
            x = self.embedding(tokens)
            facts, layer = Decoder().create_graph(x, mask)
            for i in range(cfg.layers):
                (x,) = layer.bind(self.add_variable_inputs(f"h{i}", facts)).call(x, mask)
            return self.head(x)

    return {"Decoder": Decoder, "Embedding": Embedding, "Head": Head, "GPT": GPT}


def _compute_dtype(cfg: Config) -> Any:
    import popxl

    return {"float32": popxl.float32, "float16": popxl.float16}[cfg.dtype]


def _mask(seq: int) -> np.ndarray:
    return np.triu(np.full((seq, seq), -1e4, np.float32), 1)


def _adam_kwargs(cfg: Config) -> dict[str, Any]:
    import popxl

    return dict(
        lr=cfg.lr, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps, weight_decay=0.0,
        first_order_dtype=popxl.float32,
    )  # fmt: skip


def _adam_per_variable(cfg: Config, var: Any, grad: Any) -> None:
    """popxl-addons' optimizer loop: one ``AdamOptimizerStep(cache=True)`` for the program,
    so its graph is built once per variable spec; the state is made per variable."""
    facts, graph = _optimizer(cfg).create_graph(var, grad.spec, **_adam_kwargs(cfg))
    graph.bind(facts.init(f"{var.name}.adam")).call(var, grad)


def _optimizer(cfg: Config) -> Any:
    """The program's (cached) Adam module: one per IR being built."""
    import popxl
    from popxl_addons.optimizers.adam import AdamOptimizerStep

    ir = popxl.gcg().ir
    if getattr(ir, "_bench_adam", None) is None:
        ir._bench_adam = AdamOptimizerStep(cache=True)
    return ir._bench_adam


def _adam_inline(cfg: Config, var: Any, grad: Any) -> None:
    """Adam written out with ``ops.var_updates`` in the main graph, state per variable."""
    import popxl
    import popxl.ops as ops

    m = popxl.variable(np.zeros(var.shape, np.float32), popxl.float32, f"{var.name}.m")
    v = popxl.variable(np.zeros(var.shape, np.float32), popxl.float32, f"{var.name}.v")
    step = popxl.variable(np.zeros((), np.float32), popxl.float32, f"{var.name}.step")
    ops.var_updates.accumulate_moving_average_(m, grad, f=cfg.beta1)
    ops.var_updates.accumulate_moving_average_square_(v, grad, f=cfg.beta2)
    updater = ops.var_updates.adam_updater(
        m, v, weight=var, weight_decay=0.0, time_step=step,
        beta1=cfg.beta1, beta2=cfg.beta2, epsilon=cfg.eps,
    )  # fmt: skip
    ops.scaled_add_(var, updater, b=-cfg.lr)


def _update(cfg: Config, var: Any, grad: Any) -> None:
    import popxl.ops as ops

    if cfg.replicas > 1:
        grad = ops.collectives.replicated_all_reduce(grad, op="mean")
    if cfg.pattern == "inline-sgd":
        ops.scaled_add_(var, grad, b=-cfg.lr)
    elif cfg.pattern == "inline-adam":
        _adam_inline(cfg, var, grad)
    else:
        _adam_per_variable(cfg, var, grad)


def _keys(prefix_map: dict[str, str], named: Any) -> dict[str, Any]:
    """Variables of a NamedTensors keyed like ``initial_weights``."""
    out = {}
    for key, t in named.to_dict().items():
        out[prefix_map.get(key, key)] = t
    return out


_WHOLE_NAMES = {
    "embedding.wte": "wte", "embedding.wpe": "wpe", "head.weight": "head.weight",
    "head.ln_f.weight": "ln_f.weight", "head.ln_f.bias": "ln_f.bias",
}  # fmt: skip


def _build(program: Program) -> None:
    import popxl

    cfg = program.cfg
    ir = popxl.Ir(replication=cfg.replicas)
    ir.num_host_transfers = cfg.ga
    with ir.main_graph:
        shape = (cfg.micro_batch, cfg.seq)
        program.streams = (
            popxl.h2d_stream(shape, popxl.int32, "tokens"),
            popxl.h2d_stream(shape, popxl.int32, "labels"),
        )
        program.loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        if cfg.pattern in ("grad-accum", "recompute", "pipelined", "phased"):
            _build_parts(program)
        else:
            _build_whole(program)
    program.ir = ir


def _build_whole(program: Program) -> None:
    """One forward graph for the model, ``addons.autodiff`` of it, then the optimizer."""
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons

    cfg = program.cfg
    tokens_stream, labels_stream = program.streams
    tokens, labels = ops.host_load(tokens_stream), ops.host_load(labels_stream)
    facts, fwd = _modules(cfg)["GPT"]().create_graph(tokens)
    bwd = addons.autodiff(fwd, grads_required=fwd.args.tensors)
    variables = facts.init()
    program.named = _keys(_WHOLE_NAMES, variables)
    info = fwd.bind(variables).call_with_info(tokens)
    loss, dlogits = addons.ops.cross_entropy_with_grad(
        info.outputs[0], labels.reshape((cfg.micro_batch * cfg.seq,))
    )
    ops.host_store(program.loss_stream, loss)
    grads = bwd.call(dlogits, args=bwd.grad_graph_info.inputs_dict(info))
    pairs = [(info.graph_to_parent(v), g) for v, g in zip(fwd.args.tensors, grads)]
    if cfg.pattern == "per-layer-adam":
        _per_layer_adam(program, variables, dict(pairs))
        return
    for var, grad in pairs:
        _update(cfg, var, grad)
    del popxl


def _per_layer_adam(program: Program, variables: Any, grads: dict) -> None:
    """One Adam graph per part: the layer's created once and called for every layer."""
    import popxl_addons as addons
    from popxl_addons.named_tensors import NamedTensors
    from popxl_addons.optimizers.adam import AdamOptimizerStep
    from popxl_addons.variable_factory import NamedVariableFactories

    cfg = program.cfg

    class PartAdam(addons.Module):
        """Adam for each weight of a part: weights ``w<j>`` (by-ref) and gradients ``g<j>``
        are named inputs, bound at the call; the Adam state is the graph's own."""

        def __init__(self, shapes: list):
            super().__init__()
            self.shapes = shapes
            for j in range(len(shapes)):
                setattr(self, f"adam{j}", AdamOptimizerStep())

        def build(self) -> None:
            for j, shape in enumerate(self.shapes):
                zeros = partial(np.zeros, shape, np.float32)
                w = self.add_variable_input(f"w{j}", zeros, by_ref=True)
                g = self.add_variable_input(f"g{j}", zeros)
                getattr(self, f"adam{j}")(w, g, **_adam_kwargs(cfg))

    groups: dict[str, list] = {}  # "h<i>" (a layer) or "rest", in variable order
    for key, t in variables.to_dict().items():
        top = key.split(".")[0]
        groups.setdefault(top if top[0] == "h" and top[1:].isdigit() else "rest", []).append(t)
    layer_graph = None
    for name, ts in groups.items():
        if name == "rest" or layer_graph is None:
            facts, graph = PartAdam([t.shape for t in ts]).create_graph()
            own = {k: f for k, f in facts.to_dict().items() if k.startswith("adam")}
            made = (NamedVariableFactories.from_dict(own), graph)
            if name != "rest":
                layer_graph = made
        state_facts, graph = made if name == "rest" else layer_graph
        named = dict(state_facts.init(f"{name}.adam").to_dict())
        for j, t in enumerate(ts):
            named[f"w{j}"], named[f"g{j}"] = t, grads[t]
        graph.bind(NamedTensors.from_dict(named)).call()


def _build_parts(program: Program) -> None:  # noqa: PLR0915 (one program, top to bottom)
    """Per-part gradient graphs with accumulation, called per layer (the popxl-addons
    applications' structure), in a micro-batch loop, a pipeline or phases."""
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons
    from popxl_addons.named_tensors import NamedTensors

    cfg = program.cfg
    mods = _modules(cfg)
    H, S, B = cfg.hidden, cfg.seq, cfg.micro_batch
    tokens_stream, labels_stream = program.streams
    compute = _compute_dtype(cfg)
    x_spec = popxl.TensorSpec((B * S, H), compute)
    mask = popxl.constant(_mask(S), compute, name="mask")
    emb_facts, emb = mods["Embedding"]().create_graph(popxl.TensorSpec((B, S), popxl.int32))
    layer_facts, layer = mods["Decoder"]().create_graph(x_spec, mask)
    head_facts, head = mods["Head"]().create_graph(x_spec)
    parts = {}
    for name, graph, required in (
        ("emb", emb, []),
        ("layer", layer, [layer.graph.inputs[0]]),
        ("head", head, [head.graph.inputs[0]]),
    ):
        acc_facts, bwd = addons.autodiff_with_accumulation(
            graph, graph.args.tensors, grads_required=required
        )
        if cfg.recompute and name == "layer":
            bwd = addons.transforms.recompute_graph(bwd)
        parts[name] = (acc_facts, bwd)

    buffers = None
    if cfg.pattern == "phased":
        buffers = addons.remote.named_variable_buffers(
            layer_facts, cfg.layers, shard_over_dict=False
        )
    emb_vars, head_vars = emb_facts.init("emb"), head_facts.init("head")
    layer_vars = []
    for i in range(cfg.layers):
        if buffers is None:
            layer_vars.append(layer_facts.init(f"h{i}"))
            continue
        remote = {}
        for key, buf in buffers.to_dict().items():
            data = np.zeros(buf.tensor_shape, np.float32)
            remote[key] = popxl.remote_variable(data, buf, i, name=f"h{i}.{key}")
        layer_vars.append(NamedTensors.from_dict(remote))
    accums = {
        "emb": parts["emb"][0].init("emb.grad"),
        "head": parts["head"][0].init("head.grad"),
        "layers": [parts["layer"][0].init(f"h{i}.grad") for i in range(cfg.layers)],
    }
    program.named = {"wte": emb_vars.wte, "wpe": emb_vars.wpe, "head.weight": head_vars.weight,
                     "ln_f.weight": head_vars.ln_f.weight, "ln_f.bias": head_vars.ln_f.bias}  # fmt: skip
    for i, named in enumerate(layer_vars):
        program.named.update({f"h{i}.{k}": t for k, t in named.to_dict().items()})

    def loss_grad(logits: popxl.Tensor, labels: popxl.Tensor) -> popxl.Tensor:
        loss, dlogits = addons.ops.cross_entropy_with_grad(logits, labels.reshape((B * S,)))
        ops.host_store(program.loss_stream, loss)
        return dlogits

    def backward(part: str, acc: Any, dx: Any, info: Any, args: Any = None) -> Any:
        bwd = parts[part][1]
        acts = bwd.grad_graph_info.inputs_dict(info) if args is None else args
        outs = bwd.bind(acc).call(dx, args=acts) if dx is not None else None
        return outs[0] if outs else None

    if cfg.pattern == "pipelined":
        _pipeline(program, emb, layer, head, parts, emb_vars, layer_vars, head_vars, accums,
                  mask, loss_grad)  # fmt: skip
    elif cfg.pattern == "phased":
        _phases(program, emb, layer, head, parts, emb_vars, layer_vars, head_vars, accums,
                mask, loss_grad, buffers)  # fmt: skip
        return
    else:
        inner_groups = [(emb_vars, False), (accums["emb"], True), *((v, False) for v in layer_vars),
                        *((a, True) for a in accums["layers"]), (head_vars, False),
                        (accums["head"], True)]  # fmt: skip
        micro = popxl.gcg().ir.create_empty_graph("micro_batch")
        with micro:
            inner = [
                NamedTensors.from_dict({
                    k: popxl.graph_input(t.shape, t.dtype, by_ref=by_ref)
                    for k, t in named.to_dict().items()
                })
                for named, by_ref in inner_groups
            ]  # fmt: skip
            n = cfg.layers
            e_v, e_a, l_v, l_a = inner[0], inner[1], inner[2 : 2 + n], inner[2 + n : 2 + 2 * n]
            h_v, h_a = inner[-2], inner[-1]
            m = popxl.constant(_mask(S), compute, name="mask")
            tokens, labels = ops.host_load(tokens_stream), ops.host_load(labels_stream)
            e_info = emb.bind(e_v).call_with_info(tokens)
            x, infos = e_info.outputs[0], []
            for i in range(n):
                infos.append(layer.bind(l_v[i]).call_with_info(x, m))
                x = infos[-1].outputs[0]
            h_info = head.bind(h_v).call_with_info(x)
            dx = backward("head", h_a, loss_grad(h_info.outputs[0], labels), h_info)
            for i in reversed(range(n)):
                dx = backward("layer", l_a[i], dx, infos[i])
            parts["emb"][1].bind(e_a).call(
                dx, args=parts["emb"][1].grad_graph_info.inputs_dict(e_info)
            )  # noqa: E501
        outer = [t for named, _ in inner_groups for t in named.to_dict().values()]
        ops.repeat(micro, cfg.ga, *outer)
    _accumulated_adam(program, emb_vars, head_vars, layer_vars, accums)


def _accumulated_adam(program: Program, emb_vars: Any, head_vars: Any, layer_vars: list,
                      accums: dict, only: int | None = None) -> None:  # fmt: skip
    """Per-variable Adam on the mean gradients, then the accumulators' counters reset."""
    import popxl.ops as ops

    cfg = program.cfg
    parts = [(emb_vars, accums["emb"]), *zip(layer_vars, accums["layers"]),
             (head_vars, accums["head"])]  # fmt: skip
    for named, acc in parts:
        for key, var in named.to_dict().items():
            _update(cfg, var, acc.to_dict()[f"accum.{key}"])
        ops.var_updates.accumulator_scale_(acc.mean_accum_counter, 0.0)


def _pipeline(program, emb, layer, head, parts, emb_vars, layer_vars, head_vars, accums, mask,
              loss_grad) -> None:  # noqa: ANN001 (internal, one caller)  # fmt: skip
    """Forward layers split over 2 IPUs; each IPU's backward in a later stage."""
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons

    cfg = program.cfg
    tokens_stream, labels_stream = program.streams
    half = cfg.layers // 2
    spans = [range(0, half), range(half, cfg.layers)]
    with addons.pipelined_execution(cfg.ga) as p:
        infos: dict[int, Any] = {}
        with p.stage(0), popxl.ipu(0):
            tokens = ops.host_load(tokens_stream)
            e_info = emb.bind(emb_vars).call_with_info(tokens)
            x = e_info.outputs[0]
            for i in spans[0]:
                infos[i] = layer.bind(layer_vars[i]).call_with_info(x, mask)
                x = infos[i].outputs[0]
            x = x.copy_to_ipu(1)
        with p.stage(1), popxl.ipu(1):
            for i in spans[1]:
                infos[i] = layer.bind(layer_vars[i]).call_with_info(x, mask)
                x = infos[i].outputs[0]
            h_info = head.bind(head_vars).call_with_info(x)
            labels = ops.host_load(labels_stream)
            dx = loss_grad(h_info.outputs[0], labels)
            bwd = parts["head"][1]
            (dx,) = bwd.bind(accums["head"]).call(dx, args=bwd.grad_graph_info.inputs_dict(h_info))
            bwd = parts["layer"][1]
            for i in reversed(spans[1]):
                (dx,) = bwd.bind(accums["layers"][i]).call(
                    dx, args=bwd.grad_graph_info.inputs_dict(infos[i])
                )
            dx = dx.copy_to_ipu(0)
        with p.stage(2), popxl.ipu(0):
            for i in reversed(spans[0]):
                acts = p.stash_and_restore_activations(infos[i], bwd.grad_graph_info)
                (dx,) = bwd.bind(accums["layers"][i]).call(dx, args=acts)
            e_bwd = parts["emb"][1]
            acts = p.stash_and_restore_activations(e_info, e_bwd.grad_graph_info)
            e_bwd.bind(accums["emb"]).call(dx, args=acts)


def _phases(program, emb, layer, head, parts, emb_vars, layer_vars, head_vars, accums, mask,
            loss_grad, buffers) -> None:  # noqa: ANN001 (internal, one caller)  # fmt: skip
    """Tutorial 6's phased execution: a layer's weights are loaded from their remote buffers
    for its forward phase and again for its backward phase, then updated and stored."""
    import popxl
    import popxl.ops as ops
    import popxl_addons as addons

    tokens_stream, labels_stream = program.streams
    cfg = program.cfg
    with popxl.in_sequence(True):
        tokens = ops.host_load(tokens_stream)
        e_info = emb.bind(emb_vars).call_with_info(tokens)
        x, infos, fwd_loaded = e_info.outputs[0], [], []
        for i in range(cfg.layers):
            fwd_loaded.append(addons.remote.load_remote(buffers, i))
            infos.append(layer.bind(fwd_loaded[i]).call_with_info(x, mask))
            x = infos[-1].outputs[0]
        h_info = head.bind(head_vars).call_with_info(x)
        labels = ops.host_load(labels_stream)
        bwd = parts["head"][1]
        dx = loss_grad(h_info.outputs[0], labels)
        (dx,) = bwd.bind(accums["head"]).call(dx, args=bwd.grad_graph_info.inputs_dict(h_info))
        bwd = parts["layer"][1]
        for i in reversed(range(cfg.layers)):
            loaded = addons.remote.load_remote(buffers, i)
            swap = dict(zip(fwd_loaded[i].tensors, loaded.tensors))  # this phase's copy
            acts = {k: swap.get(v, v) for k, v in bwd.grad_graph_info.inputs_dict(infos[i]).items()}
            (dx,) = bwd.bind(accums["layers"][i]).call(dx, args=acts)
            acc = accums["layers"][i]
            for key, var in loaded.to_dict().items():
                _update(cfg, var, acc.to_dict()[f"accum.{key}"])
            ops.var_updates.accumulator_scale_(acc.mean_accum_counter, 0.0)
            addons.remote.store_remote(buffers, loaded, i)
        e_bwd = parts["emb"][1]
        e_bwd.bind(accums["emb"]).call(dx, args=e_bwd.grad_graph_info.inputs_dict(e_info))
    _accumulated_adam(program, emb_vars, head_vars, [], {**accums, "layers": []})


# The hand-written JAX reference -----------------------------------------------------------


def reference_params(cfg: Config, weights: dict[str, np.ndarray]) -> dict[str, Any]:
    layers = {
        key: np.stack([weights[f"h{i}.{key}"] for i in range(cfg.layers)]) for key in LAYER_KEYS
    }
    rest = {k: v for k, v in weights.items() if not k.startswith("h") or k == "head.weight"}
    return {"layers": layers, **rest}


def reference_step(cfg: Config) -> Any:
    """``step(state, tokens, labels) -> (state, losses)``, jitted with the state donated;
    ``state = (params, m, v, t)``; tokens and labels as ``make_batches``."""
    import jax
    import jax.numpy as jnp

    H, heads, S, B = cfg.hidden, cfg.heads, cfg.seq, cfg.micro_batch
    compute = jnp.dtype(cfg.dtype)

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
        z = mm(jax.nn.softmax(s, axis=-1), split_heads(v)).transpose(0, 2, 1, 3)
        x = x + mm(z.reshape(B * S, H), p["attn.out.weight"]) + p["attn.out.bias"]
        h = layer_norm(x, p["ln2.weight"], p["ln2.bias"])
        h = jax.nn.gelu(mm(h, p["fc1.weight"]) + p["fc1.bias"], approximate=True)
        return x + mm(h, p["fc2.weight"]) + p["fc2.bias"]

    layer_fn = jax.checkpoint(decoder) if cfg.recompute else decoder

    def loss_fn(params, tokens, labels):
        mask = jnp.asarray(_mask(S)).astype(compute)
        x = (params["wte"][tokens] + params["wpe"]).reshape(B * S, H).astype(compute)
        x, _ = jax.lax.scan(lambda c, p: (layer_fn(c, p, mask), None), x, params["layers"])
        ln_f = (params["ln_f.weight"].astype(compute), params["ln_f.bias"].astype(compute))
        h = layer_norm(x, *ln_f)
        logits = mm(h, params["head.weight"].astype(compute)).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, labels.reshape(B * S, 1), axis=-1))

    grad_fn = jax.value_and_grad(loss_fn)

    def gradients(params, tokens, labels):
        """Mean gradients over the micro-batches (and replicas); losses ``(ga, replicas)``."""

        def per_replica(tokens, labels):
            def micro(acc, batch):
                loss, grads = grad_fn(params, *batch)
                return jax.tree_util.tree_map(jnp.add, acc, grads), loss

            zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
            total, losses = jax.lax.scan(micro, zeros, (tokens, labels))
            mean = jax.tree_util.tree_map(lambda g: g / cfg.ga, total)
            return jax.lax.pmean(mean, "replica"), losses

        grads, losses = jax.vmap(per_replica, in_axes=1, out_axes=(0, 1), axis_name="replica")(
            tokens, labels
        )
        return jax.tree_util.tree_map(lambda g: g[0], grads), losses

    def step(state, tokens, labels):
        params, m, v, t = state
        grads, losses = gradients(params, tokens, labels)
        if cfg.optimizer == "sgd":
            params = jax.tree_util.tree_map(lambda p, g: p - cfg.lr * g, params, grads)
            return (params, m, v, t), losses
        t = t + 1.0
        b1, b2 = cfg.beta1, cfg.beta2

        def adam(p, g, m_, v_):
            m_ = b1 * m_ + (1 - b1) * g
            v_ = b2 * v_ + (1 - b2) * g * g
            update = (m_ / (1 - b1**t)) / (jnp.sqrt(v_ / (1 - b2**t)) + cfg.eps)
            return p - cfg.lr * update, m_, v_

        out = jax.tree_util.tree_map(adam, params, grads, m, v)
        leaf = lambda o: isinstance(o, tuple)  # noqa: E731
        pick = [jax.tree_util.tree_map(lambda o, k=k: o[k], out, is_leaf=leaf) for k in range(3)]
        return (*pick, t), losses

    return jax.jit(step, donate_argnums=(0,))


class Reference:
    """The reference step with its state; ``run`` and ``weights`` as ``Program``'s."""

    def __init__(self, cfg: Config, weights: dict[str, np.ndarray] | None = None):
        import jax
        import jax.numpy as jnp

        self.cfg = cfg
        params = reference_params(cfg, initial_weights(cfg) if weights is None else weights)
        zeros = jax.tree_util.tree_map(np.zeros_like, params)
        self.state = jax.device_put((params, zeros, zeros, jnp.zeros((), jnp.float32)))
        self.fn = reference_step(cfg)

    def run(self, tokens: np.ndarray, labels: np.ndarray) -> np.ndarray:
        self.state, losses = self.fn(self.state, tokens, labels)
        return np.asarray(losses)

    def weights(self) -> dict[str, np.ndarray]:
        params = self.state[0]
        out = {k: np.asarray(v) for k, v in params.items() if k != "layers"}
        for key, stacked in params["layers"].items():
            for i in range(self.cfg.layers):
                out[f"h{i}.{key}"] = np.asarray(stacked[i])
        return out


__all__ = ["PATTERNS", "Config", "config", "initial_weights", "make_batches", "Program",
           "Reference", "reference_step", "reference_params"]  # fmt: skip
