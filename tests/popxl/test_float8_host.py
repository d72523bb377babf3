"""Float8 host data: PopXL's structured form out, structured or ml_dtypes form in."""

import ml_dtypes
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import _float8_host
from popxl.dtypes import np_dtype_float8_143, np_dtype_float8_152
from popxl.fp8_utils import host_pow2scale_cast_from_fp8, host_pow2scale_cast_to_fp8

F143, F152 = popxl.float8_143, popxl.float8_152
ML143 = np.dtype(ml_dtypes.float8_e4m3fnuz)
# 1.0, -3.0, NaN and 0.5 in float8_143.
BYTES = np.array([64, 204, 128, 56], np.uint8)
VALUES = np.array([1.0, -3.0, np.nan, 0.5], np.float32)


def structured(raw=BYTES):
    return raw.view(np_dtype_float8_143)


def ml(raw=BYTES):
    return raw.view(ML143)


def as_float(a):
    return host_pow2scale_cast_from_fp8(a, popxl.float32)


# The boundary views ------------------------------------------------------------------


def test_views_share_memory_and_round_trip():
    s = structured(BYTES.copy())
    m = _float8_host.to_ml(s)
    assert m.dtype == ML143 and np.shares_memory(m, s)
    back = _float8_host.to_structured(m)
    assert back.dtype == np_dtype_float8_143 and np.shares_memory(back, s)
    np.testing.assert_array_equal(m.astype(np.float32), VALUES)
    other = np.ones(3, np.float32)
    assert _float8_host.to_ml(other) is other and _float8_host.to_structured(other) is other


def test_is_float8_and_format_check():
    assert _float8_host.is_float8(np_dtype_float8_152) and _float8_host.is_float8(ML143)
    assert not _float8_host.is_float8(np.dtype(np.uint8))
    assert not _float8_host.is_float8(np.dtype([("float8_143", "i1")]))
    with pytest.raises(TypeError, match="holds float8_143 values but the tensor is float8_152"):
        _float8_host.checked_structured(ml(), F152)


# fp8_utils ----------------------------------------------------------------------------


def test_host_cast_returns_the_structured_form():
    out = host_pow2scale_cast_to_fp8(VALUES, F143)
    assert out.dtype == np_dtype_float8_143 == F143.as_numpy()
    np.testing.assert_array_equal(out.view(np.uint8), BYTES)
    out152 = host_pow2scale_cast_to_fp8(np.array([0.25], np.float64), F152)
    assert out152.dtype == np_dtype_float8_152
    assert out152.view(np.uint8).tolist() == [0b0_01110_00]


def test_host_cast_nans_compare_equal():
    # NumPy compares structured arrays byte by byte, so NaN (0x80) equals itself.
    a = host_pow2scale_cast_to_fp8(VALUES, F143)
    np.testing.assert_equal(a, host_pow2scale_cast_to_fp8(VALUES.astype(np.float16), F143))
    with pytest.raises(AssertionError):  # ml_dtypes arrays do not: the reason for the form
        np.testing.assert_equal(ml(), ml().copy())


@pytest.mark.parametrize("form", [structured, ml])
def test_cast_from_fp8_takes_both_forms(form):
    np.testing.assert_array_equal(
        host_pow2scale_cast_from_fp8(form(), popxl.float16, 2),
        np.array([4.0, -12.0, np.nan, 2.0], np.float16),
    )


def test_cast_from_fp8_rejects_raw_bytes():
    with pytest.raises(TypeError, match="Expected float8 host data: .* got dtype uint8"):
        host_pow2scale_cast_from_fp8(BYTES, popxl.float32)


# Variables, constants and streams -------------------------------------------------------


