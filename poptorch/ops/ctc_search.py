"""CTC prefix beam search in JAX: the device decoder of ``poptorch.ctc_beam_search_decoder``,
also what the op runs eagerly on the CPU (``torch_ops``)."""

from __future__ import annotations

import functools
from typing import Any

from popxl.ops._base import jax

_HASH_MULTIPLIERS = (1_000_003, 2_654_435_761)


def _ctc_item(lp: Any, length: Any, *, blank: int, beam_width: int, top_paths: int) -> tuple:
    """Prefix beam search of one item: ``lp`` [T, C] log probabilities, ``length`` steps."""
    jnp, lax = jax.numpy, jax.lax
    steps, classes = lp.shape
    width = beam_width
    neg = jnp.float32(-jnp.inf)
    state = (
        jnp.zeros((width, steps), jnp.int32),  # prefixes
        jnp.zeros((width,), jnp.int32),  # their lengths
        jnp.full((width,), -1, jnp.int32),  # last label (-1: empty)
        jnp.full((width,), neg).at[0].set(0.0),  # log p(prefix, ending in blank)
        jnp.full((width,), neg),  # log p(prefix, ending in a label)
        jnp.zeros((2, width), jnp.uint32),  # two hashes identifying each prefix
    )
    multipliers = jnp.array(_HASH_MULTIPLIERS, jnp.uint32)[:, None, None]

    def step(t: Any, s: tuple) -> tuple:
        prefix, plen, last, pb, pnb, hashes = s
        p = lp[t]
        total = jnp.logaddexp(pb, pnb)
        stay_pb = total + p[blank]
        stay_pnb = jnp.where(last >= 0, pnb + p[jnp.maximum(last, 0)], neg)
        labels = jnp.arange(classes, dtype=jnp.int32)
        ext = jnp.where(labels[None, :] == last[:, None], pb[:, None], total[:, None])
        ext = jnp.where(labels[None, :] == blank, neg, ext + p[None, :])  # [W, C]
        ext_hash = hashes[:, :, None] * multipliers + (labels + 1).astype(jnp.uint32)[None, None]
        # An extension equal to a live beam's prefix adds to that beam (beams are distinct).
        same = (
            (ext_hash[:, :, :, None] == hashes[:, None, None, :]).all(0)
            & ((plen + 1)[:, None, None] == plen[None, None, :])
            & (total > neg)[None, None, :]
        )  # [W, C, W]
        merged = jnp.where(same, ext[:, :, None], neg)
        stay_pnb = jnp.logaddexp(stay_pnb, jax.nn.logsumexp(merged.reshape(-1, width), axis=0))
        ext = jnp.where(same.any(-1), neg, ext)
        scores = jnp.concatenate([jnp.logaddexp(stay_pb, stay_pnb), ext.reshape(-1)])
        _, pick = lax.top_k(scores, width)
        is_ext = pick >= width
        beam = jnp.where(is_ext, (pick - width) // classes, pick)
        label = jnp.where(is_ext, (pick - width) % classes, 0)
        new_prefix = jnp.where(
            is_ext[:, None] & (jnp.arange(steps)[None, :] == plen[beam][:, None]),
            label[:, None],
            prefix[beam],
        )
        new = (
            new_prefix,
            plen[beam] + is_ext,
            jnp.where(is_ext, label, last[beam]),
            jnp.where(is_ext, neg, stay_pb[beam]),
            jnp.where(is_ext, ext.reshape(-1)[jnp.maximum(pick - width, 0)], stay_pnb[beam]),
            jnp.where(
                is_ext[None],
                ext_hash.reshape(2, -1)[:, jnp.maximum(pick - width, 0)],
                hashes[:, beam],
            ),
        )
        return jax.tree_util.tree_map(lambda a, b: jnp.where(t < length, a, b), new, s)

    prefix, plen, _, pb, pnb, _ = lax.fori_loop(0, steps, step, state)
    scores, best = lax.top_k(jnp.logaddexp(pb, pnb), top_paths)
    return scores, plen[best], prefix[best]


def ctc_beam_search(
    log_probs: Any, lengths: Any, blank: int, beam_width: int, top_paths: int
) -> tuple:
    """CTC prefix beam search over ``log_probs`` [T, B, C] (JAX): per batch item the
    ``top_paths`` best label sequences' log probabilities [B, K], lengths [B, K] and labels
    [B, K, T] (zero-padded). Candidates are ranked stay-first, then by beam and label."""
    jnp = jax.numpy
    fn = functools.partial(_ctc_item, blank=blank, beam_width=beam_width, top_paths=top_paths)
    lp = jnp.moveaxis(log_probs.astype(jnp.float32), 0, 1)
    return jax.vmap(fn)(lp, lengths.astype(jnp.int32).reshape(-1))
