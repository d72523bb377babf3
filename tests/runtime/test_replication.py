"""Replication: data-parallel training and per-group variables, on both replica mappings.

Data-parallel SGD over R replicas (gradients mean-all-reduced) must give the weights of one
replica trained on the R-times larger batch, with or without gradient accumulation.
"""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.ops import collectives

from ..replication_helpers import mode  # noqa: F401  (the `mode` fixture)

F32 = popxl.float32
MICRO_BATCH, IN, HIDDEN = 4, 3, 5
LR = 0.2
STEPS = 3


def _initial_weights():
    rng = np.random.default_rng(7)
    return {
        "w1": rng.normal(size=(IN, HIDDEN)).astype(np.float32),
        "b1": rng.normal(size=(HIDDEN,)).astype(np.float32) * 0.1,
        "w2": rng.normal(size=(HIDDEN, 1)).astype(np.float32),
    }


def _data(total_batch):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(STEPS, total_batch, IN)).astype(np.float32)
    t = rng.normal(size=(STEPS, total_batch, 1)).astype(np.float32)
    return x, t


def _mlp_loss(x, t, w1, b1, w2):
    d = ops.tanh(x @ w1 + b1) @ w2 - t
    return ops.mean(d * d)


def _numpy_sgd(weights, xs, ts):
    """The expected weights: full-batch SGD on the mean squared error."""
    w1, b1, w2 = (weights[k].astype(np.float64) for k in ("w1", "b1", "w2"))
    for x, t in zip(xs, ts):
        h = np.tanh(x @ w1 + b1)
        dy = 2 * (h @ w2 - t) / t.size
        dz = (dy @ w2.T) * (1 - h * h)
        w1, b1, w2 = w1 - LR * x.T @ dz, b1 - LR * dz.sum(0), w2 - LR * h.T @ dy
    return {"w1": w1, "b1": b1, "w2": w2}


def _training_ir(replicas, accumulation, use_repeat, micro_batch, reduce=True):
    """One SGD step per run over ``accumulation`` micro-batches per replica."""
    ir = popxl.Ir(replication=replicas)
    ir.num_host_transfers = accumulation
    with ir.main_graph:
        weights = {k: popxl.variable(v, name=k) for k, v in _initial_weights().items()}
        x_in = popxl.h2d_stream((micro_batch, IN), F32, "x")
        t_in = popxl.h2d_stream((micro_batch, 1), F32, "t")
        specs = [popxl.TensorSpec(s, F32) for s in [(micro_batch, IN), (micro_batch, 1)]]
        specs += [popxl.TensorSpec(w.shape, F32) for w in weights.values()]
        fwd = ir.create_graph(_mlp_loss, *specs)
        info = transforms.autodiff(fwd, grads_required=fwd.inputs[2:])

        def micro_step(
            w1, b1, w2, acc1: popxl.TensorByRef, acc2: popxl.TensorByRef, acc3: popxl.TensorByRef
        ):
            site = ops.call_with_info(fwd, ops.host_load(x_in), ops.host_load(t_in), w1, b1, w2)
            seed = popxl.constant(1.0, F32, "seed")
            grads = ops.call(info.graph, seed, inputs_dict=info.inputs_dict(site))
            for acc, g in zip((acc1, acc2, acc3), grads):
                ops.var_updates.accumulate_(acc, g)

        accs = [ops.init(w.shape, F32, f"acc_{k}", "zero") for k, w in weights.items()]
        if use_repeat:
            specs = [t.spec for t in (*weights.values(), *accs)]
            ops.repeat(ir.create_graph(micro_step, *specs), accumulation, *weights.values(), *accs)
        else:
            for _ in range(accumulation):
                micro_step(*weights.values(), *accs)
        for w, acc in zip(weights.values(), accs):
            grad = collectives.replicated_all_reduce(acc, "mean") if reduce else acc
            ops.var_updates.accumulate_(w, grad, -LR / accumulation)
    return ir, weights, x_in, t_in


def _train(replicas, accumulation, use_repeat=False, micro_batch=MICRO_BATCH, reduce=True):
    """Train STEPS steps; the samples of a step are split (accumulation, replicas, micro_batch)."""
    ir, weights, x_in, t_in = _training_ir(replicas, accumulation, use_repeat, micro_batch, reduce)
    xs, ts = _data(replicas * accumulation * micro_batch)
    # PopXL's layout has [nht if > 1][replicas if > 1]: leave out unit axes.
    layout = tuple(n for n in (accumulation, replicas) if n > 1) + (micro_batch,)
    with popxl.Session(ir, "ipu_model") as session:
        for x, t in zip(xs, ts):
            session.run({x_in: x.reshape(*layout, IN), t_in: t.reshape(*layout, 1)})
    return {k: session.get_tensor_data(w) for k, w in weights.items()}, xs, ts


def _assert_weights(got, want):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-6, err_msg=k)


def test_single_replica_training_matches_numpy():
    got, xs, ts = _train(1, 1)
    _assert_weights(got, _numpy_sgd(_initial_weights(), xs, ts))


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize(
    "replicas,accumulation,use_repeat",
    [(2, 1, False), (4, 1, False), (2, 2, True), (2, 3, False), (4, 2, True)],
)
def test_data_parallel_equals_one_replica_on_the_larger_batch(replicas, accumulation, use_repeat):
    got, xs, ts = _train(replicas, accumulation, use_repeat)
    larger_batch, _, _ = _train(1, 1, micro_batch=replicas * accumulation * MICRO_BATCH)
    _assert_weights(got, larger_batch)
    _assert_weights(got, _numpy_sgd(_initial_weights(), xs, ts))


