"""``TaskSession``: streams, step counting, state reads and atomic checkpoints."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl.fp8_utils import host_pow2scale_cast_to_fp8
from popxl_addons import InputStreams, NamedTensorData, NamedTensors, OutputStreams
from popxl_addons.task_session import TaskSession, write_variables_pb

W0 = np.array([1.0, 2.0], np.float32)
B0 = np.array([0.5, 0.5, 0.5], np.float32)


def _session(w0=W0, b0=B0, keys=("layer.w", "layer.b"), max_checkpoints=2, extra=False):
    """``w += x`` each run and stream ``w`` out; ``b`` only sits in the state."""
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream((2,), popxl.float32, "x")
        out_stream = popxl.d2h_stream((2,), popxl.float32, "out")
        w = popxl.variable(w0, popxl.float32, name="w")
        b = popxl.variable(b0, popxl.float32, name="b")
        ops.var_updates.accumulate_(w, ops.host_load(x_stream, "x"))
        ops.host_store(out_stream, w + 0.0)
        state = {key: t for key, t in zip(keys, (w, b))}
        if extra:
            state["extra"] = popxl.variable(np.zeros(1, np.float32), popxl.float32, name="extra")
    session = TaskSession(
        [x_stream], [out_stream], NamedTensors.from_dict(state), max_checkpoints, ir, "ipu_model"
    )
    return session, w, b


class DataLoader:
    def __init__(self, position=0):
        self.position = position
        self.resumed_from = None

    def save(self, path):
        with open(path, "w") as f:
            f.write(str(self.position))

    def resume(self, filename):
        self.resumed_from = filename
        with open(filename) as f:
            self.position = int(f.read())


def _step(session, x=(1.0, 1.0)):
    return session.run({session.inputs.x: np.asarray(x, np.float32)})[session.outputs.out]


def _visible(path):
    return sorted(os.listdir(path))


# Construction, run, state -------------------------------------------------------------------


def test_streams_are_named_and_session_is_a_popxl_session():
    session, _, _ = _session()
    assert isinstance(session, popxl.Session)
    assert isinstance(session.inputs, InputStreams) and list(session.inputs.keys()) == ["x"]
    assert isinstance(session.outputs, OutputStreams) and list(session.outputs.keys()) == ["out"]
    assert session.session_state == {"steps": 0}
    assert session.device_desc == "ipu_model"


def test_named_stream_collections_are_kept():
    ir = popxl.Ir()
    with ir.main_graph:
        inputs = InputStreams(x=((2,), popxl.float32))
        outputs = OutputStreams(out=((2,), popxl.float32))
        ops.host_store(outputs.out, ops.host_load(inputs.x) * 2.0)
    session = TaskSession(inputs, outputs, NamedTensors(), ir=ir, device_desc="cpu")
    assert session.inputs is inputs and session.outputs is outputs
    with session:
        out = session.run({inputs.x: np.ones(2, np.float32)})
    np.testing.assert_array_equal(out[outputs.out], [2.0, 2.0])


def test_run_counts_steps_and_runs():
    session, w, _ = _session()
    with session:
        np.testing.assert_array_equal(_step(session), W0 + 1)
        np.testing.assert_array_equal(_step(session, (2.0, 3.0)), W0 + [3.0, 4.0])
    assert session.session_state["steps"] == 2
    np.testing.assert_array_equal(session.get_tensor_data(w), W0 + [3.0, 4.0])


def test_get_named_tensors_data_is_keyed_like_state():
    session, _, _ = _session()
    with session:
        _step(session)
        data = session.get_named_tensors_data()
    assert isinstance(data, NamedTensorData)
    assert data.keys_flat() == ["layer.w", "layer.b"]
    np.testing.assert_array_equal(data.layer.w, W0 + 1)
    np.testing.assert_array_equal(data.layer.b, B0)


def test_add_session_state_info_merges():
    session, _, _ = _session()
    session.add_session_state_info({"lr": 0.1, "config": {"layers": 2}})
    assert session.session_state == {"steps": 0, "lr": 0.1, "config": {"layers": 2}}


def test_max_checkpoints_must_be_positive():
    with pytest.raises(ValueError, match="max_checkpoints"):
        _session(max_checkpoints=0)


def test_write_variables_pb_writes_like_write_variables_data():
    session, w, _ = _session()
    with session:
        write_variables_pb(session, {w: np.array([7.0, 8.0], np.float32)})
        np.testing.assert_array_equal(_step(session), [8.0, 9.0])


# Dataloader -----------------------------------------------------------------------------------


def test_dataloader_setter_validates():
    session, _, _ = _session()
    with pytest.raises(ValueError, match="save"):
        session.dataloader = object()

    class OnlySave:
        def save(self, path):
            pass

    with pytest.raises(ValueError, match="resume"):
        session.dataloader = OnlySave()
    dl = DataLoader()
    session.dataloader = dl
    assert session.dataloader is dl


def test_unset_dataloader_warns_through_logging(caplog):
    session, _, _ = _session()
    with caplog.at_level(logging.WARNING, logger="popxl_addons"):
        assert session.dataloader is None
    assert "No dataloader set" in caplog.text


def test_dataloader_is_saved_and_resumed(tmp_path):
    session, _, _ = _session()
    session.dataloader = DataLoader(position=42)
    session.save_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "dataloader.bin").read_text() == "42"

    other, _, _ = _session()
    other.dataloader = dl = DataLoader()
    other.load_checkpoint(tmp_path / "ckpt")
    assert dl.position == 42
    assert dl.resumed_from == os.path.join(tmp_path / "ckpt", "dataloader.bin")


def test_dataloader_not_resumed_without_its_file(tmp_path):
    session, _, _ = _session()
    session.save_checkpoint(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "dataloader.bin").exists()
    other, _, _ = _session()
    other.dataloader = dl = DataLoader(position=3)
    other.load_checkpoint(tmp_path / "ckpt")
    assert dl.resumed_from is None and dl.position == 3


# Save / load ----------------------------------------------------------------------------------


def test_checkpoint_layout(tmp_path):
    session, _, _ = _session()
    with session:
        _step(session)
    session.add_session_state_info({"lr": 0.5})
    session.save_checkpoint(str(tmp_path / "ckpt"))
    assert _visible(tmp_path) == ["ckpt"]
    assert _visible(tmp_path / "ckpt") == ["model", "session_info.json"]
    assert _visible(tmp_path / "ckpt" / "model") == ["layer.b.npz", "layer.w.npz"]
    with np.load(tmp_path / "ckpt" / "model" / "layer.w.npz") as npz:
        assert npz.files == ["layer.w"]
        np.testing.assert_array_equal(npz["layer.w"], W0 + 1)
    info = json.loads((tmp_path / "ckpt" / "session_info.json").read_text())
    assert info == {"steps": 1, "lr": 0.5}


def test_save_load_round_trip_detached(tmp_path):
    session, _, _ = _session()
    with session:
        _step(session, (3.0, 4.0))
    session.add_session_state_info({"lr": 0.5})
    session.save_checkpoint(tmp_path / "ckpt")

    other, w, b = _session(w0=np.zeros(2, np.float32), b0=np.zeros(3, np.float32))
    other.add_session_state_info({"lr": 0.0})
    other.load_checkpoint(tmp_path / "ckpt", report_missing="error")
    assert other.session_state == {"steps": 1, "lr": 0.5}
    np.testing.assert_array_equal(other.get_tensor_data(w), W0 + [3.0, 4.0])
    np.testing.assert_array_equal(other.get_tensor_data(b), B0)
    with other:
        np.testing.assert_array_equal(_step(other), W0 + [4.0, 5.0])
    assert other.session_state["steps"] == 2


def test_load_while_attached_updates_the_device(tmp_path):
    session, _, _ = _session(w0=np.array([10.0, 20.0], np.float32))
    session.save_checkpoint(tmp_path / "ckpt")
    other, _, _ = _session()
    with other:
        _step(other)
        other.load_checkpoint(tmp_path / "ckpt")
        np.testing.assert_array_equal(_step(other), [11.0, 21.0])


def test_save_while_attached_reads_the_device(tmp_path):
    session, _, _ = _session()
    with session:
        _step(session)
        _step(session)
        session.save_checkpoint(tmp_path / "ckpt")
    with np.load(tmp_path / "ckpt" / "model" / "layer.w.npz") as npz:
        np.testing.assert_array_equal(npz["layer.w"], W0 + 2)


def test_float8_variables_round_trip(tmp_path):
    data = host_pow2scale_cast_to_fp8(np.array([0.5, -1.0, np.nan]), popxl.float8_143)

    def build(values):
        ir = popxl.Ir()
        with ir.main_graph:
            v = popxl.variable(values, popxl.float8_143, name="v")
            out = popxl.d2h_stream((3,), popxl.float32, "out")
            ops.host_store(out, ops.cast(v, popxl.float32))
        return TaskSession([], [out], NamedTensors(v=v), ir=ir, device_desc="cpu"), v

    session, _ = build(data)
    session.save_checkpoint(tmp_path / "ckpt")
    other, v = build(np.zeros(3, popxl.float8_143.as_numpy()))
    other.load_checkpoint(tmp_path / "ckpt", report_missing="error")
    loaded = other.get_tensor_data(v)
    assert loaded.dtype == data.dtype == popxl.dtypes.np_dtype_float8_143
    np.testing.assert_equal(loaded, data)  # byte for byte, NaN included


def test_missing_session_info_defaults_to_zero_steps(tmp_path):
    session, _, _ = _session()
    with session:
        _step(session)
    session.save_checkpoint(tmp_path / "ckpt")
    os.remove(tmp_path / "ckpt" / "session_info.json")
    other, _, _ = _session()
    other.session_state["steps"] = 9
    other.load_checkpoint(tmp_path / "ckpt", report_missing="error")
    assert other.session_state == {"steps": 0}


def test_load_missing_directory_raises(tmp_path):
    session, _, _ = _session()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        session.load_checkpoint(tmp_path / "nope")


def test_wrong_shape_in_checkpoint_raises(tmp_path):
    session, _, _ = _session()
    session.save_checkpoint(tmp_path / "ckpt")
    np.savez(tmp_path / "ckpt" / "model" / "layer.w.npz", **{"layer.w": np.zeros(5, np.float32)})
    other, _, _ = _session()
    with pytest.raises(ValueError, match="shape"):
        other.load_checkpoint(tmp_path / "ckpt")


# report_missing ----------------------------------------------------------------------------------


@pytest.fixture
def ckpt(tmp_path):
    session, _, _ = _session(w0=np.array([5.0, 6.0], np.float32))
    session.save_checkpoint(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_report_missing_error_lists_full_paths(ckpt):
    other, w, _ = _session(extra=True)
    with pytest.raises(ValueError) as excinfo:
        other.load_checkpoint(ckpt, report_missing="error")
    assert os.path.join(ckpt, "model", "extra.npz") in str(excinfo.value)
    np.testing.assert_array_equal(other.get_tensor_data(w), W0)


def test_report_missing_error_for_unexpected_files(ckpt):
    other, _, _ = _session(keys=("layer.w", "other.b"))
    with pytest.raises(ValueError) as excinfo:
        other.load_checkpoint(ckpt, report_missing="error")
    message = str(excinfo.value)
    assert os.path.join(ckpt, "model", "layer.b.npz") in message
    assert os.path.join(ckpt, "model", "other.b.npz") in message


def test_report_missing_warn_logs_and_loads_the_rest(ckpt, caplog):
    other, w, b = _session(keys=("layer.w", "other.b"), b0=np.zeros(3, np.float32))
    with caplog.at_level(logging.WARNING, logger="popxl_addons"):
        other.load_checkpoint(ckpt)
    assert "layer.b.npz" in caplog.text and "other.b.npz" in caplog.text
    np.testing.assert_array_equal(other.get_tensor_data(w), [5.0, 6.0])
    np.testing.assert_array_equal(other.get_tensor_data(b), np.zeros(3))


def test_report_missing_none_is_silent(ckpt, caplog):
    other, w, _ = _session(extra=True)
    with caplog.at_level(logging.WARNING, logger="popxl_addons"):
        other.load_checkpoint(ckpt, report_missing="none")
    assert "extra" not in caplog.text
    np.testing.assert_array_equal(other.get_tensor_data(w), [5.0, 6.0])


def test_report_missing_applies_to_session_info_keys(ckpt):
    other, _, _ = _session()
    other.add_session_state_info({"lr": 0.1})
    with pytest.raises(ValueError, match="lr"):
        other.load_checkpoint(ckpt, report_missing="error")


def test_bad_report_mode_raises(ckpt):
    other, _, _ = _session()
    with pytest.raises(ValueError, match="report_missing"):
        other.load_checkpoint(ckpt, report_missing="loud")


# load_from_session ----------------------------------------------------------------------------------


def test_load_from_session_copies_matching_keys():
    src, _, _ = _session(w0=np.array([3.0, 4.0], np.float32), extra=True)
    with src:
        _step(src)
    dst, w, b = _session(keys=("layer.w", "other.b"), b0=np.zeros(3, np.float32))
    dst.load_from_session(src)
    np.testing.assert_array_equal(dst.get_tensor_data(w), [4.0, 5.0])
    np.testing.assert_array_equal(dst.get_tensor_data(b), np.zeros(3))


def test_load_from_session_reports(caplog):
    src, _, _ = _session(extra=True)
    dst, _, _ = _session()
    with pytest.raises(ValueError, match="extra"):
        dst.load_from_session(src, report_missing="error")
    with caplog.at_level(logging.WARNING, logger="popxl_addons"):
        dst.load_from_session(src, report_missing="warn")
    assert "extra" in caplog.text


# Rotation and atomicity -----------------------------------------------------------------------------


def test_max_checkpoints_keeps_the_newest(tmp_path):
    session, _, _ = _session(max_checkpoints=2)
    (tmp_path / "mine").mkdir()
    for i in range(4):
        session.save_checkpoint(tmp_path / f"c{i}")
    assert _visible(tmp_path) == ["c2", "c3", "mine"]


def test_resaving_a_checkpoint_does_not_count_twice(tmp_path):
    session, _, _ = _session(max_checkpoints=2)
    session.save_checkpoint(tmp_path / "a")
    session.save_checkpoint(tmp_path / "b")
    session.save_checkpoint(tmp_path / "a")
    assert _visible(tmp_path) == ["a", "b"]
    session.save_checkpoint(tmp_path / "c")
    assert _visible(tmp_path) == ["a", "c"]


def test_rotation_is_per_session_object(tmp_path):
    first, _, _ = _session(max_checkpoints=1)
    second, _, _ = _session(max_checkpoints=1)
    first.save_checkpoint(tmp_path / "first")
    second.save_checkpoint(tmp_path / "second")
    assert _visible(tmp_path) == ["first", "second"]


def test_overwriting_a_checkpoint_replaces_it(tmp_path):
    session, _, _ = _session()
    session.save_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "stale.txt").write_text("old")
    with session:
        _step(session)
    session.save_checkpoint(tmp_path / "ckpt")
    assert _visible(tmp_path) == ["ckpt"]
    assert not (tmp_path / "ckpt" / "stale.txt").exists()
    with np.load(tmp_path / "ckpt" / "model" / "layer.w.npz") as npz:
        np.testing.assert_array_equal(npz["layer.w"], W0 + 1)


def _failing_after(n, real):
    calls = []

    def fake(*args, **kwargs):
        if len(calls) >= n:
            raise OSError("disk full")
        calls.append(args)
        return real(*args, **kwargs)

    return fake


@pytest.mark.parametrize("where", ["savez", "json"])
def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, where):
    session, _, _ = _session()
    session.save_checkpoint(tmp_path / "ckpt")
    with session:
        _step(session)
    if where == "savez":
        monkeypatch.setattr(np, "savez", _failing_after(1, np.savez))
    else:
        monkeypatch.setattr(json, "dump", _failing_after(0, json.dump))
    with pytest.raises(OSError, match="disk full"):
        session.save_checkpoint(tmp_path / "ckpt")
    monkeypatch.undo()
    assert _visible(tmp_path) == ["ckpt"]
    assert _visible(tmp_path / "ckpt" / "model") == ["layer.b.npz", "layer.w.npz"]
    other, w, _ = _session(w0=np.zeros(2, np.float32))
    other.load_checkpoint(tmp_path / "ckpt", report_missing="error")
    np.testing.assert_array_equal(other.get_tensor_data(w), W0)
    assert other.session_state == {"steps": 0}


def test_crash_mid_save_of_a_new_checkpoint_leaves_nothing(tmp_path, monkeypatch):
    session, _, _ = _session(max_checkpoints=1)
    session.save_checkpoint(tmp_path / "old")
    monkeypatch.setattr(np, "savez", _failing_after(1, np.savez))
    with pytest.raises(OSError):
        session.save_checkpoint(tmp_path / "new")
    monkeypatch.undo()
    assert _visible(tmp_path) == ["old"]


def test_failing_dataloader_save_keeps_the_previous_checkpoint(tmp_path):
    class Broken(DataLoader):
        def save(self, path):
            with open(path, "w") as f:
                f.write("partial")
            raise RuntimeError("dataloader failed")

    session, _, _ = _session()
    session.save_checkpoint(tmp_path / "ckpt")
    session.dataloader = Broken()
    with pytest.raises(RuntimeError, match="dataloader failed"):
        session.save_checkpoint(tmp_path / "ckpt")
    assert _visible(tmp_path) == ["ckpt"]
    assert not (tmp_path / "ckpt" / "dataloader.bin").exists()


# Import ---------------------------------------------------------------------------------------------


def test_top_level_names_and_lazy_import():
    assert addons.TaskSession is TaskSession
    assert addons.write_variables_pb is write_variables_pb
    probe = (
        "import sys, popxl_addons\n"
        "assert not any(m.split('.')[0] in ('jax', 'runtime') for m in sys.modules), 'eager'\n"
        "assert popxl_addons.TaskSession.__module__ == 'popxl_addons.task_session'\n"
        "assert 'runtime' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)
