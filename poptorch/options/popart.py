"""The option dictionary PopTorch's backend received: its names, its checks, its log lines.

``Options.toDict()`` flattens every option into one dictionary under the names PopTorch's
C++ backend knew (``device_iterations``, ``replication_factor``, PopART session option
names such as ``enableOutlining`` or ``batchSerializationSettings.factor``).
``validate_popart_options`` reads such a dictionary the way that backend did: the Python
type of each value picks a kind (bool, unsigned integer, float, string, set/list, map),
the name must be one the backend knew for that kind, enumerated values must be in range
(PopART's enumerations are ``popart``'s; a member or its number), and every accepted value
is logged at DEBUG on ``poptorch::python`` ("poptorch.Options set X to value Y", "added A
to X", "set X[k] to v"). An invalid entry raises ``poptorch.Error``. Most PopART options
have no effect in this implementation (no PopART, no Poplar); checking them still catches
misspelt names and wrong types.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import popart

from .._log import logger
from ..enums import Liveness
from ..errors import Error

UNKNOWN_OPTION_MSG = "Unknown {kind} option {name}"
UNKNOWN_TYPE_MSG = "Unknown value type {type} for option {name}"
RANGE_MSG = "Value for {enum} out of range: {name} = {value} (valid: {valid})"
NEGATIVE_MSG = "Option {name} takes an unsigned integer, got {value}"
PATTERNS_LEVEL_MSG = (
    "PopART option 'patterns' should not be set without first setting 'patterns_level'."
)
LOCATION_KEY_MSG = "Unknown option '{key}' for tensor location {name}"
MEMORY_MSG = "available_memory_proportion[{ipu}] = {value} is not a float32 value"
PATTERN_MSG = "patterns maps pattern names to booleans, got {pattern!r}: {enabled!r}"
CONTAINER_ITEM_MSG = "Unknown value type {type} in option {name}: items must be strings or numbers"

# Options the backend took as booleans.
BOOL_OPTIONS = frozenset(
    """
    auto_round_num_ipus use_model serial_phases_execution separate_backward_phase
    broadcast_buffers enableExplicitIR enableInplaceAmbiguityChecking
    enableLoadAndOffloadRNGState batchSerializationSettings.concatOnVirtualGraphChange
    batchSerializationSettings.concatOnExecutionPhaseChange
    batchSerializationSettings.concatOnPipelineStageChange strictOpVersions
    opxAliasChecking opxModifyChecking dotOpNames exportPoplarComputationGraph
    exportPoplarVertexGraph separateCallOpPdfs enableOutlining
    enableOutliningCopyCostPruning rearrangeAnchorsOnHost rearrangeStreamsOnHost
    enablePrefetchDatastreams enableNonStableSoftmax enableReplicatedGraphs
    enableGradientAccumulation instrumentWithHardwareCycleCounter enablePipelining
    disableGradAccumulationTensorStreams disableOptimizerStateTensorStreams compileEngine
    constantWeights enableEngineCaching enableMergeExchange enableFloatingPointChecks
    enableStochasticRounding ensureFp32LossScaleTensor explicitRecomputation
    enableExplicitMainLoops useHostCopyOps aliasZeroCopy delayVarUpdates
    enableFullyConnectedPass enableSerializedMatmuls enableStableNorm decomposeGradSum
    enableDistributedReplicatedGraphs groupHostSync automaticLossScalingSettings.enabled
    enableSupportedDataTypeCasting groupNormStridedChannelGrouping
    scheduleNonWeightUpdateGradientConsumersEarly
    replicatedCollectivesSettings.prepareScheduleForMergingCollectives
    replicatedCollectivesSettings.mergeAllReduceCollectives
    """.split()
)

# Options taking an unsigned integer, without a bound.
UINT_OPTIONS = frozenset(
    """
    device_iterations num_distributed_processes distributed_process_id ipu_version ipu_id
    gradient_accumulation output_return_period replication_factor input_group_size
    input_cgt random_seed max_repeat_logs executionPhaseSettings.phases
    executionPhaseSettings.stages batchSerializationSettings.factor firstDotOp finalDotOp
    numIOTiles mergeVarUpdateMemThreshold looseThresholdAtPeak accumulationFactor
    swapLimitScheduler globalReplicationFactor globalReplicaOffset defaultBufferingDepth
    defaultPrefetchBufferingDepth compilationProgressTotal
    transitiveClosureOptimizationThreshold automaticLossScalingSettings.updatePeriod
    """.split()
)


def _members(enumeration: type[enum.IntEnum]) -> tuple[str, ...]:
    """The member names of ``enumeration`` in value order (aliases left out)."""
    return tuple(member.name for member in enumeration)


# Options taking one of PopART's enumerations (``popart``), so the backend's range check
# (``value < Enum::N``) follows PopART's declarations.
POPART_ENUM_OPTIONS: dict[str, type[enum.IntEnum]] = {
    "connection_type": popart.DeviceConnectionType,
    "sync_pattern": popart.SyncPattern,
    "accumulationAndReplicationReductionType": popart.ReductionType,
    "meanAccumulationAndReplicationReductionStrategy": popart.MeanReductionStrategy,
    "accumulateOuterFragmentSettings.schedule": popart.AccumulateOuterFragmentSchedule,
    "autodiffSettings.stitchStrategy": popart.AutodiffStitchStrategy,
    "batchSerializationSettings.transformContext": popart.BatchSerializationTransformContext,
    "batchSerializationSettings.method": popart.BatchSerializationMethod,
    "batchSerializationSettings.batchSchedule": popart.BatchSerializationBatchSchedule,
    "autoRecomputation": popart.RecomputationType,
    "mergeVarUpdate": popart.MergeVarUpdateType,
    "virtualGraphMode": popart.VirtualGraphMode,
    "syntheticDataMode": popart.SyntheticDataMode,
    "subgraphCopyingStrategy": popart.SubgraphCopyingStrategy,
    "automaticLossScalingSettings.gradientTensorTrackingMethod": (
        popart.GradientTensorTrackingMethod
    ),
}

# Every option taking an enumerated value: name -> (the enumeration's name in the
# backend's message, its member names by value). The first four are PopTorch's own.
ENUM_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "execution_mode": ("ExecutionMode", ("Pipelined", "Sharded", "Phased")),
    "tensors_liveness": ("Liveness", _members(Liveness)),
    "output_mode": ("PopartOutputMode", ("Final", "EveryN", "All", "Sum")),
    "accumulation_and_replication_reduction_type": (
        "popart::ReductionType",
        _members(popart.ReductionType),
    ),
    **{name: (e.__name__, _members(e)) for name, e in POPART_ENUM_OPTIONS.items()},
}

STRING_OPTIONS = frozenset(
    """
    log_dir saveInitializersToFile model_name logDir cachePath partialsTypeMatMuls
    customCodeletCompileFlags serializedPoprithmsShiftGraphsDir kahnTieBreaker
    """.split()
)

FLOAT_OPTIONS = frozenset(
    """
    outlineSequenceBreakCost outlineThreshold timeLimitScheduler
    automaticLossScalingSettings.thresholdUpperCountProportion
    automaticLossScalingSettings.binEdgeLocation
    """.split()
)

# Options taking a set, list or tuple of values (each item converted to a string).
LIST_OPTIONS = frozenset(
    """
    accumulateOuterFragmentSettings.excludedVirtualGraphs dotChecks
    hardwareInstrumentations customCodelets updatableNamedBuffers
    """.split()
)

# Options taking a string -> string map.
MAP_OPTIONS = frozenset(
    """
    engineOptions reportOptions convolutionOptions matmulOptions lstmOptions gclOptions
    ipuof_configs
    """.split()
)

LOCATION_KEYS = frozenset(
    """
    minElementsForOffChip minElementsForReplicatedTensorSharding onChip
    useReplicatedTensorSharding useIOTilesToLoad useIOTilesToStore
    """.split()
)
LOCATION_OPTIONS = frozenset(
    ("location_activation", "location_weight", "location_optimizer", "location_accumulator")
)

# Entries the backend read elsewhere (with "patterns"), or never (Python-side only).
SKIPPED = frozenset(("patterns_level", "anchored_tensors"))
FLOAT32_MAX = 3.4028234663852886e38


def format_value(value: Any) -> str:
    """A value as PopTorch's backend printed it: booleans as ``true``/``false``, enums as
    their number, integral floats without ``.0``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)