@pytest.mark.parametrize("form", [structured, ml])
def test_variable_constant_and_stream_take_both_forms(form):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(form(), name="v")
        c = popxl.constant(form(), F143)
        buffer = popxl.remote_buffer((4,), F143, 1)
        r = popxl.remote_variable(form(), buffer, 0)
        loaded = ops.remote_load(buffer, 0)
        x = popxl.h2d_stream((4,), F143, "x")
        outs = {}
        for name, t in {"v": v, "c": c, "r": loaded, "x": ops.host_load(x)}.items():
            outs[name] = popxl.d2h_stream((4,), F143, f"out_{name}")
            ops.host_store(outs[name], t)
    assert v.dtype is F143 and r.dtype is F143
    with popxl.Session(ir) as session:
        results = session.run({x: form()})
        data = session.get_tensors_data([v, c, r])
    for got in [*results.values(), *data.values()]:
        assert got.dtype == np_dtype_float8_143
        np.testing.assert_equal(got, structured())


def test_variable_converts_float_data_and_checks_the_format():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(VALUES, F143, log2_scale=1)
        np.testing.assert_equal(v._host_data, host_pow2scale_cast_to_fp8(VALUES, F143, 1))
        with pytest.raises(TypeError, match="holds float8_143 values but the tensor is float8_152"):
            popxl.variable(structured(), F152)
        with pytest.raises(TypeError, match="must be float8 data .*got dtype uint8"):
            popxl.constant(BYTES, F143)


def test_float8_memmap_is_used_in_place(tmp_path):
    mm = np.memmap(tmp_path / "w.bin", dtype=ML143, mode="w+", shape=(4,))
    mm[...] = ml()
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(mm, name="v")
        ops.var_updates.copy_var_update_(v, ops.negate(v))
    assert isinstance(v._host_data, np.memmap) and v._host_data.dtype == np_dtype_float8_143
    with popxl.Session(ir) as session:
        session.run()
        session.weights_to_host()
    np.testing.assert_array_equal(np.asarray(mm).astype(np.float32), -VALUES)


def test_stream_input_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.h2d_stream((4,), F152, "x")
        ops.host_store(popxl.d2h_stream((4,), F152, "y"), ops.host_load(x))
    with popxl.Session(ir) as session:
        with pytest.raises(TypeError, match="has dtype uint8, but the stream carries float8_152"):
            session.run({x: BYTES})
        with pytest.raises(TypeError, match="holds float8_143 values but the tensor is float8_152"):
            session.run({x: structured()})


def test_device_and_host_casts_agree_with_nans():
    """The device cast's output equals the host cast under np.testing.assert_equal, NaNs too."""
    data = np.array([[0.5, 300.0, np.nan], [-2.0, np.inf, 7.0]], np.float16)
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.h2d_stream(data.shape, popxl.float16, "x")
        cast = ops.pow2scale_cast_to_fp8(ops.host_load(x), popxl.constant(1), F143)
        out = popxl.d2h_stream(cast.shape, F143, "out")
        ops.host_store(out, cast)
    with popxl.Session(ir) as session:
        got = session.run({x: data})[out]
    expected = host_pow2scale_cast_to_fp8(data.astype(np.float32), F143, 1, True)
    assert got.dtype == np_dtype_float8_143
    assert (got.view(np.uint8) == 0x80).sum() == 3  # 300 * 2 overflows; NaN; inf
    np.testing.assert_equal(got, expected)


@pytest.mark.parametrize("form", [structured, ml])
def test_write_variable_data_and_run_with_outputs(form):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(4, np.float32), F143, name="v")
        out = popxl.d2h_stream((4,), F143, "out")
        ops.host_store(out, v)
    with popxl.Session(ir) as session:
        session.write_variable_data(v, form())
        host = session.create_host_outputs()
        assert host[out].dtype == np_dtype_float8_143
        given = {out: form(np.zeros(4, np.uint8))}
        session.run_with_outputs(outputs=given)
        np.testing.assert_equal(_float8_host.to_structured(given[out]), structured())
        session.run_with_outputs(outputs=host)
        np.testing.assert_equal(host[out], structured())
        np.testing.assert_equal(session.get_tensor_data(v), structured())
        with pytest.raises(TypeError, match="write float8 data, an array of dtype"):
            session.write_variable_data(v, VALUES)
        with pytest.raises(TypeError, match="holds float8_152 values but the tensor is float8_143"):
            session.write_variable_data(v, host_pow2scale_cast_to_fp8(VALUES, F152))
