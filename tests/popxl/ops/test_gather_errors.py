"""Argument and shape errors of the gather, scatter, one-hot and dynamic-slice ops."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException


@pytest.fixture
def main():
    ir = popxl.Ir()
    with ir.main_graph:
        yield ir


def _f32(*shape):
    return popxl.variable(np.zeros(shape, np.float32))


def _i32(values):
    return popxl.variable(np.array(values, np.int32), popxl.int32)


def test_gather_indices_must_be_int(main):
    with pytest.raises(TypeError, match="`indices` must have an integer dtype"):
        ops.gather(_f32(3, 2), _f32(2))


def test_gather_indices_must_be_a_tensor(main):
    with pytest.raises(TypeError, match="`indices` is not a Tensor"):
        ops.gather(_f32(3, 2), [0, 1])


def test_gather_axis_out_of_range(main):
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        ops.gather(_f32(3, 2), _i32([0]), axis=2)


def test_gather_output_name_and_type(main):
    out = ops.tied_gather(_f32(3, 2), _i32([[0, 1]]), axis=1)
    assert out.name == "tiedgather_out" and out.shape == (3, 1, 2)
    assert ops.gather(_f32(3, 2), _i32([0, 2])).name == "gather_out"


def test_groupedgather_axis0_with_groups(main):
    with pytest.raises(ValueError, match="axis 0 is the group dimension"):
        ops.groupedgather(_f32(2, 3), _i32([[0], [1]]), axis=0, group_size=2)


def test_groupedgather_group_dims_must_match(main):
    with pytest.raises(PopXLException, match="must be the group dimension of size 2"):
        ops.groupedgather(_f32(3, 4), _i32([[0], [1]]), axis=1, group_size=2)


def test_groupedgather_group_size_positive(main):
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        ops.groupedgather(_f32(2, 3), _i32([[0], [1]]), axis=1, group_size=0)


def test_scatter_ranks_must_match(main):
    with pytest.raises(PopXLException, match="same rank"):
        ops.scatter(_f32(3, 2), _i32([0, 1]), _f32(2))


def test_scatter_indices_and_values_same_shape(main):
    with pytest.raises(PopXLException, match="same shape"):
        ops.scatter(_f32(3, 2), _i32([[0, 1]]), _f32(2, 2))


def test_scatter_indices_larger_than_t(main):
    with pytest.raises(PopXLException, match="larger than `t`"):
        ops.scatter(_f32(3, 2), _i32([[0, 1, 2]]), _f32(1, 3))


def test_scatter_dtype_mismatch(main):
    with pytest.raises(PopXLException, match="dtype int32 but `t` has float32"):
        ops.scatter(_f32(3, 2), _i32([[0, 1]]), _i32([[0, 1]]))


def test_scatter_reduce_bad_reduction(main):
    with pytest.raises(ValueError, match="reduction must be one of"):
        ops.scatter_reduce(_f32(3, 2), _i32([0, 1, 0]), "mean", axis_size=2)


def test_scatter_reduce_needs_axis_size_or_initial_values(main):
    with pytest.raises(ValueError, match="one of initial_values and axis_size must be specified"):
        ops.scatter_reduce(_f32(3, 2), _i32([0, 1, 0]), "sum")


def test_scatter_reduce_axis_size_positive(main):
    with pytest.raises(ValueError, match="axis_size must be >= 1"):
        ops.scatter_reduce(_f32(3, 2), _i32([0, 1, 0]), "sum", axis_size=0)


def test_scatter_reduce_axis_size_disagrees_with_initial_values(main):
    with pytest.raises(ValueError, match="disagrees with initial_values"):
        ops.scatter_reduce(_f32(3, 2), _i32([0, 1, 0]), "sum", _f32(4, 2), axis_size=5)


def test_scatter_reduce_indices_do_not_broadcast(main):
    with pytest.raises(PopXLException, match="does not broadcast to `data`"):
        ops.scatter_reduce(_f32(3, 2), _i32([0, 1]), "sum", axis_size=2)


def test_scatter_reduce_indices_rank_too_high(main):
    with pytest.raises(PopXLException, match="more than `data`"):
        ops.scatter_reduce(_f32(3), _i32([[0, 1, 0]]), "sum", axis_size=2)


def test_scatter_reduce_initial_values_shape(main):
    with pytest.raises(PopXLException, match="cannot receive `data`"):
        ops.scatter_reduce(_f32(3, 2), _i32([0, 1, 0]), "sum", _f32(2, 1))


def test_scatter_reduce_shape_and_name(main):
    out = ops.scatter_reduce(_f32(3, 2), _i32([3, 0, 1]), "sum", axis_size=5)
    assert out.shape == (5, 2) and out.name == "scatterreduce_out"


def test_onehot_num_classes_must_be_constant(main):
    with pytest.raises(ValueError, match="must be known when the op is created"):
        ops.onehot(_i32([1, 2]), _i32(3), _f32(2), -1)


def test_onehot_num_classes_must_be_positive_int(main):
    with pytest.raises(ValueError, match="one positive integer"):
        ops.onehot(_i32([1, 2]), popxl.constant(np.array(0, np.int32)), _f32(2), -1)


def test_onehot_values_need_two_elements(main):
    with pytest.raises(PopXLException, match="exactly 2 elements"):
        ops.onehot(_i32([1, 2]), popxl.constant(3), _f32(3), -1)


def test_onehot_indices_must_be_int(main):
    with pytest.raises(TypeError, match="`t` must have an integer dtype"):
        ops.onehot(_f32(2), popxl.constant(3), _f32(2), 0)


def test_onehot_shape_dtype_and_name(main):
    out = ops.onehot(_i32([[1, 5]]), popxl.constant(np.array(6, np.int32)), _i32([0, 1]), 1)
    assert out.shape == (1, 6, 2) and out.dtype == popxl.int32 and out.name == "onehot_out"


def test_dynamic_slice_axes_sizes_length_mismatch(main):
    with pytest.raises(ValueError, match="must have the same length"):
        ops.dynamic_slice(_f32(4, 3), _i32([0, 0]), [0, 1], [2], False)


def test_dynamic_slice_repeated_axis(main):
    with pytest.raises(ValueError, match="name an axis twice"):
        ops.dynamic_slice(_f32(4, 3), _i32([0, 0]), [0, -2], [1, 1], False)


def test_dynamic_slice_size_larger_than_axis(main):
    with pytest.raises(ValueError, match="size 4 for axis 1"):
        ops.dynamic_slice(_f32(4, 3), _i32([0]), [1], [4], False)


def test_dynamic_slice_axis_out_of_range(main):
    with pytest.raises(ValueError, match="out of range"):
        ops.dynamic_slice(_f32(4, 3), _i32([0]), [2], [1], False)


def test_dynamic_slice_index_length(main):
    with pytest.raises(PopXLException, match="one offset per axis"):
        ops.dynamic_slice(_f32(4, 3), _i32([0, 1]), [0], [1], False)


def test_dynamic_slice_index_must_be_int(main):
    with pytest.raises(TypeError, match="`index` must have an integer dtype"):
        ops.dynamic_slice(_f32(4, 3), _f32(1), [0], [1], False)


def test_dynamic_update_shape_mismatch(main):
    with pytest.raises(PopXLException, match="gives \\(2, 3\\)"):
        ops.dynamic_update(_f32(4, 3), _i32([0]), _f32(2, 2), [0], [2], False)


def test_dynamic_update_dtype_mismatch(main):
    with pytest.raises(PopXLException, match="dtype int32 but `t` has float32"):
        ops.dynamic_update(_f32(4, 3), _i32([0]), _i32(np.zeros((1, 3))), [0], [1], False)


def test_dynamic_names_and_inplace_alias(main):
    t = _f32(4, 3)
    assert ops.dynamic_slice(t, _i32([1]), [0], [2], True).name == "dynamic_slice_out"
    assert ops.dynamic_update(t, _i32([1]), _f32(1, 3), [0], [1], True).name == "dynamic_update_out"
    out = ops.dynamic_update_(t, _i32([1]), _f32(1, 3), [0], [1], True)
    assert out.name == "dynamicupdateinplace_out"
    assert out._producer.type == "DynamicUpdateInplace"
