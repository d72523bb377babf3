"""PopTorch's enumerations (``poptorch.OutputMode``, ``CommGroupType`` ...)."""

from __future__ import annotations

import enum


class OutputMode(enum.IntEnum):
    """Which results a model call returns.

    * ``All``: one result per micro-batch.
    * ``Sum``: the sum over all micro-batches of the call.
    * ``Final``: the last micro-batch's result.
    * ``EveryN``: the last micro-batch of every N-th device iteration (N is the
      ``output_return_period``).
    * ``Default``: ``All`` for inference, ``Final`` for training.
    """

    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class ReductionType(enum.IntEnum):
    """How gradients are reduced over micro-batches and replicas."""

    Sum = 0
    Mean = 1
    NoReduction = 2


class MeanReductionStrategy(enum.IntEnum):
    """When the mean's division happens (``Running``: keep a running mean; ``Post``: after
    summing; ``PostAndLoss``: deprecated)."""

    Running = 0
    Post = 1
    PostAndLoss = 2


class CommGroupType(enum.IntEnum):
    """How replicas are grouped for a per-group variable or an input split.

    * ``All``: one group of every replica.
    * ``Consecutive``: groups ``{0..k-1}, {k..2k-1}, ...`` for group size ``k``.
    * ``Orthogonal``: groups ``{0, m, 2m...}, {1, m+1...}`` with ``m = replicas / k``.
    * ``NoGrouping``: every replica is its own group.
    """

    All = 0
    Consecutive = 1
    Orthogonal = 2
    NoGrouping = 3


class VariableRetrievalMode(enum.IntEnum):
    """Which replicas' values of a grouped variable reach the host: ``OnePerGroup`` (the
    first replica of each group) or ``AllReplicas`` (PopTorch's numbering: 0 and 2)."""

    OnePerGroup = 0
    AllReplicas = 2


class DataLoaderMode(enum.IntEnum):
    """``Sync``: load in the caller; ``Async``: prefetch in a background worker;
    ``AsyncRebatched``: the workers load batches of ``rebatched_worker_size`` samples and the
    accessor concatenates and splits them into combined batches (for iterable datasets
    only the last combined batch's remainder is dropped, not each worker's)."""

    Sync = 0
    Async = 1
    AsyncRebatched = 2


class SharingStrategy(enum.IntEnum):
    """How a dataset reaches the worker. The worker here is a thread sharing memory with the
    caller, so every strategy behaves as ``SharedMemory``."""

    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class ConnectionType(enum.IntEnum):
    """When the executor attaches: ``Always`` (at compile), ``OnDemand`` (at first run),
    ``Never`` (compile only; running raises)."""

    Always = 0
    OnDemand = 1
    Never = 2


class SyncPattern(enum.IntEnum):
    """IPU synchronisation pattern (recorded; one device needs no synchronisation)."""

    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class Liveness(enum.IntEnum):
    """Where phased execution keeps tensors between phases."""

    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class AutoStage(enum.IntEnum):
    """How blocks get stage ids: the IPU id (``SameAsIpu``) or a running count."""

    SameAsIpu = 0
    AutoIncrement = 1


class HalfFloatCastingBehavior(enum.IntEnum):
    """Deprecated in PopTorch: how mixed half/float operations are cast (always
    ``HalfUpcastToFloat`` here, PyTorch's type promotion)."""

    FloatDowncastToHalf = 0
    HalfUpcastToFloat = 1
    Default = 2


class MatMulSerializationMode(enum.Enum):
    """The dimension ``poptorch.serializedMatMul`` splits: the input channels, the reducing
    dimension, the output channels, or none (``Disabled``)."""

    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class OverlapMode(enum.Enum):
    """How host transfers of a tensor overlap compute (``set_overlap_for_input`` /
    ``set_overlap_for_output``): not at all, with the next gradient accumulation
    iteration, or with the next device iteration (through IO tiles)."""

    NoOverlap = "no_overlap"
    OverlapAccumulationLoop = "overlap_accumulation_loop"
    OverlapDeviceIterationLoop = "overlap_device_iteration_loop"


class MultiConvPlanType(enum.IntEnum):
    """How a ``poptorch.MultiConv`` plans its convolutions: together (``Parallel``, the
    default) or one by one (``Serial``)."""

    Parallel = 0
    Serial = 1


ENUMS = {
    cls.__name__: cls
    for cls in (
        OutputMode,
        ReductionType,
        MeanReductionStrategy,
        CommGroupType,
        VariableRetrievalMode,
        DataLoaderMode,
        SharingStrategy,
        ConnectionType,
        SyncPattern,
        Liveness,
        AutoStage,
        HalfFloatCastingBehavior,
        MatMulSerializationMode,
        OverlapMode,
        MultiConvPlanType,
    )
}
"""Every enumeration by name (config files and ``from_json`` name members as
``"OutputMode.All"``)."""
