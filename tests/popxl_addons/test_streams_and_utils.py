"""InputStreams/OutputStreams, utils and named_replica_grouping (reference 1.14, 1.16, 1.20)."""

import logging

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.named_replica_grouping import (
    NamedReplicaGrouping,
    fill_none_group,
    get_ild_replica_grouping,
    get_ild_size_from_popdist,
    get_instance_replica_grouping,
    is_cross_ild,
    is_cross_instance,
)
from popxl_addons.utils import (
    OrderedDict,
    WeightsDict,
    duplicate_items,
    overrides,
    suffix_graph_name,
    timer,
)

F32 = popxl.float32


# Streams -----------------------------------------------------------------------------------


def test_input_and_output_streams_by_name_position_and_iteration():
    ir = popxl.Ir()
    with ir.main_graph:
        inputs = addons.InputStreams(x=((2,), F32), y=((), popxl.int32))
        outputs = addons.OutputStreams(out=((2,), F32))
        ops.host_store(
            outputs.out, ops.host_load(inputs.x) * ops.cast(ops.host_load(inputs[1]), F32)
        )
    assert isinstance(inputs, OrderedDict)
    assert inputs.x is inputs["x"] is inputs[0] and inputs[1] is inputs.y
    assert inputs[:2] == [inputs.x, inputs.y]
    assert list(inputs) == [inputs.x, inputs.y]  # iteration yields the streams
    assert list(inputs.keys()) == ["x", "y"]
    assert inputs.x.tensor_id == "x" and inputs.y.dtype == popxl.int32 and inputs.x.shape == (2,)
    with pytest.raises(AttributeError, match="x, y|'x', 'y'"):
        _ = inputs.z
    with pytest.raises(KeyError, match="Available keys"):
        inputs["z"]
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run({inputs.x: np.array([1.0, 2.0], np.float32), inputs.y: np.int32(3)})
    np.testing.assert_allclose(result[outputs.out], [3.0, 6.0])


def test_from_streams_keys_by_tensor_id():
    with popxl.Ir().main_graph:
        a = popxl.h2d_stream((1,), F32, "a")
        b = popxl.h2d_stream((1,), F32, "b")
    streams = addons.InputStreams.from_streams([b, a])
    assert list(streams.keys()) == ["b", "a"] and streams.a is a and streams[0] is b


# utils ---------------------------------------------------------------------------------------


def test_ordered_dict_idx():
    d = OrderedDict(a=1, b=2)
    assert d.idx(0) == 1 and d.idx(-1) == 2


def test_weights_dict_validates_dtype_and_host_shape():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        w = popxl.variable(np.zeros((2, 3), np.float32), name="w")
        grouped = popxl.variable(
            np.zeros((2, 3), np.float32),
            name="g",
            replica_grouping=ir.replica_grouping(group_size=1),
        )
    weights = WeightsDict({w: np.ones((2, 3), np.float32)})
    weights[grouped] = np.ones((2, 3), np.float32)  # host shape (num_groups, 3)
    assert len(weights) == 2 and list(weights) == [w, grouped]
    with pytest.raises(ValueError, match="dtype"):
        weights[w] = np.ones((2, 3), np.float64)
    with pytest.raises(ValueError, match="shape"):
        weights[w] = np.ones((3, 2), np.float32)
    with pytest.raises(ValueError, match="shape"):
        weights[grouped] = np.ones((3,), np.float32)
    del weights[w]
    assert list(weights) == [grouped]


def test_timer_logs_the_duration(caplog):
    with caplog.at_level(logging.INFO, logger="popxl_addons"):
        with timer("compile"):
            pass
    assert "compile:" in caplog.text and "mins" in caplog.text


def test_small_helpers():
    class Base:
        def f(self):
            pass

    class Child(Base):
        def f(self):
            pass

    assert overrides(Child, Base, "f") and not overrides(Base, Base, "f")
    assert duplicate_items([3, 1, 3, 2, 1, 3]) == [3, 1]
    assert suffix_graph_name("Linear_subgraph(3)", "bwd") == "Linear_bwd"
    assert suffix_graph_name("main", "recomp") == "main_recomp"


# named_replica_grouping ----------------------------------------------------------------------


def test_build_groups_maps_every_name_to_the_grouping():
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(group_size=2)
    groups = NamedReplicaGrouping.build_groups(["fc.weight", "fc.bias", "scale"], rg)
    assert groups.keys_flat() == ["fc.weight", "fc.bias", "scale"]
    assert all(g is rg for g in groups.values_flat())
    assert type(groups.fc) is NamedReplicaGrouping


def test_grouping_helpers_in_a_single_process():
    ir = popxl.Ir(replication=128)
    with ir.main_graph:
        assert (
            fill_none_group(None, 5) == 5
            and fill_none_group(ir.replica_grouping(), 5) == ir.replica_grouping()
        )
        assert get_instance_replica_grouping() == ir.replica_grouping()
        assert not is_cross_instance(ir.replica_grouping())
        assert get_ild_size_from_popdist() == 64
        full = ir.replica_grouping()
        ild = get_ild_replica_grouping(full)
        assert ild.group_size == 64 and ild.stride == 1
        assert is_cross_ild(full) and not is_cross_ild(ild) and not is_cross_ild(None)
        strided = ir.replica_grouping(stride=2, group_size=64)
        ild_strided = get_ild_replica_grouping(strided)
        assert ild_strided.stride == 2 and ild_strided.group_size == 32
        small = ir.replica_grouping(group_size=8)
        assert get_ild_replica_grouping(small) == small
    with popxl.Ir(replication=4).main_graph:
        assert get_ild_size_from_popdist() == 4
