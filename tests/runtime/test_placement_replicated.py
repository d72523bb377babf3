"""Replicated programs placed on an (replicas x IPUs) device mesh: device (r, k) runs IPU k of
replica r. Every test compares the placed run with ``POPXL_PLACEMENT=off`` (replicas mapped,
each replica's IPUs on one device) and with NumPy where the numbers are simple."""

from functools import partial

import jax
import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl.ops import collectives
from popxl_addons.transforms.autodiff import autodiff_with_accumulation
from runtime.session.program import build_program

LR = 0.1


def _both(monkeypatch, run, *args):
    """``run(*args)`` unplaced then placed: (off result, on result). ``run`` builds its own
    Ir, so each mode compiles its own step (the step cache is keyed by mode)."""
    results = []
    for placement in ("off", "on"):
        monkeypatch.setenv("POPXL_PLACEMENT", placement)
        results.append(run(*args))
    return results


def _assert_same(off, on, rtol=1e-6, atol=1e-6):
    assert len(off) == len(on)
    for a, b in zip(off, on):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# (a) A chain of linear layers, one per IPU, trained with replica-averaged gradients ------------


def _chain_weights(ipus):
    rng = np.random.default_rng(1)
    return [rng.normal(0, 0.5, (4, 4)).astype(np.float32) for _ in range(ipus)]


def _train_chain(replicas, ipus, data):
    """Layer k (``h @ w_k``) on IPU k, activations copied forward and gradients backward;
    loss ``0.5 * sum(h_N ** 2)`` per replica; each IPU averages its weight's gradient over
    the replicas and takes an SGD step. Streams: x in, (loss, output) out per replica."""
    weights = _chain_weights(ipus)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        x_in = popxl.h2d_stream((2, 4), popxl.float32, "x")
        loss_out = popxl.d2h_stream((), popxl.float32, "loss")
        y_out = popxl.d2h_stream((2, 4), popxl.float32, "y")
        ws, acts = [], []
        with popxl.ipu(0):
            h = ops.host_load(x_in)
        for k in range(ipus):
            with popxl.ipu(k):
                ws.append(popxl.variable(weights[k], name=f"w{k}"))
                if k:
                    h = h.copy_to_ipu(k)
                acts.append(h)
                h = ops.matmul(h, ws[k])
        with popxl.ipu(ipus - 1):
            ops.host_store(y_out, h)
            ops.host_store(loss_out, ops.sum(h * h) * 0.5)
            g = h
        for k in reversed(range(ipus)):
            with popxl.ipu(k):
                if k < ipus - 1:
                    g = g.copy_to_ipu(k)
                dw = ops.matmul(ops.transpose(acts[k]), g)
                g = ops.matmul(g, ops.transpose(ws[k]))
                dw = collectives.replicated_all_reduce(dw, op="mean")
                ops.var_updates.accumulate_(ws[k], dw, f=-LR)
    outs = []
    with popxl.Session(ir, "ipu_model") as session:
        for x in data:
            got = session.run({x_in: x})
            outs += [got[loss_out], got[y_out]]
        placed = session._program.ipus
    return outs + [session.get_tensor_data(w) for w in ws], placed


def _chain_reference(replicas, ipus, data):
    ws = _chain_weights(ipus)
    outs = []
    for x in data:
        acts, h = [], x
        for w in ws:
            acts.append(h)
            h = h @ w
        outs += [0.5 * (h * h).sum(axis=(-2, -1)), h]
        g = h
        grads = [None] * ipus
        for k in reversed(range(ipus)):
            grads[k] = (np.swapaxes(acts[k], -1, -2) @ g).mean(axis=0)
            g = g @ ws[k].T
        ws = [w - LR * d for w, d in zip(ws, grads)]
    return outs + ws


@pytest.mark.parametrize(("replicas", "ipus"), [(2, 2), (2, 4)])
def test_replicated_chain_trains_the_same_placed_and_unplaced(monkeypatch, replicas, ipus):
    data = np.random.default_rng(2).normal(0, 1, (3, replicas, 2, 4)).astype(np.float32)
    (off, off_ipus), (on, on_ipus) = _both(monkeypatch, _train_chain, replicas, ipus, data)
    assert (off_ipus, on_ipus) == (0, ipus)
    _assert_same(off, on)
    _assert_same(on, _chain_reference(replicas, ipus, data), rtol=1e-5, atol=1e-5)
    assert not np.allclose(on[-1], _chain_weights(ipus)[-1])  # the weights did train


