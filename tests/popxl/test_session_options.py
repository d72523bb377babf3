"""Session options: PopART's names and defaults, validated assignment, teaching errors."""

import pydantic
import pytest

import popxl
from popxl.session_options import SessionOptions, VirtualGraphMode


def test_same_object_every_call_and_per_ir():
    ir = popxl.Ir()
    opts = ir._pb_ir.getSessionOptions()
    assert opts is ir._pb_ir.getSessionOptions()
    assert opts is not popxl.Ir()._pb_ir.getSessionOptions()


def test_defaults_as_popxl_sets_them():
    opts = popxl.Ir()._pb_ir.getSessionOptions()
    assert opts.virtualGraphMode is VirtualGraphMode.Manual
    assert opts.enableExplicitMainLoops and opts.useHostCopyOps and opts.explicitRecomputation
    assert opts.numIOTiles == 0 and opts.engineOptions == {} and opts.dotChecks == set()


def test_assignment_is_validated():
    opts = SessionOptions()
    opts.numIOTiles = 32
    assert opts.numIOTiles == 32
    with pytest.raises(pydantic.ValidationError):
        opts.numIOTiles = "many"
    with pytest.raises(pydantic.ValidationError):
        opts.numIOTiles = -1
    assert opts.numIOTiles == 32


def test_unknown_option_names_the_closest():
    opts = SessionOptions()
    with pytest.raises(AttributeError, match="did you mean 'enableStochasticRounding'"):
        opts.enableStochasticRoundng = True
    with pytest.raises(AttributeError, match="no option 'cachPath'.*'cachePath'"):
        _ = opts.cachPath
