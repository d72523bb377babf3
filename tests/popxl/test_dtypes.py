"""``popxl.dtypes``: the dtype singletons, their properties and conversions."""

import copy
import pickle

import ml_dtypes
import numpy as np
import pytest

import popxl
from popxl import dtypes
from popxl.testing import get_all_dtypes, get_all_int_dtypes

# name: (is_int, is_floating_point, is_signed, is_complex, numpy dtype)
TABLE = {
    "bool": (False, False, False, False, np.bool_),
    "int8": (True, False, True, False, np.int8),
    "int16": (True, False, True, False, np.int16),
    "int32": (True, False, True, False, np.int32),
    "int64": (True, False, True, False, np.int64),
    "uint8": (True, False, False, False, np.uint8),
    "uint16": (True, False, False, False, np.uint16),
    "uint32": (True, False, False, False, np.uint32),
    "uint64": (True, False, False, False, np.uint64),
    "float8_143": (False, True, True, False, [("float8_143", "u1")]),
    "float8_152": (False, True, True, False, [("float8_152", "u1")]),
    "float16": (False, True, True, False, np.float16),
    "float32": (False, True, True, False, np.float32),
    "float64": (False, True, True, False, np.float64),
    "complex64": (False, False, True, True, np.complex64),
    "complex128": (False, False, True, True, np.complex128),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_dtype_properties(name):
    dt = getattr(popxl, name)
    is_int, is_float, is_signed, is_complex, np_type = TABLE[name]
    assert dt is getattr(dtypes, name)
    assert dt.name == name
    assert (dt.is_int, dt.is_floating_point, dt.is_signed, dt.is_complex) == (
        is_int, is_float, is_signed, is_complex,
    )  # fmt: skip
    assert dt.as_numpy() == np.dtype(np_type)
    assert repr(dt) == f"popxl.dtypes.{name}"
    assert dtypes.dtype.from_name(name) is dt


def test_aliases():
    assert popxl.half is popxl.float16
    assert popxl.float is popxl.float32
    assert popxl.double is popxl.float64
    assert popxl.bool is dtypes.bool
    assert popxl.float == popxl.float32
    assert popxl.float16 != popxl.float32


def test_dtype_cannot_be_instantiated():
    with pytest.raises(TypeError, match="Cannot create popxl.dtypes.dtype instances"):
        dtypes.dtype()


def test_from_name_unknown():
    with pytest.raises(ValueError, match="not_a_type"):
        dtypes.dtype.from_name("not_a_type")


@pytest.mark.parametrize(
    "value,expected",
    [
        ("float32", popxl.float32),
        ("int8", popxl.int8),
        (bool, popxl.bool),
        (float, popxl.float32),
        (int, popxl.int64),  # via np.dtype(int)
        (np.float16, popxl.float16),
        (np.dtype("uint16"), popxl.uint16),
        (np.zeros(2, np.int32), popxl.int32),
        (np.zeros((), np.complex64), popxl.complex64),
        (ml_dtypes.float8_e4m3fnuz, popxl.float8_143),
        (np.dtype(ml_dtypes.float8_e5m2fnuz), popxl.float8_152),
        (dtypes.np_dtype_float8_143, popxl.float8_143),
        (np.zeros(2, [("float8_152", "u1")]), popxl.float8_152),
    ],
)
def test_as_dtype(value, expected):
    assert dtypes.dtype.as_dtype(value) is expected


def test_as_dtype_of_a_dtype_is_accepted():
    # Deliberate difference: the original raised ValueError for a popxl.dtype argument.
    assert dtypes.dtype.as_dtype(popxl.float16) is popxl.float16


@pytest.mark.parametrize("value", [object(), "nonsense", np.dtype("U4"), 3.5])
def test_as_dtype_unknown(value):
    with pytest.raises(ValueError, match="There is not a popxl.dtype that is compatible"):
        dtypes.dtype.as_dtype(value)


def test_torch_conversions():
    torch = pytest.importorskip("torch")
    assert popxl.float16.as_torch() is torch.float16
    assert popxl.bool.as_torch() is torch.bool
    assert dtypes.dtype.as_dtype(torch.int32) is popxl.int32
    assert dtypes.dtype.as_dtype(torch.zeros(2, dtype=torch.float64)) is popxl.float64
    with pytest.raises(TypeError):
        popxl.uint32.as_torch()


def test_dtypes_are_singletons_under_copy_and_pickle():
    for dt in get_all_dtypes() + [popxl.bool]:
        assert copy.copy(dt) is dt
        assert copy.deepcopy(dt) is dt
        assert pickle.loads(pickle.dumps(dt)) is dt


def test_dtypes_are_hashable_dict_keys():
    table = {dt: dt.name for dt in get_all_dtypes()}
    assert table[popxl.float32] == "float32"


def test_float8_host_dtypes():
    # PopXL's structured form: one raw byte per element, in a field named after the format.
    assert dtypes.np_dtype_float8_143 == np.dtype([("float8_143", "u1")])
    assert dtypes.np_dtype_float8_152 == np.dtype([("float8_152", "u1")])
    assert popxl.utils.np_dtype_float8_143 is dtypes.np_dtype_float8_143
    assert popxl.utils.np_dtype_float8_152 is dtypes.np_dtype_float8_152
    assert popxl.float8_143.itemsize == popxl.float8_152.itemsize == 1
    # The runtime's (JAX's) view of the same bytes.
    assert popxl.float8_143._np_device == np.dtype(ml_dtypes.float8_e4m3fnuz)
    assert popxl.float8_152._np_device == np.dtype(ml_dtypes.float8_e5m2fnuz)
    assert popxl.float32._np_device == popxl.float32.as_numpy()


def test_testing_dtype_lists():
    assert get_all_dtypes() == [
        popxl.int8, popxl.int16, popxl.int32, popxl.int64,
        popxl.uint8, popxl.uint16, popxl.uint32, popxl.uint64,
        popxl.float8_143, popxl.float8_152, popxl.float16, popxl.float32, popxl.float64,
        popxl.complex64, popxl.complex128,
    ]  # fmt: skip
    assert get_all_int_dtypes(include_unsigned=False) == [
        popxl.int8,
        popxl.int16,
        popxl.int32,
        popxl.int64,
    ]
    assert get_all_int_dtypes(include_signed=False) == [
        popxl.uint8,
        popxl.uint16,
        popxl.uint32,
        popxl.uint64,
    ]
    assert get_all_int_dtypes(False, False) == []
