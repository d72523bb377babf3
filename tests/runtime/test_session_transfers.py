"""Host <-> device transfers of variables: PopXL's attach/detach and lazy-fetch rules."""

import contextlib
from unittest import mock

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def _counter(start=0.0, weights_to_host_on_exit=True):
    """w += 1 per run (stored to the host after the update); v stays as written."""
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.full(2, start, np.float32), name="w")
        v = popxl.variable(np.array([10, 20], np.int32), name="v")
        c = popxl.constant(np.ones(2, np.float32), name="c")
        w_out = popxl.d2h_stream((2,), popxl.float32, "w_out")
        v_out = popxl.d2h_stream((2,), popxl.int32, "v_out")
        ops.var_updates.accumulate_(w, c)
        ops.host_store(w_out, w)
        ops.host_store(v_out, v + 0)
    session = popxl.Session(ir, "ipu_model", weights_to_host_on_exit)
    return session, w, v, c, w_out, v_out


def _spy(session, name):
    return mock.patch.object(session, name, wraps=getattr(session, name))


# Entering and leaving ---------------------------------------------------------------------


def test_enter_attaches_and_uploads_weights():
    session, w, *_ = _counter()
    assert not session.is_attached
    with _spy(session, "weights_from_host") as upload:
        with session as entered:
            assert entered is session
            assert session.is_attached
            assert upload.call_count == 1
    assert not session.is_attached


def test_exit_downloads_weights_then_detaches():
    session, w, *_ = _counter()
    with _spy(session, "weights_to_host") as download:
        with session:
            session.run()
            session.run()
            assert download.call_count == 0
        assert download.call_count == 1
    assert not session.is_attached
    np.testing.assert_array_equal(session.get_tensor_data(w), [2.0, 2.0])


def test_exit_skips_download_when_disabled():
    session, w, *_ = _counter(weights_to_host_on_exit=False)
    with _spy(session, "weights_to_host") as download:
        with session:
            session.run()
        assert download.call_count == 0
    assert not session.is_attached


def test_nested_contexts_are_no_ops():
    session, w, *_ = _counter()
    with _spy(session, "weights_from_host") as upload, _spy(session, "weights_to_host") as download:
        with session:
            with session:
                session.run()
                assert (upload.call_count, download.call_count) == (1, 0)
            assert session.is_attached
            assert (upload.call_count, download.call_count) == (1, 0)
            session.run()
        assert (upload.call_count, download.call_count) == (1, 1)
    assert not session.is_attached
    np.testing.assert_array_equal(session.get_tensor_data(w), [2.0, 2.0])


def test_reentering_uploads_host_weights_again():
    session, w, _, _, w_out, _ = _counter(weights_to_host_on_exit=False)
    with _spy(session, "weights_from_host") as upload:
        with session:
            np.testing.assert_array_equal(session.run()[w_out], [1.0, 1.0])
            np.testing.assert_array_equal(session.run()[w_out], [2.0, 2.0])
        with session:
            # The device progress was never downloaded, so the host's start value is back.
            np.testing.assert_array_equal(session.run()[w_out], [1.0, 1.0])
        assert upload.call_count == 2


def test_reentering_continues_from_downloaded_weights():
    session, w, _, _, w_out, _ = _counter()
    with session:
        session.run()
    with session:
        np.testing.assert_array_equal(session.run()[w_out], [2.0, 2.0])


def test_exception_inside_context_skips_download_but_detaches():
    session, w, *_ = _counter()
    with _spy(session, "weights_to_host") as download:
        with pytest.raises(KeyError, match="boom"):
            with session:
                session.run()
                raise KeyError("boom")
        assert download.call_count == 0
    assert not session.is_attached
    np.testing.assert_array_equal(session.get_tensor_data(w), [0.0, 0.0])


