"""A tensor-parallel transformer block, written as Graphcore's popxl applications write
them, and the same block in plain JAX (the reference).

The popxl block is sharded over a tensor-parallel replica group (Megatron-style):

* attention: ``f`` (``replicated_all_reduce_identical_inputs``), a column-parallel QKV
  projection (each replica owns ``heads / tp`` heads), rotary embeddings on queries and
  keys, causal attention of the local heads, a row-parallel output projection and ``g``
  (``replicated_all_reduce_identical_grad_inputs``);
* feed-forward: each replica normalises its slice of the hidden axis with the sharded
  layer norm (the ``LayerNormDistributed`` layer, at its initial weights), gathers the
  result, and runs a column-parallel then row-parallel MLP between ``f`` and ``g``;
* head: layer norm, a vocabulary-parallel projection and ``cross_entropy_sharded_loss``.

The residual stream is replicated; weights sharded over the group are variables with the
transposed grouping (one value per rank). ``full_weights`` draws the unsharded weights,
``shard_weights`` cuts them the way the popxl block holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import popxl
import popxl_addons as addons
from popxl import ReplicaGrouping, ops
from popxl_addons.layers.layer_norm_distributed import LayerNormDistributed
from popxl_addons.ops.cross_entropy_sharded_loss import cross_entropy_sharded_loss
from popxl_addons.ops.replicated_all_reduce_TP import (
    replicated_all_reduce_identical_grad_inputs,
    replicated_all_reduce_identical_inputs,
)
from popxl_addons.ops.rotary_pos_embed import rotary_pos_embed, trig_tables
from popxl_addons.patterns import apply_pre_alias_patterns


@dataclass(frozen=True)
class Config:
    seq: int = 16
    hidden: int = 64
    heads: int = 8
    ffn: int = 256
    vocab: int = 64
    rotary_dim: int = 4
    tp: int = 4
    eps: float = 1e-5
    # The head splits its rows and concatenates them again before ``f``, as code that
    # processes sequence chunks does: ``f``'s input is then a concat's output.
    chunked_head: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


WEIGHT_SHAPES = {
    "ln1_w": ("hidden",),
    "ln1_b": ("hidden",),
    "qkv_w": ("hidden", "3hidden"),
    "qkv_b": ("3hidden",),
    "out_w": ("hidden", "hidden"),
    "out_b": ("hidden",),
    "ff1_w": ("hidden", "ffn"),
    "ff1_b": ("ffn",),
    "ff2_w": ("ffn", "hidden"),
    "ff2_b": ("hidden",),
    "lnf_w": ("hidden",),
    "lnf_b": ("hidden",),
    "head_w": ("hidden", "vocab"),
}


def full_weights(cfg: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Unsharded float32 weights (layer-norm scales around 1, the rest small)."""
    rng = np.random.default_rng(seed)
    sizes = {"hidden": cfg.hidden, "3hidden": 3 * cfg.hidden, "ffn": cfg.ffn, "vocab": cfg.vocab}
    weights = {}
    for name, dims in WEIGHT_SHAPES.items():
        shape = tuple(sizes[d] for d in dims)
        value = rng.standard_normal(shape) * (0.1 if name.endswith("_b") else 0.2)
        weights[name] = (value + (1.0 if name in ("ln1_w", "lnf_w") else 0.0)).astype(np.float32)
    # The sharded layer norm starts from its layer's initial values.
    weights["ln2_w"] = np.ones(cfg.hidden, np.float32)
    weights["ln2_b"] = np.zeros(cfg.hidden, np.float32)
    return weights


def _qkv_columns(cfg: Config, rank: int) -> np.ndarray:
    """The QKV columns of the heads of tensor-parallel ``rank``: its q, then k, then v."""
    width = cfg.hidden // cfg.tp
    return np.concatenate(
        [part * cfg.hidden + np.arange(rank * width, (rank + 1) * width) for part in range(3)]
    )


