"""Sessions given or switched devices, transfer logs (lazy weights-to-host), the IO-tile
rules of numIOTiles, and Session._full_input_shape."""

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.utils import _to_device_info

FROM_HOST = "Writing weights from host, "
TO_HOST = "Writing weights to host complete."


@pytest.fixture
def log(monkeypatch, capsys):
    monkeypatch.setenv("POPART_LOG_LEVEL", "TRACE")
    capsys.readouterr()
    return lambda: capsys.readouterr().err


def _ir(replication=1):
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        w = popxl.variable(np.float32(2.0), name="w")
        ops.var_updates.accumulate_(w, popxl.constant(1.0))
        out = popxl.d2h_stream((), popxl.float32, "out")
        ops.host_store(out, w)
    return ir, w, out


def test_attached_device_is_set_up_once(log):
    ir, w, out = _ir()
    device = _to_device_info("ipu_model")
    assert device.attach() and device.isAttached
    session = popxl.Session(ir, device)
    assert session.is_attached
    with session:  # already attached: no second weights_from_host, no detach on exit
        assert session.run()[out] == 3.0
    assert device.isAttached and session.is_attached
    assert log().count(FROM_HOST) == 1
    device.detach()
    assert not session.is_attached


def test_weights_to_host_only_when_stale(log):
    ir, w, _ = _ir()
    with popxl.Session(ir, "cpu") as session:
        session.get_tensor_data(w)
        session.write_variables_data({w: np.float32(5.0)})
        session.get_tensors_data([w])
        assert log().count(TO_HOST) == 0
        session.run()
        assert session.get_tensor_data(w) == 6.0 and session.get_tensor_data(w) == 6.0
        assert log().count(TO_HOST) == 1


def test_every_variable_reuses_its_host_copy_on_attach(log):
    ir, w, _ = _ir()
    with ir.main_graph:
        buffer = popxl.remote_buffer((2,), popxl.float32)
        r = popxl.remote_variable(np.ones(2, np.float32), buffer, name="r")
    with popxl.Session(ir, "cpu"):
        pass
    text = log()
    for var in (w, r):
        assert (
            len(re.findall(f"Reusing TensorData for d2hWeightBuffer of tensor {var.id}\n", text))
            == 1
        )


@pytest.mark.parametrize(
    "compiled, device",
    [("ipu_hw", ("ipu_model", 1)), ("cpu", ("ipu_model", 1)), ("ipu_model", ("ipu_model", 2))],
)
def test_incompatible_device_is_refused_on_enter(compiled, device):
    ir, _, _ = _ir()
    session = popxl.Session(ir, compiled)
    other = _to_device_info(*device)
    session._set_device(other)
    with pytest.raises(RuntimeError, match=f"compiled for a {compiled} device with 1 IPU"):
        with session:
            pass
    assert not session.is_attached and not other.isAttached


def test_matching_device_runs_and_detaches():
    ir, _, out = _ir(replication=2)
    session = popxl.Session(ir, "ipu_model")
    device = _to_device_info("ipu_model", 2)
    session._set_device(device)
    with session:
        assert device.isAttached
        np.testing.assert_array_equal(session.run()[out], [3.0, 3.0])
    assert not device.isAttached


def test_device_factory_errors():
    with pytest.raises(ValueError, match=r"multiple devices \(provided: 2\) are not supported"):
        _to_device_info("cpu", 2)
    with pytest.raises(ValueError, match="Incorrect device type provided: gpu"):
        _to_device_info("gpu")


def test_full_input_shape():
    ir, _, _ = _ir(replication=4)
    ir.num_host_transfers = 8
    session = popxl.Session(ir, "cpu")
    assert session._full_input_shape((3, 4)) == (8, 4, 3, 4)
    assert popxl.Session(_ir()[0], "cpu")._full_input_shape((3,)) == (3,)


def _io_tile_ir(num_io_tiles):
    ir = popxl.Ir()
    ir._pb_ir.getSessionOptions().numIOTiles = num_io_tiles
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32), name="x")
        with popxl.io_tiles():
            y = x + 1
        out = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(out, ops.io_tile_copy(y))
    return ir, out


def test_ops_on_io_tiles_need_reserved_tiles():
    with pytest.raises(ValueError, match=r"No IO tile graph for index 0: op Add\.\d+ is placed"):
        popxl.Session(_io_tile_ir(0)[0], "ipu_model")
    ir, out = _io_tile_ir(32)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[out], [2.0, 2.0])


@pytest.mark.parametrize(
    "tiles, message",
    [
        (
            16,
            "16 is an invalid number of IO tiles. Number of IO tiles must be an even number and >= 32.",
        ),
        (33, "33 is an invalid number of IO tiles"),
        (1472, "Tiles per IPU 1472 should exceed number of IO tiles 1472."),
    ],
)
def test_io_tile_counts_follow_popart_rules(tiles, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        popxl.Session(_io_tile_ir(tiles)[0], "ipu_model")
