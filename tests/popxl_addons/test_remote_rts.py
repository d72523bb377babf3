"""Remote buffers for named variables (``popxl_addons.remote``, reference 1.12) and the
replicated tensor sharding helpers (``popxl_addons.rts``, reference 1.13 and 6.8).

Replicated programs run with replicas mapped by ``jax.vmap`` and by ``jax.shard_map`` (the
``mode`` fixture). Values are checked through ``popxl.Session`` against NumPy.
"""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl.ops import collectives
from popxl_addons.named_replica_grouping import NamedReplicaGrouping
from popxl_addons.named_tensors import NamedTensors
from popxl_addons.remote import (
    NamedRemoteBuffers,
    create_remote_buffer,
    load_remote,
    load_remote_graph,
    named_buffers,
    named_variable_buffers,
    store_remote,
    store_remote_graph,
)
from popxl_addons.rts import (
    all_gather_replica_sharded_graph,
    gather_replica_sharded_tensor,
    reduce_replica_sharded_graph,
    reduce_replica_sharded_tensor,
    replica_sharded_spec,
)
from popxl_addons.variable_factory import NamedVariableFactories, VariableFactory

from ..replication_helpers import mode  # noqa: F401  (the `mode` fixture)

F32 = popxl.float32
I32 = popxl.int32


def _store(t):
    stream = popxl.d2h_stream(t.shape, t.dtype)
    ops.host_store(stream, t)
    return stream


def _replicated(x, replicas):
    """Host layout of a value that every replica holds (a stream's input or output):
    ``(replicas, *shape)``, or ``shape`` with one replica."""
    x = np.asarray(x)
    return x if replicas == 1 else np.ascontiguousarray(np.broadcast_to(x, (replicas, *x.shape)))


def _shard_if_sharded(t, buffer, group=None):
    return collectives.replica_sharded_slice(t, group) if buffer.meta_shape else t


def _factories(*entries):
    """NamedVariableFactories from ``(key, shape, kwargs)`` triples (zero data)."""
    return NamedVariableFactories.from_dict(
        {
            key: VariableFactory(lambda s=shape: np.zeros(s, np.float32), **kw)
            for key, shape, kw in entries
        }
    )


# create_remote_buffer ------------------------------------------------------------------------


