"""VariableFactory and NamedVariableFactories (reference 1.3 and 6.4)."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl_addons.dot_tree import DotTree
from popxl_addons.named_replica_grouping import NamedReplicaGrouping
from popxl_addons.named_tensors import NamedTensors
from popxl_addons.variable_factory import (
    NamedVariableFactories,
    VariableFactory,
    add_replica_sharded_variable_input,
    add_variable_input,
)

F32 = popxl.float32


class Counter:
    """A callable data source returning 0, 1, 2, ... (as float32 arrays of ``shape``)."""

    def __init__(self, shape=(2,)):
        self.calls = 0
        self.shape = shape

    def __call__(self):
        value = np.full(self.shape, self.calls, np.float32)
        self.calls += 1
        return value


def _read(ir, variables):
    """Run ``ir`` once, storing every variable to a stream; ``{variable: device value}``."""
    with ir.main_graph:
        streams = {}
        for v in variables:
            streams[v] = popxl.d2h_stream(v.shape, v.dtype)
            ops.host_store(streams[v], v)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
        host = session.get_tensors_data(variables)
    for v in variables:
        np.testing.assert_array_equal(out[streams[v]], host[v])
    return host


# Data sources ------------------------------------------------------------------------------


def test_callable_is_called_twice_when_the_factory_is_built():
    ir = popxl.Ir()
    source = Counter()
    with ir.main_graph:
        factory = VariableFactory(source, name="w")
        assert source.calls == 2  # a smoke test, then the peek
        first = factory.create_tensor()
        assert source.calls == 2  # the peeked value is used
        second = factory.create_tensor()
        assert source.calls == 3
    data = _read(ir, [first, second])
    np.testing.assert_array_equal(data[first], [1, 1])  # the second draw
    np.testing.assert_array_equal(data[second], [2, 2])


def test_random_callable_consumes_two_draws_at_build_and_init_gets_the_second():
    np.random.seed(42)
    expected_first_init = [np.random.normal(0, 0.02, (3, 2)) for _ in range(3)][1]
    np.random.seed(42)
    ir = popxl.Ir()
    with ir.main_graph:
        factory = VariableFactory(
            lambda: np.random.normal(0, 0.02, (3, 2)).astype(np.float32), name="w"
        )
        w = factory.create_tensor()
    np.testing.assert_allclose(_read(ir, [w])[w], expected_first_init.astype(np.float32))


def test_a_failing_callable_is_a_value_error():
    def broken():
        raise RuntimeError("boom")

    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="Passed callable via data_iter throws error."):
            VariableFactory(broken)


def test_iterables_are_not_smoke_tested_and_yield_successive_values():
    ir = popxl.Ir()
    arrays = [np.full(2, i, np.float32) for i in range(3)]
    consumed = []

    def generate():
        for a in arrays:
            consumed.append(a)
            yield a

    with ir.main_graph:
        factory = VariableFactory(generate(), name="w")
        assert len(consumed) == 1  # only the peek
        a = factory.create_tensor()
        b = factory.create_tensor(empty=True)  # does not advance the iterator
        c = factory.create_tensor()
        factory.create_tensor()
        with pytest.raises(StopIteration):
            factory.create_tensor()
    data = _read(ir, [a, c])
    np.testing.assert_array_equal(data[a], [0, 0])
    np.testing.assert_array_equal(data[c], [1, 1])
    assert b.shape == (2,)


def test_something_neither_callable_nor_iterable_is_a_value_error():
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="data_iter"):
            VariableFactory(3)


def test_data_without_a_shape_is_rejected():
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="shape"):
            VariableFactory(lambda: 0.5)
        VariableFactory(lambda: np.zeros(()))  # a 0-d array is fine


def test_dtype_defaults_to_the_data_dtype_and_an_explicit_dtype_casts():
    ir = popxl.Ir()
    with ir.main_graph:
        f64 = VariableFactory(lambda: np.arange(3, dtype=np.float64))
        assert f64.dtype == popxl.float64
        cast = VariableFactory(lambda: np.arange(3, dtype=np.float64) + 0.5, popxl.float16, "c")
        assert cast.dtype == popxl.float16
        t = cast.create_tensor()
    assert t.dtype == popxl.float16
    value = _read(ir, [t])[t]
    assert value.dtype == np.float16
    np.testing.assert_array_equal(value, [0.5, 1.5, 2.5])


def test_attributes_and_default_grouping():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        f = VariableFactory(lambda: np.zeros((2, 3), np.float32), name="w", by_ref=True)
    assert f.name == "w" and f.by_ref and not f.replica_sharded
    assert f.shape == (2, 3) and f.meta_shape == ()
    assert f.replica_grouping == ir.replica_grouping()
    assert f.replica_grouping.group_size == 2


def test_a_factory_needs_a_graph_context_for_its_default_grouping():
    with pytest.raises(RuntimeError, match="no graph has been selected"):
        VariableFactory(lambda: np.zeros(2, np.float32))


def test_create_input_uses_the_name_prefix_by_ref_and_spec():
    ir = popxl.Ir()
    with ir.main_graph:
        f = VariableFactory(lambda: np.zeros((2, 3), np.float32), name="w", by_ref=True)

    def body():
        a = f.create_input()
        b = f.create_input(prefix="layer")
        return a, b

    with ir.main_graph:
        graph = ir.create_empty_graph("g")
        with graph:
            a, b = body()
    assert a.name == "w" and b.name == "layer.w"
    assert a.shape == (2, 3) and a.dtype == F32
    assert a in graph._by_ref_inputs and b in graph._by_ref_inputs
    assert graph.inputs == (a, b)


# Replica groupings -------------------------------------------------------------------------


def test_several_groups_stack_successive_draws_per_group():
    ir = popxl.Ir(replication=4)
    source = Counter(shape=(2,))
    with ir.main_graph:
        grouping = ir.replica_grouping(stride=1, group_size=2)  # groups {0, 1} and {2, 3}
        factory = VariableFactory(source, name="w", replica_grouping=grouping)
        assert factory.next_data(empty=True).shape == (2, 2)
        w = factory.create_tensor()
        assert w.shape == (2,) and w.shape_on_host == (2, 2)
        stream = popxl.d2h_stream(w.shape, w.dtype, "out")
        ops.host_store(stream, w + 0.0)
    with popxl.Session(ir, "ipu_model") as session:
        per_replica = session.run()[stream]
        host = session.get_tensor_data(w)
    np.testing.assert_array_equal(host, [[1, 1], [2, 2]])  # draws 1 and 2 (0 was the smoke test)
    np.testing.assert_array_equal(per_replica, [[1, 1], [1, 1], [2, 2], [2, 2]])


def test_replica_sharded_factory_has_flat_shard_shape_and_full_meta_shape():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        f = VariableFactory(
            lambda: np.arange(12, dtype=np.float32).reshape(3, 4), name="w", shard_over=4
        )
        assert f.replica_sharded
        assert f.shape == (3,) and f.meta_shape == (3, 4)
        with pytest.raises(ValueError, match="shard_over"):
            VariableFactory(lambda: np.zeros(8, np.float32), shard_over=8)


def test_replica_sharded_factory_initialises_the_full_tensor():
    ir = popxl.Ir(replication=2)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ir.main_graph:
        f = VariableFactory(lambda: data, name="w", shard_over=2)
        shard = f.create_tensor()
        stream = popxl.d2h_stream(shard.shape, shard.dtype, "out")
        ops.host_store(stream, shard + 0.0)
    assert shard.shape == (3,) and shard.meta_shape == (2, 3)
    with popxl.Session(ir, "ipu_model") as session:
        shards = session.run()[stream]
    np.testing.assert_array_equal(shards.reshape(2, 3), data)


def test_replica_groupings_property_mirrors_the_keys():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        half = ir.replica_grouping(group_size=1)
        facts = NamedVariableFactories.from_dict(
            {
                "a.w": VariableFactory(
                    lambda: np.zeros(1, np.float32), name="w", replica_grouping=half
                ),
                "b": VariableFactory(lambda: np.zeros(1, np.float32), name="b"),
            }
        )
    groupings = facts.replica_groupings
    assert isinstance(groupings, NamedReplicaGrouping)
    assert groupings.keys_flat() == ["a.w", "b"]
    assert groupings.a.w == half and groupings.b == ir.replica_grouping()


# NamedVariableFactories ------------------------------------------------------------------


def _factories(ir):
    with ir.main_graph:
        return NamedVariableFactories.from_dict(
            {
                "weight": VariableFactory(lambda: np.ones((2, 2), np.float32), name="weight"),
                "bias": VariableFactory(lambda: np.full(2, 3.0, np.float32), name="bias"),
                "a.z": VariableFactory(lambda: np.zeros(1, np.float32), name="z"),
            }
        )


def test_init_creates_variables_in_sorted_key_order_named_by_key():
    ir = popxl.Ir()
    facts = _factories(ir)
    assert facts.keys_flat() == ["weight", "bias", "a.z"]
    with ir.main_graph:
        variables = facts.init()
    assert isinstance(variables, NamedTensors)
    assert variables.keys_flat() == ["a.z", "bias", "weight"]
    assert [v.name for v in ir.main_graph.variables] == ["a.z", "bias", "weight"]
    assert facts.keys_flat() == ["weight", "bias", "a.z"]  # the factories keep their order
    data = _read(ir, variables.tensors)
    np.testing.assert_array_equal(data[variables.weight], np.ones((2, 2)))
    np.testing.assert_array_equal(data[variables.bias], [3.0, 3.0])


def test_init_with_prefix_names_variables_prefix_dot_key():
    ir = popxl.Ir()
    facts = _factories(ir)
    with ir.main_graph:
        variables = facts.init("layer")
    assert [t.name for t in variables.values_flat()] == ["layer.a.z", "layer.bias", "layer.weight"]


def test_a_second_init_gets_deduplicated_names_in_sorted_order():
    ir = popxl.Ir()
    facts = _factories(ir)
    with ir.main_graph:
        first = facts.init()
        second = facts.init()
    assert [t.name for t in first.values_flat()] == ["a.z", "bias", "weight"]
    assert [t.name for t in second.values_flat()] == ["a.z__t0", "bias__t1", "weight__t2"]
    assert set(first.tensors).isdisjoint(second.tensors)


def test_init_zero_and_init_undef_work_in_a_subgraph_in_insertion_order():
    ir = popxl.Ir()
    facts = _factories(ir)
    with ir.main_graph:
        graph = ir.create_empty_graph("accumulators")
        with graph:
            zeros = facts.init_zero()
            undef = facts.init_undef()
            for t in zeros.values_flat():
                popxl.graph_output(t)
        assert zeros.keys_flat() == ["weight", "bias", "a.z"]
        assert undef.keys_flat() == ["weight", "bias", "a.z"]
        assert [t.name for t in zeros.values_flat()] == ["weight", "bias", "a.z"]
        assert all(t in graph for t in zeros.values_flat() + undef.values_flat())
        assert [t.shape for t in zeros.values_flat()] == [(2, 2), (2,), (1,)]
        outs = ops.call(graph)
        streams = []
        for t in outs:
            s = popxl.d2h_stream(t.shape, t.dtype)
            ops.host_store(s, t)
            streams.append(s)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    for s, t in zip(streams, outs):
        np.testing.assert_array_equal(result[s], np.zeros(t.shape))


def test_init_empty_does_not_advance_the_data():
    ir = popxl.Ir()
    source = Counter()
    with ir.main_graph:
        facts = NamedVariableFactories(w=VariableFactory(source, name="w"))
        empty = facts.init(empty=True)
        full = facts.init()
    assert source.calls == 2
    np.testing.assert_array_equal(_read(ir, [full.w])[full.w], [1, 1])
    assert empty.w.shape == (2,)


def test_init_from_memmap_creates_and_fills_a_missing_file(tmp_path):
    ir = popxl.Ir()
    source = Counter()
    with ir.main_graph:
        facts = NamedVariableFactories(w=VariableFactory(source, name="w"))
        variables = facts.init(memmap_dir=str(tmp_path / "weights"))
    np.testing.assert_array_equal(np.load(tmp_path / "weights" / "w.npy"), [1, 1])
    assert source.calls == 2  # the peeked value filled the file
    np.testing.assert_array_equal(_read(ir, [variables.w])[variables.w], [1, 1])


def test_init_from_memmap_reuses_an_existing_file_without_drawing(tmp_path):
    np.save(tmp_path / "w.npy", np.full(2, 7.0, np.float32))
    ir = popxl.Ir()
    source = Counter()
    with ir.main_graph:
        facts = NamedVariableFactories(w=VariableFactory(source, name="w"))
        variables = facts.init(memmap_dir=str(tmp_path), read_only_if_exists=True)
    assert isinstance(variables.w._host_data, np.memmap) and variables.w._host_data.mode == "r"
    assert source.calls == 2
    with ir.main_graph:
        stream = popxl.d2h_stream((2,), F32)
        ops.host_store(stream, variables.w)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[stream], [7.0, 7.0])


def test_init_remote_creates_remote_variables_in_sorted_order():
    ir = popxl.Ir()
    facts = _factories(ir)
    with ir.main_graph:
        buffers = DotTree()  # any DotTree of buffers with the same keys
        for key, f in facts.to_dict().items():
            buffers.insert(key, popxl.remote_buffer(f.shape, f.dtype, 1), overwrite=True)
        remote = facts.init_remote(buffers, 0, prefix="r")
        loaded = ops.remote_load(buffers.bias, 0)
        stream = popxl.d2h_stream(loaded.shape, loaded.dtype)
        ops.host_store(stream, loaded)
    assert remote.keys_flat() == ["a.z", "bias", "weight"]
    assert [t.name for t in remote.values_flat()] == ["r.a.z", "r.bias", "r.weight"]
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[stream], [3.0, 3.0])


def test_init_remote_with_a_missing_buffer_raises_key_error():
    ir = popxl.Ir()
    facts = _factories(ir)
    with ir.main_graph:
        with pytest.raises(KeyError):
            facts.init_remote(NamedVariableFactories())


# Free functions ----------------------------------------------------------------------------


def test_add_variable_input_makes_an_input_and_a_matching_factory():
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_empty_graph("g")
        with graph:
            t, f = add_variable_input(
                "w", lambda: np.ones(3, np.float32), popxl.float16, by_ref=True
            )
    assert graph.inputs == (t,) and t in graph._by_ref_inputs
    assert t.name == "w" and t.dtype == popxl.float16 and t.shape == (3,)
    assert f.name == "w" and f.dtype == popxl.float16 and f.by_ref


def test_add_replica_sharded_variable_input_shards_over_the_whole_group_by_default():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        graph = ir.create_empty_graph("g")
        with graph:
            t, f = add_replica_sharded_variable_input("w", lambda: np.zeros((4, 2), np.float32))
            g2 = ir.replica_grouping(group_size=2)
            t2, f2 = add_replica_sharded_variable_input(
                "v", lambda: np.zeros((4, 2), np.float32), replica_grouping=g2
            )
    assert t.shape == (2,) and t.meta_shape == (4, 2)
    assert f.shape == (2,) and f.meta_shape == (4, 2) and f.replica_sharded
    assert t2.shape == (4,) and f2.replica_grouping == g2
