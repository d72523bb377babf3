"""DOT checkpoints: which checks write files (dotChecks, POPART_DOT_CHECKS, ALL) and where."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def _build(ir, save_dir=None):
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32), name="x")
        y = x * 2
        ir.dot_checkpoint("Foo", save_dir)
        d2h = popxl.d2h_stream((3,), popxl.float32, "out")
        ops.host_store(d2h, y + 1)
        ir.dot_checkpoint("Bar", save_dir)


def _files(folder):
    return sorted(p.name for p in folder.glob("*.dot"))


@pytest.mark.parametrize(
    "checks, written",
    [
        ({""}, []),
        ({"FINAL"}, ["FINAL.dot"]),
        ({"foo", "BAR"}, ["Bar.dot", "Foo.dot"]),  # names match in any case
        ({"ALL"}, ["Bar.dot", "FINAL.dot", "Foo.dot"]),
    ],
)
def test_dot_checks_option_selects_checkpoints(tmp_path, monkeypatch, checks, written):
    monkeypatch.setenv("POPART_DOT_CHECKS", "")
    ir = popxl.Ir()
    opts = ir._pb_ir.getSessionOptions()
    opts.dotChecks = checks
    opts.logDir = str(tmp_path)
    _build(ir)
    popxl.Session(ir, "cpu")  # writes the FINAL checkpoint
    assert _files(tmp_path) == written


def test_environment_adds_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("POPART_DOT_CHECKS", "FOO:final")
    ir = popxl.Ir()
    ir._pb_ir.getSessionOptions().logDir = str(tmp_path)
    _build(ir)
    popxl.Session(ir, "cpu")
    assert _files(tmp_path) == ["FINAL.dot", "Foo.dot"]
    assert ir._pb_ir.getSessionOptions().dotChecks == set()  # the environment decided


def test_first_checkpoint_turns_all_on_and_save_dir_sets_log_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("POPART_DOT_CHECKS", raising=False)
    ir = popxl.Ir()
    _build(ir, tmp_path / "dots")
    opts = ir._pb_ir.getSessionOptions()
    assert opts.dotChecks == {"ALL"} and opts.logDir == str(tmp_path / "dots")
    popxl.Session(ir, "cpu")
    assert _files(tmp_path / "dots") == ["Bar.dot", "FINAL.dot", "Foo.dot"]
    text = (tmp_path / "dots" / "Foo.dot").read_text()
    assert text.startswith("digraph") and "Mul" in text and "HostStore" not in text