def test_replicated_chain_copies_are_device_to_device_transfers(monkeypatch):
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        out = popxl.d2h_stream((3,), popxl.float32)
        with popxl.ipu(0):
            a = popxl.variable(np.array([1.0, 2.0, 3.0], np.float32), name="a")
            y = (a * 2.0).copy_to_ipu(1)
        with popxl.ipu(1):
            ops.host_store(out, collectives.replicated_all_reduce(y))
    session = popxl.Session(ir, "ipu_model")
    hlo = session._lowered().as_text()
    assert "collective_permute" in hlo  # the ipu_copy
    assert "all_reduce" in hlo  # between the replicas of IPU 1
    with session:
        np.testing.assert_array_equal(session.run()[out], [[4.0, 8.0, 12.0]] * 2)


# (b) popxl_addons pipelined training, replicated --------------------------------------------


class _Scale(addons.Module):
    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("w", partial(np.random.normal, 0, 0.5, (4, 4)), x.dtype)
        return ops.gelu(x @ w)


def _pipelined_training(data):
    """Two stages (IPU 0 and 1), gradients of IPU 0's layer in stage 2 from stashed
    activations; after each pipeline the mean gradients are averaged over the replicas and
    each IPU updates its weight (SGD). ``data``: (runs, steps, replicas, 2, 4)."""
    np.random.seed(3)
    runs, steps, replicas = data.shape[:3]
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        x_in = popxl.h2d_stream((2, 4), popxl.float32, "x")
        spec = popxl.TensorSpec((2, 4), popxl.float32)
        with popxl.ipu(0):
            facts0, g0 = _Scale().create_graph(spec)
            dfacts0, dg0 = autodiff_with_accumulation(g0, [g0.args.w])
        with popxl.ipu(1):
            facts1, g1 = _Scale().create_graph(spec)
            dfacts1, dg1 = autodiff_with_accumulation(
                g1, [g1.args.w], grads_required=[g1.graph.inputs[0]]
            )
        with popxl.ipu(0):
            v0, d0 = facts0.init(), dfacts0.init()
        with popxl.ipu(1):
            v1, d1 = facts1.init(), dfacts1.init()
        with addons.pipelined_execution(steps) as p:
            with p.stage(0), popxl.ipu(0):
                info0 = g0.bind(v0).call_with_info(ops.host_load(x_in))
                h = info0.outputs[0].copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                info1 = g1.bind(v1).call_with_info(h)
                seed = info1.outputs[0] * 2.0  # d(sum y^2)/dy
                (dh,) = dg1.bind(d1).call(seed, args=dg1.grad_graph_info.inputs_dict(info1))
                dh = dh.copy_to_ipu(0)
            with p.stage(2), popxl.ipu(0):
                acts = p.stash_and_restore_activations(info0, dg0.grad_graph_info)
                dg0.bind(d0).call(dh, args=acts)
        # The pipeline's call site is on IPU 0, so IPU 1's weight reads as on IPU 0 there:
        # its update runs in a subgraph called on IPU 1.
        sgd = ir.create_empty_graph("sgd")
        with sgd:
            w = popxl.graph_input((4, 4), popxl.float32, "w", by_ref=True)
            ops.var_updates.accumulate_(w, popxl.graph_input((4, 4), popxl.float32), f=-LR)
        for ipu, (v, d) in enumerate([(v0, d0), (v1, d1)]):
            with popxl.ipu(ipu):
                ops.call(sgd, v.w, collectives.replicated_all_reduce(d.accum.w, op="mean"))
                ops.var_updates.accumulator_zero_(d.mean_accum_counter)
    ir.num_host_transfers = steps
    with popxl.Session(ir, "ipu_model") as session:
        initial = [session.get_tensor_data(t) for t in (v0.w, v1.w)]
        for run in data:
            session.run({x_in: run})
        placed = session._program.ipus
        trained = [session.get_tensor_data(t) for t in (v0.w, v1.w, d0.accum.w, d1.accum.w)]
        return trained + initial, placed


