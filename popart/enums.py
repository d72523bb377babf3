"""PopART's public enumerations, with PopART's Python names and values.

Each is an ``IntEnum``, as PopART's bound enums convert with ``int()``: applications pass
them to PopTorch as ``opts._Popart.set("syntheticDataMode",
int(popart.SyntheticDataMode.RandomNormal))``. Values follow the order of PopART's C++
declarations (``willow/include/popart/sessionoptions.hpp`` and its neighbours); where the
Python binding renamed a member (``RecomputationType.NoRecompute`` for C++ ``None``,
``CommGroupType.Ungrouped``), the Python name is used.
"""

from __future__ import annotations

import enum

# The session options' enumerations are popxl's own (PopXL shipped inside PopART's package).
from popxl.session_options import ExecutionPhaseIOSchedule as ExecutionPhaseIOSchedule
from popxl.session_options import ExecutionPhaseSchedule as ExecutionPhaseSchedule
from popxl.session_options import RecomputationType as RecomputationType
from popxl.session_options import SyntheticDataMode as SyntheticDataMode
from popxl.session_options import VirtualGraphMode as VirtualGraphMode


class AccumulateOuterFragmentSchedule(enum.IntEnum):
    Scheduler = 0
    Serial = 1
    OverlapCycleOptimized = 2
    OverlapMemoryOptimized = 3


class AutodiffStitchStrategy(enum.IntEnum):
    RecomputeMinimal = 0
    RecomputeAllNonInputs = 1
    AddFwdOutputs = 2
    SafeAddFwdOutputs = 3


class BatchSerializationBatchSchedule(enum.IntEnum):
    Scheduler = 0
    Isomorphic = 1
    OverlapOnIo = 2
    OverlapOnCompute = 3


class BatchSerializationMethod(enum.IntEnum):
    UnrollDynamic = 0
    UnrollStatic = 1
    Loop = 2


class BatchSerializationTransformContext(enum.IntEnum):
    Fwd = 0
    Bwd = 1
    Forward = 0  # the binding's aliases
    Backward = 1


class CommGroupType(enum.IntEnum):
    All = 0
    Consecutive = 1
    Orthogonal = 2
    Ungrouped = 3


class DataType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    FLOAT8_143 = 2
    FLOAT8_152 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    UINT32 = 8
    UINT64 = 9
    BOOL = 10
    FLOAT = 11
    FLOAT16 = 12
    BFLOAT16 = 13
    DOUBLE = 14
    COMPLEX64 = 15
    COMPLEX128 = 16
    STRING = 17
    UNDEFINED = 18


class DeviceConnectionType(enum.IntEnum):
    Always = 0
    OnDemand = 1
    Never = 2


class DeviceType(enum.IntEnum):
    IpuModel = 0
    Cpu = 1
    Ipu = 2
    OfflineIpu = 3
    Sim = 4


class GradientTensorTrackingMethod(enum.IntEnum):
    AllNonViewChangingGradientTensors = 0
    ConvAndMatmulGradients = 1
    GradientsOfUserSpecifiedTensors = 2


class InitType(enum.IntEnum):
    NoInit = 0
    Zero = 1


class Instrumentation(enum.IntEnum):
    Outer = 0
    Inner = 1


class MeanReductionStrategy(enum.IntEnum):
    Running = 0
    Post = 1


class MergeVarUpdateType(enum.IntEnum):
    Off = 0  # C++ None
    All = 1
    AutoLoose = 2
    AutoTight = 3


class PatternsLevel(enum.IntEnum):
    NoPatterns = 0
    Minimal = 1
    Default = 2
    All = 3


class RecomputeType(enum.IntEnum):
    Undefined = 0
    Checkpoint = 1
    Recompute = 2
    Recomputed = 3


class ReductionType(enum.IntEnum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class ReplicatedTensorSharding(enum.IntEnum):
    Off = 0
    On = 1


class SubgraphCopyingStrategy(enum.IntEnum):
    OnEnterAndExit = 0
    JustInTime = 1


class SyncPattern(enum.IntEnum):
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class TensorStorage(enum.IntEnum):
    OnChip = 0
    OffChip = 1


class TileSet(enum.IntEnum):
    Compute = 0
    IO = 1


class VariableRetrievalMode(enum.IntEnum):
    OnePerGroup = 0
    AllReduceReplicas = 1
    AllReplicas = 2