def test_exception_in_nested_context_keeps_outer_attached():
    session, w, *_ = _counter()
    with session:
        with pytest.raises(RuntimeError, match="inner"):
            with session:
                raise RuntimeError("inner")
        assert session.is_attached
        session.run()
    np.testing.assert_array_equal(session.get_tensor_data(w), [1.0, 1.0])


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.run(),
        lambda s: s.run_with_outputs(outputs=s.create_host_outputs()),
        lambda s: s.weights_from_host(),
        lambda s: s.weights_to_host(),
    ],
    ids=["run", "run_with_outputs", "weights_from_host", "weights_to_host"],
)
def test_runtime_functions_require_attached(call):
    session, *_ = _counter()
    with pytest.raises(ValueError, match="Must be attached to device"):
        call(session)
    with session:
        pass
    with pytest.raises(ValueError, match="Must be attached to device"):
        call(session)


# Reading -----------------------------------------------------------------------------------


def test_get_fetches_only_when_stale():
    session, w, v, c, *_ = _counter()
    with session:
        with _spy(session, "weights_to_host") as download:
            np.testing.assert_array_equal(session.get_tensor_data(w), [0.0, 0.0])
            assert download.call_count == 0
            session.run()
            np.testing.assert_array_equal(session.get_tensor_data(w), [1.0, 1.0])
            assert download.call_count == 1
            np.testing.assert_array_equal(session.get_tensor_data(w), [1.0, 1.0])
            np.testing.assert_array_equal(session.get_tensor_data(v), [10, 20])
            assert download.call_count == 1
            session.run()
            np.testing.assert_array_equal(session.get_tensor_data(c), [1.0, 1.0])
            assert download.call_count == 1, "constants never trigger a transfer"
            data = session.get_tensors_data([w, v, c])
            assert download.call_count == 2, "one transfer for all variables"
            np.testing.assert_array_equal(data[w], [2.0, 2.0])
            np.testing.assert_array_equal(data[v], [10, 20])


def test_get_tensors_data_returns_dict_keyed_by_tensor():
    session, w, v, c, *_ = _counter()
    data = session.get_tensors_data([w, v, c])
    assert set(data) == {w, v, c}
    assert data[v].dtype == np.int32


def test_detached_read_returns_host_values_without_transfer():
    session, w, *_ = _counter(weights_to_host_on_exit=False)
    with session:
        session.run()
        session.run()
    with _spy(session, "weights_to_host") as download:
        np.testing.assert_array_equal(session.get_tensor_data(w), [0.0, 0.0])
        assert download.call_count == 0


def test_detached_read_after_download_on_exit():
    session, w, *_ = _counter()
    with session:
        session.run()
        session.run()
        session.run()
    np.testing.assert_array_equal(session.get_tensor_data(w), [3.0, 3.0])


def test_read_values_are_snapshots():
    session, w, *_ = _counter()
    before = session.get_tensor_data(w)
    with session:
        session.run()
        first = session.get_tensor_data(w)
        session.run()
        second = session.get_tensor_data(w)
    np.testing.assert_array_equal(before, [0.0, 0.0])
    np.testing.assert_array_equal(first, [1.0, 1.0])
    np.testing.assert_array_equal(second, [2.0, 2.0])
    with pytest.raises(ValueError, match="read-only"):
        before[0] = 5.0
    with pytest.raises(ValueError, match="read-only"):
        second[0] = 5.0


def test_read_rejects_non_variables():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros(2, np.float32), name="w")
        h2d = popxl.h2d_stream((2,), popxl.float32, "x")
        x = ops.host_load(h2d)
        y = x + w
        d2h = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(d2h, y)
    session = popxl.Session(ir)
    for bad in (x, y, h2d, d2h, "w"):
        with pytest.raises(TypeError, match="is not of type Constant or Variable"):
            session.get_tensor_data(bad)
    with pytest.raises(TypeError, match="is not of type Constant or Variable"):
        session.get_tensors_data([w, y])


