"""Remote buffers, remote variables and replica-sharded (RTS) variables.

Replicated tests run with replicas mapped by ``jax.vmap`` and by ``jax.shard_map`` (the
``mode`` fixture).
"""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import dtypes, transforms
from popxl.ops import collectives
from popxl.remote_buffer import RemoteBuffer

from ..replication_helpers import mode  # noqa: F401  (the `mode` fixture)

F32 = popxl.float32


def _store(t, name=None):
    stream = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(stream, t)
    return stream


# RemoteBuffer API --------------------------------------------------------------------------


def test_buffer_ids_count_from_one_per_ir():
    with popxl.Ir().main_graph:
        first = RemoteBuffer((2,), popxl.int8, 1)
        second = popxl.remote_buffer((3,), popxl.int16, 2)
        assert (first.remote_buffer_id, second.remote_buffer_id) == (1, 2)
        assert isinstance(second, RemoteBuffer)
        assert (second.tensor_shape, second.tensor_dtype, second.entries) == ((3,), popxl.int16, 2)
    with popxl.Ir().main_graph:
        assert popxl.remote_buffer((2,), popxl.int8).remote_buffer_id == 1
        assert popxl.remote_buffer((2,), popxl.int8).entries == 1


def test_buffer_properties():
    with popxl.Ir().main_graph:
        buffer = popxl.remote_buffer((0,), popxl.int8)
    with pytest.raises(AttributeError):
        buffer.tensor_shape = (11, 11)
    with pytest.raises(AttributeError):
        buffer.tensor_dtype = popxl.int16
    buffer.entries = 3
    assert buffer.entries == 3
    assert buffer.meta_shape == ()
    buffer.meta_shape = [2, 2]
    assert buffer.meta_shape == (2, 2)
    buffer.set_remote_buffer_info(popxl.int16, (3, 11, 5), 42)
    assert (buffer.tensor_shape, buffer.tensor_dtype, buffer.entries) == (
        (3, 11, 5),
        popxl.int16,
        42,
    )
    assert isinstance(hash(buffer), int)


@pytest.mark.parametrize("entries", [0, -1])
def test_entries_must_be_positive(entries):
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="^Entries must be a non-zero, positive integer"):
            popxl.remote_buffer((2,), popxl.int8, entries)
        buffer = popxl.remote_buffer((2,), popxl.int8)
    with pytest.raises(ValueError, match="^Entries must be a non-zero, positive integer"):
        buffer.entries = entries


def test_validate_tensor_matches_buffer():
    with popxl.Ir(replication=2).main_graph:
        t = popxl.variable(np.zeros((1, 3, 5)), popxl.int8)
        popxl.remote_buffer((1, 3, 5), popxl.int8).validate_tensor_matches_buffer(t)
        for buffer in (
            popxl.remote_buffer((3, 5), popxl.int8),
            popxl.remote_buffer((1, 3, 5), popxl.int16),
        ):
            with pytest.raises(ValueError, match="does not match buffer"):
                buffer.validate_tensor_matches_buffer(t)
            with pytest.raises(ValueError, match="does not match buffer"):
                ops.remote_store(buffer, 0, t)
            with pytest.raises(ValueError, match="does not match buffer"):
                ops.remote_load_(buffer, 0, t)
        # A shard matches a sharded buffer through its meta-shape.
        shard = collectives.replica_sharded_slice(popxl.variable(np.zeros((2, 3), np.float32)))
        sharded = popxl.remote_buffer((4,), F32)
        sharded.meta_shape = (2, 3)
        sharded.validate_tensor_matches_buffer(shard, num_shards=2)
        with pytest.raises(ValueError, match="does not match buffer"):
            sharded.validate_tensor_matches_buffer(shard)


def test_load_spec_and_offset_validation():
    with popxl.Ir().main_graph:
        buffer = popxl.remote_buffer((2, 3), popxl.float16, 2)
        loaded = ops.remote_load(buffer, 1, "w")
        assert (loaded.shape, loaded.dtype, loaded.name) == (
            (2, 3),
            popxl.float16,
            "w_remote_loaded",
        )
        with pytest.raises(ValueError, match="offset"):
            ops.remote_load(buffer, popxl.constant(1.0))
        with pytest.raises(ValueError, match="out of range"):
            popxl.remote_variable(np.zeros((2, 3), np.float16), buffer, 2)


