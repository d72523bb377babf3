"""Per-IPU variable storage of placed programs (runtime.devices.ipu_slots): each device holds only
the variables of its IPU, the memory report shows it, and weights IO keeps working."""

import numpy as np
import pytest

import popxl
from popxl import ops
from runtime.devices.ipu_slots import SlotLayout
from runtime.session.program import build_program


def test_layout_pairs_equal_sizes_across_ipus_and_pads_the_rest():
    f32, f16 = np.float32, np.float16
    shapes = [((4, 8), f32), ((32,), f32), ((16,), f32), ((8,), f16), ((2, 16), f32)]
    layout = SlotLayout.build(2, shapes, [0, 1, 0, 1, 0])
    # 32-element float32: entries 0 and 4 on IPU 0, entry 1 on IPU 1 -> two slots.
    assert layout.slots == ((0, 1), (2, None), (None, 3), (4, None))
    assert layout.owned_bytes() == [128 + 64 + 128, 128 + 16]
    assert layout.resident_bytes() == 128 + 16 + 64 + 128
    values = [np.arange(np.prod(s), dtype=d).reshape(s) + 10 * i for i, (s, d) in enumerate(shapes)]
    slots = layout.pack(values)
    assert [s.shape for s in slots] == [(2, 32), (2, 16), (2, 8), (2, 32)]
    np.testing.assert_array_equal(slots[0][1], values[1])
    np.testing.assert_array_equal(slots[2][0], np.zeros(8, f16))  # padding
    for got, want in zip(layout.unpack(slots), values):
        np.testing.assert_array_equal(got, want)
    assert layout.where(4) == (3, 0)


def _two_ipus():
    """IPU 0: a (64, 64) float32 weight, written, and u (16,) float32 (read only).
    IPU 1: b (64, 64) float32, written, and h (8,) float16, written. y = (x @ a) @ b."""
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((64,), popxl.float32, "x")
        out = popxl.d2h_stream((64,), popxl.float32, "y")
        with popxl.ipu(0):
            a = popxl.variable(np.full((64, 64), 0.5, np.float32), name="a")
            u = popxl.variable(np.arange(16, dtype=np.float32), name="u")
            y = ops.matmul(ops.host_load(x_in), a) + ops.sum(u)
            a += 1.0
            y = y.copy_to_ipu(1)
        with popxl.ipu(1):
            b = popxl.variable(np.full((64, 64), 2.0, np.float32), name="b")
            h = popxl.variable(np.ones((8,), np.float16), name="h")
            ops.host_store(out, ops.matmul(y, b))
            b += 1.0
            h += 1.0
    return ir, x_in, out, (a, u, b, h)


@pytest.mark.parametrize("placement", ["off", "on"])
def test_memory_report_shows_variables_resident_per_ipu(monkeypatch, placement):
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    ir, *_ = _two_ipus()
    report = popxl.Session(ir, "ipu_model").memory_report()
    owned = [64 * 64 * 4 + 16 * 4, 64 * 64 * 4 + 8 * 2]  # 16448, 16400
    assert [m.variables for m in report.ipus] == owned
    if placement == "on":
        # a and b share one slot; u and h have no partner of their size: padding.
        assert [m.resident for m in report.ipus] == [16384 + 64 + 16] * 2
        assert report.devices == 2
    else:
        assert [m.resident for m in report.ipus] == [sum(owned)] * 2
        assert report.devices == 1
    # XLA's arguments per device are the resident variables plus the input stream.
    assert report.xla["argument"] == report.ipus[0].resident + 64 * 4
    assert "resident" in str(report)


