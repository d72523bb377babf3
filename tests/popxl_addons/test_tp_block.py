"""A tensor-parallel transformer block (4 replicas) against the same block in plain JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ..replication_helpers import mode  # noqa: F401  (the `mode` fixture)
from .tp_block_model import Config, build_tp_block, full_weights, jax_loss, unshard_grads


@pytest.mark.usefixtures("mode")
def test_tp_block_matches_plain_jax() -> None:
    cfg = Config()
    weights = full_weights(cfg)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((cfg.seq, cfg.hidden)).astype(np.float32)
    labels = rng.integers(0, cfg.vocab, cfg.seq).astype(np.int32)

    block = build_tp_block(cfg, weights, x, labels)
    with block.session:
        loss, grads = block.run()

    ref_loss, (ref_w, ref_x) = jax.value_and_grad(
        lambda w, xs: jax_loss(cfg, w, xs, jnp.asarray(labels)), argnums=(0, 1)
    )({k: jnp.asarray(v) for k, v in weights.items()}, jnp.asarray(x))
    np.testing.assert_allclose(loss, np.full(cfg.tp, float(ref_loss)), rtol=1e-5)
    # Gradients of replicated tensors are identical on every replica.
    for name in ("x", "ln1_w", "out_b", "ff2_b", "lnf_b"):
        np.testing.assert_allclose(
            grads[name], np.stack([grads[name][0]] * cfg.tp), rtol=1e-6, atol=1e-7
        )
    whole = unshard_grads(cfg, grads)
    assert set(whole) == set(weights) | {"x"}
    np.testing.assert_allclose(whole.pop("x"), np.asarray(ref_x), rtol=1e-4, atol=1e-6)
    for name, g in whole.items():
        np.testing.assert_allclose(g, np.asarray(ref_w[name]), rtol=1e-4, atol=1e-6, err_msg=name)