# Loads and stores --------------------------------------------------------------------------


def test_store_load_and_load_inplace(rng):
    """The reference's store/load scenario: two buffers, tensor and int offsets."""
    data = {
        "store_1": rng.random((1, 3, 5)).astype(np.float32),
        "store_2": rng.random((7, 11)).astype(np.float16),
        "store_3": rng.random((7, 11)).astype(np.float16),
    }
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        v = {name: popxl.variable(x, name=name) for name, x in data.items()}
        target_1 = popxl.variable(np.zeros((1, 3, 5), np.float32), name="target_1")
        target_3 = popxl.variable(np.zeros((7, 11), np.float16), name="target_3")
        buffer_1 = RemoteBuffer((1, 3, 5), popxl.float32, 1)
        offset_1 = popxl.constant(0, name="offset_1")
        ops.remote_store(buffer_1, offset_1, v["store_1"])
        out_1 = ops.remote_load(buffer_1, offset_1, "load_out_1")
        out_1_inplace = ops.remote_load_(buffer_1, offset_1, target_1)
        buffer_2 = RemoteBuffer((7, 11), popxl.float16, 2)
        ops.remote_store(buffer_2, popxl.constant(0), v["store_2"])
        ops.remote_store(buffer_2, 1, v["store_3"])
        out_2 = ops.remote_load(buffer_2, popxl.constant(0))
        out_3_inplace = ops.remote_load_(buffer_2, 1, target_3)
        outs = [out_1, out_1_inplace, target_1, out_2, out_3_inplace, target_3]
        streams = [_store(t) for t in outs]
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
        host_target = session.get_tensor_data(target_1)
    got = [result[s] for s in streams]
    expected = [data["store_1"]] * 3 + [data["store_2"]] + [data["store_3"]] * 2
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g, e)
    np.testing.assert_array_equal(host_target, data["store_1"])  # remote_load_ overwrote it


def test_several_buffers_and_dtypes_with_runtime_offsets():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        ints = popxl.remote_buffer((3,), popxl.int32, 4)
        halves = popxl.remote_buffer((2, 2), popxl.float16, 3)
        where_in = popxl.h2d_stream((), popxl.int32, "where")
        x_in = popxl.h2d_stream((3,), popxl.int32, "x")
        where = ops.host_load(where_in)
        ops.remote_store(ints, where, ops.host_load(x_in))
        ops.remote_store(halves, 2, popxl.constant(np.full((2, 2), 0.5, np.float16)))
        loaded = [ops.remote_load(ints, k) for k in range(4)]
        streams = [_store(t) for t in loaded] + [_store(ops.remote_load(halves, 2))]
    with popxl.Session(ir, "ipu_model") as session:
        session.run({where_in: np.int32(2), x_in: np.array([1, 2, 3], np.int32)})
        result = session.run({where_in: np.int32(0), x_in: np.array([7, 8, 9], np.int32)})
    got = [result[s] for s in streams]
    np.testing.assert_array_equal(got[0], [7, 8, 9])
    np.testing.assert_array_equal(got[1], [0, 0, 0])  # never written: zero-initialised
    np.testing.assert_array_equal(got[2], [1, 2, 3])  # written by the first run
    np.testing.assert_array_equal(got[4], np.full((2, 2), 0.5, np.float16))
    assert got[4].dtype == np.float16


def test_stores_and_loads_inside_repeat_with_the_loop_counter():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buffer = popxl.remote_buffer((2,), F32, 4)

        def fill(i, x):
            ops.remote_store(buffer, i, x)
            return i + 1, x * 2.0

        def total(i, acc):
            return i + 1, acc + ops.remote_load(buffer, i)

        u32 = popxl.TensorSpec((), popxl.uint32)
        vec = popxl.TensorSpec((2,), F32)
        fill_graph = ir.create_graph(fill, u32, vec)
        total_graph = ir.create_graph(total, u32, vec)
        ops.repeat(fill_graph, 4, popxl.constant(0, popxl.uint32), popxl.constant([1.0, -1.0]))
        _, acc = ops.repeat(
            total_graph, 4, popxl.constant(0, popxl.uint32), popxl.constant([0.0, 0.0])
        )
        slots = [_store(ops.remote_load(buffer, k)) for k in range(4)]
        acc_out = _store(acc)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    for k, s in enumerate(slots):
        np.testing.assert_array_equal(result[s], [2.0**k, -(2.0**k)])
    np.testing.assert_array_equal(result[acc_out], [15.0, -15.0])


