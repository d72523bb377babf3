"""Reference rules of the extra features (see ``generator_extras``), computed by hand.

A remote variable's buffer slot is the leaf's value in each replica's environment: loads
copy it out, stores replace it. A replica-sharded variable's slot holds the replica's
shard: the flat, zero-padded full tensor cut into one chunk per member of the variable's
replica group, in rank order. popxl-addons gradients are ``jax.vjp`` of the forward block,
accumulators the running mean of each step's gradient. Placement changes nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .generator_extras import ADDONS_SHIFT, BATCH_SHIFT
from .program import Block, Node

if TYPE_CHECKING:
    from .reference import Env, Evaluator


def group_members(replicas: int, grouping: tuple[int, int] | None) -> list[list[int]]:
    """The members of each replica's group in rank order (PopXL's stride/group_size)."""
    if grouping is None:
        return [list(range(replicas))] * replicas
    stride, size = grouping
    out = []
    for r in range(replicas):
        block = r // (stride * size) * stride * size
        out.append([block + r % stride + stride * k for k in range(size)])
    return out


def shard_of(full: np.ndarray, rank: int, size: int) -> np.ndarray:
    flat = np.asarray(full).reshape(-1)
    chunk = -(-flat.size // size)
    flat = np.concatenate([flat, np.zeros(chunk * size - flat.size, flat.dtype)])
    return flat[rank * chunk : (rank + 1) * chunk]


def gathered(shards: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    return np.concatenate(shards)[: math.prod(shape)].reshape(shape)


def vjp(evaluator: Evaluator, body: Block, vals: list, seeds: list, wrt: tuple) -> list:
    """Gradients of ``body``'s outputs (cotangents ``seeds``) with respect to inputs ``wrt``."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from .reference import Env  # noqa: PLC0415

    def gradients(vals: list, seeds: list) -> Any:
        def forward(*diff: Any) -> list:
            args = list(vals)
            for pos, d in zip(wrt, diff):
                args[pos] = d
            (outs,) = evaluator.run_block(body, [Env(jnp)], [args])
            return outs

        return jax.vjp(forward, *(vals[p] for p in wrt))[1](seeds)

    return [np.asarray(g) for g in jax.jit(gradients)(vals, seeds)]


class ExtraRules:
    """Mixed into the reference's ``Evaluator``: a ``_<op>`` handler per extra op."""

    def _remote_load(self: Evaluator, node: Node, envs: list[Env]) -> None:
        for env in envs:
            env.define(node.outs[0], env.vals[node.args[0]])

    _rts_load = _remote_load

    def _remote_store(self: Evaluator, node: Node, envs: list[Env]) -> None:
        target, v = node.args
        for env in envs:
            env.define(target, np.asarray(env.vals[v]).astype(self.dtype(target)))

    def _rts_store(self: Evaluator, node: Node, envs: list[Env]) -> None:
        target, v = node.args
        for env in envs:
            env.define(target, np.asarray(env.vals[v]).astype(env.vals[target].dtype))

    def _rts_gather(self: Evaluator, node: Node, envs: list[Env]) -> None:
        members = group_members(len(envs), node.attrs["group"])
        shape = self.program.specs[node.outs[0]].shape
        shards = [env.vals[node.args[0]] for env in envs]
        for r, env in enumerate(envs):
            env.define(node.outs[0], gathered([shards[m] for m in members[r]], shape))

    def _rts_slice(self: Evaluator, node: Node, envs: list[Env]) -> None:
        members = group_members(len(envs), node.attrs["group"])
        for r, env in enumerate(envs):
            shard = shard_of(env.vals[node.args[0]], members[r].index(r), len(members[r]))
            env.define(node.outs[0], shard)

    def _addons_grad(self: Evaluator, node: Node, envs: list[Env]) -> None:
        a = node.attrs
        body: Block = a["body"]
        n_in = len(body.inputs)
        wanted = (*a["wrt"], *a["acc"])
        for env in envs:
            vals = [env.vals[v] for v in node.args[:n_in]]
            seeds = [env.vals[v] for v in node.args[n_in:]]
            steps = []
            for s in range(a["steps"]):
                shifted = list(vals)
                shifted[0] = (vals[0] + np.float32(s * ADDONS_SHIFT)).astype(vals[0].dtype)
                steps.append(vjp(self, body, shifted, seeds, wanted))
            n_plain = len(a["wrt"])
            results = steps[-1][:n_plain] + [
                np.mean([g[k] for g in steps], axis=0) for k in range(n_plain, len(wanted))
            ]
            for vid, g in zip(node.outs, results):
                env.define(vid, np.asarray(g).astype(self.dtype(vid)))

    def _batch_serial(self: Evaluator, node: Node, envs: list[Env]) -> None:
        from .reference import Env as Fresh  # noqa: PLC0415

        a = node.attrs
        n_load = a["n_load"]
        for env in envs:
            vals = [env.vals[v] for v in node.args]
            per_step = []
            for j in range(a["steps"]):
                args = [shifted(x, j) for x in vals[:n_load]] + vals[n_load:]
                ((outs,),) = [self.run_block(a["body"], [Fresh(np)], [args])]
                per_step.append(outs)
            for k, vid in enumerate(node.outs):
                env.define(vid, np.stack([np.asarray(o[k]) for o in per_step]))


def shifted(x: np.ndarray, step: int) -> np.ndarray:
    """What batch-serial step ``step`` loads for ``x``."""
    x = np.asarray(x)
    if x.dtype == np.int32:
        return (x + np.int32(step)).astype(np.int32)
    return (x + x.dtype.type(step * BATCH_SHIFT)).astype(x.dtype)


def rts_leaf_values(program: Any, leaf: Any, full: list[np.ndarray]) -> list[np.ndarray]:
    """Each replica's shard of an RTS leaf whose full per-replica values are ``full``."""
    members = group_members(program.replicas, leaf.grouping)
    return [shard_of(full[r], members[r].index(r), len(members[r])) for r in range(len(full))]


def rts_leaf_finals(program: Any, leaf: Any, shards: list[np.ndarray]) -> list[np.ndarray]:
    """Each replica's view of the full RTS variable, gathered from its group's shards."""
    members = group_members(program.replicas, leaf.grouping)
    shape = program.specs[leaf.vid].shape
    return [gathered([shards[m] for m in members[r]], shape) for r in range(len(shards))]