def test_reading_a_shard_handle_names_its_variable():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        var, shard = popxl.replica_sharded_variable(np.arange(4, dtype=np.float32), name="w")
    session = popxl.Session(ir)
    with pytest.raises(TypeError, match=f"loaded from variable {var.id}: read that variable"):
        session.get_tensor_data(shard)
    np.testing.assert_array_equal(session.get_tensor_data(var), np.arange(4))


# Writing -----------------------------------------------------------------------------------


def test_write_while_attached_updates_host_and_device():
    session, w, v, _, w_out, v_out = _counter()
    with session:
        session.run()
        session.write_variable_data(w, np.array([5.0, 6.0], np.float32))
        with _spy(session, "weights_to_host") as download:
            np.testing.assert_array_equal(session.get_tensor_data(w), [5.0, 6.0])
            assert download.call_count == 1, "the run made the host stale; the write did not fetch"
        outputs = session.run()
        np.testing.assert_array_equal(outputs[w_out], [6.0, 7.0])
        np.testing.assert_array_equal(outputs[v_out], [10, 20])


def test_write_while_attached_does_not_mark_host_stale():
    session, w, v, *_ = _counter()
    with session:
        with _spy(session, "weights_to_host") as download:
            session.write_variables_data({w: np.array([3.0, 4.0], np.float32)})
            np.testing.assert_array_equal(session.get_tensor_data(w), [3.0, 4.0])
            assert download.call_count == 0


def test_write_while_stale_keeps_newer_device_values_of_other_variables():
    session, w, v, _, w_out, v_out = _counter()
    with session:
        session.run()
        session.run()
        session.write_variable_data(v, np.array([7, 8], np.int32))
        np.testing.assert_array_equal(session.get_tensor_data(w), [2.0, 2.0])
        np.testing.assert_array_equal(session.get_tensor_data(v), [7, 8])
        outputs = session.run()
    np.testing.assert_array_equal(outputs[w_out], [3.0, 3.0])
    np.testing.assert_array_equal(outputs[v_out], [7, 8])


def test_write_while_detached_updates_host_only_until_enter():
    session, w, v, _, w_out, _ = _counter()
    with session:
        session.run()
    with _spy(session, "weights_from_host") as upload:
        session.write_variable_data(w, np.array([5.0, 5.0], np.float32))
        assert upload.call_count == 0
    assert not session.is_attached
    np.testing.assert_array_equal(session.get_tensor_data(w), [5.0, 5.0])
    with session:
        np.testing.assert_array_equal(session.run()[w_out], [6.0, 6.0])


def test_write_accepts_python_numbers():
    ir = popxl.Ir()
    with ir.main_graph:
        f = popxl.variable(0.0, popxl.float32, name="f")
        i = popxl.variable(0, popxl.int32, name="i")
        b = popxl.variable(False, popxl.bool, name="b")
        out = popxl.d2h_stream((), popxl.float32, "out")
        ops.host_store(out, f + 1.0)
    session = popxl.Session(ir)
    session.write_variables_data({f: 3, i: 4, b: True})
    data = session.get_tensors_data([f, i, b])
    assert data[f].dtype == np.float32 and data[f] == 3.0
    assert data[i].dtype == np.int32 and data[i] == 4
    assert data[b].dtype == np.bool_ and data[b]
    with session:
        session.write_variable_data(f, 1.5)
        assert session.run()[out] == 2.5


def test_write_copies_the_callers_array():
    session, w, *_ = _counter()
    data = np.array([1.0, 2.0], np.float32)
    session.write_variable_data(w, data)
    data[:] = 9.0
    np.testing.assert_array_equal(session.get_tensor_data(w), [1.0, 2.0])


