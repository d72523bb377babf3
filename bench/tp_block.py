"""Tensor parallelism: a transformer block sharded over TP=4 replicas vs plain JAX.

The block of ``tests/popxl_addons/tp_block_model.py`` (attention and feed-forward sharded
with ``replicated_all_reduce_TP``, sharded layer norm, sharded cross-entropy, rotary
embeddings), one training step (loss and the gradient of every weight and of the input)
per ``session.run``, against ``jax.jit(jax.value_and_grad(...))`` of the same block
unsharded on one device. Two placements of the 4 replicas:

* ``vmap``: all replicas on one device (``jax.vmap`` over the replica axis);
* ``shard_map``: one replica per device, on 4 CPU devices forced with
  ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (the reference runs on the first).

Each placement runs in a fresh process, timing both programs there in alternating rounds.
Run: python bench/tp_block.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench._common import compare, device_name, report  # noqa: E402

SIZES = {"seq": 128, "hidden": 256, "heads": 8, "ffn": 1024, "vocab": 1024, "rotary_dim": 16}


def variant(mode: str) -> None:
    """Time the TP block and the plain-JAX block in this process; print one JSON line."""
    import jax
    import jax.numpy as jnp

    from tests.popxl_addons.tp_block_model import Config, build_tp_block, full_weights, jax_loss

    os.environ["POPXL_REPLICATION"] = mode
    cfg = Config(**SIZES)
    weights = full_weights(cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((cfg.seq, cfg.hidden)).astype(np.float32)
    labels = rng.integers(0, cfg.vocab, cfg.seq).astype(np.int32)
    block = build_tp_block(cfg, weights, x, labels)
    reference = jax.jit(jax.value_and_grad(lambda w, xs, ls: jax_loss(cfg, w, xs, ls), (0, 1)))
    args = ({k: jnp.asarray(v) for k, v in weights.items()}, jnp.asarray(x), jnp.asarray(labels))
    with block.session:
        loss, _ = block.run()
        ref_loss, _ = reference(*args)
        np.testing.assert_allclose(loss[0], float(ref_loss), rtol=1e-4)
        project, ref = compare(block.run, lambda: jax.block_until_ready(reference(*args)), 20)
    print(json.dumps({"project": project, "reference": ref, "device": device_name()}))


def run_mode(mode: str, devices: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
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
        name = f"TP=4 block step ({mode}, {devices} device{'s' * (devices > 1)}), s"
        rows.append((name, result["project"], result["reference"], "s"))
        print(f"{mode}: {result['device']}")
    print(f"sizes: {SIZES}")
    report(rows)


if __name__ == "__main__":
    main()