def _counter_program(replication=1):
    """Each run: load slot 0, add the input, store it back, stream the new value."""
    ir = popxl.Ir(replication=replication)
    with ir.main_graph, popxl.in_sequence():
        buffer = popxl.remote_buffer((2,), F32, 1)
        x_in = popxl.h2d_stream((2,), F32, "x")
        value = ops.remote_load(buffer, 0) + ops.host_load(x_in)
        ops.remote_store(buffer, 0, value)
        out = _store(value)
    return ir, x_in, out


def test_contents_persist_across_runs_and_detach_attach():
    ir, x_in, out = _counter_program()
    session = popxl.Session(ir, "ipu_model")
    one = np.ones(2, np.float32)
    with session:
        assert session.run({x_in: one})[out].tolist() == [1.0, 1.0]
        assert session.run({x_in: one})[out].tolist() == [2.0, 2.0]
    with session:
        assert session.run({x_in: 2 * one})[out].tolist() == [4.0, 4.0]


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas", [2, 4])
def test_each_replica_has_its_own_buffer(replicas):
    ir, x_in, out = _counter_program(replicas)
    xs = np.arange(replicas * 2, dtype=np.float32).reshape(replicas, 2)
    with popxl.Session(ir, "ipu_model") as session:
        session.run({x_in: xs})
        got = session.run({x_in: xs})[out]
    np.testing.assert_array_equal(got, 2 * xs)


# Remote variables --------------------------------------------------------------------------


def test_remote_variable_doc_example():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x = np.array(1).astype(np.int32)
        buffer = popxl.remote_buffer(x.shape, dtypes.int32, 1)
        remote_x = popxl.remote_variable(x, buffer, 0)
        loaded_x = ops.remote_load(buffer, 0)
        ops.var_updates.accumulate_(loaded_x, popxl.variable(2))
        ops.remote_store(buffer, 0, loaded_x)
        y_d2h = _store(loaded_x)
    with popxl.Session(ir, "ipu_model") as session:
        outputs = session.run({})
        final_weight = session.get_tensor_data(remote_x)
    assert outputs[y_d2h] == 3
    assert final_weight == 3


def test_remote_variables_share_a_buffer_and_are_read_and_written_by_the_session():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buffer = popxl.remote_buffer((2,), F32, 3)
        a = popxl.remote_variable(np.array([1.0, 2.0], np.float32), buffer, 0, name="a")
        b = popxl.remote_variable(np.array([5.0, 6.0], np.float32), buffer, 2, name="b")
        assert a.shape == b.shape == (2,)
        loaded_b = ops.remote_load(buffer, 2)
        ops.remote_store(buffer, 2, loaded_b * 10.0)
        streams = [_store(ops.remote_load(buffer, k)) for k in range(3)]
    session = popxl.Session(ir, "ipu_model")
    with session:
        result = session.run()
        np.testing.assert_array_equal(result[streams[0]], [1.0, 2.0])
        np.testing.assert_array_equal(result[streams[2]], [50.0, 60.0])
        np.testing.assert_array_equal(session.get_tensor_data(b), [50.0, 60.0])
        session.write_variable_data(a, np.array([7.0, 8.0], np.float32))  # uploads into slot 0
        result = session.run()
        np.testing.assert_array_equal(result[streams[0]], [7.0, 8.0])
        np.testing.assert_array_equal(result[streams[2]], [500.0, 600.0])  # not reset
    session.write_variable_data(b, np.array([1.0, 1.0], np.float32))  # detached: host only
    np.testing.assert_array_equal(session.get_tensor_data(b), [1.0, 1.0])
    with session:  # weights_from_host writes it into its slot
        np.testing.assert_array_equal(session.run()[streams[2]], [10.0, 10.0])


