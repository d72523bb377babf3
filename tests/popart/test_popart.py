"""``popart``: PopART's enumerations, logger, exceptions and version, as programs use them."""

from __future__ import annotations

import enum
import subprocess
import sys

import numpy as np
import pytest

import popart
import popxl
import popxl.ops as ops


@pytest.mark.parametrize(
    ("member", "value"),
    [
        # Values read from PopART's C++ declarations (sessionoptions.hpp, datatype.hpp, ...).
        (popart.SyntheticDataMode.RandomNormal, 2),
        (popart.SyntheticDataMode.RandomUniform, 3),
        (popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized, 3),
        (popart.RecomputationType.NoRecompute, 0),
        (popart.RecomputationType.Pipeline, 3),
        (popart.RecomputationType.RecomputeAll, 4),
        (popart.SubgraphCopyingStrategy.JustInTime, 1),
        (popart.BatchSerializationBatchSchedule.Isomorphic, 1),
        (popart.VirtualGraphMode.ExecutionPhases, 3),
        (popart.MergeVarUpdateType.AutoTight, 3),
        (popart.CommGroupType.Ungrouped, 3),
        (popart.DataType.FLOAT, 11),
        (popart.DataType.BFLOAT16, 13),
        (popart.DeviceType.Sim, 4),
        (popart.VariableRetrievalMode.AllReplicas, 2),
    ],
    ids=str,
)
def test_enumerations_have_poparts_values(member, value):
    assert int(member) == value
    assert type(member)[member.name] is member


# Each enumeration's Python member names in value order, as PopART's bindings
# (python/popart/popart_core/popart.cpp, popart._internal.ir) name them; every one
# numbers its members 0, 1, 2... as the C++ declarations do.
MEMBERS = {
    "AccumulateOuterFragmentSchedule": (
        "Scheduler Serial OverlapCycleOptimized OverlapMemoryOptimized"
    ),
    "AutodiffStitchStrategy": (
        "RecomputeMinimal RecomputeAllNonInputs AddFwdOutputs SafeAddFwdOutputs"
    ),
    "BatchSerializationBatchSchedule": "Scheduler Isomorphic OverlapOnIo OverlapOnCompute",
    "BatchSerializationMethod": "UnrollDynamic UnrollStatic Loop",
    "BatchSerializationTransformContext": "Fwd Bwd",
    "CommGroupType": "All Consecutive Orthogonal Ungrouped",
    "DataType": (
        "UINT8 INT8 FLOAT8_143 FLOAT8_152 UINT16 INT16 INT32 INT64 UINT32 UINT64 BOOL FLOAT "
        "FLOAT16 BFLOAT16 DOUBLE COMPLEX64 COMPLEX128 STRING UNDEFINED"
    ),
    "DeviceConnectionType": "Always OnDemand Never",
    "DeviceType": "IpuModel Cpu Ipu OfflineIpu Sim",
    "ExecutionPhaseIOSchedule": "Preload OnDemand",
    "ExecutionPhaseSchedule": "Interleaving Batch BatchClusteredIO",
    "GradientTensorTrackingMethod": (
        "AllNonViewChangingGradientTensors ConvAndMatmulGradients GradientsOfUserSpecifiedTensors"
    ),
    "InitType": "NoInit Zero",
    "Instrumentation": "Outer Inner",
    "MeanReductionStrategy": "Running Post",
    "MergeVarUpdateType": "Off All AutoLoose AutoTight",
    "PatternsLevel": "NoPatterns Minimal Default All",
    "RecomputationType": "NoRecompute Standard NormOnly Pipeline RecomputeAll",
    "RecomputeType": "Undefined Checkpoint Recompute Recomputed",
    "ReductionType": "Sum Mean NoReduction",
    "ReplicatedTensorSharding": "Off On",
    "SubgraphCopyingStrategy": "OnEnterAndExit JustInTime",
    "SyncPattern": "Full SinglePipeline ReplicaAndLadder",
    "SyntheticDataMode": "Off Zeros RandomNormal RandomUniform",
    "TensorStorage": "OnChip OffChip",
    "TileSet": "Compute IO",
    "VariableRetrievalMode": "OnePerGroup AllReduceReplicas AllReplicas",
    "VirtualGraphMode": "Off Manual Auto ExecutionPhases",
}


@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_enumerations_have_poparts_members_in_order(name):
    enumeration = getattr(popart, name)
    assert [m.name for m in enumeration] == MEMBERS[name].split()
    assert [int(m) for m in enumeration] == list(range(len(enumeration)))


def test_every_enumeration_popart_exports_is_checked():
    exported = {
        n for n, v in vars(popart).items() if isinstance(v, type) and issubclass(v, enum.Enum)
    }
    assert exported == set(MEMBERS)


def test_binding_aliases_name_the_same_members():
    context = popart.BatchSerializationTransformContext
    assert context.Forward is context.Fwd and context.Backward is context.Bwd


def test_importing_popart_imports_neither_torch_nor_jax():
    code = "import sys, popart; print(sorted({'torch', 'jax', 'jaxlib'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_popxl_session_options_take_poparts_enumerations():
    ir = popxl.Ir()
    opts = ir._pb_ir.getSessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    assert opts.virtualGraphMode is popart.VirtualGraphMode.Manual
    assert popxl.session_options.SyntheticDataMode is popart.SyntheticDataMode


def test_popart_exception_is_what_popxl_raises():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32))
        b = popxl.variable(np.ones(2, np.float16))
        with pytest.raises(popart.popart_exception):
            ops.add(a, b)
    assert popart.exception is popart.popart_exception


def test_the_logger_is_poparts():
    assert popart.getLogger() is popart.getLogger("session")
    assert popart.getLogger().name == "popart"


def test_version_and_device_info():
    assert popart.versionString().startswith("popxl-jax")
    assert isinstance(popxl.utils._to_device_info("ipu_model", 1), popart.DeviceInfo)


def test_a_name_popart_lacks_says_what_is_provided():
    with pytest.raises(AttributeError, match="PopART's builder, sessions and _internal"):
        popart.Builder  # noqa: B018