@pytest.mark.usefixtures("mode")
def test_without_the_all_reduce_replicas_train_on_their_own_samples():
    """Guards the comparison above against being vacuous."""
    got, xs, ts = _train(2, 1, reduce=False)
    first_replica = xs[:, :MICRO_BATCH], ts[:, :MICRO_BATCH]
    _assert_weights(got, _numpy_sgd(_initial_weights(), *first_replica))
    assert not np.allclose(got["w1"], _numpy_sgd(_initial_weights(), xs, ts)["w1"], rtol=1e-3)


# Variables per replica group (reference 4.1) ---------------------------------------------


def _grouped_program(replicas, stride, group_size, data, retrieval_mode):
    """Each replica adds its own input to the variable and streams the value it started with."""
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        rg = ir.replica_grouping(stride, group_size)
        var = popxl.variable(data, F32, "v", replica_grouping=rg, retrieval_mode=retrieval_mode)
        x_in = popxl.h2d_stream(var.shape, F32, "x")
        out = popxl.d2h_stream(var.shape, F32, "v_out")
        ops.host_store(out, var)
        ops.var_updates.accumulate_(var, ops.host_load(x_in))
    return popxl.Session(ir, "ipu_model"), var, x_in, out


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("stride,group_size", [(2, 2), (1, 2), (4, 1)])
def test_variables_initialised_per_group(stride, group_size):
    replicas = 4
    groups = replicas // group_size
    data = np.arange(groups * 3, dtype=np.float32).reshape(groups, 3)
    session, var, x_in, out = _grouped_program(replicas, stride, group_size, data, "one_per_group")
    assignment = var.replica_grouping.assignment
    assert var.shape == (3,) and var.shape_on_host == (groups, 3)
    xs = np.arange(replicas, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    with session:
        np.testing.assert_array_equal(session.run({x_in: xs})[out], data[assignment])
        # one_per_group reads each group's first replica.
        firsts = [assignment.index(g) for g in range(groups)]
        np.testing.assert_array_equal(session.get_tensor_data(var), data + xs[firsts])
        session.write_variable_data(var, -data)
        np.testing.assert_array_equal(session.run({x_in: xs})[out], -data[assignment])


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("stride,group_size", [(2, 2), (1, 1)])
def test_all_replicas_retrieval(stride, group_size):
    replicas = 4
    groups = replicas // group_size
    data = np.arange(groups * 3, dtype=np.float32).reshape(groups, 3)
    session, var, x_in, out = _grouped_program(replicas, stride, group_size, data, "all_replicas")
    assignment = var.replica_grouping.assignment
    xs = np.arange(replicas, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(session.get_tensor_data(var), data[assignment])
    with session:
        session.run({x_in: xs})
        got = session.get_tensor_data(var)
        assert got.shape == (replicas, 3)
        np.testing.assert_array_equal(got, data[assignment] + xs)  # row r = replica r
        if group_size == 1:  # one value per replica already: writable like one_per_group
            session.write_variable_data(var, np.zeros((4, 3), np.float32))
            np.testing.assert_array_equal(session.run({x_in: xs})[out], 0.0)
        else:
            with pytest.raises(NotImplementedError, match="all_replicas"):
                session.write_variable_data(var, data)


# Choosing the replica mapping ---------------------------------------------------------------


def test_replication_mode_choice(monkeypatch):
    import jax

    from runtime.session.program import replication_mode

    devices = len(jax.devices())
    monkeypatch.delenv("POPXL_REPLICATION", raising=False)
    assert replication_mode(1) == "none"
    assert replication_mode(2) == ("shard_map" if devices >= 2 else "vmap")
    assert replication_mode(devices * 2) == "vmap"  # not enough devices: one device, vmap
    monkeypatch.setenv("POPXL_REPLICATION", "vmap")
    assert replication_mode(2) == "vmap"
    monkeypatch.setenv("POPXL_REPLICATION", "shard_map")
    with pytest.raises(ValueError, match="needs"):
        replication_mode(devices * 2)
    monkeypatch.setenv("POPXL_REPLICATION", "pmap")
    with pytest.raises(ValueError, match="POPXL_REPLICATION"):
        replication_mode(2)


def test_more_replicas_than_devices_run_with_vmap(monkeypatch):
    import jax

    monkeypatch.setenv("POPXL_REPLICATION", "auto")
    replicas = 2 * len(jax.devices())
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        x_in = popxl.h2d_stream((), F32, "x")
        out = popxl.d2h_stream((), F32, "sum")
        ops.host_store(out, collectives.replicated_all_reduce(ops.host_load(x_in)))
    xs = np.arange(replicas, dtype=np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run({x_in: xs})[out], np.full(replicas, xs.sum()))


@pytest.mark.parametrize("mapping", ["vmap", "shard_map"])
def test_the_mode_fixture_selects_the_mapping(monkeypatch, mapping):
    """The replicated tests' ``mode`` fixture really switches how replicas are mapped."""
    monkeypatch.setenv("POPXL_REPLICATION", mapping)
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        ops.host_store(popxl.d2h_stream((), F32), popxl.constant(1.0) + 1.0)
    assert popxl.Session(ir, "ipu_model")._program.mode == mapping