def shard_weights(cfg: Config, w: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    """Per-rank pieces of the sharded weights (replicated weights are not listed)."""

    def cols(a: np.ndarray, n: int) -> list[np.ndarray]:
        return np.split(a, n, axis=-1)

    tp = cfg.tp
    return {
        "qkv_w": [w["qkv_w"][:, _qkv_columns(cfg, r)] for r in range(tp)],
        "qkv_b": [w["qkv_b"][_qkv_columns(cfg, r)] for r in range(tp)],
        "out_w": np.split(w["out_w"], tp, axis=0),
        "ff1_w": cols(w["ff1_w"], tp),
        "ff1_b": cols(w["ff1_b"], tp),
        "ff2_w": np.split(w["ff2_w"], tp, axis=0),
        "head_w": cols(w["head_w"], tp),
    }


# The popxl block ----------------------------------------------------------------------------


class ShardedModule(addons.Module):
    """A module whose variables are either replicated or sharded over ``tp_group``."""

    def __init__(self, cfg: Config, tp_group: ReplicaGrouping, weights: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp_group = tp_group
        self.weights = weights
        self.shards = shard_weights(cfg, weights)

    def weight(self, name: str) -> popxl.Tensor:
        if name in self.shards:  # one value per tensor-parallel rank
            return self.add_variable_input(
                name, self.shards[name], popxl.float32, replica_grouping=self.tp_group.transpose()
            )
        return self.add_variable_input(name, lambda: self.weights[name], popxl.float32)


class Attention(ShardedModule):
    def build(self, x: popxl.Tensor, sin: popxl.Tensor, cos: popxl.Tensor) -> popxl.Tensor:
        cfg = self.cfg
        local_heads = cfg.heads // cfg.tp
        h = ops.layer_norm(x, self.weight("ln1_w"), self.weight("ln1_b"), eps=cfg.eps)
        h = replicated_all_reduce_identical_inputs(h, group=self.tp_group)
        qkv = h @ self.weight("qkv_w") + self.weight("qkv_b")
        q, k, v = (
            t.reshape((1, cfg.seq, local_heads, cfg.head_dim)) for t in ops.split(qkv, 3, axis=-1)
        )
        q = rotary_pos_embed(q, sin, cos, cfg.rotary_dim)
        k = rotary_pos_embed(k, sin, cos, cfg.rotary_dim)
        q, k, v = (
            ops.transpose(t.reshape((cfg.seq, local_heads, cfg.head_dim)), (1, 0, 2))
            for t in (q, k, v)
        )
        scores = (q @ ops.transpose(k, (0, 2, 1))) * (1.0 / np.sqrt(cfg.head_dim))
        mask = np.triu(np.full((cfg.seq, cfg.seq), -1e4, np.float32), 1)
        probs = ops.softmax(scores + popxl.constant(mask), axis=-1)
        z = ops.transpose(probs @ v, (1, 0, 2)).reshape((cfg.seq, local_heads * cfg.head_dim))
        out = z @ self.weight("out_w")
        out = replicated_all_reduce_identical_grad_inputs(out, group=self.tp_group)
        return x + out + self.weight("out_b")


class FeedForward(ShardedModule):
    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        group = self.tp_group
        x_slice = ops.collectives.replicated_slice(x, axis=1, group=group)
        (h_slice,) = self.call_module(LayerNormDistributed(group), name="ln2")(x_slice)
        h = ops.collectives.replicated_all_gather(h_slice, axis=1, group=group)
        h = replicated_all_reduce_identical_inputs(h, group=group)
        h = ops.gelu(h @ self.weight("ff1_w") + self.weight("ff1_b"))
        out = replicated_all_reduce_identical_grad_inputs(h @ self.weight("ff2_w"), group=group)
        return x + out + self.weight("ff2_b")


class Head(ShardedModule):
    def build(self, x: popxl.Tensor, labels: popxl.Tensor) -> popxl.Tensor:
        cfg = self.cfg
        h = ops.layer_norm(x, self.weight("lnf_w"), self.weight("lnf_b"), eps=cfg.eps)
        if cfg.chunked_head:
            h = ops.concat(ops.split(h, 2, axis=0), axis=0)
        h = replicated_all_reduce_identical_inputs(h, group=self.tp_group)
        logits = h @ self.weight("head_w")
        # Each rank holds vocab / tp classes: shift the labels into its range.
        first_class = self.add_variable_input(
            "first_class",
            [np.int32(r * (cfg.vocab // cfg.tp)) for r in range(cfg.tp)],
            popxl.int32,
            replica_grouping=self.tp_group.transpose(),
        )
        return cross_entropy_sharded_loss(
            logits, labels - first_class, replica_grouping=self.tp_group
        )


class Block(ShardedModule):
    def build(self, x: popxl.Tensor, labels: popxl.Tensor) -> popxl.Tensor:
        sin, cos = (popxl.constant(t) for t in trig_tables(self.cfg.seq, self.cfg.rotary_dim))
        modules = (Attention, FeedForward, Head)
        attn, ff, head = (m(self.cfg, self.tp_group, self.weights) for m in modules)
        (x,) = self.call_module(attn, name="attention")(x, sin, cos)
        (x,) = self.call_module(ff, name="feed_forward")(x)
        (loss,) = self.call_module(head, name="head")(x, labels)
        return loss


# The same block in plain JAX ----------------------------------------------------------------


def _layer_norm(x: Any, w: Any, b: Any, eps: float) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * w + b


def _rope(t: Any, sin: Any, cos: Any, rotary_dim: int) -> Any:
    rot, rest = t[..., :rotary_dim], t[..., rotary_dim:]
    real, imag = rot[..., ::2], rot[..., 1::2]
    s, c = sin[:, None, :], cos[:, None, :]
    turned = jnp.stack([real * c - imag * s, imag * c + real * s], axis=-1)
    return jnp.concatenate([turned.reshape(rot.shape), rest], axis=-1)


def jax_loss(cfg: Config, w: dict[str, Any], x: Any, labels: Any) -> Any:
    """The block's mean cross-entropy, unsharded, on one device."""
    sin, cos = (jnp.asarray(t) for t in trig_tables(cfg.seq, cfg.rotary_dim))
    h = _layer_norm(x, w["ln1_w"], w["ln1_b"], cfg.eps)
    qkv = h @ w["qkv_w"] + w["qkv_b"]
    q, k, v = (t.reshape(cfg.seq, cfg.heads, cfg.head_dim) for t in jnp.split(qkv, 3, axis=-1))
    q, k = _rope(q, sin, cos, cfg.rotary_dim), _rope(k, sin, cos, cfg.rotary_dim)
    scores = jnp.einsum("qhd,khd->hqk", q, k) / np.sqrt(cfg.head_dim)
    scores = scores + jnp.triu(jnp.full((cfg.seq, cfg.seq), -1e4, jnp.float32), 1)
    z = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1), v)
    x = x + z.reshape(cfg.seq, cfg.hidden) @ w["out_w"] + w["out_b"]
    h = _layer_norm(x, w["ln2_w"], w["ln2_b"], cfg.eps)
    x = x + jax.nn.gelu(h @ w["ff1_w"] + w["ff1_b"], approximate=True) @ w["ff2_w"] + w["ff2_b"]
    logits = _layer_norm(x, w["lnf_w"], w["lnf_b"], cfg.eps) @ w["head_w"]
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=-1))


# Running the popxl block --------------------------------------------------------------------

# popxl variable name (without the module prefix) -> reference weight name
VARIABLE_NAMES = {"ln2.weight": "ln2_w", "ln2.bias": "ln2_b"}


def reference_name(variable: str) -> str:
    short = variable.split(".", 1)[1]
    return VARIABLE_NAMES.get(short, short)


@dataclass
class TPBlock:
    """A compiled popxl training-step program: loss and gradients of every weight."""

    session: Any
    inputs: dict[Any, np.ndarray]
    loss: Any
    grads: dict[str, Any]  # reference weight name (or "x") -> d2h stream

    def run(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        out = self.session.run(self.inputs)
        return out[self.loss], {name: out[s] for name, s in self.grads.items()}


def build_tp_block(
    cfg: Config, weights: dict[str, np.ndarray], x: np.ndarray, labels: np.ndarray
) -> TPBlock:
    """The block on ``cfg.tp`` replicas (one tensor-parallel group), ready to run."""
    ir = popxl.Ir(replication=cfg.tp)
    tp_group = ir.replica_grouping(group_size=cfg.tp)
    with ir.main_graph:
        x_stream = popxl.h2d_stream(x.shape, popxl.float32, "x")
        label_stream = popxl.h2d_stream(labels.shape, popxl.int32, "labels")
        xt, lt = ops.host_load(x_stream, "x"), ops.host_load(label_stream, "labels")
        facts, graph = Block(cfg, tp_group, weights).create_graph(xt, lt)
        floats = [t for t in graph.graph.inputs if t.dtype.is_floating_point]
        dgraph = addons.autodiff(graph, grads_required=floats)
        variables = facts.init()
        fwd = graph.bind(variables).call_with_info(xt, lt)
        grads = dgraph.call(
            popxl.constant(np.float32(1)), args=dgraph.grad_graph_info.inputs_dict(fwd)
        )
        names = {t: n for n, t in graph.args.to_dict().items()}
        streams = {}
        for t, g in zip(floats, grads):
            name = reference_name(names[t]) if t in names else "x"
            streams[name] = popxl.d2h_stream(g.shape, g.dtype, f"grad_{name}")
            ops.host_store(streams[name], g)
        loss = fwd.outputs[0]
        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)
    apply_pre_alias_patterns(ir)  # f's forward and g's gradient become identities
    session = popxl.Session(ir, "ipu_model")
    replicated = {x_stream: np.stack([x] * cfg.tp), label_stream: np.stack([labels] * cfg.tp)}
    return TPBlock(session, replicated, loss_stream, streams)


def unshard_grads(cfg: Config, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Whole-weight gradients from the per-replica ones (replicated weights: replica 0)."""
    cols = {"ff1_w", "ff1_b", "head_w", "ln2_w", "ln2_b"}
    rows = {"out_w", "ff2_w"}
    out = {}
    for name, g in grads.items():
        if name in ("qkv_w", "qkv_b"):
            full = np.zeros((*g.shape[1:-1], 3 * cfg.hidden), g.dtype)
            for r in range(cfg.tp):
                full[..., _qkv_columns(cfg, r)] = g[r]
            out[name] = full
        elif name in cols:
            out[name] = np.concatenate(list(g), axis=-1)
        elif name in rows:
            out[name] = np.concatenate(list(g), axis=0)
        else:
            out[name] = g[0]
    return out
