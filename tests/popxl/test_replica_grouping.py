"""``ReplicaGrouping``: construction, validation, assignment, transpose, non-constant groups."""

import pytest

import popxl


def test_cannot_be_constructed_directly():
    with pytest.raises(RuntimeError):
        popxl.ReplicaGrouping()


@pytest.mark.parametrize(
    "stride,group_size,assignment",
    [
        (1, 2, [0, 0, 1, 1, 2, 2, 3, 3]),
        (1, 4, [0, 0, 0, 0, 1, 1, 1, 1]),
        (2, 4, [0, 1, 0, 1, 0, 1, 0, 1]),
        (4, 2, [0, 1, 2, 3, 0, 1, 2, 3]),
        (2, 2, [0, 1, 0, 1, 2, 3, 2, 3]),
        (1, 1, [0, 1, 2, 3, 4, 5, 6, 7]),
        (1, 8, [0] * 8),
        (1, None, [0] * 8),
        (2, None, [0, 1, 0, 1, 0, 1, 0, 1]),
    ],
)
def test_assignments(stride, group_size, assignment):
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping(stride, group_size)
    assert rg.assignment == assignment
    assert rg.is_const and rg.const_rg is rg
    assert rg.group_size == assignment.count(0)
    assert rg.num_groups == 8 // rg.group_size
    assert rg.to_device_map is None and rg.to_host_map is None


def test_defaults_and_stride_normalisation():
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping()
    assert (rg.stride, rg.group_size, rg.num_groups) == (1, 8, 1)
    assert ir.replica_grouping(8, 1).stride == 1  # group_size 1 normalises the stride
    assert popxl.Ir().replica_grouping().assignment == [0]


@pytest.mark.parametrize(
    "stride,group_size", [(0, 1), (3, None), (16, None), (-1, 2), (1, 0), (1, 16), (1, 3), (2, 8)]
)
def test_invalid_parameters(stride, group_size):
    ir = popxl.Ir(replication=8)
    with pytest.raises(ValueError):
        ir.replica_grouping(stride, group_size)


def test_repr():
    ir = popxl.Ir(replication=8)
    assert repr(ir.replica_grouping(2, 4)) == (
        "ReplicaGrouping(num_replicas=8, stride=2, group_size=4, num_groups=2)"
    )
    rg = ir.replica_grouping_from_assignments([0, 0, 1, 1, 0, 0, 1, 1])
    assert repr(rg) == "ReplicaGrouping(assignment=[0, 0, 1, 1, 0, 0, 1, 1])"


def test_equality():
    ir = popxl.Ir(replication=8)
    assert ir.replica_grouping() == ir.replica_grouping(1, 8)
    assert ir.replica_grouping(1, 2) != ir.replica_grouping(2, 2)
    assert ir.replica_grouping(1, 4) != popxl.Ir(replication=8).replica_grouping(1, 4)
    assert ir.replica_grouping_from_assignments([0, 1, 0, 1, 0, 1, 0, 1]) == ir.replica_grouping(
        2, 4
    )
    with pytest.raises(TypeError):
        _ = ir.replica_grouping() == 1
    assert len({ir.replica_grouping(), ir.replica_grouping(1, 8)}) == 1


@pytest.mark.parametrize(
    "params,expected", [((1, 1), (1, 16)), ((1, 4), (4, 4)), ((2, 8), (1, 2)), ((8, 2), (1, 8))]
)
def test_transpose_constant(params, expected):
    ir = popxl.Ir(replication=16)
    rg = ir.replica_grouping(*params).transpose()
    assert (rg.stride, rg.group_size) == expected


def test_transpose_to_and_from_non_constant():
    ir = popxl.Ir(replication=8)
    t = ir.replica_grouping(2, 2).transpose()
    assert not t.is_const and t.assignment == [0, 0, 1, 1, 0, 0, 1, 1]
    back = t.transpose()
    assert back.is_const and back.assignment == [0, 1, 0, 1, 2, 3, 2, 3]


def test_non_constant_grouping():
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping_from_assignments([0, 0, 1, 1, 0, 0, 1, 1])
    assert not rg.is_const
    with pytest.raises(NotImplementedError):
        _ = rg.stride
    assert (rg.group_size, rg.num_groups) == (4, 2)
    assert rg.const_rg.assignment == [0, 0, 1, 1, 2, 2, 3, 3]
    assert rg.to_device_map == [0, 1, 0, 1]
    assert rg.to_host_map == [0, 1]


def test_from_assignments_returns_constant_when_possible():
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping_from_assignments([0, 1, 2, 3, 0, 1, 2, 3])
    assert rg.is_const and (rg.stride, rg.group_size) == (4, 2)


@pytest.mark.parametrize(
    "assignment",
    [
        [0, 0, 1],
        [1, 1, 0, 0, 0, 0, 1, 1],
        [0, 0, 0, 1, 1, 1, 2, 2],
        [0, 2, 1, 1, 0, 0, 2, 2],
        [0, 0, 2, 2, 0, 0, 2, 2],
    ],
)
def test_from_assignments_validation(assignment):
    ir = popxl.Ir(replication=8)
    with pytest.raises(ValueError):
        ir.replica_grouping_from_assignments(assignment)


# PopART's VariableSettings view (ReplicaGrouping._to_variable_settings) ------------------------


@pytest.mark.parametrize(
    "replicas, stride, group_size, groups",
    [
        (2, 1, 2, [[0, 1]]),
        (4, 2, 2, [[0, 2], [1, 3]]),
        (4, 1, 2, [[0, 1], [2, 3]]),
        (2, 1, 1, [[0], [1]]),
        (8, 2, 4, [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ],
)
def test_variable_settings_groups(replicas, stride, group_size, groups):
    rg = popxl.Ir(replication=replicas).replica_grouping(stride=stride, group_size=group_size)
    for mode in ("one_per_group", "all_replicas", None):
        settings = rg._to_variable_settings(mode)
        assert settings.groups(replicas) == groups == rg.members
        assert settings.group_count(replicas) == len(groups)
    assert rg._to_variable_settings().retrieval_mode == "one_per_group"
    assert rg._to_variable_settings("all_replicas").retrieval_mode == "all_replicas"


def test_variable_settings_groups_for_another_replica_count():
    settings = (
        popxl.Ir(replication=4).replica_grouping(stride=2, group_size=2)._to_variable_settings()
    )
    assert settings.groups(8) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    with pytest.raises(ValueError, match="stride=2 and group_size=2 do not split 3 replicas"):
        settings.groups(3)


def test_variable_settings_of_a_grouping_without_constant_stride():
    rg = popxl.Ir(replication=4).replica_grouping_from_assignments([0, 1, 1, 0])
    settings = rg._to_variable_settings("all_replicas")
    assert settings.groups(4) == [[0, 3], [1, 2]]
    with pytest.raises(ValueError, match="made for 4 replicas and has no constant stride"):
        settings.groups(8)


def test_variable_settings_rejects_an_unknown_retrieval_mode():
    rg = popxl.Ir(replication=2).replica_grouping()
    with pytest.raises(ValueError, match="Invalid retrieval_mode: first. Use 'one_per_group'"):
        rg._to_variable_settings("first")
