"""Pretraining the tensor-parallel block with data parallelism, as applications write it.

Tensor parallelism 2 inside each data-parallel replica group, data parallelism 2 across them
(4 replicas): ``addons.autodiff``, then ``apply_pre_alias_patterns``, then a mean all-reduce of
every gradient over the data-parallel group and SGD updates, for several ``session.run`` steps.
The reference trains the unsharded block in plain JAX on the mean of the two batches' losses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.patterns import apply_pre_alias_patterns

from ..replication_helpers import mode  # noqa: F401  (the `mode` fixture)
from .tp_block_model import Block, Config, full_weights, jax_loss, reference_name, shard_weights

TP, DP, STEPS, LR = 2, 2, 3, 0.1


def _data(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((DP, cfg.seq, cfg.hidden)).astype(np.float32)
    labels = rng.integers(0, cfg.vocab, (DP, cfg.seq)).astype(np.int32)
    return x, labels


def _build(cfg: Config, weights: dict[str, np.ndarray], x: np.ndarray, labels: np.ndarray):
    ir = popxl.Ir(replication=TP * DP)
    tp_group = ir.replica_grouping(group_size=TP)
    dp_group = tp_group.transpose()  # replicas holding the same tensor-parallel rank
    with ir.main_graph:
        x_stream = popxl.h2d_stream(x.shape[1:], popxl.float32, "x")
        label_stream = popxl.h2d_stream(labels.shape[1:], popxl.int32, "labels")
        xt, lt = ops.host_load(x_stream, "x"), ops.host_load(label_stream, "labels")
        facts, graph = Block(cfg, tp_group, weights).create_graph(xt, lt)
        trained = [t for t in graph.args.tensors if t.dtype.is_floating_point]
        dgraph = addons.autodiff(graph, grads_required=trained)
        variables = facts.init()
        fwd = graph.bind(variables).call_with_info(xt, lt)
        grads = dgraph.call(
            popxl.constant(np.float32(1)), args=dgraph.grad_graph_info.inputs_dict(fwd)
        )
        names = {t: n for n, t in graph.args.to_dict().items()}
        by_input = dict(zip(trained, grads))
        params = {}
        for name, var in variables.to_dict().items():
            if graph.args.to_dict()[name] not in by_input:
                continue
            grad = ops.collectives.replicated_all_reduce(
                by_input[graph.args.to_dict()[name]], op="mean", group=dp_group
            )
            ops.scaled_add_(var, grad, b=-LR)
            params[reference_name(names[graph.args.to_dict()[name]])] = var
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_stream, fwd.outputs[0])
    apply_pre_alias_patterns(ir)
    session = popxl.Session(ir, "ipu_model")
    per_replica = np.repeat(np.arange(DP), TP)  # replicas 0, 1 see batch 0; 2, 3 batch 1
    inputs = {x_stream: x[per_replica], label_stream: labels[per_replica]}
    return session, inputs, loss_stream, params


def _reference(cfg, weights, x, labels):
    def loss_fn(w):
        losses = [jax_loss(cfg, w, jnp.asarray(x[d]), jnp.asarray(labels[d])) for d in range(DP)]
        return jnp.mean(jnp.stack(losses)), jnp.stack(losses)

    w = {k: jnp.asarray(v) for k, v in weights.items()}
    history = []
    for _ in range(STEPS):
        (_, losses), g = jax.value_and_grad(loss_fn, has_aux=True)(w)
        history.append(np.asarray(losses))
        w = {k: w[k] - LR * g[k] for k in w}
    return np.stack(history), {k: np.asarray(v) for k, v in w.items()}


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("chunked_head", [False, True])
def test_tp2_dp2_pretraining_matches_plain_jax(chunked_head: bool) -> None:
    cfg = Config(tp=TP, heads=4, hidden=32, ffn=64, vocab=32, seq=8, chunked_head=chunked_head)
    weights = full_weights(cfg)
    x, labels = _data(cfg)
    session, inputs, loss_stream, params = _build(cfg, weights, x, labels)
    with session:
        losses = np.stack([session.run(inputs)[loss_stream] for _ in range(STEPS)])
    ref_losses, ref_weights = _reference(cfg, weights, x, labels)

    # Every replica of a data-parallel group reports its batch's loss.
    np.testing.assert_allclose(losses, np.repeat(ref_losses, TP, axis=1), rtol=1e-4)
    data = session.get_tensors_data(params.values())
    shards = shard_weights(cfg, ref_weights)
    for name in ("ln2_w", "ln2_b"):  # the sharded layer norm holds a slice per rank
        shards[name] = np.split(ref_weights[name], TP, axis=-1)
    for name, var in params.items():
        want = np.stack(shards[name]) if name in shards else ref_weights[name]
        np.testing.assert_allclose(data[var], want, rtol=1e-4, atol=1e-5, err_msg=name)