def test_replicated_pipeline_trains_the_same_placed_and_unplaced(monkeypatch):
    data = np.random.default_rng(4).normal(0, 1, (3, 6, 2, 2, 4)).astype(np.float32)
    (off, off_ipus), (on, on_ipus) = _both(monkeypatch, _pipelined_training, data)
    assert (off_ipus, on_ipus) == (0, 2)
    _assert_same(off, on, rtol=1e-5)
    _assert_same(on[:2], _pipeline_reference(on[4:], data), rtol=1e-4, atol=1e-5)


def _pipeline_reference(ws, data):
    """The weights ``ws`` after SGD on the mean gradient over each run's steps and
    replicas."""
    import jax.numpy as jnp

    def loss(w0, w1, x):
        y = jax.nn.gelu(jax.nn.gelu(x @ w0, approximate=True) @ w1, approximate=True)
        return jnp.sum(y**2)

    for run in data:
        grads = [jax.grad(loss, argnums=(0, 1))(*ws, x) for x in run.reshape(-1, 2, 4)]
        ws = [w - LR * np.mean([g[k] for g in grads], axis=0) for k, w in enumerate(ws)]
    return ws


# (c) Replica groupings and retrieval modes ------------------------------------------------------


def _grouped(x, writes=None):
    """IPU 0: ``g`` (one value per replica, one_per_group) += x; copied to IPU 1, where
    ``a`` (one group of both replicas, all_replicas retrieval) += 2 * x and ``s`` (shared)
    is read. ``x``: (runs, replicas, 3)."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x_in = popxl.h2d_stream((3,), popxl.float32, "x")
        out = popxl.d2h_stream((3,), popxl.float32, "y")
        per_replica = ir.replica_grouping(group_size=1)
        with popxl.ipu(0):
            g = popxl.variable(
                np.array([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]], np.float32),
                name="g",
                replica_grouping=per_replica,
                retrieval_mode="one_per_group",
            )
            xv = ops.host_load(x_in)
            g += xv
            y = g.copy_to_ipu(1, 0)
            x1 = xv.copy_to_ipu(1)
        with popxl.ipu(1):
            a = popxl.variable(
                np.array([5.0, 6.0, 7.0], np.float32),
                name="a",
                replica_grouping=ir.replica_grouping(group_size=2),
                retrieval_mode="all_replicas",
            )
            s = popxl.variable(np.array([0.5, 0.25, 2.0], np.float32), name="s")
            ops.var_updates.accumulate_(a, x1, f=2.0)
            ops.host_store(out, y * s + a)
    outs = []
    with popxl.Session(ir, "ipu_model") as session:
        if writes is not None:
            session.write_variable_data(g, writes)
        for run in x:
            outs.append(session.run({x_in: run})[out])
        values = session.get_tensors_data([g, a, s])
        placed = session._program.ipus
    return outs + [values[g], values[a], values[s]], placed


def test_grouped_variables_round_trip_placed_like_unplaced(monkeypatch):
    x = np.random.default_rng(5).normal(0, 1, (2, 2, 3)).astype(np.float32)
    written = np.array([[-1.0, 0.0, 1.0], [4.0, 4.0, 4.0]], np.float32)
    for writes, g0 in [(None, [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]]), (written, written)]:
        (off, off_ipus), (on, on_ipus) = _both(monkeypatch, _grouped, x, writes)
        assert (off_ipus, on_ipus) == (0, 2)
        _assert_same(off, on, rtol=0, atol=0)
        g_final, a_final, s_final = on[-3:]
        np.testing.assert_allclose(g_final, np.asarray(g0) + x.sum(axis=0), rtol=1e-6, atol=1e-6)
        # all_replicas: one row per replica, each replica having added its own data.
        np.testing.assert_allclose(
            a_final, [5.0, 6.0, 7.0] + 2.0 * x.sum(axis=0), rtol=1e-6, atol=1e-6
        )
        np.testing.assert_array_equal(s_final, [0.5, 0.25, 2.0])


def test_grouped_host_values_are_unchanged_by_a_round_trip(monkeypatch):
    """weights_from_host then weights_to_host with no run: every layout gives back exactly
    what it was given (per group, per replica, shared)."""
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    x = np.zeros((0, 2, 3), np.float32)
    written = np.array([[np.pi, -0.0, 1e-30], [7.0, -8.5, 1e30]], np.float32)
    (g, a, s), placed = _grouped(x, written)
    assert placed == 2
    np.testing.assert_array_equal(g, written)
    np.testing.assert_array_equal(a, [[5.0, 6.0, 7.0]] * 2)
    np.testing.assert_array_equal(s, [0.5, 0.25, 2.0])


def _orthogonal_groups(x):
    """4 replicas in 2 orthogonal groups ({0, 2} and {1, 3}): ``v`` (one value per group)
    on IPU 0 scales each replica's input; IPU 1 sums it within the group and IPU 0 adds
    that sum to ``v``. ``x``: (runs, 4, 2)."""
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        x_in = popxl.h2d_stream((2,), popxl.float32, "x")
        out = popxl.d2h_stream((2,), popxl.float32, "y")
        group = ir.replica_grouping(stride=2, group_size=2)
        with popxl.ipu(0):
            v = popxl.variable(
                np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), name="v", replica_grouping=group
            )
            y = (ops.host_load(x_in) * v).copy_to_ipu(1, 0)
        with popxl.ipu(1):
            total = collectives.replicated_all_reduce(y, group=group)
            ops.host_store(out, total)
            back = total.copy_to_ipu(0, 1)
        with popxl.ipu(0):
            v += back
    outs = []
    with popxl.Session(ir, "ipu_model") as session:
        for run in x:
            outs.append(session.run({x_in: run})[out])
        return outs + [session.get_tensor_data(v)], session._program.ipus


def test_grouped_collectives_on_four_replicas_placed_like_unplaced(monkeypatch):
    """4 replicas x 2 IPUs = 8 devices: POPXL_PLACEMENT=auto places the program."""
    x = np.random.default_rng(7).normal(0, 1, (2, 4, 2)).astype(np.float32)
    monkeypatch.setenv("POPXL_PLACEMENT", "off")
    off, off_ipus = _orthogonal_groups(x)
    monkeypatch.setenv("POPXL_PLACEMENT", "auto")
    on, on_ipus = _orthogonal_groups(x)
    assert (off_ipus, on_ipus) == (0, 2)
    _assert_same(off, on)
    v = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    for run, got in zip(x, on):
        sums = np.stack([run[0] * v[0] + run[2] * v[0], run[1] * v[1] + run[3] * v[1]])
        np.testing.assert_allclose(got, sums[[0, 1, 0, 1]], rtol=1e-6)
        v = v + sums
    np.testing.assert_allclose(on[-1], v, rtol=1e-6)


# (d) Replicated tensor sharding (remote variables sharded over the replicas) --------------------


def _rts_training(x):
    """A remote replica-sharded weight (each replica holds half of it), gathered and used on
    IPU 1 on data computed on IPU 0, its gradient reduce-scattered to the shards and stored
    back. ``x``: (runs, replicas, 4)."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x_in = popxl.h2d_stream((4,), popxl.float32, "x")
        out = popxl.d2h_stream((4,), popxl.float32, "y")
        buffer = popxl.replica_sharded_buffer((4,), popxl.float32)
        w = popxl.remote_replica_sharded_variable(
            np.array([1.0, -2.0, 3.0, 0.5], np.float32), buffer, 0, name="w"
        )
        with popxl.ipu(0):
            xv = (ops.host_load(x_in) * 2.0).copy_to_ipu(1)
        with popxl.ipu(1):
            shard = ops.remote_load(buffer, 0)
            full = collectives.replicated_all_gather(shard)
            ops.host_store(out, xv * full)
            grad = collectives.replicated_reduce_scatter(
                xv, op="add", configure_output_for_replicated_tensor_sharding=True
            )
            ops.var_updates.accumulate_(shard, grad, f=-LR)
            ops.remote_store(buffer, 0, shard)
    outs = []
    with popxl.Session(ir, "ipu_model") as session:
        for run in x:
            outs.append(session.run({x_in: run})[out])
        placed = session._program.ipus
        return outs + [session.get_tensor_data(w)], placed


