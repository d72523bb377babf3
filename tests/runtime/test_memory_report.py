"""Session.memory_report(): variables, remote buffers and XLA's peak, per virtual IPU."""

import numpy as np
import pytest

import popxl
from popxl import ops


def _two_ipu_program() -> popxl.Ir:
    """IPU 0: a (4, 8) float32 variable (128 B). IPU 1: a (16,) float32 variable (64 B),
    a (8,) float16 variable (16 B) and a remote buffer of 3 entries of (10,) float32
    (120 B)."""
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros((4, 8), np.float32))
        w += 1.0
        with popxl.ipu(1):
            v = popxl.variable(np.zeros((16,), np.float32))
            h = popxl.variable(np.zeros((8,), np.float16))
            v += 2.0
            h += 1.0
            buf = popxl.remote_buffer((10,), popxl.float32, 3)
            ops.remote_store(buf, 0, v[:10])
    return ir


@pytest.mark.parametrize("placement", ["off", "on"])
def test_report_counts_variables_and_remote_buffers_per_ipu(monkeypatch, placement):
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    report = popxl.Session(_two_ipu_program(), "ipu_model").memory_report()
    assert [(m.ipu, m.variables, m.remote) for m in report.ipus] == [(0, 128, 0), (1, 80, 120)]
    assert report.devices == (2 if placement == "on" else 1)
    xla = report.xla
    # Every variable and buffer is an argument of the step (stacked per device when placed).
    assert xla["argument"] >= 128 + 64 + 16 + 120
    peak = xla["argument"] + xla["output"] - xla["alias"] + xla["temp"]
    assert all(m.device_peak == peak for m in report.ipus)
    assert all(m.chip_peak == peak - 120 for m in report.ipus)
    assert report.fits
    assert "chip peak" in str(report)


def test_remote_variables_leave_the_chip(monkeypatch):
    """The same 64 KiB of weights on chip or in a remote buffer: the chip peak drops by at
    least their size when they stream in per use."""
    monkeypatch.setenv("POPXL_PLACEMENT", "off")
    data = np.ones((128, 128), np.float32)

    def build(remote: bool) -> popxl.Ir:
        ir = popxl.Ir()
        with ir.main_graph:
            out = popxl.d2h_stream((128,), popxl.float32)
            if remote:
                buf = popxl.remote_buffer((128, 128), popxl.float32, 1)
                var = popxl.remote_variable(data, buf, 0)
                w = ops.remote_load(buf, 0)
            else:
                var = popxl.variable(data)
                w = var
            ops.host_store(out, ops.sum(w, 0))
        return ir, var

    on_chip = popxl.Session(build(False)[0], "ipu_model").memory_report()[0]
    streamed = popxl.Session(build(True)[0], "ipu_model").memory_report()[0]
    assert (on_chip.variables, on_chip.remote) == (65536, 0)
    assert (streamed.variables, streamed.remote) == (0, 65536)
    assert streamed.chip_peak <= on_chip.chip_peak
