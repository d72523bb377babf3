"""``poptorch.Options``: how a model is compiled and run, with PopTorch's fluent setters.

``Options`` is a pydantic model: every value is validated and typed, ``model_dump_json()``
serialises it, ``clone()`` (or ``copy.deepcopy``) makes an independent, unfrozen copy.
The setters (``deviceIterations(10)``, ``Training.gradientAccumulation(4)``...) check
their arguments as PopTorch did, store them and return the object they were called on, so
calls chain. The snake_case fields (``device_iterations``, ``training.
gradient_accumulation``...) are what the program builder reads. PopART session options
live in ``_Popart.options`` (``opts._Popart.set(name, value)``); the setters PopTorch
implemented through it (``Precision.enableStochasticRounding``, ``enableSyntheticData``,
``enableExecutableCaching``...) store there too, so both ways agree. ``toDict()`` is the
flat dictionary PopTorch's backend received (see ``_options_popart``); it is checked and
logged when a model is built. A model wrapper or ``DataLoader`` may ``_freeze()`` the
options it uses: a frozen object raises ``AttributeError("Can't modify frozen Options")``
on any change.

Options marked "accepted without effect here" are validated and recorded (and appear in
``toDict()``) but change nothing: there is no PopART, Poplar or IPU behind this package.

The sub-objects (``Training``, ``Precision``, ``TensorLocations``, ``Distributed``,
``Jit``) are in ``_options_groups``, the shared machinery (freezing, ``set``, argument
checks, ``_Popart``) in ``_options_base``, config files and JSON in ``_options_text``.

>>> opts = Options().deviceIterations(10)
>>> _ = opts.Training.gradientAccumulation(4)
>>> opts.replication_factor, opts.training.gradient_accumulation
(1, 4)
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from .._log import logger
from ..enums import CommGroupType, ConnectionType, OutputMode, SyncPattern
from ..strategies import (
    ExecutionStrategy,
    ParallelPhasedExecution,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Strategy,
)
from . import text as _options_text
from .base import ConfigFileError as ConfigFileError
from .base import OptionValueError as OptionValueError
from .base import _Base, _bool, _check, _enum_member, _int, _positive, _str
from .base import _PopartOptions as _PopartOptions
from .groups import AnchoredTensor as AnchoredTensor
from .groups import TensorLocationSettings as TensorLocationSettings
from .groups import _DistributedOptions as _DistributedOptions
from .groups import _JitOptions as _JitOptions
from .groups import _PrecisionOptions as _PrecisionOptions
from .groups import _TensorLocationOptions as _TensorLocationOptions
from .groups import _TrainingOptions as _TrainingOptions
from .groups import distributed_env as distributed_env
from .popart import validate_popart_options as _validate

EVERY_N_MSG = (
    "OutputMode.EveryN needs output_return_period, the number of device iterations between "
    "returned results: outputMode(OutputMode.EveryN, 10)."
)
INPUT_GROUP_ALL_MSG = (
    "inputReplicaGrouping cannot use CommGroupType.All (input_group_type cannot be All): "
    "every replica would read the same data. Use CommGroupType.Consecutive or "
    "CommGroupType.Orthogonal."
)
STRATEGY_MSG = (
    "setExecutionStrategy expects a PipelinedExecution, ShardedExecution, "
    "SerialPhasedExecution or ParallelPhasedExecution, got {got}."
)
MEMORY_PROPORTION_MSG = (
    "available_memory_proportion must map IPU names to values in (0, 1], e.g. "
    "{{'IPU0': 0.5}}; got {got!r}."
)
DEFAULT_OUTPUT_MSG = "An output mode must be picked before serialisation"
MERGE_MSG = "Can't merge dictionaries, they have some keys in common: {keys}"
OFFLINE_VERSION_MSG = "useOfflineIpuTarget: ipu_version must be 1, 2 or 21, got {got!r}."
DEFAULT_SOURCE_EXCLUDES = ["install/poptorch", "site-packages/torch", "site-packages/poptorch"]
MAX_REPEAT_LOGS_ALL = (1 << 64) - 1


def _no_effect(description: str) -> str:
    return f"Accepted without effect here: {description}"


class Options(_Base):
    """Every option controlling how a model is compiled and executed.

    Fields use snake_case; PopTorch's camelCase setters set them. Values that the IR's
    session options also hold (replication, accumulation, stochastic rounding, partials,
    caching, log dir, IO tiles) are written there when a model is built. Creating an
    ``Options()`` applies ``POPTORCH_CACHE_DIR`` (``enableExecutableCaching``) and the JSON
    in ``POPTORCH_DEFAULT_OPTIONS`` (see ``from_json``).
    """

    device_iterations: int = Field(1, ge=1, description="Device iterations per host call.")
    replication_factor: int = Field(1, ge=1, description="Model replicas (data parallel).")
    input_group_size: int = Field(1, ge=1, description="Replicas sharing one input slice.")
    input_group_type: CommGroupType = Field(CommGroupType.Consecutive)
    output_mode: OutputMode = Field(OutputMode.Default)
    output_return_period: int = Field(1, ge=1)
    random_seed: int | None = Field(None, description="Seeds shuffling and weight init.")
    use_ipu_model: bool = Field(False, description="Run on 'ipu_model' instead of 'ipu_hw'.")
    log_dir: str = Field("", description="Session logDir.")
    model_name: str = Field("", description="Prefix of the program's name scope.")
    connection_type: ConnectionType = Field(ConnectionType.Always)
    sync_pattern: SyncPattern = Field(
        SyncPattern.Full, description=_no_effect("JAX devices need no sync pattern.")
    )
    auto_round_num_ipus: bool = Field(
        False, description=_no_effect("any number of virtual IPUs runs.")
    )
    available_memory_proportion: dict[str, float] = Field(
        default_factory=dict, description=_no_effect("no tile memory planner.")
    )
    broadcast_buffers: bool = Field(
        True,
        description="Refuse replicated models whose forward updates buffers (as PopTorch, "
        "which broadcast them); False lets each replica keep its own buffers.",
    )
    max_repeat_logs: int = Field(
        4, ge=0, description=_no_effect("the log does not suppress repeated lines.")
    )
    ipu_id: int | None = Field(None, description=_no_effect("devices are JAX's devices."))
    ipu_version: int | None = Field(
        None, description="Set by useOfflineIpuTarget (with ConnectionType.Never)."
    )
    anchored_tensors: dict[str, AnchoredTensor] = Field(
        default_factory=dict,
        description="anchorTensor's tensors by short name (see poptorch.execution.anchors).",
    )
    source_location_excludes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SOURCE_EXCLUDES),
        description=_no_effect("no IR source locations are printed."),
    )
    show_compilation_progress_bar: bool = Field(
        True,
        description="Show the first call's stages and elapsed time in a terminal (a bar on "
        "stderr) and record the compilation time (compilationTime).",
    )
    relax_optimizer_attributes_checks: bool = Field(
        False, description=_no_effect("optimizer attributes are checked as given.")
    )
    module_namescope_enabled: bool = Field(
        True, description="Name captured ops (and their tensors) after their torch module paths."
    )
    strategy: Strategy = Field(
        default_factory=PipelinedExecution,
        description=(
            "How the blocks a model marks (poptorch.Block / BeginBlock) are placed on IPUs and "
            "run: sharded, pipelined or phased (see poptorch.execution.staged)."
        ),
    )
    training: _TrainingOptions = Field(default_factory=_TrainingOptions)
    precision: _PrecisionOptions = Field(default_factory=_PrecisionOptions)
    tensor_locations: _TensorLocationOptions = Field(default_factory=_TensorLocationOptions)
    distributed: _DistributedOptions = Field(default_factory=_DistributedOptions.from_env)
    jit: _JitOptions = Field(default_factory=_JitOptions)
    popart: _PopartOptions = Field(default_factory=_PopartOptions)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        if not data:
            path = os.environ.get("POPTORCH_CACHE_DIR", "")
            if path:
                logger.info("POPTORCH_CACHE_DIR is set: setting cache path to %s", path)
                self.enableExecutableCaching(path)
            self.from_json(os.environ.get("POPTORCH_DEFAULT_OPTIONS", "{}"))

    @model_validator(mode="after")
    def _link(self) -> Options:
        """Point Precision and Training at this object's ``_Popart`` options."""
        for child in (self.precision, self.training):
            if child.__pydantic_private__ is not None:
                child.__pydantic_private__["_popart"] = self.popart
        return self

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Options:
        copied = super().__deepcopy__(memo)
        copied._link()
        return copied

    @classmethod
    def _set_aliases(cls) -> dict[str, str]:
        return {"input_cgt": "input_group_type", "use_model": "use_ipu_model"}

    # Sub-option groups, under PopTorch's names.
    @property
    def Training(self) -> _TrainingOptions:  # noqa: N802
        return self.training

    @property
    def Precision(self) -> _PrecisionOptions:  # noqa: N802
        return self.precision

    @property
    def TensorLocations(self) -> _TensorLocationOptions:  # noqa: N802
        return self.tensor_locations

    @property
    def Distributed(self) -> _DistributedOptions:  # noqa: N802
        return self.distributed

    @property
    def Jit(self) -> _JitOptions:  # noqa: N802
        return self.jit

    @property
    def _Popart(self) -> _PopartOptions:  # noqa: N802
        return self.popart

    # PopTorch's private names that applications and tests read.
    @property
    def _execution_strategy(self) -> ExecutionStrategy:
        return self.strategy

    @property
    def _source_location_excludes(self) -> list[str]:
        return self.source_location_excludes

    @property
    def _show_compilation_progress_bar(self) -> bool:
        return self.show_compilation_progress_bar

    @property
    def _relax_optimizer_checks(self) -> bool:
        return self.relax_optimizer_attributes_checks

    @property
    def _module_namescope_enabled(self) -> bool:
        return self.module_namescope_enabled

    # Values PopTorch kept in the PopART options.
    @property
    def executable_cache_dir(self) -> str:
        """Where compiled programs are cached (``""``: no caching); see
        ``enableExecutableCaching``."""
        o = self.popart.options
        return str(o.get("cachePath", "")) if o.get("enableEngineCaching") else ""

    def recomputes(self, ipus: int) -> bool:
        """Whether a model pipelined over ``ipus`` IPUs recomputes: its backward stages run
        each block's forward again rather than stash its activations (the same numbers,
        smaller stashes). PopART's ``autoRecomputation`` when set (any
        ``popart.RecomputationType`` but ``NoRecompute``), else PopTorch's default:
        ``Pipeline`` for a pipeline over more than one IPU."""
        chosen = self.popart.options.get("autoRecomputation")
        return ipus > 1 if chosen is None else bool(chosen)

    @property
    def synthetic_data(self) -> bool:
        """``enableSyntheticData``: the program makes its input data on the device and
        sends no output to the host (PopART's ``syntheticDataMode``)."""
        return bool(self.popart.options.get("syntheticDataMode", 0))

    @property
    def input_cgt(self) -> CommGroupType:
        return self.input_group_type

    # General setters.
    def deviceIterations(self, device_iterations: int) -> Options:  # noqa: N802
        """Run ``device_iterations`` iterations on the device per host call (a loop)."""
        self.device_iterations = _positive("deviceIterations", device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> Options:  # noqa: N802
        """Replicate the model ``replication_factor`` times (data parallel)."""
        self.replication_factor = _positive("replicationFactor", replication_factor)
        return self

    def inputReplicaGrouping(  # noqa: N802
        self, input_group_size: int, input_group_type: CommGroupType
    ) -> Options:
        """Replicas in one group of ``input_group_size`` read the same slice of the input
        (``NoGrouping``: each replica its own slice). The size must divide
        ``replicationFactor``: checked when the model is built, so the two may be set in
        either order."""
        kind = _enum_member(CommGroupType, input_group_type, "input_group_type")
        if kind == CommGroupType.NoGrouping:
            input_group_size, kind = 1, CommGroupType.Consecutive
        if kind == CommGroupType.All:
            raise OptionValueError(INPUT_GROUP_ALL_MSG)
        size = _positive("input_group_size", input_group_size)
        self.input_group_size, self.input_group_type = size, kind
        return self

    def outputMode(
        self, output_mode: OutputMode, output_return_period: int | None = None
    ) -> Options:  # noqa: N802
        """Which results a call returns (see ``OutputMode``). ``output_return_period`` is
        needed by ``EveryN`` and ignored (with an info message) by the other modes."""
        mode = _enum_member(OutputMode, output_mode, "outputMode")
        if mode == OutputMode.EveryN:
            if output_return_period is None:
                raise OptionValueError(EVERY_N_MSG)
            period = _positive("output_return_period", output_return_period)
        else:
            if output_return_period:
                logger.info(
                    "Anchor return period argument ignored with output_mode set to %s", mode
                )
            period = 1
        self.output_mode, self.output_return_period = mode, period
        return self

    def defaultOutputMode(self) -> bool:  # noqa: N802
        """Whether the output mode is still ``OutputMode.Default``."""
        return self.output_mode == OutputMode.Default

    def anchorTensor(  # noqa: N802
        self,
        short_name: str,
        long_name: str,
        output_mode: OutputMode | None = None,
        output_return_period: int | None = 1,
    ) -> Options:
        """Return the program's tensor ``long_name`` (``Gradient___<weight>``,
        ``UpdatedVar___<weight>``, ``finalLossScale``) under ``short_name``, read with
        ``getAnchoredTensor``; ``output_mode`` defaults to the model's."""
        self.checkIsFrozen()
        mode = None if output_mode is None else _enum_member(OutputMode, output_mode, "output_mode")
        period = (
            1
            if mode != OutputMode.EveryN
            else _positive("output_return_period", output_return_period)
        )
        self.anchored_tensors[_str("short_name", short_name)] = AnchoredTensor(
            long_name=_str("long_name", long_name),
            use_default_mode=mode is None,
            output_mode=mode,
            output_return_period=period,
        )
        return self

    def randomSeed(self, random_seed: int) -> Options:  # noqa: N802
        """Seed data shuffling and weight initialisation (and torch's generator, as PopTorch
        did, when torch is loaded)."""
        seed = _int("randomSeed", random_seed)
        _check(seed < 2**64, "randomSeed", "an integer < 2**64 (a 64-bit seed)", seed)
        self.random_seed = seed
        if "torch" in sys.modules:
            sys.modules["torch"].manual_seed(random_seed)
        return self

    def useIpuModel(self, use_model: bool) -> Options:  # noqa: N802
        """Run on the IPU Model device description instead of IPU hardware."""
        self.use_ipu_model = _bool("useIpuModel", use_model)
        return self

    def useIpuId(self, ipu_id: int) -> Options:  # noqa: N802
        """The IPU device id to attach to (accepted without effect here: JAX's devices)."""
        self.ipu_id = _int("useIpuId", ipu_id)
        return self

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> Options:  # noqa: N802
        """Compile only, for IPU version ``ipu_version`` (1, 2 or 21): sets
        ``connectionType(ConnectionType.Never)``, so running the model raises."""
        if ipu_version not in (1, 2, 21) or isinstance(ipu_version, bool):
            raise OptionValueError(OFFLINE_VERSION_MSG.format(got=ipu_version))
        self.connectionType(ConnectionType.Never)
        self.ipu_version = ipu_version
        return self

    def enableExecutableCaching(self, path: str | None) -> Options:  # noqa: N802
        """Cache compiled programs in ``path`` (``None`` disables caching): session options
        ``enableEngineCaching`` / ``cachePath``; programs persist across processes where the
        runtime's cache is on (``POPXL_CACHE_DIR``)."""
        if path is None:
            self.popart.set("enableEngineCaching", False)
        else:
            self.popart.set("cachePath", _str("enableExecutableCaching", path))
            self.popart.set("enableEngineCaching", True)
        return self

    def logDir(self, log_dir: str) -> Options:  # noqa: N802
        self.log_dir = _str("logDir", log_dir)
        return self

    def modelName(self, name: str) -> Options:  # noqa: N802
        """Name of the model: the prefix of its program's name scope."""
        self.model_name = _str("modelName", name)
        return self

    def maxRepeatLogs(self, max_lines: int | None) -> Options:  # noqa: N802
        """Suppress a log line repeated more than ``max_lines`` times (None: never).
        Accepted without effect here."""
        self.max_repeat_logs = (
            MAX_REPEAT_LOGS_ALL if max_lines is None else _int("maxRepeatLogs", max_lines)
        )
        return self

    def connectionType(self, connection_type: ConnectionType) -> Options:  # noqa: N802
        """When the executor attaches (``Never``: compile only)."""
        self.connection_type = _enum_member(ConnectionType, connection_type, "connectionType")
        return self

    def syncPattern(self, sync_pattern: SyncPattern) -> Options:  # noqa: N802
        """Accepted without effect here: JAX devices need no sync pattern."""
        self.sync_pattern = _enum_member(SyncPattern, sync_pattern, "syncPattern")
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:  # noqa: N802
        """Accepted without effect here: any number of virtual IPUs runs."""
        self.auto_round_num_ipus = _bool("autoRoundNumIPUs", auto_round_num_ipus)
        return self

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> Options:  # noqa: N802
        """With replicas, a forward that updates buffers is refused unless this is False
        (then each replica updates its own copy and they drift apart)."""
        self.broadcast_buffers = _bool("broadcastBuffers", broadcast_buffers)
        return self

    def setAvailableMemoryProportion(
        self, available_memory_proportion: dict[str, float]
    ) -> Options:  # noqa: N802
        """Temporary memory per IPU (``{"IPU0": 0.5}``): accepted without effect here."""
        values = dict(available_memory_proportion)
        ok = all(
            isinstance(k, str) and k.startswith("IPU") and k[3:].isdigit() for k in values
        ) and all(isinstance(v, (int, float)) and 0 < v <= 1 for v in values.values())
        if not ok:
            raise OptionValueError(MEMORY_PROPORTION_MSG.format(got=available_memory_proportion))
        self.available_memory_proportion = values
        return self

    def setExecutionStrategy(self, strategy: ExecutionStrategy) -> Options:  # noqa: N802
        """Choose how the model's blocks are placed and scheduled."""
        if not isinstance(strategy, ExecutionStrategy) or not hasattr(strategy, "kind"):
            raise TypeError(STRATEGY_MSG.format(got=type(strategy).__name__))
        self.strategy = strategy  # type: ignore[assignment]  # checked just above
        return self

    def enableSyntheticData(self, enabled: bool) -> Options:  # noqa: N802
        """Run without host transfers, to measure the device alone: inputs are random
        normal data made on the device (the same every run), outputs are not sent back
        (the returned tensors are zeros) and no transfers are timed (PopART's
        ``syntheticDataMode`` ``RandomNormal``). As in PopTorch, any true value turns it on:
        applications pass ``int(popart.SyntheticDataMode.RandomNormal)``."""
        if not isinstance(enabled, int):
            _bool("enableSyntheticData", enabled)  # raises, naming the option and the value
        self.popart.set("syntheticDataMode", 2 if enabled else 0)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> Options:  # noqa: N802
        """Count IPU cycles: refused when the model runs, as PopTorch refused it without IPU
        hardware (there is no cycle counter here; the latencies time each call)."""
        _bool("logCycleCount", log_cycle_count)
        self.popart.set("instrumentWithHardwareCycleCounter", log_cycle_count)
        return self

    def enableProfiling(self, profile_dir: str | None = None) -> Options:  # noqa: N802
        """Accepted without effect here: no Poplar profile is written (engine options
        ``autoReport.*``)."""
        directory = "." if profile_dir is None else _str("enableProfiling", profile_dir)
        self.popart._merge(
            "engineOptions",
            {
                "debug.allowOutOfMemory": "true",
                "autoReport.directory": directory,
                "autoReport.all": "true",
            },
        )
        return self

    def enableStableNorm(self, enabled: bool) -> Options:  # noqa: N802
        """Accepted without effect here: norms are always computed the stable way."""
        self.popart.set("enableStableNorm", _bool("enableStableNorm", enabled))
        return self

    def updatableNamedBuffers(self, buffers: list[str]) -> Options:  # noqa: N802
        """Buffers ``buffersFromHost`` may update (accepted without effect here)."""
        names = list(buffers)
        _check(all(isinstance(b, str) for b in names), "updatableNamedBuffers", "strings", buffers)
        self.popart.set("updatableNamedBuffers", names)
        return self

    def disableModuleNamescope(self) -> Options:  # noqa: N802
        """Do not name captured ops and tensors after their torch module paths
        (``poptorch.NameScope`` names still apply)."""
        self.module_namescope_enabled = False
        return self

    def sourceLocationExcludes(self, excludes: list[str]) -> Options:  # noqa: N802
        """Accepted without effect here: no IR source locations are printed."""
        values = list(excludes)
        _check(
            all(isinstance(e, str) for e in values), "sourceLocationExcludes", "strings", excludes
        )
        self.source_location_excludes = values
        return self

    def appendToLocationExcludes(self, *excludes: str) -> Options:  # noqa: N802
        """Accepted without effect here: no IR source locations are printed."""
        _check(
            all(isinstance(e, str) for e in excludes),
            "appendToLocationExcludes",
            "strings",
            excludes,
        )
        self.source_location_excludes = [*self.source_location_excludes, *excludes]
        return self

    def showCompilationProgressBar(self, show: bool = True) -> Options:  # noqa: N802
        """Show a progress bar on the first call (its stages: capture, building the program,
        compiling, first run, with the time elapsed) when stderr is a terminal, and record
        how long compiling takes (``compilationTime``)."""
        self.show_compilation_progress_bar = _bool("showCompilationProgressBar", show)
        return self

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> Options:  # noqa: N802
        """Accepted without effect here: optimizer attributes are checked as given."""
        self.relax_optimizer_attributes_checks = _bool("relaxOptimizerAttributesChecks", relax)
        return self

    # Copies, files, JSON, the backend dictionary.
    def clone(self) -> Options:
        """A deep, unfrozen copy that can be changed without affecting this one."""
        return copy.deepcopy(self)

    def _for_model(self, training: bool) -> Options:
        """The options a model wrapper keeps, as PopTorch's ``PoplarExecutor`` made them:
        this object is frozen (changing it after wrapping a model raises) and the returned
        copy has its output mode resolved (``Final`` for training, ``All`` for inference)
        and is frozen too."""
        self._freeze()
        kept = self.clone()
        if kept.defaultOutputMode():
            kept.outputMode(resolved_output_mode(kept, training))
        kept._freeze()
        return kept

    def loadFromFile(self, filepath: str) -> Options:  # noqa: N802
        """Apply one setter call per line of ``filepath`` (``deviceIterations(10)``), as
        written in Python without the ``options.`` prefix; see ``_options_text``. Blank
        lines and ``#`` comments are skipped; may be called several times (later files
        override earlier ones)."""
        lines = _options_text.parse_file(filepath)
        _options_text.apply_lines(self, filepath, lines)
        return self

    def from_json(self, string: str) -> Options:
        """Apply ``{"setter.path": value}`` (e.g. ``{"Training.gradientAccumulation": 4}``,
        ``{"_Popart.set": ["name", 1]}``, ``{"connectionType": "ConnectionType.OnDemand"}``):
        a list value is the argument list."""
        _options_text.apply_json(self, string)
        return self

    def toDict(self) -> dict[str, Any]:  # noqa: N802
        """Every option in one flat dictionary under the names PopTorch's backend received
        (``poptorch.poptorch_core._validateOptions`` checks it). The output mode must have
        been chosen."""
        if self.defaultOutputMode():
            raise OptionValueError(DEFAULT_OUTPUT_MSG)
        return self._backend_dict(self.output_mode)

    def _backend_dict(self, output_mode: OutputMode) -> dict[str, Any]:
        out = _strategy_dict(self.strategy)
        out.update(copy.deepcopy(self.popart.options))
        for part in (
            self._general_dict(output_mode),
            self.training.toDict(),
            self.distributed.toDict(),
            self.tensor_locations.toDict(),
        ):
            common = sorted(set(out) & set(part))
            if common:
                raise OptionValueError(MERGE_MSG.format(keys=common))
            out.update(part)
        return out

    def _general_dict(self, output_mode: OutputMode) -> dict[str, Any]:
        out: dict[str, Any] = {
            "replication_factor": self.replication_factor,
            "input_group_size": self.input_group_size,
            "input_cgt": int(self.input_group_type),
            "broadcast_buffers": self.broadcast_buffers,
            "device_iterations": self.device_iterations,
            "log_dir": self.log_dir or ".",
            "max_repeat_logs": self.max_repeat_logs,
            "auto_round_num_ipus": self.auto_round_num_ipus,
            "anchored_tensors": {k: a.as_list() for k, a in self.anchored_tensors.items()},
            "output_mode": int(output_mode),
            "output_return_period": self.output_return_period,
            "connection_type": int(self.connection_type),
            "sync_pattern": int(self.sync_pattern),
            "available_memory_proportion": {
                int(k[3:]): float(v) for k, v in self.available_memory_proportion.items()
            },
            "use_model": self.use_ipu_model,
        }
        optional = {
            "model_name": self.model_name or None,
            "random_seed": self.random_seed,
            "ipu_id": self.ipu_id,
            "ipu_version": self.ipu_version,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    def apply_to_session_options(self, session_options: Any, training: bool) -> None:
        """Check and log (DEBUG) the backend dictionary as PopTorch did at compile time, then
        write the values the IR's session options also hold (one source of truth)."""
        _validate(self._backend_dict(resolved_output_mode(self, training)))
        so = session_options
        so.replicatedGraphCount = self.replication_factor
        so.enableReplicatedGraphs = self.replication_factor > 1
        ga = self.training.gradient_accumulation if training else 1
        so.accumulationFactor = ga
        so.enableGradientAccumulation = ga > 1
        so.enableStochasticRounding = self.precision.stochastic_rounding
        so.partialsTypeMatMuls = self.precision.partials_type
        conv = self._Popart.options.get("convolutionOptions") or {}
        so.convolutionOptions = {k: str(v) for k, v in conv.items()}
        so.enableEngineCaching = bool(self.executable_cache_dir)
        if self.executable_cache_dir:
            so.cachePath = self.executable_cache_dir
        so.logDir = self.log_dir
        so.numIOTiles = self.tensor_locations.num_io_tiles
        so.syntheticDataMode = int(self.popart.options.get("syntheticDataMode", 0))
        so.autoRecomputation = int(self.popart.options.get("autoRecomputation", 0))


def _strategy_dict(strategy: Any) -> dict[str, Any]:
    """The backend options of an execution strategy (``execution_mode`` 0: pipelined,
    1: sharded, 2: phased, with the phased settings)."""
    if isinstance(strategy, (SerialPhasedExecution, ParallelPhasedExecution)):
        return {
            "execution_mode": 2,
            "separate_backward_phase": strategy.separate_backward_phase,
            "tensors_liveness": int(strategy.liveness),
            "serial_phases_execution": isinstance(strategy, SerialPhasedExecution),
        }
    return {"execution_mode": 1 if isinstance(strategy, ShardedExecution) else 0}


def validate_popart_options(options: Mapping[str, Any]) -> None:
    """``poptorch.poptorch_core._validateOptions``: check a ``toDict()`` dictionary as
    PopTorch's backend did (raises ``poptorch.Error``), logging each value at DEBUG."""
    _validate(options)


def resolved_output_mode(options: Options, training: bool) -> OutputMode:
    """``OutputMode.Default`` resolved: ``Final`` for training, ``All`` for inference."""
    if options.output_mode != OutputMode.Default:
        return options.output_mode
    return OutputMode.Final if training else OutputMode.All


def batches_per_call(options: Options, training: bool = True) -> int:
    """Micro-batches one model call consumes: ``deviceIterations * (replicas / input group
    size)``, times ``gradientAccumulation`` when training. The one place this is counted."""
    replicas = options.replication_factor // options.input_group_size
    accumulation = options.Training.gradient_accumulation if training else 1
    return options.device_iterations * replicas * accumulation