def test_rts_remote_variable_updates_placed_like_unplaced(monkeypatch):
    x = np.random.default_rng(6).normal(0, 1, (3, 2, 4)).astype(np.float32)
    (off, off_ipus), (on, on_ipus) = _both(monkeypatch, _rts_training, x)
    assert (off_ipus, on_ipus) == (0, 2)
    _assert_same(off, on)
    w = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    for run, got in zip(x, on):
        np.testing.assert_allclose(got, 2.0 * run * w, rtol=1e-6)
        w = w - LR * 2.0 * run.sum(axis=0)
    np.testing.assert_allclose(on[-1], w, rtol=1e-6)


# (e) Each device holds only its IPU's variables of its replica ----------------------------------


def _two_ipus_replicated():
    """IPU 0: a (8, 8) float32 (written) and u (16,) float32 (read);
    IPU 1: b (8, 8) float32 (written) and h (8,) float16 (written)."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x_in = popxl.h2d_stream((8,), popxl.float32, "x")
        out = popxl.d2h_stream((8,), popxl.float32, "y")
        with popxl.ipu(0):
            a = popxl.variable(np.full((8, 8), 0.5, np.float32), name="a")
            u = popxl.variable(np.arange(16, dtype=np.float32), name="u")
            y = ops.matmul(ops.host_load(x_in), a) + ops.sum(u)
            a += 1.0
            y = y.copy_to_ipu(1)
        with popxl.ipu(1):
            b = popxl.variable(np.full((8, 8), 2.0, np.float32), name="b")
            h = popxl.variable(np.ones((8,), np.float16), name="h")
            ops.host_store(out, ops.matmul(y, b) + ops.cast(h, popxl.float32))
            b += 1.0
            h += 1.0
    return ir, x_in, out, (a, u, b, h)


def test_each_device_holds_its_ipus_variables_of_its_replica(monkeypatch):
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir, x_in, out, (a, u, b, h) = _two_ipus_replicated()
    session = popxl.Session(ir, "ipu_model")
    program = session._program
    assert (program.ipus, program.replicas) == (2, 2)
    names = {v.name: home for v, home in zip(program.variables, program.homes)}
    assert names == {"a": 0, "u": 0, "b": 1, "h": 1}
    report = session.memory_report()
    # Slots: [a | b] 256 bytes, [u | padding] 64 bytes, [padding | h] 16 bytes.
    assert [m.variables for m in report.ipus] == [256 + 64, 256 + 16]
    assert [m.resident for m in report.ipus] == [256 + 64 + 16] * 2
    assert report.devices == 2  # devices per replica; 4 in all
    # XLA's per-device arguments: the resident slots and one replica's input (8 floats).
    assert report.xla["argument"] == 256 + 64 + 16 + 8 * 4
    mesh_devices = np.array(jax.local_devices()[:4]).reshape(2, 2)
    with session:
        for slot, members in zip(session._state[:3], program.slots.slots):
            assert slot.shape[:2] == (2, 2)
            assert len(slot.addressable_shards) == 4
            for shard in slot.addressable_shards:
                assert shard.data.shape == (1, 1, slot.shape[2])
                r, k = shard.index[0].start, shard.index[1].start
                assert shard.device == mesh_devices[r, k]
                entry = members[k]
                if entry is not None:
                    var = program.variables[entry]
                    np.testing.assert_array_equal(
                        np.asarray(shard.data).reshape(var.shape), var._host_data
                    )
        x = np.stack([np.ones(8, np.float32), np.zeros(8, np.float32)])
        got = session.run({x_in: x})[out]
        np.testing.assert_allclose(got, [[4.0 * 8 * 2 + 120 * 16 + 1] * 8, [120 * 16 + 1] * 8])
        np.testing.assert_array_equal(session.get_tensor_data(a), np.full((8, 8), 1.5))
        np.testing.assert_array_equal(session.get_tensor_data(h), np.full(8, 2, np.float16))


# (f) Too few devices ------------------------------------------------------------------------------


def test_placement_on_with_too_few_devices_for_the_replicas_teaches(monkeypatch):
    """2 IPUs x 8 replicas need 16 devices; the tests force 8."""
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir = popxl.Ir(replication=8)
    with ir.main_graph, popxl.ipu(0):
        popxl.variable(1.0).copy_to_ipu(1, 0)
    with pytest.raises(ValueError) as info:
        build_program(ir)
    message = str(info.value)
    assert "uses 2 IPUs per replica x 8 replicas = 16 devices but JAX has 8 devices" in message
    assert "--xla_force_host_platform_device_count=16" in message


def test_auto_with_too_few_devices_for_the_replicas_runs_unplaced(monkeypatch):
    monkeypatch.setenv("POPXL_PLACEMENT", "auto")
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        out = popxl.d2h_stream((), popxl.float32)
        with popxl.ipu(0):
            y = popxl.variable(1.5, name="v").copy_to_ipu(1, 0)
        with popxl.ipu(1):
            ops.host_store(out, collectives.replicated_all_reduce(y))
    with popxl.Session(ir, "ipu_model") as session:
        assert (session._program.ipus, session._program.mode) == (0, "shard_map")
        np.testing.assert_array_equal(session.run()[out], np.full(8, 12.0))


# Weights IO and the executable cache ----------------------------------------------------------


def _remote_per_replica(writes):
    """A remote variable with one value per replica, loaded on IPU 0, scaled on IPU 1 and
    stored back; ``writes``: values written while attached, before the second run."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        out = popxl.d2h_stream((3,), popxl.float32, "y")
        buffer = popxl.remote_buffer((3,), popxl.float32, 2)
        r = popxl.remote_variable(
            np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32),
            buffer,
            1,
            name="r",
            replica_grouping=ir.replica_grouping(group_size=1),
        )
        with popxl.ipu(0):
            loaded = ops.remote_load(buffer, 1).copy_to_ipu(1)
        with popxl.ipu(1):
            scaled = loaded * 3.0
            ops.remote_store(buffer, 1, scaled)
            ops.host_store(out, scaled)
    with popxl.Session(ir, "ipu_model") as session:
        first = session.run()[out]
        session.write_variable_data(r, writes)
        second = session.run()[out]
        return [first, second, session.get_tensor_data(r)], session._program.ipus


