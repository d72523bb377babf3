"""ipu_copy / io_tile_copy placement and names; remote_code_load argument checks."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def test_ipu_copy_records_placement_and_name():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32), name="x")
        with popxl.ipu(0):
            y = x + 1.0
        z = ops.ipu_copy(y, 1)
        w = y.copy_to_ipu(2, 0)
    assert z.name == f"{y.name}_c1" and z._producer.type == "IpuCopy"
    assert z.ipu == 1 and w.ipu == 2
    assert z._producer.attrs["source"] == 0
    assert y.ipu == 0


def test_ipu_copy_cannot_infer_source():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32), name="x")
        with pytest.raises(ValueError, match="Could not infer the ipu") as info:
            ops.ipu_copy(x, 1)
        assert "Please specify `source`" in str(info.value)
        assert ops.ipu_copy(x, 1, source=0).ipu == 1
        assert x.ipu == 0  # the copy's source placement is read back by consumers


def test_io_tile_copy_switches_tile_set():
    # As in PopART: the copy's output lives on the op's tile set, its input on the other.
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32), name="x")
        with popxl.io_tiles():
            y = x + 0.0
        z = ops.io_tile_copy(y)
    assert z.name == f"{y.name}_iotilecopy" and z._producer.type == "IoTileCopy"
    assert y.tile_set == "io" and z.tile_set == "compute"


def test_remote_code_load_checks_arguments():
    ir = popxl.Ir()
    sub = ir.create_graph(lambda: None)
    with ir.main_graph:
        before = len(ir.main_graph._ops)
        assert ops.remote_code_load(sub, "executable") is None
        assert len(ir.main_graph._ops) == before  # records nothing
        for destination in ("compute_buffer", "io_buffer"):
            with pytest.raises(NotImplementedError):
                ops.remote_code_load(sub, destination)
        with pytest.raises(ValueError, match="destination"):
            ops.remote_code_load(sub, "somewhere")
        with pytest.raises(ValueError, match="inside itself"):
            ops.remote_code_load(ir.main_graph, "executable")
        with pytest.raises(TypeError, match="Graph"):
            ops.remote_code_load("graph", "executable")
