"""The PopART views real PopXL code reaches into: _pb_ir, _pb_graph, _pb_tensor, the log."""

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import _log


def _small_ir():
    ir = popxl.Ir()
    sub = ir.create_graph(lambda x: ops.gelu(x), popxl.TensorSpec((2,), popxl.float32))
    with ir.main_graph:
        w = popxl.variable(np.ones((2,), np.float16), name="w")
        y = ops.call(sub, ops.cast(w, popxl.float32))[0]
        z = y + 1
    return ir, sub, w, z


def test_graphs_and_ops_carry_popxl_type_names():
    ir, sub, _, _ = _small_ir()
    graphs = ir._pb_ir.getAllGraphs()
    assert [g.id for g in graphs] == ["", sub.id]
    assert [op.opType() for op in ir.main_graph._pb_graph.getOps()] == ["Cast", "Call", "Add"]
    assert [op.opType() for op in graphs[1].getOps()] == ["Gelu"]
    assert ir._pb_ir.getMainGraph().getOps()[0].id == ir.main_graph._ops[0].id


def test_tensor_info_shape_and_lower_case_type_round_trip():
    _, _, w, z = _small_ir()
    assert w._pb_tensor.info.shape() == [2] and w._pb_tensor.info.data_type_lcase() == "float16"
    assert popxl.dtype.as_dtype(z._pb_tensor.info.data_type_lcase()) is popxl.float32
    assert z._pb_tensor.id == z.id


def test_log_ir_writes_schedules_only_when_debug_is_on(monkeypatch, capsys):
    ir, sub, _, _ = _small_ir()
    monkeypatch.delenv("POPART_LOG_LEVEL", raising=False)
    ir._pb_ir.logIr()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("POPART_LOG_LEVEL", "DEBUG")
    ir._pb_ir.logIr()
    err = capsys.readouterr().err
    assert re.search(r"Z popart:ir \d+\.\d+ D: Graph '':", err)
    assert f"Graph '{sub.id}':" in err and "Gelu" in err


@pytest.mark.parametrize(
    "env, logger_level, level, shown",
    [
        ("", None, _log.DEBUG, False),
        ("INFO", None, _log.DEBUG, False),
        ("DEBUG", None, _log.DEBUG, True),
        ("TRACE", None, _log.TRACE, True),
        ("", "DEBUG", _log.DEBUG, True),  # popart.getLogger().setLevel("DEBUG")
        ("OFF", "DEBUG", _log.TRACE, False),
    ],
)
def test_log_level_from_env_or_popart_logger(monkeypatch, capsys, env, logger_level, level, shown):
    import logging

    monkeypatch.setenv("POPART_LOG_LEVEL", env)
    logger = logging.getLogger("popart")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    if logger_level:
        logger.setLevel(logger_level)
    _log.log(level, "hello there", "devicex")
    err = capsys.readouterr().err
    assert (" popart:devicex " in err and err.endswith(": hello there\n")) is shown
