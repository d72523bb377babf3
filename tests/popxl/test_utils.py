"""``popxl.utils``: ``to_numpy`` conversion rules and ``table_to_string``."""

import numpy as np
import pytest

import popxl
from popxl.utils import HW_DEVICE_CONNECTION_TIMEOUT, downcast_np_dtypes, table_to_string, to_numpy


def test_constants():
    assert downcast_np_dtypes == {
        np.dtype(np.int64): np.dtype(np.int32),
        np.dtype(np.uint64): np.dtype(np.uint32),
        np.dtype(np.float64): np.dtype(np.float32),
    }
    assert HW_DEVICE_CONNECTION_TIMEOUT == 10000


@pytest.mark.parametrize(
    "value,dtype",
    [
        (1, np.int32),
        (1.0, np.float32),
        (True, np.bool_),
        ([1, 2], np.int32),
        ([1.0, 2.0], np.float32),
        ([True, False], np.bool_),
        (np.ones(2, np.int64), np.int32),
        (np.ones(2, np.uint64), np.uint32),
        (np.ones(2, np.float64), np.float32),
        (np.ones(2, np.int8), np.int8),
        (np.float64(2.0), np.float32),
    ],
)
def test_inferred_dtypes(value, dtype):
    assert to_numpy(value).dtype == np.dtype(dtype)


def test_no_downcast_and_explicit_dtype():
    assert to_numpy(np.ones(2, np.int64), downcast=False).dtype == np.int64
    assert to_numpy(np.ones(2, np.float64), popxl.float64).dtype == np.float64
    np.testing.assert_array_equal(to_numpy([1.7, -2.2], popxl.int32), [1, -2])


def test_copy_semantics():
    x = np.ones(3, np.float32)
    assert not np.shares_memory(to_numpy(x), x)
    assert np.shares_memory(to_numpy(x, copy=False), x)
    assert np.shares_memory(to_numpy(x, popxl.float32, copy=False), x)
    assert not np.shares_memory(to_numpy(np.ones(3), copy=False), x)  # downcast copies


def test_float8_only_arguments():
    with pytest.raises(RuntimeError):
        to_numpy(np.ones(2, np.float32), popxl.float32, log2_scale=1)
    with pytest.raises(RuntimeError):
        to_numpy(np.ones(2, np.float32), nan_on_overflow=True)
    out = to_numpy(np.array([1.0, 2.0], np.float32), popxl.float8_143)
    assert out.dtype == popxl.float8_143.as_numpy() == popxl.utils.np_dtype_float8_143
    np.testing.assert_array_equal(out.view(np.uint8), [64, 72])  # 1.0 and 2.0 in float8_143
    with pytest.raises(TypeError, match="must be float8 data .* or float16/32/64 data"):
        to_numpy(np.array([1, 2], np.int32), popxl.float8_143)


def test_memmap(tmp_path):
    mm = np.memmap(tmp_path / "a.bin", dtype=np.float32, mode="w+", shape=(4,))
    assert to_numpy(mm, copy=False) is mm
    assert to_numpy(mm, popxl.float32, copy=False) is mm
    mm64 = np.memmap(tmp_path / "b.bin", dtype=np.float64, mode="w+", shape=(4,))
    assert to_numpy(mm64, copy=False, downcast=False) is mm64


def test_memmap_of_another_dtype_is_rejected(tmp_path):
    mm = np.memmap(tmp_path / "a.bin", dtype=np.float32, mode="w+", shape=(4,))
    message = (
        "When passing a memory-mapped NumPy array, the `dtype` parameter must be None or the "
        "same as the array's dtype; the array has float32 but popxl.dtypes.float16 was "
        "requested. Memory-mapped data is used in place and never converted: create the "
        "np.memmap with dtype float16, or leave `dtype` out."
    )
    with pytest.raises(ValueError) as info:
        to_numpy(mm, popxl.float16, copy=False)
    assert str(info.value) == message


def test_fortran_ordered_memmap_is_rejected(tmp_path):
    mm = np.memmap(tmp_path / "a.bin", dtype=np.float32, mode="w+", shape=(2, 3), order="F")
    with pytest.raises(ValueError) as info:
        to_numpy(mm, copy=False)
    assert str(info.value).startswith(
        "When passing a memory-mapped NumPy array, it must already be in C-ordered and aligned "
        "form, because it is used in place. Create the np.memmap with order='C'"
    )


@pytest.mark.parametrize("dtype", [None, popxl.float64])
def test_64_bit_memmap_needing_downcast_is_rejected(tmp_path, dtype):
    mm64 = np.memmap(tmp_path / "b.bin", dtype=np.float64, mode="w+", shape=(4,))
    with pytest.raises(ValueError) as info:
        to_numpy(mm64, dtype, copy=False)
    assert str(info.value) == (
        f"When passing a memory-mapped NumPy array, the dtype {dtype} is not supported, as it "
        "requires downcasting the array into a new array with a dtype supported by PopXL (the "
        "array has float64). Create the np.memmap with float32, or pass downcast=False to use "
        "the 64-bit data in place."
    )


def test_memmap_with_a_non_constant_grouping_is_copied_with_a_warning(tmp_path, capfd):
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping_from_assignments([0, 1, 1, 0])
    mm = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="w+", shape=(2, 3))
    mm[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ir.main_graph:
        capfd.readouterr()
        w = popxl.variable(mm, name="w", replica_grouping=rg)
        err = capfd.readouterr().err
    assert err.count("you have passed np.memmap data and a non-const replica grouping") == 1
    assert "In creation of variable w," in err
    assert not isinstance(w._host_data, np.memmap)
    mm[...] = -1.0
    np.testing.assert_array_equal(w._host_data, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_memmap_with_a_constant_grouping_stays_in_place(tmp_path, capfd):
    ir = popxl.Ir(replication=4)
    mm = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="w+", shape=(2, 3))
    with ir.main_graph:
        w = popxl.variable(mm, name="w", replica_grouping=ir.replica_grouping(2, 2))
    assert w._host_data is mm
    assert capfd.readouterr().err == ""


def test_torch_input():
    torch = pytest.importorskip("torch")
    out = to_numpy(torch.ones(2, dtype=torch.float64, requires_grad=True))
    assert isinstance(out, np.ndarray) and out.dtype == np.float32


def test_table_to_string():
    rows = [["Index", "Graph Tensor"], [0, "x"], [10, "weights"]]
    text = table_to_string(rows)
    lines = text.split("\n")
    assert lines[0] == "Index | Graph Tensor"
    assert lines[1] == "-" * (len(lines[0]) + 1)  # header length including its newline
    assert lines[2] == "0     | x           "
    assert lines[3] == "10    | weights     "
    assert text.endswith("\n")
    assert table_to_string(rows, delimiter=",", header=False).split("\n")[0] == "Index,Graph Tensor"
    assert table_to_string([]) == ""
