"""popxl-addons' replica-communicating custom ops, under vmap and shard_map replication.

Each test runs a replicated program (``mode`` fixture: both mappings), with per-replica
inputs streamed in, and compares the per-replica outputs and gradients with NumPy
references of the unsharded computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException
from popxl_addons.ops.cross_entropy_sharded_loss import cross_entropy_sharded_loss
from popxl_addons.ops.layer_norm_distributed import layer_norm_distributed
from popxl_addons.ops.replicated_all_reduce_TP import (
    replicated_all_reduce,
    replicated_all_reduce_identical_grad_inputs,
    replicated_all_reduce_identical_inputs,
)
from popxl_addons.ops.replicated_strided_collectives import (
    replicated_all_gather_strided,
    replicated_all_reduce_strided,
    replicated_all_reduce_strided_graph,
    replicated_all_reduce_strided_identical_inputs,
    replicated_reduce_scatter_strided,
)
from popxl_addons.patterns import apply_pre_alias_patterns

from ..replication_helpers import mode, run_replicated  # noqa: F401  (the `mode` fixture)

R = 4


def run_with_grad(
    replicas: int,
    build: Callable[..., popxl.Tensor],
    inputs: Sequence[np.ndarray],
    cot: np.ndarray,
    diff: Sequence[int] = (0,),
    patterns: bool = True,
) -> tuple[np.ndarray, list[np.ndarray], str]:
    """Forward output, gradients of inputs ``diff`` for the output cotangent ``cot`` (all
    in host layout ``(replicas, ...)``), and the gradient graph's schedule before the
    pre-alias patterns (which the all-reduce pairs need, as in the original) ran."""
    ir = popxl.Ir(replication=replicas)
    lead = 1 if replicas > 1 else 0  # host layout: (replicas, ...) only when replicated
    with ir.main_graph:
        streams = [
            popxl.h2d_stream(x.shape[lead:], popxl.dtypes.dtype.as_dtype(x.dtype), f"in{i}")
            for i, x in enumerate(inputs)
        ]
        tensors = [ops.host_load(s, f"x{i}") for i, s in enumerate(streams)]
        graph = ir.create_graph(build, *tensors)
        info = popxl.transforms.autodiff(graph, grads_required=[graph.inputs[k] for k in diff])
        call = ops.call_with_info(graph, *tensors)
        cot_stream = popxl.h2d_stream(
            cot.shape[lead:], popxl.dtypes.dtype.as_dtype(cot.dtype), "cot"
        )
        grads = ops.call(
            info.graph, ops.host_load(cot_stream, "cot"), inputs_dict=info.inputs_dict(call)
        )
        outs = [call.outputs[0], *grads]
        out_streams = [popxl.d2h_stream(o.shape, o.dtype, f"out{i}") for i, o in enumerate(outs)]
        for s, o in zip(out_streams, outs):
            ops.host_store(s, o)
    schedule = info.graph.print_schedule()
    if patterns:
        apply_pre_alias_patterns(ir)
    with popxl.Session(ir, "ipu_model") as session:
        values = session.run({**dict(zip(streams, inputs)), cot_stream: cot})
    results = [values[s] for s in out_streams]
    return results[0], results[1:], schedule


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# Tensor-parallel all-reduce pairs -----------------------------------------------------------


TP_CASES = {
    # name: (op, forward reduces, backward reduces)
    "identical_inputs": (replicated_all_reduce_identical_inputs, False, True),
    "identical_grad_inputs": (replicated_all_reduce_identical_grad_inputs, True, False),
    "plain": (replicated_all_reduce, True, True),
}


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("name", TP_CASES)
@pytest.mark.parametrize("group_size", [R, 2])
def test_all_reduce_tp_pairs(name: str, group_size: int) -> None:
    fn, fwd_reduces, bwd_reduces = TP_CASES[name]
    x, cot = _data(R, 2, 3), _data(R, 2, 3, seed=1)

    def build(t: popxl.Tensor) -> popxl.Tensor:
        return fn(t, group=popxl.gcg().ir.replica_grouping(group_size=group_size))

    y, (dx,), schedule = run_with_grad(R, build, [x], cot)
    groups = [list(range(g, g + group_size)) for g in range(0, R, group_size)]

    def reduced(v: np.ndarray) -> np.ndarray:
        out = v.copy()
        for g in groups:
            out[g] = v[g].sum(0)
        return out

    np.testing.assert_allclose(y, reduced(x) if fwd_reduces else x, rtol=1e-6)
    np.testing.assert_allclose(dx, reduced(cot) if bwd_reduces else cot, rtol=1e-6)
    assert "ReplicatedAllReduceTP." in schedule


NEED_PATTERN = (
    "You need to run the `OpToIdentityPattern` pattern before running the IR: a {type} op "
    "with identical_inputs=True is still in the IR"
)


@pytest.mark.parametrize(
    "fn, type_",
    [
        (replicated_all_reduce_identical_inputs, "ReplicatedAllReduceTP"),  # in the forward
        (replicated_all_reduce_identical_grad_inputs, "ReplicatedAllReduceTP"),  # its gradient
        (replicated_all_reduce_strided_identical_inputs, "ReplicatedAllReduceStrided"),
    ],
)
def test_identity_form_needs_the_op_to_identity_pattern(fn: Any, type_: str) -> None:
    """As the original's Opx: the session refuses an all-reduce pair's identity form that
    ``OpToIdentityPattern`` has not rewritten (here: no ``apply_pre_alias_patterns``)."""
    x, cot = _data(2, 3), _data(2, 3, seed=1)
    with pytest.raises(PopXLException) as info:
        run_with_grad(2, fn, [x], cot, patterns=False)
    assert str(info.value).startswith(NEED_PATTERN.format(type=type_))
    assert "call that after autodiff and before creating the Session" in str(info.value)


def test_all_reduce_tp_accepts_only_add() -> None:
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros(2, np.float32))
        with pytest.raises(PopXLException, match="CollectiveOperator::Add is the only"):
            replicated_all_reduce_identical_inputs(x, op="mean")
        with pytest.raises(PopXLException, match="Add and CollectiveOperator::Mean are"):
            replicated_all_reduce_strided(x, op="max")


# Strided collectives ------------------------------------------------------------------------


def _strided_groups(stride: int, size: int, replicas: int) -> list[list[int]]:
    firsts = sorted({r % stride + (r // (stride * size)) * stride * size for r in range(replicas)})
    return [[f + k * stride for k in range(size)] for f in firsts]


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("stride,size", [(2, 2), (1, 4), (4, 2)])
def test_strided_collectives(stride: int, size: int) -> None:
    replicas = 8 if stride * size > R else R
    x = _data(replicas, 2, 3)

    def build(ir: popxl.Ir, t: popxl.Tensor) -> list[popxl.Tensor]:
        rg = ir.replica_grouping(stride=stride, group_size=size)
        return [
            replicated_all_reduce_strided(t, group=rg),
            replicated_all_reduce_strided(t, "mean", group=rg),
            replicated_all_gather_strided(t, rg),
            replicated_reduce_scatter_strided(t, group=rg),
        ]

    summed, mean, gathered, scattered = run_replicated(replicas, build, [x])
    chunk = -(-6 // size)
    for g in _strided_groups(stride, size, replicas):
        total = x[g].sum(0)
        padded = np.pad(total.reshape(-1), (0, chunk * size - 6))
        for rank, r in enumerate(g):
            np.testing.assert_allclose(summed[r], total, rtol=1e-6)
            np.testing.assert_allclose(mean[r], total / size, rtol=1e-6)
            np.testing.assert_allclose(gathered[r], x[g].reshape(-1))
            np.testing.assert_allclose(scattered[r], padded[rank * chunk : (rank + 1) * chunk])


@pytest.mark.usefixtures("mode")
def test_strided_all_reduce_gradients_swap_flags() -> None:
    x, cot = _data(R, 3), _data(R, 3, seed=2)

    def build(t: popxl.Tensor) -> popxl.Tensor:
        rg = popxl.gcg().ir.replica_grouping(stride=2, group_size=2)
        return replicated_all_reduce_strided_identical_inputs(t, group=rg)

    y, (dx,), schedule = run_with_grad(R, build, [x], cot)
    np.testing.assert_allclose(y, x)
    expected = np.stack([cot[r] + cot[r ^ 2] for r in range(R)])  # groups {0,2}, {1,3}
    np.testing.assert_allclose(dx, expected, rtol=1e-6)
    assert "ReplicatedAllReduceStrided." in schedule


@pytest.mark.usefixtures("mode")
def test_all_reduce_strided_graph_reduces_each_named_tensor() -> None:
    from popxl_addons import NamedTensors

    a, b = _data(R, 2), _data(R, 3, seed=1)

    def build(ir: popxl.Ir, ta: popxl.Tensor, tb: popxl.Tensor) -> list[popxl.Tensor]:
        tensors = NamedTensors.from_dict({"a": ta, "b": tb})
        graph, names = replicated_all_reduce_strided_graph(tensors, "mean")
        assert names == ["a", "b"]
        return list(graph.bind(tensors).call())

    ra, rb = run_replicated(R, build, [a, b])
    np.testing.assert_allclose(ra, np.broadcast_to(a.mean(0), a.shape), rtol=1e-6)
    np.testing.assert_allclose(rb, np.broadcast_to(b.mean(0), b.shape), rtol=1e-6)


# Sharded cross-entropy ------------------------------------------------------------------------


def _cross_entropy(logits: Any, labels: np.ndarray) -> Any:
    """Per-sample loss of the full (unsharded) logits, in JAX."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_p, jnp.asarray(labels)[:, None], axis=-1)[:, 0]


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_sharded(reduction: str) -> None:
    n, classes = 6, 12
    shard = classes // R
    full = _data(n, classes) * 3
    labels = np.random.default_rng(3).integers(0, classes, n)
    logits = np.stack([full[:, r * shard : (r + 1) * shard] for r in range(R)])
    adjusted = np.stack([labels - r * shard for r in range(R)]).astype(np.int32)
    cot_shape = (R, n) if reduction == "none" else (R,)
    cot = np.broadcast_to(_data(*cot_shape[1:], seed=4), cot_shape).copy()

    def build(x: popxl.Tensor, idx: popxl.Tensor) -> popxl.Tensor:
        return cross_entropy_sharded_loss(x, idx, reduction=reduction)

    y, (dx,), schedule = run_with_grad(R, build, [logits, adjusted], cot)
    reduce = {"none": lambda v: v, "mean": jnp.mean, "sum": jnp.sum}[reduction]
    loss, pullback = jax.vjp(lambda z: reduce(_cross_entropy(z, labels)), jnp.asarray(full))
    (want,) = pullback(jnp.asarray(cot[0]))
    for r in range(R):
        np.testing.assert_allclose(y[r], np.asarray(loss), rtol=1e-5)
    np.testing.assert_allclose(
        np.concatenate(list(dx), axis=1), np.asarray(want), rtol=1e-5, atol=1e-6
    )
    assert "CrossEntropyShardedGrad." in schedule