@pytest.mark.usefixtures("mode")
def test_grouped_remote_variable_doc_example():
    ir = popxl.Ir(replication=2)
    num_groups = 2
    v_h = np.arange(0, num_groups * 32).reshape((num_groups, 32))
    rg = ir.replica_grouping(group_size=ir.replication_factor // num_groups)
    with ir.main_graph, popxl.in_sequence():
        remote_buffer = popxl.remote_buffer((32,), dtypes.int32)
        remote_v = popxl.remote_variable(v_h, remote_buffer, replica_grouping=rg)
        v = ops.remote_load(remote_buffer, 0)
        v += 1
        ops.remote_store(remote_buffer, 0, v)
        out = _store(v)
    with popxl.Session(ir, "ipu_model") as sess:
        streamed = sess.run()[out]
    assert np.array_equiv(sess.get_tensor_data(remote_v), v_h + 1)
    np.testing.assert_array_equal(streamed, v_h + 1)  # replica r holds group r's value


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("retrieval_mode", ["one_per_group", "all_replicas"])
def test_grouped_remote_variable_retrieval_modes(retrieval_mode):
    """4 replicas in 2 groups (stride 2); each replica adds its own input."""
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(stride=2, group_size=2)  # assignment [0, 1, 0, 1]
    data = np.array([[1.0, 2.0], [10.0, 20.0]], np.float32)
    with ir.main_graph, popxl.in_sequence():
        buffer = popxl.remote_buffer((2,), F32)
        var = popxl.remote_variable(
            data, buffer, replica_grouping=rg, retrieval_mode=retrieval_mode
        )
        x_in = popxl.h2d_stream((), F32, "x")
        ops.remote_store(buffer, 0, ops.remote_load(buffer, 0) + ops.host_load(x_in))
    xs = np.array([0.0, 0.0, 0.0, 0.5], np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        session.run({x_in: xs})
        got = session.get_tensor_data(var)
    if retrieval_mode == "one_per_group":
        np.testing.assert_array_equal(got, data)  # first replica of each group
    else:
        np.testing.assert_array_equal(got, data[[0, 1, 0, 1]] + xs[:, None])


@pytest.mark.parametrize(
    "shape, dtype, grouping_args",
    [((2, 2, 2), F32, (1, 2)), ((2, 2), popxl.float16, (1, 2)), ((2, 3), F32, (1, 1))],
)
def test_remote_variable_must_fit_its_slot(shape, dtype, grouping_args):
    """A single group of 2 given (2, 2, 2) data in a (2, 2) buffer (upstream's
    test_d2hWeightBuffer_elision): PopART silently copied the first slot-size bytes."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        buffer = popxl.remote_buffer((2, 2), F32)
        grouping = ir.replica_grouping(*grouping_args)
        var = popxl.remote_variable(np.ones(shape), buffer, dtype=dtype, replica_grouping=grouping)
        _store(ops.remote_load(buffer, 0))
    per_replica = shape[1:] if grouping.num_groups > 1 else shape
    groups = "1 group" if grouping.num_groups == 1 else f"{grouping.num_groups} groups"
    with pytest.raises(ValueError) as info:
        popxl.Session(ir, "ipu_model")
    assert str(info.value).startswith(
        f"Remote variable {var.id} is {dtype.name}{per_replica} on each replica, but its slot 0 "
        "of remote buffer 1 holds float32(2, 2)."
    )
    assert f"has {groups})." in str(info.value)


@pytest.mark.parametrize("grouping_args", [(1, 2), (1, 1)])
def test_remote_variable_of_the_slot_size_but_another_shape(grouping_args):
    """As PopART copied bytes, a variable with as many elements as its slot is stored
    row-major (upstream's test_replica_grouping puts (1, 1) variables in (1,) slots)."""
    ir = popxl.Ir(replication=2)
    grouping = ir.replica_grouping(*grouping_args)
    data = np.arange(4 * grouping.num_groups, dtype=np.float32).reshape(-1, 1, 4)
    data = data if grouping.num_groups > 1 else data[0]  # (1, 4) per replica
    with ir.main_graph:
        buffer = popxl.remote_buffer((2, 2), F32)
        var = popxl.remote_variable(data, buffer, replica_grouping=grouping)
        loaded = ops.remote_load(buffer, 0)
        out = _store(loaded)
        ops.remote_store(buffer, 0, loaded * 10.0)
    assert var.shape == (1, 4) and loaded.shape == (2, 2)
    with popxl.Session(ir, "ipu_model") as session:
        streamed = session.run()[out]
        got = session.get_tensor_data(var)
    per_replica = data if grouping.num_groups > 1 else np.stack([data, data])
    np.testing.assert_array_equal(streamed, per_replica.reshape(2, 2, 2))
    np.testing.assert_array_equal(got, data * 10.0)
    assert got.shape == data.shape


# Replica-sharded variables ------------------------------------------------------------------


@pytest.mark.usefixtures("mode")
def test_remote_rts_variable_doc_example():
    ir = popxl.Ir()
    ir.replication_factor = 2
    ir.num_host_transfers = 1
    with ir.main_graph, popxl.in_sequence():
        x = np.array([1, 2]).astype(np.int32)
        buffer = popxl.remote_buffer((x.size // 2,), dtypes.int32, 1)
        remote_x = popxl.remote_replica_sharded_variable(x, buffer, 0)
        loaded_x = ops.remote_load(buffer, 0)
        assert (loaded_x.shape, loaded_x.meta_shape) == ((1,), (2,))
        full_x = collectives.replicated_all_gather(loaded_x)
        ops.var_updates.accumulate_(full_x, popxl.variable([3, 4]))
        updated_shard = collectives.replica_sharded_slice(full_x)
        ops.remote_store(buffer, 0, updated_shard)
        gathered = _store(full_x)
    with popxl.Session(ir, "ipu_model") as session:
        outputs = session.run({})
        final_weight = session.get_tensor_data(remote_x)
    np.testing.assert_array_equal(final_weight, [4, 6])
    np.testing.assert_array_equal(outputs[gathered], [[4, 6], [4, 6]])
    assert buffer.meta_shape == (2,)


@pytest.mark.usefixtures("mode")
def test_remote_rts_variable_in_a_buffer_with_larger_slots():
    """PopXL accepts a full-shape buffer for an RTS variable: each shard fills the start of
    its replica's slot, the rest is zero, and the session reads the shards back."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        buffer = popxl.RemoteBuffer((4,), F32, 1)
        x = popxl.remote_replica_sharded_variable(np.array([1, 2, 3, 4], np.float32), buffer, 0)
        assert x.shape == (2,) and x.meta_shape == (4,)
        slots = _store(ops.remote_load(buffer, 0))
    with popxl.Session(ir) as session:
        outputs = session.run()
        np.testing.assert_array_equal(session.get_tensor_data(x), [1, 2, 3, 4])
        session.write_variable_data(x, np.array([5, 6, 7, 8], np.float32))
        outputs_after = session.run()
        np.testing.assert_array_equal(session.get_tensor_data(x), [5, 6, 7, 8])
    np.testing.assert_array_equal(outputs[slots], [[1, 2, 0, 0], [3, 4, 0, 0]])
    np.testing.assert_array_equal(outputs_after[slots], [[5, 6, 0, 0], [7, 8, 0, 0]])


@pytest.mark.usefixtures("mode")
def test_rts_variable_doc_example():
    ir = popxl.Ir()
    ir.replication_factor = 2
    with ir.main_graph, popxl.in_sequence():
        x = np.array([1, 2]).astype(np.int32)
        remote_x, loaded_x = popxl.replica_sharded_variable(x, dtypes.int32)
        assert loaded_x.name == f"{remote_x.name}_rts"
        assert (loaded_x.shape, loaded_x.meta_shape) == ((1,), (2,))
        sharded_y = collectives.replica_sharded_slice(popxl.variable([3, 4]))
        ops.var_updates.accumulate_(loaded_x, sharded_y)
    with popxl.Session(ir, "ipu_model") as session:
        session.run({})
    np.testing.assert_array_equal(session.get_tensor_data(remote_x), [4, 6])
    with session:  # reloaded from the host value, updated again
        session.run({})
    np.testing.assert_array_equal(session.get_tensor_data(remote_x), [7, 10])


def test_rts_variable_with_python_list_data_keeps_the_downcast_dtype():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        var, shard = popxl.replica_sharded_variable([1, 2])
        assert var.dtype == shard.dtype == popxl.int32
        assert ir._remote_buffers[0].tensor_dtype == popxl.int32


@pytest.mark.usefixtures("mode")
def test_shard_over_smaller_than_the_group_repeats_the_shards():
    ir = popxl.Ir(replication=4)
    with ir.main_graph, popxl.in_sequence():
        var, shard = popxl.replica_sharded_variable(np.array([1.0, 2.0], np.float32), shard_over=2)
        assert shard.shape == (1,)
        shard_out = _store(shard)
        full = collectives.replicated_all_gather(shard, group=ir.replica_grouping(1, 2))
        full_out = _store(full)
        shard += 1.0
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    np.testing.assert_array_equal(result[shard_out], [[1.0], [2.0], [1.0], [2.0]])
    np.testing.assert_array_equal(result[full_out], [[1.0, 2.0]] * 4)
    np.testing.assert_array_equal(session.get_tensor_data(var), [2.0, 3.0])


@pytest.mark.usefixtures("mode")
def test_grouped_rts_variable_reads_and_writes_the_full_value():
    """4 replicas, 2 groups of 2; 3 elements per group padded to 2 shards of 2."""
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(1, 2)
    data = np.array([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]], np.float32)
    with ir.main_graph, popxl.in_sequence():
        buffer = popxl.replica_sharded_buffer(data.shape, F32, rg)
        assert (buffer.tensor_shape, buffer.meta_shape) == ((2,), (3,))
        var = popxl.remote_replica_sharded_variable(data, buffer, 0, replica_grouping=rg)
        assert var.shape_on_host == (2, 3)
        shard = ops.remote_load(buffer, 0)
        shard_out = _store(shard)
        ops.remote_store(buffer, 0, shard * 2.0)
        full_out = _store(collectives.replicated_all_gather(shard, group=rg))
    session = popxl.Session(ir, "ipu_model")
    with session:
        result = session.run()
        np.testing.assert_array_equal(result[shard_out], [[1, 2], [3, 0], [10, 20], [30, 0]])
        np.testing.assert_array_equal(result[full_out], data[[0, 0, 1, 1]])
        np.testing.assert_array_equal(session.get_tensor_data(var), 2 * data)
        session.write_variable_data(var, np.array([[5, 6, 7], [8, 9, 0]], np.float32))
        result = session.run()
        np.testing.assert_array_equal(result[full_out], [[5, 6, 7]] * 2 + [[8, 9, 0]] * 2)
    np.testing.assert_array_equal(session.get_tensor_data(var), [[10, 12, 14], [16, 18, 0]])


@pytest.mark.usefixtures("mode")
def test_rts_variable_all_replicas_retrieval():
    """Each replica's full value is gathered from the shards of its group."""
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(1, 2)
    data = np.array([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]], np.float32)
    with ir.main_graph:
        var, shard = popxl.replica_sharded_variable(
            data, replica_grouping=rg, retrieval_mode="all_replicas"
        )
        shard += 1.0
    session = popxl.Session(ir, "ipu_model")
    np.testing.assert_array_equal(session.get_tensor_data(var), data[[0, 0, 1, 1]])
    with session:
        session.run()
    np.testing.assert_array_equal(session.get_tensor_data(var), data[[0, 0, 1, 1]] + 1.0)


def test_replica_sharded_buffer_shapes():
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        full = popxl.replica_sharded_buffer((3, 5), F32)
        assert (full.tensor_shape, full.meta_shape) == ((2,), (3, 5))  # ceil(15 / 8)
        grouped = popxl.replica_sharded_buffer(
            (2, 4, 2), F32, ir.replica_grouping(1, 4), shard_over=2
        )
        assert (grouped.tensor_shape, grouped.meta_shape) == ((4,), (4, 2))


@pytest.mark.parametrize(
    "replicas,group_size,shard_over", [(8, None, 16), (8, 4, 8), (8, 4, 3), (4, None, 0)]
)
def test_shard_over_must_divide_the_group(replicas, group_size, shard_over):
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        rg = ir.replica_grouping(1, group_size)
        with pytest.raises(ValueError, match="shard_over"):
            popxl.replica_sharded_buffer((4,), F32, rg, shard_over)
        with pytest.raises(ValueError, match="shard_over"):
            popxl.replica_sharded_variable(
                np.zeros(4, np.float32), replica_grouping=rg, shard_over=shard_over
            )


def test_rts_needs_replication():
    message = "The IR's global replication factor is 1. It must be greater than 1"
    with popxl.Ir().main_graph:
        buffer = popxl.remote_buffer((1,), F32)
        with pytest.raises(ValueError, match=message):
            popxl.remote_replica_sharded_variable(np.zeros(2, np.float32), buffer)
        with pytest.raises(ValueError, match=message):
            popxl.replica_sharded_variable(np.zeros(2, np.float32))


def test_rts_buffer_meta_shape_must_agree():
    with popxl.Ir(replication=2).main_graph:
        buffer = popxl.remote_buffer((2,), F32, 2)
        popxl.remote_replica_sharded_variable(np.zeros(4, np.float32), buffer, 0)
        assert buffer.meta_shape == (4,)
        with pytest.raises(ValueError, match="meta-shape"):
            popxl.remote_replica_sharded_variable(np.zeros((2, 2), np.float32), buffer, 1)


# An RTS optimiser step -----------------------------------------------------------------------


@pytest.mark.usefixtures("mode")
@pytest.mark.parametrize("replicas", [2, 4])
def test_rts_sgd_step_matches_numpy(replicas, rng):
    """Gather the sharded weight, compute, differentiate, reduce-scatter the gradient into
    shards, update the shard, store it: over two runs, against NumPy."""
    w0 = rng.normal(size=(3, 2)).astype(np.float32)  # 6 elements: padded for 4 replicas
    lr = 0.1
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        x_in = popxl.h2d_stream((4, 3), F32, "x")
        t_in = popxl.h2d_stream((4, 2), F32, "target")
        buffer = popxl.replica_sharded_buffer(w0.shape, F32)
        w = popxl.remote_replica_sharded_variable(w0, buffer, 0, name="w")
        graph = ir.create_graph(
            lambda x, weight: x @ weight,
            popxl.TensorSpec((4, 3), F32),
            popxl.TensorSpec((3, 2), F32),
        )
        info = transforms.autodiff(graph, grads_required=[graph.inputs[1]])
        with popxl.in_sequence():
            x, target = ops.host_load(x_in), ops.host_load(t_in)
            shard = ops.remote_load(buffer, 0)
            full = collectives.replicated_all_gather(shard)
            site = ops.call_with_info(graph, x, full)
            (y,) = site.outputs
            (dw,) = ops.call(info.graph, y - target, inputs_dict=info.inputs_dict(site))
            grad_shard = collectives.replicated_reduce_scatter(
                dw, "add", configure_output_for_replicated_tensor_sharding=True
            )
            assert grad_shard.meta_shape == (3, 2)
            ops.var_updates.accumulate_(shard, grad_shard, -lr)
            ops.remote_store(buffer, 0, shard)
            gathered = _store(collectives.replicated_all_gather(shard))
    xs = rng.normal(size=(2, replicas, 4, 3)).astype(np.float32)
    ts = rng.normal(size=(2, replicas, 4, 2)).astype(np.float32)
    expected = w0
    with popxl.Session(ir, "ipu_model") as session:
        for step in range(2):
            result = session.run({x_in: xs[step], t_in: ts[step]})
            grad = sum(
                xs[step, r].T @ (xs[step, r] @ expected - ts[step, r]) for r in range(replicas)
            )
            expected = expected - lr * grad
            np.testing.assert_allclose(
                result[gathered], np.broadcast_to(expected, (replicas, 3, 2)), rtol=1e-5, atol=1e-6
            )
    np.testing.assert_allclose(session.get_tensor_data(w), expected, rtol=1e-5, atol=1e-6)