@pytest.mark.parametrize("placement", ["off", "on"])
def test_weights_io_with_per_ipu_variables(monkeypatch, placement):
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    ir, x_in, out, (a, u, b, h) = _two_ipus()
    x = np.linspace(-1, 1, 64).astype(np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        y1 = session.run({x_in: x})[out]
        session.write_variable_data(b, np.full((64, 64), -1.0, np.float32))
        y2 = session.run({x_in: x})[out]
        got = session.get_tensors_data([a, u, b, h])
        if placement == "on":
            slot = session._state[0]
            assert {d.id for d in slot.sharding.device_set} == {0, 1}
            assert slot.shape == (2, 64 * 64)
    a0, ones = np.full((64, 64), 0.5, np.float32), np.ones((64, 64), np.float32)
    np.testing.assert_allclose(y1, ((x @ a0) + 120) @ (2 * ones), rtol=1e-5)
    np.testing.assert_allclose(y2, ((x @ (a0 + 1)) + 120) @ -ones, rtol=1e-5)
    np.testing.assert_array_equal(got[a], a0 + 2)
    np.testing.assert_array_equal(got[u], np.arange(16, dtype=np.float32))
    np.testing.assert_array_equal(got[b], np.zeros((64, 64), np.float32))
    np.testing.assert_array_equal(got[h], np.full(8, 3, np.float16))
    # Detached: the host copies were written back on exit; a new session starts from them.
    np.testing.assert_array_equal(session.get_tensor_data(b), np.zeros((64, 64), np.float32))


def test_same_sized_variables_of_two_ipus_share_one_array(monkeypatch):
    """w (read on IPU 0) and v (updated on IPU 1) have one size: one (2, 4) array, row k on
    device k, and the update on device 1 leaves device 0's row alone."""
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir = popxl.Ir()
    with ir.main_graph:
        out = popxl.d2h_stream((4,), popxl.float32)
        with popxl.ipu(0):
            w = popxl.variable(np.arange(4, dtype=np.float32), name="w")
            y = (w * 2.0).copy_to_ipu(1)
        with popxl.ipu(1):
            v = popxl.variable(np.ones(4, np.float32), name="v")
            ops.var_updates.accumulate_(v, y)
            ops.host_store(out, v)
    program = build_program(ir)
    assert program.slots is not None and program.homes == (0, 1)
    assert program.slots.slots == ((0, 1),)
    with popxl.Session(ir, "ipu_model") as session:
        first = session.run()[out]
        second = session.run()[out]
        rows = np.asarray(session._state[0])
    np.testing.assert_array_equal(first, 1 + np.arange(4) * 2)
    np.testing.assert_array_equal(second, 1 + np.arange(4) * 4)
    np.testing.assert_array_equal(rows, [np.arange(4), 1 + np.arange(4) * 4])
    np.testing.assert_array_equal(session.get_tensor_data(w), np.arange(4))


def test_placed_program_is_saved_to_and_loaded_from_the_executable_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    results = []
    for _ in range(2):
        ir, x_in, out, (a, u, b, h) = _two_ipus()
        opts = ir._pb_ir.getSessionOptions()
        opts.enableEngineCaching, opts.cachePath = True, str(tmp_path)
        with popxl.Session(ir, "ipu_model") as session:
            assert session._program.ipus == 2 and session._executable is not None
            results.append(session.run({x_in: np.ones(64, np.float32)})[out])
            assert session.get_tensor_data(h)[0] == 2.0
    assert len(list(tmp_path.glob("*.popef"))) == 1
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], np.full(64, (32 + 120) * 2 * 64, np.float32))


@pytest.mark.parametrize("placement", ["off", "on"])
def test_remote_variable_of_a_placed_program_reads_and_writes(monkeypatch, placement):
    """A remote variable updated on IPU 1 next to an on-chip variable on IPU 0."""
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((3,), popxl.float32, 2)
        with popxl.ipu(0):
            a = popxl.variable(np.ones(3, np.float32), name="a")
            a += 1.0
            y = (a * 1.0).copy_to_ipu(1)
        with popxl.ipu(1):
            r = popxl.remote_variable(np.full(3, 5.0, np.float32), buf, 1, name="r")
            loaded = ops.remote_load(buf, 1)
            ops.remote_store(buf, 1, loaded + y)
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
        assert session.get_tensor_data(r).tolist() == [7.0, 7.0, 7.0]
        session.write_variables_data({r: np.zeros(3, np.float32)})
        session.run()
        got = session.get_tensors_data([a, r])
    assert got[a].tolist() == [3.0, 3.0, 3.0] and got[r].tolist() == [3.0, 3.0, 3.0]
