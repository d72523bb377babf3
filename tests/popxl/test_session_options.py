"""Session options: PopART's names and defaults, validated assignment, teaching errors."""

import enum

import pydantic
import pytest

import popxl
from popxl.session_options import (
    ExecutionPhaseIOSchedule,
    ExecutionPhaseSchedule,
    ExecutionPhaseSettings,
    SessionOptions,
    VirtualGraphMode,
)


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


def test_every_option_says_what_it_does():
    for cls in (SessionOptions, ExecutionPhaseSettings):
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no description"


def test_options_without_effect_say_so():
    fields = SessionOptions.model_fields
    for name in ("aliasZeroCopy", "useHostCopyOps", "constantWeights", "accumulationFactor"):
        assert fields[name].description.startswith("Accepted without effect here: ")
    for name in ("numIOTiles", "enableEngineCaching", "dotChecks", "enableStochasticRounding"):
        assert "without effect" not in fields[name].description


def test_enums_accept_popart_members_names_and_values():
    class OtherVirtualGraphMode(enum.Enum):  # stands for popart.VirtualGraphMode
        Off = 0
        Manual = 1

    opts = SessionOptions()
    opts.virtualGraphMode = OtherVirtualGraphMode.Off
    assert opts.virtualGraphMode is VirtualGraphMode.Off
    opts.virtualGraphMode = "Auto"
    assert opts.virtualGraphMode is VirtualGraphMode.Auto
    opts.virtualGraphMode = 3
    assert opts.virtualGraphMode is VirtualGraphMode.ExecutionPhases
    with pytest.raises(pydantic.ValidationError, match="expected a VirtualGraphMode"):
        opts.virtualGraphMode = "Sometimes"


def test_execution_phase_settings_is_a_validated_sub_object():
    opts = SessionOptions()
    settings = opts.executionPhaseSettings
    assert (settings.phases, settings.stages) == (0, 2)
    assert settings.schedule is ExecutionPhaseSchedule.Interleaving
    settings.phases = 4
    settings.weightIOSchedule = "OnDemand"
    assert opts.executionPhaseSettings.phases == 4
    assert settings.weightIOSchedule is ExecutionPhaseIOSchedule.OnDemand
    with pytest.raises(AttributeError, match="'ExecutionPhaseSettings' has no option 'phase'"):
        settings.phase = 1
    with pytest.raises(pydantic.ValidationError):
        settings.stages = 0


def test_engine_options_hold_strings_only():
    opts = SessionOptions()
    opts.engineOptions["opt.enableInlining"] = "false"
    assert opts.engineOptions == {"opt.enableInlining": "false"}
    with pytest.raises(TypeError, match="map strings to strings"):
        opts.engineOptions["debug.retainDebugInformation"] = True
    opts.engineOptions = {"a": "1"}
    with pytest.raises(TypeError, match="map strings to strings"):
        opts.engineOptions.update(b=2)
    assert opts.engineOptions == {"a": "1"}


def test_replication_factor_lives_in_the_options():
    ir = popxl.Ir(replication=4)
    opts = ir._pb_ir.getSessionOptions()
    assert (opts.enableReplicatedGraphs, opts.replicatedGraphCount) == (True, 4)
    assert opts.getGlobalReplicationFactor() == 4 == ir.replication_factor
    assert list(opts.replica_offsets()) == [0, 1, 2, 3]
    ir.replication_factor = 1
    assert not opts.enableReplicatedGraphs and ir.instance_replication_factor == 1


def test_distributed_replicas_and_offsets():
    ir = popxl.Ir(replication=2)
    opts = ir._pb_ir.getSessionOptions()
    opts.globalReplicationFactor = 8
    opts.globalReplicaOffset = 6
    assert ir.replication_factor == 2  # not distributed yet
    opts.enableDistributedReplicatedGraphs = True
    assert (ir.replication_factor, ir.instance_replication_factor) == (8, 2)
    assert list(opts.replica_offsets()) == [6, 7]
