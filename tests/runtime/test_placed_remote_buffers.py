"""Placed programs with remote buffers: reading and writing weights goes through device 0's
copy of each buffer (buffers are kept valid on every device)."""

import numpy as np

import popxl
from popxl import ops


def test_placed_remote_variables_read_and_write(monkeypatch):
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir = popxl.Ir()
    with ir.main_graph:
        out = popxl.d2h_stream((3,), popxl.float32)
        buf = popxl.remote_buffer((3,), popxl.float32, 1)
        remote = popxl.remote_variable(np.array([1.0, 2.0, 3.0], np.float32), buf, 0)
        with popxl.ipu(0):
            w = popxl.variable(np.zeros(3, np.float32), name="w")
            w += 1.0
            loaded = ops.remote_load(buf, 0)
        with popxl.ipu(1):
            doubled = ops.ipu_copy(loaded, 1, 0) * 2.0
            ops.remote_store(buf, 0, doubled)
            ops.host_store(out, doubled)
    with popxl.Session(ir, "ipu_model") as session:
        assert session._program.ipus == 2
        np.testing.assert_array_equal(session.run()[out], [2.0, 4.0, 6.0])
        np.testing.assert_array_equal(session.get_tensor_data(remote), [2.0, 4.0, 6.0])
        session.write_variables_data({remote: np.array([5.0, 5.0, 5.0], np.float32)})
        np.testing.assert_array_equal(session.run()[out], [10.0, 10.0, 10.0])
        np.testing.assert_array_equal(session.get_tensor_data(w), [2.0, 2.0, 2.0])