@pytest.mark.usefixtures("mode")
def test_cross_entropy_sharded_ignore_index_over_two_groups() -> None:
    n, classes, tp = 5, 8, 2
    shard = classes // tp
    full = [_data(n, classes, seed=s) for s in (0, 1)]  # one problem per group
    labels = np.asarray([0, 3, 7, 0, 5])
    logits = np.stack([full[r // tp][:, (r % tp) * shard : (r % tp + 1) * shard] for r in range(R)])
    adjusted = np.stack([labels - (r % tp) * shard for r in range(R)]).astype(np.int32)
    ignore = np.stack([np.asarray(-(r % tp) * shard) for r in range(R)]).astype(np.int32)

    def build(x: popxl.Tensor, idx: popxl.Tensor, ign: popxl.Tensor) -> popxl.Tensor:
        group = popxl.gcg().ir.replica_grouping(group_size=tp)
        return cross_entropy_sharded_loss(x, idx, ign, replica_grouping=group)

    y, (dx,), _ = run_with_grad(R, build, [logits, adjusted, ignore], np.ones(R, np.float32))
    keep = labels != 0
    for r in range(R):
        problem = jnp.asarray(full[r // tp])
        loss, grad = jax.value_and_grad(
            lambda z: jnp.sum(_cross_entropy(z, labels) * keep) / keep.sum()
        )(problem)
        np.testing.assert_allclose(y[r], np.asarray(loss), rtol=1e-5)
        part = np.asarray(grad)[:, (r % tp) * shard : (r % tp + 1) * shard]
        np.testing.assert_allclose(dx[r], part, rtol=1e-5, atol=1e-6)


def test_cross_entropy_sharded_errors() -> None:
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros((3, 4), np.float32))
        idx = popxl.variable(np.zeros(3, np.int32))
        with pytest.raises(PopXLException, match="logits must be of rank 2"):
            cross_entropy_sharded_loss(x.reshape((3, 2, 2)), idx)
        with pytest.raises(PopXLException, match="same number of samples"):
            cross_entropy_sharded_loss(x, popxl.variable(np.zeros(2, np.int32)))
        with pytest.raises(ValueError, match="`reduction` should be one of"):
            cross_entropy_sharded_loss(x, idx, reduction="avg")  # type: ignore[arg-type]


# Distributed layer norm ------------------------------------------------------------------------


def _layer_norm(x: Any, w: Any, b: Any, eps: float = 1e-5) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * w + b


@pytest.mark.usefixtures("mode")
def test_layer_norm_distributed() -> None:
    n, hidden = 5, 16
    shard = hidden // R
    x, w, b = _data(n, hidden) * 2 + 1, _data(hidden, seed=1), _data(hidden, seed=2)
    cot = _data(n, hidden, seed=3)

    def split(v: np.ndarray) -> np.ndarray:
        return np.stack(np.split(v, R, axis=-1))

    def build(t: popxl.Tensor, wt: popxl.Tensor, bt: popxl.Tensor) -> popxl.Tensor:
        return layer_norm_distributed(t, wt, bt)

    y, grads, schedule = run_with_grad(
        R, build, [split(x), split(w), split(b)], split(cot), diff=(0, 1, 2)
    )
    want, pullback = jax.vjp(_layer_norm, *(jnp.asarray(v) for v in (x, w, b)))
    expected = pullback(jnp.asarray(cot))
    np.testing.assert_allclose(np.concatenate(list(y), -1), np.asarray(want), rtol=1e-4, atol=1e-5)
    for got, ref in zip(grads, expected):
        np.testing.assert_allclose(
            np.concatenate(list(got), -1), np.asarray(ref), rtol=1e-4, atol=1e-5
        )
    assert "LayerNormDistributedGrad." in schedule
    assert shard * R == hidden


def test_layer_norm_distributed_on_one_replica_is_layer_norm() -> None:
    x, w, b = _data(3, 6), _data(6, seed=1), _data(6, seed=2)
    cot = _data(3, 6, seed=3)
    y, grads, _ = run_with_grad(
        1,
        lambda t, wt, bt: layer_norm_distributed(t, wt, bt, epsilon=1e-3),
        [x, w, b],
        cot,
        diff=(0, 1, 2),
    )
    want, pullback = jax.vjp(
        lambda *a: _layer_norm(*a, eps=1e-3), *(jnp.asarray(v) for v in (x, w, b))
    )
    np.testing.assert_allclose(y, np.asarray(want), rtol=1e-4, atol=1e-5)
    for got, ref in zip(grads, pullback(jnp.asarray(cot))):
        np.testing.assert_allclose(got, np.asarray(ref), rtol=1e-4, atol=1e-5)