def test_create_remote_buffer_plain_sharded_and_already_sharded():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        spec = popxl.TensorSpec((4, 3), F32)
        plain = create_remote_buffer(spec, entries=2)
        assert (plain.tensor_shape, plain.tensor_dtype, plain.meta_shape) == ((4, 3), F32, ())
        assert plain.entries == 2
        assert create_remote_buffer(spec, shard_over=1).meta_shape == ()
        for shard_over in (2, 4):
            sharded = create_remote_buffer(spec, 3, shard_over=shard_over)
            assert (sharded.tensor_shape, sharded.meta_shape) == ((12 // shard_over,), (4, 3))
            assert (sharded.tensor_dtype, sharded.entries) == (F32, 3)
        # A spec that is already a shard gives a plain buffer that keeps its meta-shape.
        shard_spec = popxl.TensorSpec((3,), popxl.float16, (4, 3))
        for shard_over in (None, 4):
            kept = create_remote_buffer(shard_spec, 5, shard_over=shard_over)
            assert (kept.tensor_shape, kept.meta_shape) == ((3,), (4, 3))
            assert (kept.tensor_dtype, kept.entries) == (popxl.float16, 5)
        # A tensor works as the spec.
        t = popxl.variable(np.zeros((2, 4), np.float16))
        from_tensor = create_remote_buffer(t, shard_over=4)
        assert (from_tensor.tensor_shape, from_tensor.meta_shape) == ((2,), (2, 4))


@pytest.mark.parametrize("shape,shard_over", [((2, 3), 4), ((5,), 2), ((3,), 4)])
def test_create_remote_buffer_rejects_uneven_shards(shape, shard_over):
    n = int(np.prod(shape))
    with popxl.Ir(replication=4).main_graph:
        with pytest.raises(
            ValueError, match=f"^Can't shard tensor with {n} elements over {shard_over} replicas"
        ):
            create_remote_buffer(popxl.TensorSpec(shape, F32), shard_over=shard_over)


def test_create_remote_buffer_for_grouped_variables():
    """With several groups the buffer holds one group's shard (the group axis is not in
    the tensor or meta shape)."""
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        spec = popxl.TensorSpec((4, 2), F32)
        for stride, group_size, shard_over, shard in [(1, 4, 4, 2), (1, 4, 2, 4), (2, 2, 2, 4)]:
            rg = ir.replica_grouping(stride, group_size)
            assert rg.num_groups > 1
            buffer = create_remote_buffer(spec, 2, rg, shard_over)
            assert (buffer.tensor_shape, buffer.meta_shape, buffer.entries) == ((shard,), (4, 2), 2)
        unsharded = create_remote_buffer(spec, replica_group=ir.replica_grouping(1, 4))
        assert (unsharded.tensor_shape, unsharded.meta_shape) == ((4, 2), ())


@pytest.mark.usefixtures("mode")
def test_grouped_sharded_buffer_holds_each_groups_value():
    """4 replicas, 2 groups of 2: a buffer from ``create_remote_buffer`` and a grouped RTS
    variable in it; the session reads and writes ``(groups, *shape)``."""
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(stride=2, group_size=2)  # assignment [0, 1, 0, 1]
    data = np.arange(16, dtype=np.float32).reshape(2, 4, 2)
    with ir.main_graph, popxl.in_sequence():
        buffer = create_remote_buffer(popxl.TensorSpec((4, 2), F32), 1, rg, 2)
        var = popxl.remote_replica_sharded_variable(data, buffer, 0, replica_grouping=rg)
        shard = ops.remote_load(buffer, 0)
        full = _store(gather_replica_sharded_tensor(shard, replica_group=rg))
        ops.remote_store(buffer, 0, shard * 2.0)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[full], data[[0, 1, 0, 1]])
    np.testing.assert_array_equal(session.get_tensor_data(var), 2 * data)


# named_variable_buffers / named_buffers ------------------------------------------------------

SHAPES = [("w", (4, 2)), ("b.c", (8,)), ("s", (4,))]


@pytest.mark.parametrize(
    "shard_over_dict,shards",
    [
        (True, {"w": 4, "b.c": 4, "s": 4}),
        (False, {"w": 1, "b.c": 1, "s": 1}),
        (1, {"w": 1, "b.c": 1, "s": 1}),
        (2, {"w": 2, "b.c": 2, "s": 2}),
        (4, {"w": 4, "b.c": 4, "s": 4}),
        ({"w": 1, "b.c": 2, "s": 4}, {"w": 1, "b.c": 2, "s": 4}),
        ({"w": 1, "b.c": 2}, {"w": 1, "b.c": 2, "s": 4}),  # a missing key is sharded
        ({}, {"w": 4, "b.c": 4, "s": 4}),
    ],
)
def test_named_variable_buffers_shard_over(shard_over_dict, shards):
    with popxl.Ir(replication=4).main_graph:
        facts = _factories(*[(k, s, {}) for k, s in SHAPES])
        buffers = named_variable_buffers(facts, 3, shard_over_dict)
    assert isinstance(buffers, NamedRemoteBuffers)
    assert buffers.keys_flat() == facts.keys_flat() == ["w", "b.c", "s"]
    for key, shape in SHAPES:
        buffer = buffers.to_dict()[key]
        n = int(np.prod(shape))
        if shards[key] == 1:
            assert (buffer.tensor_shape, buffer.meta_shape) == (shape, ())
        else:
            assert (buffer.tensor_shape, buffer.meta_shape) == ((n // shards[key],), shape)
        assert (buffer.entries, buffer.tensor_dtype) == (3, F32)


@pytest.mark.parametrize("shard_over", [0, 5, -1])
def test_named_variable_buffers_rejects_invalid_int(shard_over):
    with popxl.Ir(replication=4).main_graph:
        facts = _factories(("w", (4, 2), {}))
        with pytest.raises(ValueError, match=r"shard_over must be in \[1, 4\]"):
            named_variable_buffers(facts, shard_over_dict=shard_over)


def test_named_variable_buffers_shards_by_default_and_raises_on_uneven_sizes():
    with popxl.Ir(replication=4).main_graph:
        facts = _factories(("w", (4, 2), {}), ("odd", (3,), {}))
        with pytest.raises(ValueError, match="Can't shard tensor with 3 elements over 4 replicas"):
            named_variable_buffers(facts)
        with pytest.raises(ValueError, match="Can't shard tensor with 3 elements over 2 replicas"):
            named_variable_buffers(facts, shard_over_dict={"odd": 2})
        buffers = named_variable_buffers(facts, shard_over_dict={"odd": 1})
        assert (buffers.odd.tensor_shape, buffers.w.tensor_shape) == ((3,), (2,))


def test_named_variable_buffers_for_grouped_and_sharded_factories():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        rg = ir.replica_grouping(group_size=2)
        facts = _factories(
            ("grouped", (8,), {"replica_grouping": rg}),
            ("sharded", (4, 2), {"shard_over": 2}),
            ("whole", (4, 2), {"shard_over": 4}),
        )
        assert facts.sharded.shape == (4,) and facts.sharded.meta_shape == (4, 2)
        default = named_variable_buffers(facts)
        assert (default.grouped.tensor_shape, default.grouped.meta_shape) == ((4,), (8,))
        # An already-sharded factory keeps its own shard count whatever shard_over_dict says.
        for shard_over_dict in (True, False, 1):
            buffers = named_variable_buffers(facts, shard_over_dict=shard_over_dict)
            assert (buffers.sharded.tensor_shape, buffers.sharded.meta_shape) == ((4,), (4, 2))
            assert (buffers.whole.tensor_shape, buffers.whole.meta_shape) == ((2,), (4, 2))
        unsharded = named_variable_buffers(facts, shard_over_dict=False)
        assert (unsharded.grouped.tensor_shape, unsharded.grouped.meta_shape) == ((8,), ())
        with pytest.raises(ValueError, match=r"shard_over must be in \[1, 2\]"):
            named_variable_buffers(facts, shard_over_dict=4)  # the grouped factory's group is 2


def test_named_buffers_copy_each_tensors_spec():
    with popxl.Ir(replication=2).main_graph:
        full = popxl.variable(np.zeros((2, 3), np.float16), name="full")
        shard = collectives.replica_sharded_slice(popxl.variable(np.zeros((4, 2), np.float32)))
        tensors = NamedTensors.from_dict({"z.full": full, "a": shard})
        buffers = named_buffers(tensors, entries=2)
    assert buffers.keys_flat() == ["z.full", "a"]
    assert (buffers.z.full.tensor_shape, buffers.z.full.tensor_dtype) == ((2, 3), popxl.float16)
    assert buffers.z.full.meta_shape == ()
    assert (buffers.a.tensor_shape, buffers.a.meta_shape) == ((4,), (4, 2))
    assert {b.entries for b in buffers.values_flat()} == {2}


# init_remote -----------------------------------------------------------------------------------


class Affine(addons.Module):
    def __init__(self, weights, biases):
        super().__init__()
        self.weights, self.biases = weights, biases

    def build(self, x):
        weight = self.add_variable_input("weight", iter(self.weights), F32)
        bias = self.add_variable_input("bias", iter(self.biases), F32)
        return x @ weight + bias


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_init_remote_variables_are_read_and_written_through_the_session(replicas, rng):
    """Two entries of an Affine layer's weights, sharded over all replicas (when there is
    more than one): load an entry chosen on the host, gather, compute, add 1, store back."""
    weights = rng.normal(size=(2, 3, 4)).astype(np.float32)
    biases = rng.normal(size=(2, 4)).astype(np.float32)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph, popxl.in_sequence():
        x_in = popxl.h2d_stream((2, 3), F32, "x")
        at_in = popxl.h2d_stream((), I32, "at")
        facts, graph = Affine(weights, biases).create_graph(popxl.TensorSpec((2, 3), F32))
        buffers = named_variable_buffers(facts, entries=2)
        first = facts.init_remote(buffers, 0, "first")
        second = facts.init_remote(buffers, 1, prefix="second")
        assert facts.keys_flat() == ["weight", "bias"]
        assert first.keys_flat() == second.keys_flat() == ["bias", "weight"]
        assert [t.name for t in first.values_flat()] == ["first.bias", "first.weight"]
        assert [t.name for t in second.values_flat()] == ["second.bias", "second.weight"]
        expected_meta = (3, 4) if replicas > 1 else ()
        assert first.weight.meta_shape == buffers.weight.meta_shape == expected_meta

        load, names = load_remote_graph(buffers, 2)
        loaded = NamedTensors.pack(names, load.call(ops.host_load(at_in)))
        gather, gathered_names = all_gather_replica_sharded_graph(loaded)
        full = NamedTensors.pack(gathered_names, gather.bind(loaded).call())
        (y,) = graph.bind(full).call(ops.host_load(x_in))
        y_out = _store(y)
        updated = {
            k: _shard_if_sharded(t + 1.0, buffers.to_dict()[k]) for k, t in full.to_dict().items()
        }
        store = store_remote_graph(buffers, 2)
        store.bind(NamedTensors.from_dict(updated)).call(ops.host_load(at_in))

    x = rng.normal(size=(2, 3)).astype(np.float32)
    host = {x_in: _replicated(x, replicas)}
    session = popxl.Session(ir, "ipu_model")
    np.testing.assert_array_equal(session.get_tensor_data(first.weight), weights[0])
    np.testing.assert_array_equal(session.get_tensor_data(second.bias), biases[1])
    with session:
        got = session.run({**host, at_in: _replicated(np.int32(0), replicas)})[y_out]
        np.testing.assert_allclose(
            got, _replicated(x @ weights[0] + biases[0], replicas), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(session.get_tensor_data(first.weight), weights[0] + 1.0)
        np.testing.assert_allclose(session.get_tensor_data(second.weight), weights[1])
        new_bias = np.array([10.0, 20.0, 30.0, 40.0], np.float32)
        session.write_variable_data(second.bias, new_bias)
        got = session.run({**host, at_in: _replicated(np.int32(1), replicas)})[y_out]
        np.testing.assert_allclose(
            got, _replicated(x @ weights[1] + new_bias, replicas), rtol=1e-5, atol=1e-6
        )
    np.testing.assert_allclose(session.get_tensor_data(second.weight), weights[1] + 1.0)
    np.testing.assert_allclose(session.get_tensor_data(second.bias), new_bias + 1.0)
    np.testing.assert_allclose(session.get_tensor_data(first.bias), biases[0] + 1.0)


class ShardedScale(addons.Module):
    def __init__(self, w0, shard_over):
        super().__init__()
        self.w0, self.shard_over = w0, shard_over

    def build(self, x):
        shard = self.add_replica_sharded_variable_input(
            "w", iter([self.w0]), F32, shard_over=self.shard_over
        )
        group = popxl.gcg().ir.replica_grouping(1, self.shard_over) if self.shard_over else None
        return x * gather_replica_sharded_tensor(shard, replica_group=group)


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas,shard_over", [(2, None), (4, None), (4, 2)])
def test_init_remote_of_a_sharded_factory_makes_an_rts_variable(replicas, shard_over):
    w0 = np.arange(8, dtype=np.float32).reshape(2, 4)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph, popxl.in_sequence():
        facts, graph = ShardedScale(w0, shard_over).create_graph(popxl.TensorSpec((2, 4), F32))
        shards = shard_over or replicas
        assert graph.args.w.shape == (8 // shards,) and graph.args.w.meta_shape == (2, 4)
        buffers = named_variable_buffers(facts)
        assert (buffers.w.tensor_shape, buffers.w.meta_shape) == ((8 // shards,), (2, 4))
        var = facts.init_remote(buffers, prefix="scale").w
        assert var.name == "scale.w" and var.meta_shape == (2, 4)
        state = load_remote(buffers)
        (y,) = graph.bind(state).call(popxl.constant(np.full((2, 4), 2.0, np.float32)))
        y_out = _store(y)
        store_remote(buffers, NamedTensors(w=state.w * 3.0))
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[y_out], _replicated(2 * w0, replicas))
    np.testing.assert_array_equal(session.get_tensor_data(var), 3 * w0)


@pytest.mark.usefixtures("mode")
def test_init_remote_of_grouped_factories():
    """4 replicas, 2 groups (stride 2) with different data, sharded inside each group."""
    ir = popxl.Ir(replication=4)
    data = [np.full((2, 2), 1.0, np.float32), np.full((2, 2), 5.0, np.float32)]
    with ir.main_graph, popxl.in_sequence():
        rg = ir.replica_grouping(stride=2, group_size=2)
        facts = NamedVariableFactories(v=VariableFactory(iter(data), replica_grouping=rg))
        buffers = named_variable_buffers(facts)
        assert (buffers.v.tensor_shape, buffers.v.meta_shape) == ((2,), (2, 2))
        var = facts.init_remote(buffers).v
        state = load_remote(buffers)
        full = gather_replica_sharded_tensor(state.v, replica_group=rg)
        out = _store(full)
        store_remote(buffers, NamedTensors(v=collectives.replica_sharded_slice(full + 1.0, rg)))
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[out], np.stack(data)[[0, 1, 0, 1]])
    np.testing.assert_array_equal(session.get_tensor_data(var), np.stack(data) + 1.0)


@pytest.mark.usefixtures("mode")
def test_init_remote_from_memmap_files(tmp_path):
    """``memmap_dir`` keeps each variable's full value in ``<dir>/<prefix>.<key>.npy``."""
    ir = popxl.Ir(replication=2)
    w0 = np.arange(6, dtype=np.float32).reshape(3, 2)
    with ir.main_graph, popxl.in_sequence():
        facts = NamedVariableFactories(w=VariableFactory(lambda: w0.copy()))
        buffers = named_variable_buffers(facts, entries=2)
        created = facts.init_remote(buffers, 0, "p", memmap_dir=str(tmp_path)).w
        np.save(tmp_path / "q.w.npy", 2 * w0)
        existing = facts.init_remote(buffers, 1, "q", memmap_dir=str(tmp_path)).w
        full = gather_replica_sharded_tensor(load_remote(buffers, 1).w)
        out = _store(full)
    np.testing.assert_array_equal(np.load(tmp_path / "p.w.npy"), w0)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[out], _replicated(2 * w0, 2))
    np.testing.assert_array_equal(session.get_tensor_data(created), w0)
    np.testing.assert_array_equal(session.get_tensor_data(existing), 2 * w0)


# load_remote_graph / store_remote_graph --------------------------------------------------------


def test_load_and_store_graphs_sort_names_and_grow_entries():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        buffers = NamedRemoteBuffers.from_dict(
            {
                "z": popxl.remote_buffer((2,), F32, 1),
                "a.b": popxl.remote_buffer((3,), popxl.float16, 5),
                "m": create_remote_buffer(popxl.TensorSpec((4, 2), F32), shard_over=2),
            }
        )
        load, names = load_remote_graph(buffers, entries=3)
        assert names == ["a.b", "m", "z"]
        assert [buffers.z.entries, buffers.a.b.entries, buffers.m.entries] == [3, 5, 3]
        (index,) = load.graph.inputs
        assert (index.shape, index.dtype) == ((), I32)
        assert load.args.keys_flat() == []
        outs = load.graph.outputs
        assert [(o.shape, o.dtype, o.meta_shape) for o in outs] == [
            ((3,), popxl.float16, ()),
            ((4,), F32, (4, 2)),
            ((2,), F32, ()),
        ]
        store = store_remote_graph(buffers, entries=4)
        assert [buffers.z.entries, buffers.a.b.entries, buffers.m.entries] == [4, 5, 4]
        assert store.args.keys_flat() == ["a.b", "m", "z"]
        assert (store.graph.inputs[0].shape, store.graph.inputs[0].dtype) == ((), I32)
        assert list(store.graph.inputs[1:]) == store.args.values_flat()
        assert store.args.m.meta_shape == (4, 2) and store.args.m.shape == (4,)
        assert not store.graph.outputs
        # Growing to fewer entries leaves the buffers alone.
        load_remote_graph(buffers)
        assert [buffers.z.entries, buffers.a.b.entries, buffers.m.entries] == [4, 5, 4]


def test_load_and_store_graph_schedules_match_the_reference():
    """Tutorial 5's printed schedules (reference 6.6)."""

    class Add(addons.Module):
        def build(self, x):
            w = self.add_variable_input("weight", lambda: np.ones(x.shape, np.float32), x.dtype)
            return x + w

    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(np.ones(5, np.float32), name="x")
        facts, _ = Add().create_graph(x)
        buffers = named_variable_buffers(facts, entries=2, shard_over_dict=False)
        load, names = load_remote_graph(buffers, entries=2)
        store = store_remote_graph(buffers, entries=2)
    assert names == ["weight"]
    assert load.print_schedule() == (
        "Graph : load_remote_subgraph(1)\n"
        "  (%1) -> (%3) {\n"
        "    Init.101 () -> (%2 [(5,) float32])\n"
        "    RemoteLoad.102 (%2 [(5,) float32], %1 [() int32]) -> (%3 [(5,) float32])\n"
        "  }"
    )
    assert store.print_schedule() == (
        "Graph : store_remote_subgraph(2)\n"
        "  (%1, weight=%2) -> () {\n"
        "    RemoteStore.103 (%2 [(5,) float32], %1 [() int32]) -> ()\n"
        "  }"
    )


def test_remote_variables_demo_values():
    """Tutorial 5's demo: two entries of one Add graph's weight; the expected values (the
    stored notebook printed NaN)."""

    class Add(addons.Module):
        def build(self, x):
            w = self.add_variable_input("weight", lambda: np.ones(x.shape, np.float32), x.dtype)
            return x + w

    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(np.ones(5, np.float32), name="x")
        facts, graph = Add().create_graph(x)
        buffers = named_variable_buffers(facts, entries=2, shard_over_dict=False)
        first, second = (
            facts.init_remote(buffers, 0, "first"),
            facts.init_remote(buffers, 1, "second"),
        )
        load, names = load_remote_graph(buffers, entries=2)
        store = store_remote_graph(buffers, entries=2)
        weights = NamedTensors.pack(names, load.call(0))
        (y,) = graph.bind(weights).call(x)
        out = _store(y)
        weights.weight += 1.0 / 3.0
        store.bind(weights).call(0)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_allclose(session.run()[out], np.full(5, 2.0))
        np.testing.assert_allclose(session.run()[out], np.full(5, 2.0 + 1.0 / 3.0))
    np.testing.assert_allclose(session.get_tensor_data(first.weight), np.full(5, 1.0 + 2.0 / 3.0))
    np.testing.assert_array_equal(session.get_tensor_data(second.weight), np.ones(5))


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_store_then_load_round_trip_across_runs_and_entries(replicas, rng):
    """Each run loads entry ``load_at`` then stores its input at ``store_at`` (indices are
    tensors streamed from the host): a value stored in one run is read in a later one."""
    shapes = {"w": (4, 2), "b.c": (4,)}
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph, popxl.in_sequence():
        buffers = NamedRemoteBuffers.from_dict(
            {
                k: create_remote_buffer(popxl.TensorSpec(s, F32), shard_over=replicas)
                for k, s in shapes.items()
            }
        )
        load, names = load_remote_graph(buffers, entries=3)
        store = store_remote_graph(buffers, entries=3)
        load_at, store_at = (
            popxl.h2d_stream((), I32, "load_at"),
            popxl.h2d_stream((), I32, "store_at"),
        )
        x_in = {k: popxl.h2d_stream(s, F32, k) for k, s in shapes.items()}
        loaded = NamedTensors.pack(names, load.call(ops.host_load(load_at)))
        gather, _ = all_gather_replica_sharded_graph(loaded)
        outs = dict(zip(names, map(_store, gather.bind(loaded).call())))
        new = {k: _shard_if_sharded(ops.host_load(x_in[k]), buffers.to_dict()[k]) for k in shapes}
        store.bind(NamedTensors.from_dict(new)).call(ops.host_load(store_at))
    values = [
        {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()} for _ in range(5)
    ]
    schedule = [(0, 0), (1, 0), (2, 1), (0, 2), (1, 0)]  # (store_at, load_at) per run
    stored = [{k: np.zeros(s, np.float32) for k, s in shapes.items()} for _ in range(3)]
    with popxl.Session(ir, "ipu_model") as session:
        for run, (s_at, l_at) in enumerate(schedule):
            feed = {
                load_at: _replicated(np.int32(l_at), replicas),
                store_at: _replicated(np.int32(s_at), replicas),
                **{x_in[k]: _replicated(values[run][k], replicas) for k in shapes},
            }
            result = session.run(feed)
            for k in shapes:
                np.testing.assert_array_equal(
                    result[outs[k]], _replicated(stored[l_at][k], replicas)
                )
            stored[s_at] = values[run]


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas", [1, 4])
def test_load_and_store_graphs_inside_repeat(replicas):
    """``ops.repeat`` stores ``(i + 1) * base`` at entry ``i`` (the loop counter), a second
    loop sums the entries back; int indices read single entries."""
    base = np.arange(8, dtype=np.float32).reshape(2, 4)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph, popxl.in_sequence():
        buffers = NamedRemoteBuffers(
            w=create_remote_buffer(popxl.TensorSpec((2, 4), F32), shard_over=replicas)
        )
        load, names = load_remote_graph(buffers, entries=3)
        store = store_remote_graph(buffers, entries=3)
        gather, _ = all_gather_replica_sharded_graph(NamedTensors(w=load.graph.outputs[0]))

        def fill(i):
            value = popxl.constant(base) * (ops.cast(i, F32) + 1.0)
            store.bind(NamedTensors(w=_shard_if_sharded(value, buffers.w))).call(i)
            return i + 1

        def total(i, acc):
            loaded = NamedTensors.pack(names, load.call(i))
            (full,) = gather.bind(loaded).call()
            return i + 1, acc + full

        counter = popxl.TensorSpec((), I32)
        fill_graph = ir.create_graph(fill, counter)
        total_graph = ir.create_graph(total, counter, popxl.TensorSpec((2, 4), F32))
        ops.repeat(fill_graph, 3, popxl.constant(0, I32))
        _, acc = ops.repeat(
            total_graph, 3, popxl.constant(0, I32), popxl.constant(np.zeros((2, 4), np.float32))
        )
        acc_out = _store(acc)
        singles = []
        for entry in range(3):
            (shard,) = load.call(entry)
            singles.append(_store(gather_replica_sharded_tensor(shard)))
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    np.testing.assert_array_equal(result[acc_out], _replicated(6 * base, replicas))
    for entry, stream in enumerate(singles):
        np.testing.assert_array_equal(result[stream], _replicated((entry + 1) * base, replicas))


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("use_io_tiles", [False, True])
def test_inline_load_remote_and_store_remote(use_io_tiles):
    """``store_remote`` stores the keys it shares with the buffers (extra keys are
    ignored); ``load_remote`` reads an entry given as an int or a tensor."""
    ir = popxl.Ir(replication=2)
    ir._pb_ir.getSessionOptions().numIOTiles = 32  # ops on IO tiles need some
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([1.0, -2.0, 3.0, -4.0], np.float32)
    with ir.main_graph, popxl.in_sequence():
        tensors = NamedTensors.from_dict(
            {
                "x.a": popxl.variable(a, name="a"),
                "s": collectives.replica_sharded_slice(popxl.variable(s, name="s")),
            }
        )
        buffers = named_buffers(tensors, entries=2)
        extra = NamedTensors.from_dict(
            {**tensors.to_dict(), "unused": popxl.variable(np.zeros(3, np.float32))}
        )
        store_remote(buffers, extra, 1, use_io_tiles)
        at_one = load_remote(buffers, 1, use_io_tiles)
        at_zero = load_remote(buffers, popxl.constant(0, I32), use_io_tiles)
        assert at_one.keys_flat() == ["s", "x.a"]
        assert at_one.s.meta_shape == (4,) and at_one.s.shape == (2,)
        outs = [_store(at_one.x.a), _store(gather_replica_sharded_tensor(at_one.s))]
        outs += [_store(at_zero.x.a), _store(gather_replica_sharded_tensor(at_zero.s))]
        assert load_remote(NamedRemoteBuffers()).keys_flat() == []
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    got = [result[o] for o in outs]
    np.testing.assert_array_equal(got[0], _replicated(a, 2))
    np.testing.assert_array_equal(got[1], _replicated(s, 2))
    np.testing.assert_array_equal(got[2], np.zeros((2, 2, 3)))  # entry 0 never written
    np.testing.assert_array_equal(got[3], np.zeros((2, 4)))


# replica_sharded_spec ------------------------------------------------------------------------


def test_replica_sharded_spec_rules():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        everyone, pairs, single = (
            ir.replica_grouping(),
            ir.replica_grouping(1, 2),
            ir.replica_grouping(1, 1),
        )
        spec = popxl.TensorSpec((4, 3), popxl.float16)
        assert replica_sharded_spec(spec, everyone) == popxl.TensorSpec((3,), popxl.float16, (4, 3))
        assert replica_sharded_spec(spec, pairs) == popxl.TensorSpec((6,), popxl.float16, (4, 3))
        assert replica_sharded_spec(spec, single) == spec  # group size 1: unchanged
        odd = popxl.TensorSpec((3, 3), F32)
        assert replica_sharded_spec(odd, everyone) == odd  # indivisible: unchanged
        assert replica_sharded_spec(odd, pairs) == odd
        shard = popxl.TensorSpec((3,), F32, (4, 3))
        assert replica_sharded_spec(shard, everyone) == shard  # already sharded: unchanged
        t = popxl.variable(np.zeros((2, 4), np.float32))
        assert replica_sharded_spec(t, everyone) == popxl.TensorSpec((2,), F32, (2, 4))
        sliced = collectives.replica_sharded_slice(t)
        assert replica_sharded_spec(sliced, pairs) == sliced.spec


# gathering ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas", [2, 4])
def test_gather_replica_sharded_tensor(replicas):
    """A shard gathers to the full tensor (also through the IO tiles and in groups); an
    unsharded tensor is returned as is."""
    data = np.arange(12, dtype=np.float32).reshape(replicas, 12 // replicas)
    ir = popxl.Ir(replication=replicas)
    ir._pb_ir.getSessionOptions().numIOTiles = 32  # ops on IO tiles need some
    with ir.main_graph, popxl.in_sequence():
        full = popxl.variable(np.arange(8, dtype=np.float32).reshape(4, 2) - 3.0, name="full")
        assert gather_replica_sharded_tensor(full) is full
        assert gather_replica_sharded_tensor(full, use_io_tiles=True) is full
        shard = collectives.replica_sharded_slice(full)
        plain = gather_replica_sharded_tensor(shard)
        io = gather_replica_sharded_tensor(shard, use_io_tiles=True)
        assert plain.shape == io.shape == (4, 2) and plain.meta_shape == io.meta_shape == ()
        assert io.name.endswith("_iotilecopy")  # gathered on the IO tiles, copied back
        outs = [_store(plain), _store(io)]
        # Per-replica data, identical within each pair: a pair's shards gather to its value.
        x_in = popxl.h2d_stream(data.shape[1:], F32, "x")
        pairs = ir.replica_grouping(1, 2)
        pair_shard = collectives.replica_sharded_slice(ops.host_load(x_in), pairs)
        outs.append(_store(gather_replica_sharded_tensor(pair_shard, replica_group=pairs)))
    per_pair = np.repeat(data[::2], 2, axis=0)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run({x_in: per_pair})
    expected = np.arange(8, dtype=np.float32).reshape(4, 2) - 3.0
    np.testing.assert_array_equal(result[outs[0]], _replicated(expected, replicas))
    np.testing.assert_array_equal(result[outs[1]], _replicated(expected, replicas))
    np.testing.assert_array_equal(result[outs[2]], per_pair)


@pytest.mark.usefixtures("mode")
def test_all_gather_replica_sharded_graph():
    """Sorted names, one named input per tensor, gathered outputs in the same order, per-key
    groups (``const_rg`` of the given grouping), unsharded inputs passed through."""
    ir = popxl.Ir(replication=4)
    ir._pb_ir.getSessionOptions().numIOTiles = 32  # ops on IO tiles need some
    w = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    u = np.array([7.0, 8.0, 9.0], np.float32)
    with ir.main_graph, popxl.in_sequence():
        pairs = ir.replica_grouping(1, 2)
        tensors = NamedTensors.from_dict(
            {
                "z.w": collectives.replica_sharded_slice(popxl.variable(w)),
                "b": collectives.replica_sharded_slice(popxl.variable(b), pairs),
                "u": popxl.variable(u),
            }
        )
        groups = NamedReplicaGrouping.from_dict({"b": pairs})
        graph, names = all_gather_replica_sharded_graph(tensors, replica_groups=groups)
        assert names == ["b", "u", "z.w"]
        assert graph.args.keys_flat() == names
        assert list(graph.graph.inputs) == graph.args.values_flat()
        assert [t.meta_shape for t in graph.graph.inputs] == [(4,), (), (2, 4)]
        assert [o.shape for o in graph.graph.outputs] == [(4,), (3,), (2, 4)]
        outs = [_store(t) for t in graph.bind(tensors).call()]
        io_graph, _ = all_gather_replica_sharded_graph(tensors, True, groups)
        outs += [_store(t) for t in io_graph.bind(tensors).call()]
        empty, empty_names = all_gather_replica_sharded_graph(NamedTensors())
        assert empty_names == [] and not empty.graph.outputs
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    for k, expected in enumerate([b, u, w] * 2):
        np.testing.assert_array_equal(result[outs[k]], _replicated(expected, 4))


# reducing ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_reduce_replica_sharded_tensor(replicas, rng):
    """Per-replica data reduced to shards (checked by gathering them back) or all-reduced."""
    x = rng.normal(size=(replicas, 4, 2)).astype(np.float32)
    odd = rng.normal(size=(replicas, 3)).astype(np.float32)
    host_x = x if replicas > 1 else x[0]
    host_odd = odd if replicas > 1 else odd[0]
    ir = popxl.Ir(replication=replicas)
    expected = {}
    with ir.main_graph, popxl.in_sequence():
        x_in, odd_in = popxl.h2d_stream((4, 2), F32, "x"), popxl.h2d_stream((3,), F32, "odd")
        xt, oddt = ops.host_load(x_in), ops.host_load(odd_in)
        everyone = ir.replica_grouping()
        sharded = replicas > 1
        outs = {}
        for op, reduce in [("add", np.sum), ("mean", np.mean)]:
            shard = reduce_replica_sharded_tensor(xt, op)
            assert shard.meta_shape == ((4, 2) if sharded else ())
            assert shard.shape == ((8 // replicas,) if sharded else (4, 2))
            outs[op] = _store(gather_replica_sharded_tensor(shard))
            expected[op] = _replicated(reduce(x, axis=0), replicas)
        unshardable = reduce_replica_sharded_tensor(oddt, "add", everyone, everyone)
        assert (unshardable.shape, unshardable.meta_shape) == ((3,), ())
        outs["odd"] = _store(unshardable)
        expected["odd"] = _replicated(odd.sum(0), replicas)
        single = reduce_replica_sharded_tensor(xt, "mean", shard_group=ir.replica_grouping(1, 1))
        assert (single.shape, single.meta_shape) == ((4, 2), ())
        outs["single"] = _store(single)
        expected["single"] = _replicated(x.mean(0), replicas)
        if replicas == 4:
            pairs = ir.replica_grouping(1, 2)
            # Reduce over everyone, shard over pairs: all-reduce then slice.
            pair_shard = reduce_replica_sharded_tensor(xt, "add", everyone, pairs)
            assert (pair_shard.shape, pair_shard.meta_shape) == ((4,), (4, 2))
            outs["pairs"] = _store(gather_replica_sharded_tensor(pair_shard, replica_group=pairs))
            expected["pairs"] = _replicated(x.sum(0), 4)
            # Reduce and shard within pairs: a reduce-scatter per pair.
            within = reduce_replica_sharded_tensor(xt, "mean", pairs)
            assert (within.shape, within.meta_shape) == ((4,), (4, 2))
            outs["within"] = _store(gather_replica_sharded_tensor(within, replica_group=pairs))
            pair_means = (x[0::2] + x[1::2]) / 2
            expected["within"] = np.repeat(pair_means, 2, axis=0)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run({x_in: host_x, odd_in: host_odd})
    for key, stream in outs.items():
        np.testing.assert_allclose(result[stream], expected[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("use_io_tiles", [False, True])
def test_reduce_replica_sharded_graph(replicas, use_io_tiles, rng):
    """Per-key shard groups: ``a`` sharded like the reduction (reduce-scatter), ``b`` not
    sharded (group size 1: all-reduce), ``d`` sharded over pairs (all-reduce then slice
    when that differs from all replicas), ``c`` missing from the groups and unshardable."""
    shapes = {"d": (2, 4), "a": (4, 2), "c": (3,), "b": (8,)}
    data = {k: rng.normal(size=(replicas, *s)).astype(np.float32) for k, s in shapes.items()}
    ir = popxl.Ir(replication=replicas)
    ir._pb_ir.getSessionOptions().numIOTiles = 32  # ops on IO tiles need some
    with ir.main_graph, popxl.in_sequence():
        everyone, pairs = ir.replica_grouping(), ir.replica_grouping(1, 2)
        streams = {k: popxl.h2d_stream(s, F32, k) for k, s in shapes.items()}
        tensors = NamedTensors.from_dict({k: ops.host_load(s, k) for k, s in streams.items()})
        groups = NamedReplicaGrouping.from_dict(
            {"a": everyone, "b": ir.replica_grouping(1, 1), "d": pairs}
        )
        graph, names = reduce_replica_sharded_graph(tensors, "mean", use_io_tiles, groups, everyone)
        assert names == ["a", "b", "c", "d"]
        assert graph.args.keys_flat() == names
        schedule = graph.print_schedule()
        assert schedule.startswith("Graph : replica_reduce_subgraph(")
        op_types = [line.split(".")[0].strip() for line in schedule.splitlines()[2:-1]]
        pairs_are_everyone = pairs == everyone
        assert op_types.count("ReplicatedReduceScatter") == (2 if pairs_are_everyone else 1)
        assert op_types.count("ReplicaShardedSlice") == (0 if pairs_are_everyone else 1)
        assert op_types.count("ReplicatedAllReduce") == (2 if pairs_are_everyone else 3)
        reduced = dict(zip(names, graph.bind(tensors).call()))
        assert [reduced[k].meta_shape for k in names] == [(4, 2), (), (), (2, 4)]
        assert [reduced[k].shape for k in names] == [(8 // replicas,), (8,), (3,), (4,)]
        full = {
            "a": gather_replica_sharded_tensor(reduced["a"]),
            "d": gather_replica_sharded_tensor(reduced["d"], replica_group=pairs),
            "b": reduced["b"],
            "c": reduced["c"],
        }
        outs = {k: _store(t) for k, t in full.items()}
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run({streams[k]: data[k] for k in shapes})
    for k in shapes:
        np.testing.assert_allclose(
            result[outs[k]], _replicated(data[k].mean(0), replicas), rtol=1e-5, atol=1e-6
        )


def test_reduce_replica_sharded_graph_defaults_to_all_replicas():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        tensors = NamedTensors(g=popxl.variable(np.zeros((2, 2), np.float32)))
        graph, names = reduce_replica_sharded_graph(tensors)
        (out,) = graph.graph.outputs
        assert names == ["g"] and (out.shape, out.meta_shape) == ((2,), (2, 2))
        assert "ReplicatedReduceScatter" in graph.print_schedule()