def _log_set(name: str, value: Any) -> None:
    logger.debug("poptorch.Options set %s to value %s", name, format_value(value))


def _check_uint(name: str, value: int) -> None:
    if value < 0:
        raise Error(NEGATIVE_MSG.format(name=name, value=value), "poptorch_cpp_error")
    if name in ENUM_OPTIONS:
        _check_member(name, value, *ENUM_OPTIONS[name])
    if name == "hardwareInstrumentations":
        _check_member(name, value, "Instrumentation", _members(popart.Instrumentation))


def _check_member(name: str, value: int, enumeration: str, members: tuple[str, ...]) -> None:
    if value >= len(members):
        valid = ", ".join(f"{i} {member}" for i, member in enumerate(members))
        raise Error(
            RANGE_MSG.format(enum=enumeration, name=name, value=value, valid=valid),
            "poptorch_cpp_error",
        )


def _known(name: str, kind: str, names: frozenset[str] | Mapping[str, Any]) -> None:
    if name not in names:
        raise Error(UNKNOWN_OPTION_MSG.format(kind=kind, name=name), "poptorch_cpp_error")


def _item_text(name: str, item: Any) -> str:
    """An item of a set / list / map option as the string the backend received."""
    if not isinstance(item, (str, int, float)):
        raise Error(
            CONTAINER_ITEM_MSG.format(type=type(item).__name__, name=name), "poptorch_cpp_error"
        )
    if name == "hardwareInstrumentations":
        if isinstance(item, bool) or not isinstance(item, int):
            raise Error(
                f"{name} takes popart.Instrumentation values, got {item!r}", "poptorch_cpp_error"
            )
        _check_uint(name, item)
    return format_value(item)


