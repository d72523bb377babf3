"""Tensor parallelism: a transformer block sharded over TP=4 replicas vs hand-written JAX.

The block of ``tests/popxl_addons/tp_block_model.py`` (attention and feed-forward sharded
with ``replicated_all_reduce_TP``, sharded layer norm, sharded cross-entropy, rotary
embeddings), one training step (loss and the gradient of every weight and of the input)
per ``session.run``, against three references in plain JAX, all ``jax.jit`` of
``jax.value_and_grad``:

* hand TP: the same sharded math written directly with named-axis collectives
  (``hand_tp_step``: ``lax.psum``/``all_gather``, Megatron's ``f`` and ``g`` as
  ``custom_vjp`` pairs), mapped over the 4 replicas like the project's step, its outputs
  left on the device;
* hand TP + host: the same, its outputs fetched to NumPy arrays with ``jax.device_get``
  (``session.run`` hands back host arrays);
* unsharded: the whole block on one device.

The bench checks that the hand TP step gives the project's loss and per-replica gradients.
Two placements of the 4 replicas:

* ``vmap``: all replicas on one device (``jax.vmap`` over the replica axis);
* ``shard_map``: one replica per device, on 4 CPU devices forced with
  ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (the unsharded reference runs on
  the first).

Each placement runs in a fresh process, timing the project against each reference there
in alternating rounds.
Run: python bench/tp_block.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench._common import child_env, compare, device_name, report, set_matmul_precision  # noqa: E402

SIZES = {"seq": 128, "hidden": 256, "heads": 8, "ffn": 1024, "vocab": 1024, "rotary_dim": 16}


def variant(mode: str) -> None:
    """Time the TP block, the hand-written TP step and the plain-JAX block in this process
    (alternating rounds); print one JSON line."""
    import jax
    import jax.numpy as jnp

    from tests.popxl_addons.tp_block_model import (
        Config,
        build_tp_block,
        full_weights,
        jax_loss,
        shard_weights,
    )

    os.environ["POPXL_REPLICATION"] = mode
    cfg = Config(**SIZES)
    weights = full_weights(cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((cfg.seq, cfg.hidden)).astype(np.float32)
    labels = rng.integers(0, cfg.vocab, cfg.seq).astype(np.int32)
    block = build_tp_block(cfg, weights, x, labels)
    reference = jax.jit(jax.value_and_grad(lambda w, xs, ls: jax_loss(cfg, w, xs, ls), (0, 1)))
    args = ({k: jnp.asarray(v) for k, v in weights.items()}, jnp.asarray(x), jnp.asarray(labels))
    pieces = dict(shard_weights(cfg, weights))
    # the sharded layer norm holds a slice of its weights on each replica
    pieces.update({k: np.split(weights[k], cfg.tp) for k in ("ln2_w", "ln2_b")})
    shards = {k: jnp.asarray(np.stack(v)) for k, v in pieces.items()}
    replicated = {k: jnp.asarray(v) for k, v in weights.items() if k not in shards}
    hand, hand_args = hand_tp_program(
        cfg, mode, (shards, replicated, jnp.asarray(x), jnp.asarray(labels))
    )
    with block.session:
        loss, grads = block.run()
        ref_loss, _ = reference(*args)
        np.testing.assert_allclose(loss[0], float(ref_loss), rtol=1e-4)
        # the hand-written TP step computes the same loss and per-replica gradients
        hand_loss, (g_shards, g_repl, g_x) = hand(*hand_args)
        assert np.allclose(loss, hand_loss, rtol=1e-5), (loss, hand_loss)
        for name, value in {**g_shards, **g_repl, "x": g_x}.items():
            assert np.allclose(grads[name], value, rtol=1e-3, atol=1e-5), name
        run = block.run
        project, tp_ref = compare(run, lambda: jax.block_until_ready(hand(*hand_args)), 20)
        # session.run hands back host (NumPy) arrays: the hand TP step's fetched too
        project2, tp_host = compare(run, lambda: jax.device_get(hand(*hand_args)), 20)
        project3, ref = compare(run, lambda: jax.block_until_ready(reference(*args)), 20)
    print(
        json.dumps(
            {
                "project": min(project, project2, project3),
                "hand_tp": tp_ref,
                "hand_tp_host": tp_host,
                "reference": ref,
                "device": device_name(),
                "load": os.getloadavg(),
            }
        )
    )


# The same tensor-parallel math written by hand in JAX ---------------------------------------

AXIS = "tp"


def hand_tp_step(cfg: Any) -> Callable[..., Any]:
    """One replica's training step of the TP block, written directly with named-axis
    collectives (Megatron's ``f`` and ``g`` as ``custom_vjp`` pairs, the sharded layer norm
    and sharded cross-entropy): ``(shards, replicated, x, labels) -> (loss, grads)`` where
    ``grads`` are this replica's gradients of its shards, of the replicated weights and of
    ``x``. Map it over the axis ``"tp"`` with ``jax.vmap`` or ``jax.shard_map``."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from popxl_addons.ops.rotary_pos_embed import trig_tables
    from tests.popxl_addons.tp_block_model import _layer_norm, _rope

    @jax.custom_vjp
    def f(t: Any) -> Any:  # identity forward, all-reduce of the gradient
        return t

    f.defvjp(lambda t: (t, None), lambda _, g: (lax.psum(g, AXIS),))

    @jax.custom_vjp
    def g(t: Any) -> Any:  # all-reduce forward, identity gradient (the result is replicated)
        return lax.psum(t, AXIS)

    g.defvjp(lambda t: (lax.psum(t, AXIS), None), lambda _, d: (d,))

    width = cfg.hidden // cfg.tp

    @jax.custom_vjp
    def local_slice(t: Any) -> Any:  # this replica's slice of the hidden axis
        return lax.dynamic_slice_in_dim(t, lax.axis_index(AXIS) * width, width, axis=-1)

    local_slice.defvjp(
        lambda t: (local_slice(t), None),
        lambda _, d: (lax.all_gather(d, AXIS, axis=d.ndim - 1, tiled=True),),
    )

    @jax.custom_vjp
    def gather(t: Any) -> Any:  # all-gather forward, this replica's slice of the gradient
        return lax.all_gather(t, AXIS, axis=t.ndim - 1, tiled=True)

    gather.defvjp(lambda t: (gather(t), None), lambda _, d: (local_slice(d),))

    sin, cos = (jnp.asarray(t) for t in trig_tables(cfg.seq, cfg.rotary_dim))
    mask = jnp.triu(jnp.full((cfg.seq, cfg.seq), -1e4, jnp.float32), 1)
    local_heads, part = cfg.heads // cfg.tp, cfg.vocab // cfg.tp

    def loss(s: dict, r: dict, x: Any, labels: Any) -> Any:
        h = f(_layer_norm(x, r["ln1_w"], r["ln1_b"], cfg.eps))
        qkv = h @ s["qkv_w"] + s["qkv_b"]
        q, k, v = (t.reshape(cfg.seq, local_heads, cfg.head_dim) for t in jnp.split(qkv, 3, -1))
        q, k = _rope(q, sin, cos, cfg.rotary_dim), _rope(k, sin, cos, cfg.rotary_dim)
        scores = jnp.einsum("qhd,khd->hqk", q, k) / np.sqrt(cfg.head_dim) + mask
        z = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1), v)
        x = x + g(z.reshape(cfg.seq, width) @ s["out_w"]) + r["out_b"]
        # sharded layer norm: statistics of the whole hidden axis from the local slices
        xs = local_slice(x)
        mean = lax.psum(xs.sum(-1, keepdims=True), AXIS) / cfg.hidden
        var = lax.psum(((xs - mean) ** 2).sum(-1, keepdims=True), AXIS) / cfg.hidden
        hs = (xs - mean) * lax.rsqrt(var + cfg.eps) * s["ln2_w"] + s["ln2_b"]
        h = f(gather(hs))
        ff = jax.nn.gelu(h @ s["ff1_w"] + s["ff1_b"], approximate=True)
        x = x + g(ff @ s["ff2_w"]) + r["ff2_b"]
        logits = f(_layer_norm(x, r["lnf_w"], r["lnf_b"], cfg.eps)) @ s["head_w"]
        # sharded cross-entropy: global max and sum of exponentials, the label's logit
        top = lax.pmax(lax.stop_gradient(logits).max(-1, keepdims=True), AXIS)
        total = g(jnp.exp(logits - top).sum(-1))
        local = labels - lax.axis_index(AXIS) * part
        mine = (local >= 0) & (local < part)
        picked = jnp.take_along_axis(logits, jnp.clip(local, 0, part - 1)[:, None], -1)[:, 0]
        label_logit = g(jnp.where(mine, picked, 0.0))
        return jnp.mean(jnp.log(total) + top[:, 0] - label_logit)

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