def test_remote_variable_written_while_attached_placed_like_unplaced(monkeypatch):
    writes = np.array([[-1.0, 0.5, 2.0], [7.0, 8.0, 9.0]], np.float32)
    (off, off_ipus), (on, on_ipus) = _both(monkeypatch, _remote_per_replica, writes)
    assert (off_ipus, on_ipus) == (0, 2)
    _assert_same(off, on, rtol=0, atol=0)
    np.testing.assert_array_equal(on[0], [[3.0, 6.0, 9.0], [12.0, 15.0, 18.0]])
    np.testing.assert_array_equal(on[1], writes * 3.0)
    np.testing.assert_array_equal(on[2], writes * 3.0)


def test_replicated_placed_program_is_saved_to_and_loaded_from_the_executable_cache(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    results = []
    for _ in range(2):
        ir, x_in, out, (a, u, b, h) = _two_ipus_replicated()
        opts = ir._pb_ir.getSessionOptions()
        opts.enableEngineCaching, opts.cachePath = True, str(tmp_path)
        with popxl.Session(ir, "ipu_model") as session:
            assert session._program.ipus == 2 and session._executable is not None
            x = np.stack([np.ones(8, np.float32), np.full(8, 2.0, np.float32)])
            results.append(session.run({x_in: x})[out])
            np.testing.assert_array_equal(session.get_tensor_data(b), np.full((8, 8), 3.0))
    assert len(list(tmp_path.glob("*.popef"))) == 1
    np.testing.assert_array_equal(results[0], results[1])
    expected = [[(0.5 * 8 * 1.0 + 120) * 16 + 1] * 8, [(0.5 * 8 * 2.0 + 120) * 16 + 1] * 8]
    np.testing.assert_allclose(results[0], expected)