def _list_option(name: str, value: Any) -> None:
    _known(name, "set / vector", LIST_OPTIONS)
    for item in value:
        text = _item_text(name, item)
        if name == "accumulateOuterFragmentSettings.excludedVirtualGraphs":
            _int_text(name, text)
        logger.debug("poptorch.Options added %s to %s", text, name)


def _int_text(name: str, text: str) -> None:
    try:
        int(text)
    except ValueError:
        raise Error(
            f"Option {name} takes virtual graph ids (integers), got {text!r}", "poptorch_cpp_error"
        ) from None


def _map_option(name: str, value: Mapping[Any, Any], options: Mapping[str, Any]) -> None:
    if name == "available_memory_proportion":
        for ipu, memory in value.items():
            if not isinstance(ipu, int) or not isinstance(memory, (int, float)):
                raise Error(MEMORY_MSG.format(ipu=ipu, value=memory), "poptorch_cpp_error")
            if not math.isfinite(memory) or abs(memory) > FLOAT32_MAX:
                raise Error(MEMORY_MSG.format(ipu=ipu, value=memory), "poptorch_cpp_error")
        return
    if name == "patterns":
        if "patterns_level" not in options:
            raise Error(PATTERNS_LEVEL_MSG, "poptorch_cpp_error")
        _check_patterns_level(options["patterns_level"])
        for pattern, enabled in value.items():
            if not isinstance(pattern, str) or not isinstance(enabled, bool):
                raise Error(
                    PATTERN_MSG.format(pattern=pattern, enabled=enabled), "poptorch_cpp_error"
                )
        return
    if name.startswith("location_"):
        _known(name, "tensor location", LOCATION_OPTIONS)
        for key, setting in value.items():
            if key not in LOCATION_KEYS:
                raise Error(LOCATION_KEY_MSG.format(key=key, name=name), "poptorch_cpp_error")
            if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
                raise Error(
                    NEGATIVE_MSG.format(name=f"{name}[{key}]", value=setting), "poptorch_cpp_error"
                )
            logger.debug("Setting %s to %s for location %s", key, setting, name)
        return
    _known(name, "map", MAP_OPTIONS)
    for key, item in value.items():
        logger.debug(
            "poptorch.Options set %s[%s] to %s", name, _item_text(name, key), _item_text(name, item)
        )


def _check_patterns_level(level: Any) -> None:
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 3:
        raise Error(
            f"patterns_level must be a popart.PatternsLevel value (0 to 3), got {level!r}",
            "poptorch_cpp_error",
        )


def _scalar_option(name: str, value: Any) -> bool:
    """Check and log a bool / int / float / str entry; False if ``value`` is none of them."""
    if isinstance(value, bool):
        _known(name, "bool", BOOL_OPTIONS)
    elif isinstance(value, float):
        _known(name, "floating point", FLOAT_OPTIONS)
    elif isinstance(value, int):
        if name not in UINT_OPTIONS and name not in ENUM_OPTIONS:
            raise Error(UNKNOWN_OPTION_MSG.format(kind="uint64", name=name), "poptorch_cpp_error")
        _check_uint(name, value)
    elif isinstance(value, str):
        _known(name, "string", STRING_OPTIONS)
        if name == "logDir":
            logger.warning(
                'Ignoring call to poptorch.Options._Popart.set("logDir",...): use '
                "poptorch.Options.logDir() instead"
            )
            return True
    else:
        return False
    _log_set(name, value)
    return True


def validate_popart_options(options: Mapping[str, Any]) -> None:
    """Check ``options`` (``Options.toDict()``) as PopTorch's backend did, logging each
    accepted value at DEBUG; raise ``poptorch.Error`` for an unknown name, a value of the
    wrong type or an enumerated value out of range."""
    for name, value in options.items():
        if not isinstance(name, str):
            raise Error(f"Option names must be strings, got {name!r}", "poptorch_cpp_error")
        if name in SKIPPED:
            continue
        if name == "compilation_progress_bar_fn":
            if not callable(value):
                raise Error(
                    UNKNOWN_TYPE_MSG.format(type=type(value).__name__, name=name),
                    "poptorch_cpp_error",
                )
            continue
        if _scalar_option(name, value):
            continue
        if isinstance(value, (set, frozenset, list, tuple)):
            _list_option(name, value)
        elif isinstance(value, Mapping):
            _map_option(name, value, options)
        else:
            raise Error(
                UNKNOWN_TYPE_MSG.format(type=type(value).__name__, name=name), "poptorch_cpp_error"
            )