@pytest.mark.parametrize(
    "target, data, error, match",
    [
        ("c", np.ones(2, np.float32), TypeError, "is not of type Variable"),
        ("w", np.ones(2, np.float64), TypeError, "dtype float64"),
        ("w", np.ones(2, np.int32), TypeError, "dtype int32"),
        ("w", np.ones(3, np.float32), ValueError, "must match the shape"),
        ("w", np.ones((1, 2), np.float32), ValueError, "must match the shape"),
    ],
)
def test_write_errors(target, data, error, match):
    session, w, v, c, *_ = _counter()
    tensor = {"w": w, "c": c}[target]
    with pytest.raises(error, match=match):
        session.write_variable_data(tensor, data)
    np.testing.assert_array_equal(session.get_tensor_data(w), [0.0, 0.0])


def test_write_rejects_non_tensors():
    session, *_ = _counter()
    with pytest.raises(TypeError, match="is not of type Variable"):
        session.write_variables_data({"w": np.ones(2, np.float32)})


@pytest.mark.parametrize("attached", [False, True])
def test_write_with_one_bad_entry_changes_nothing(attached):
    session, w, v, _, w_out, v_out = _counter()
    good_w = np.array([5.0, 5.0], np.float32)
    bad_v = np.array([1, 2], np.int64)
    with _spy(session, "weights_from_host") as upload:
        with session if attached else contextlib.nullcontext():
            calls = upload.call_count
            with pytest.raises(TypeError, match="dtype int64"):
                session.write_variables_data({w: good_w, v: bad_v})
            with pytest.raises(ValueError, match="must match the shape"):
                session.write_variables_data({w: good_w, v: np.ones(3, np.int32)})
            assert upload.call_count == calls
            np.testing.assert_array_equal(session.get_tensor_data(w), [0.0, 0.0])
            np.testing.assert_array_equal(session.get_tensor_data(v), [10, 20])
            if attached:
                outputs = session.run()
                np.testing.assert_array_equal(outputs[w_out], [1.0, 1.0])
                np.testing.assert_array_equal(outputs[v_out], [10, 20])


# State after a rejected run ------------------------------------------------------------------


def test_rejected_run_leaves_variables_unchanged():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros(3, np.float32), name="w")
        h2d = popxl.h2d_stream((3,), popxl.float32, "x")
        d2h = popxl.d2h_stream((3,), popxl.float32, "w_out")
        ops.var_updates.accumulate_(w, ops.host_load(h2d))
        ops.host_store(d2h, w)
    session = popxl.Session(ir)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    with session:
        session.run({h2d: x})
        bad_inputs = [
            {h2d: np.ones(4, np.float32)},
            {h2d: np.ones(3, np.int32)},
            {h2d: np.ones(3, np.float64)},
            {},
        ]
        for i, inputs in enumerate(bad_inputs):
            with pytest.raises((ValueError, TypeError)):
                session.run(inputs, downcast_inputs=i != 2)
            with pytest.raises(ValueError, match="Shape mismatch for output"):
                session.run_with_outputs({h2d: x}, {d2h: np.zeros(4, np.float32)})
            np.testing.assert_array_equal(session.get_tensor_data(w), x)
        np.testing.assert_array_equal(session.run({h2d: x})[d2h], 2 * x)
    np.testing.assert_array_equal(session.get_tensor_data(w), 2 * x)


def test_in_sync_with_ipu_follows_the_host_copy():
    session, w, v, c, *_ = _counter()
    assert w.in_sync_with_ipu
    with session:
        session.run()
        assert not w.in_sync_with_ipu
        assert c.in_sync_with_ipu
        session.get_tensor_data(w)
        assert w.in_sync_with_ipu
        session.run()
    assert w.in_sync_with_ipu


def test_exit_detaches_even_when_the_download_fails():
    session, *_ = _counter()
    failing = mock.patch.object(session, "weights_to_host", side_effect=RuntimeError("link down"))
    with failing, pytest.raises(RuntimeError, match="link down"):
        with session:
            session.run()
    assert not session.is_attached
    with session:
        session.run()