def hand_tp_program(cfg: Any, mode: str, args: tuple) -> tuple[Callable[..., Any], tuple]:
    """``jax.jit`` of the hand-written step over the replicas, and ``args`` placed for it.

    ``args`` are ``(shards stacked on a leading replica axis, replicated weights, x,
    labels)``; the program returns ``(losses, grads)``, each with a leading replica axis.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    step = hand_tp_step(cfg)
    if mode == "vmap":
        return jax.jit(jax.vmap(step, in_axes=(0, None, None, None), axis_name=AXIS)), args

    def one(s: dict, r: dict, x: Any, labels: Any) -> Any:
        out = step(jax.tree.map(lambda a: a[0], s), r, x, labels)
        return jax.tree.map(lambda a: a[None], out)

    mesh = jax.make_mesh((cfg.tp,), (AXIS,))
    specs = (P(AXIS), P(), P(), P())
    mapped = jax.shard_map(one, mesh=mesh, in_specs=specs, out_specs=P(AXIS), check_vma=False)
    placed = tuple(
        jax.device_put(a, NamedSharding(mesh, spec)) for a, spec in zip(args, specs, strict=True)
    )
    return jax.jit(mapped), placed


def run_mode(mode: str, devices: int) -> dict:
    env = child_env(JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    out = subprocess.run(
        [sys.executable, __file__, "--variant", mode],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", choices=("vmap", "shard_map"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        variant(args.variant)
        return
    rows = []
    for mode, devices in (("vmap", 1), ("shard_map", 4)):
        result = run_mode(mode, devices)
        where = f"{mode} x{devices}"
        for label, key in (
            ("hand TP", "hand_tp"),
            ("hand TP+host", "hand_tp_host"),
            ("unsharded", "reference"),
        ):
            rows.append((f"TP=4 {where} vs {label}, s/step", result["project"], result[key], "s"))
        print(f"{mode}: {result['device']}, load average {result['load']}")
    print(f"sizes: {SIZES}")
    report(rows)


if __name__ == "__main__":
    set_matmul_precision()
    main()
