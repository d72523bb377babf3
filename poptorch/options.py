"""``poptorch.Options``: how a model is compiled and run, with PopTorch's fluent setters.

``Options`` is a pydantic model: every value is validated and typed, ``model_dump_json()``
serialises it, and ``clone()`` deep-copies it. The setters (``deviceIterations(10)``,
``Training.gradientAccumulation(4)``...) validate, store and return the object they were
called on, so calls chain. ``apply_to_session_options`` writes the overlapping values onto
an ``Ir``'s session options (``ir._pb_ir.getSessionOptions()``): that is where the runtime
reads them, so the two never disagree.

>>> opts = Options().deviceIterations(10)
>>> _ = opts.Training.gradientAccumulation(4)
>>> opts.replication_factor, opts.training.gradient_accumulation
(1, 4)
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import popxl

from .enums import (
    ENUMS,
    CommGroupType,
    ConnectionType,
    HalfFloatCastingBehavior,
    MeanReductionStrategy,
    OutputMode,
    ReductionType,
    SyncPattern,
)
from .optim import as_dtype
from .strategies import ExecutionStrategy, PipelinedExecution, Strategy

POSITIVE_MSG = "{name} must be a positive integer, got {value!r}."
PERIOD_MSG = (
    "output_return_period is only used with OutputMode.EveryN (got {mode}); drop the period "
    "or use outputMode(OutputMode.EveryN, {period})."
)
EVERY_N_MSG = (
    "OutputMode.EveryN needs output_return_period, the number of device iterations between "
    "returned results: outputMode(OutputMode.EveryN, 10)."
)
INPUT_GROUP_ALL_MSG = (
    "inputReplicaGrouping cannot use CommGroupType.All: every replica would read the same "
    "data. Use CommGroupType.Consecutive or CommGroupType.Orthogonal."
)
STRATEGY_MSG = (
    "setExecutionStrategy expects a PipelinedExecution, ShardedExecution, "
    "SerialPhasedExecution or ParallelPhasedExecution, got {got}."
)
ACTIVATION_RTS_MSG = (
    "Activations cannot use replicated tensor sharding: each replica computes its own "
    "activations. Shard weights, optimiser state or accumulators instead."
)
IO_TILES_MSG = (
    "The {kind} location loads or stores through IO tiles, but no IO tiles are reserved. "
    "Reserve some with options.TensorLocations.numIOTiles(32)."
)
PARTIALS_MSG = "setPartialsType accepts float32 ('float') or float16 ('half'), got {got!r}."
CONFIG_LINE_MSG = (
    "{path}:{line}: {text!r} is not an option call. Each line must be one setter call "
    "without the 'options.' prefix, e.g. deviceIterations(10) or "
    "Training.gradientAccumulation(4)."
)
CONFIG_NAME_MSG = "{path}:{line}: Options has no setter {name!r}."
PROCESS_MSG = "Invalid process id {pid}: it must be in [0, {n}) for {n} processes."
MEMORY_PROPORTION_MSG = (
    "available_memory_proportion must map IPU names to values in (0, 1], e.g. "
    "{{'IPU0': 0.5}}; got {got!r}."
)


class _Base(BaseModel):
    model_config = ConfigDict(validate_assignment=True, extra="forbid")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(POSITIVE_MSG.format(name=name, value=value))
    return value


def _partials_name(dtype: Any) -> str:
    try:
        resolved = as_dtype(dtype)
    except ValueError:
        raise ValueError(PARTIALS_MSG.format(got=dtype)) from None
    return "half" if resolved == popxl.float16 else "float"


class TensorLocationSettings(_Base):
    """Where one class of tensors (weights, optimiser state, accumulators, activations) lives.

    ``useOnChipStorage(False)`` (with ``minElementsForOffChip``) puts weights, optimiser
    state and accumulators in remote buffers (streaming memory) that the program loads where
    they are used and stores after updates; for activations, the forward values the
    backward reads are stored after the forward and loaded back for the backward.
    ``useReplicatedTensorSharding(True)`` (with ``minElementsForReplicatedTensorSharding``)
    shards weights, optimiser state and accumulators over the replicas of their group:
    gradients are reduce-scattered, each replica updates its shard and weights are
    all-gathered where used. ``useIOTilesToLoad`` / ``useIOTilesToStore`` run the remote
    loads / stores on the IO tiles (reserve them with ``numIOTiles``). See
    ``poptorch._storage``.

    >>> TensorLocationSettings().useOnChipStorage(False).on_chip
    False
    """

    on_chip: bool | None = Field(None, description="True: on-chip; False: streaming memory.")
    replicated_tensor_sharding: bool = Field(False, description="Shard over replicas.")
    min_elements_off_chip: int = Field(0, ge=0, description="Smaller tensors stay on chip.")
    min_elements_rts: int = Field(0, ge=0, description="Smaller tensors are not sharded.")
    io_tiles_to_load: bool = Field(False, description="Load through IO tiles.")
    io_tiles_to_store: bool = Field(False, description="Store through IO tiles.")

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        """Keep the tensors on chip (True) or in streaming memory (False)."""
        self.on_chip = use
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        """Shard the tensors over replicas (weights and optimiser state)."""
        self.replicated_tensor_sharding = use
        return self

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:  # noqa: N802
        """Tensors with fewer elements stay on chip."""
        self.min_elements_off_chip = min_elements
        return self

    def minElementsForReplicatedTensorSharding(  # noqa: N802
        self, min_elements: int
    ) -> TensorLocationSettings:
        """Tensors with fewer elements are not sharded."""
        self.min_elements_rts = min_elements
        return self

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        """Load the tensors through IO tiles."""
        self.io_tiles_to_load = use
        return self

    def useIOTilesToStore(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        """Store the tensors through IO tiles (RTS tensors)."""
        self.io_tiles_to_store = use
        return self


class _TensorLocationOptions(_Base):
    """``Options.TensorLocations``: the location settings of each tensor class."""

    weight: TensorLocationSettings = Field(default_factory=TensorLocationSettings)
    optimizer: TensorLocationSettings = Field(default_factory=TensorLocationSettings)
    accumulator: TensorLocationSettings = Field(default_factory=TensorLocationSettings)
    activation: TensorLocationSettings = Field(default_factory=TensorLocationSettings)
    num_io_tiles: int = Field(0, ge=0, description="IO tiles per IPU (session numIOTiles).")

    def setWeightLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:  # noqa: N802
        self.weight = location
        return self

    def setOptimizerLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:  # noqa: N802
        self.optimizer = location
        return self

    def setAccumulatorLocation(  # noqa: N802
        self, location: TensorLocationSettings
    ) -> _TensorLocationOptions:
        self.accumulator = location
        return self

    def setActivationLocation(  # noqa: N802
        self, location: TensorLocationSettings
    ) -> _TensorLocationOptions:
        """Off chip: the forward values the backward needs go through streaming memory."""
        if location.replicated_tensor_sharding:
            raise ValueError(ACTIVATION_RTS_MSG)
        self.activation = location
        return self

    def check_io_tiles(self) -> None:
        """Raise if a location loads or stores through IO tiles but none are reserved."""
        for kind in ("weight", "optimizer", "accumulator", "activation"):
            s = getattr(self, kind)
            if (s.io_tiles_to_load or s.io_tiles_to_store) and self.num_io_tiles == 0:
                raise ValueError(IO_TILES_MSG.format(kind=kind))

    def numIOTiles(self, num_tiles: int) -> _TensorLocationOptions:  # noqa: N802
        """Reserve ``num_tiles`` IO tiles per IPU (bounds ``popxl.io_tiles()``)."""
        self.num_io_tiles = num_tiles
        return self


class _TrainingOptions(_Base):
    """``Options.Training``: gradient accumulation and its reductions."""

    gradient_accumulation: int = Field(1, ge=1, description="Micro-batches per optimiser step.")
    reduction_type: ReductionType = Field(
        ReductionType.Mean, description="Mean or Sum over micro-batches and replicas."
    )
    mean_reduction_strategy: MeanReductionStrategy | None = Field(
        None,
        description=(
            "Accepted without effect here: the program always sums the micro-batch gradients "
            "in the accumulator "
            "and divides once per step (Post)."
        ),
    )
    automatic_loss_scaling: bool = Field(
        False,
        description=(
            "Adapt the loss scaling while training: starting from the optimiser's "
            "loss_scaling, a step whose gradients are not all finite is skipped and the "
            "scale multiplied by als_backoff_factor; after als_growth_interval finite steps "
            "in a row it is multiplied by als_growth_factor."
        ),
    )
    als_growth_interval: int = Field(2000, ge=1, description="Finite steps before growing.")
    als_growth_factor: float = Field(2.0, gt=1.0, description="Scale growth on success.")
    als_backoff_factor: float = Field(0.5, gt=0.0, lt=1.0, description="Scale cut on overflow.")
    convolution_dithering: bool = Field(
        False, description="Accepted without effect here: no convolution dithering in XLA."
    )

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:  # noqa: N802
        """Accumulate ``gradient_accumulation`` micro-batches per optimiser step."""
        self.gradient_accumulation = _positive("gradientAccumulation", gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(  # noqa: N802
        self, reduction_type: ReductionType
    ) -> _TrainingOptions:
        """Reduce gradients over micro-batches and replicas by their mean or their sum."""
        if reduction_type == ReductionType.NoReduction:
            raise ValueError(
                "accumulationAndReplicationReductionType must be ReductionType.Mean or "
                "ReductionType.Sum: gradients of several micro-batches must be combined."
            )
        self.reduction_type = ReductionType(reduction_type)
        return self

    def setMeanAccumulationAndReplicationReductionStrategy(  # noqa: N802
        self, mean_reduction_strategy: MeanReductionStrategy
    ) -> _TrainingOptions:
        self.mean_reduction_strategy = MeanReductionStrategy(mean_reduction_strategy)
        return self

    def setAutomaticLossScaling(  # noqa: N802
        self,
        enabled: bool,
        growth_interval: int | None = None,
        growth_factor: float | None = None,
        backoff_factor: float | None = None,
    ) -> _TrainingOptions:
        """Adapt the loss scaling to the gradients (see ``automatic_loss_scaling``).

        The optimiser's ``loss_scaling`` is the initial scale and becomes a device variable
        that the program updates after every optimiser step: on a step whose reduced
        gradients hold an inf or NaN the weights, optimiser state and step count are left
        unchanged and the scale is multiplied by ``backoff_factor`` (default 0.5); after
        ``growth_interval`` (default 2000) finite steps in a row it is multiplied by
        ``growth_factor`` (default 2). ``optimizer.state_dict()["loss_scaling"]`` reads it.
        """
        self.automatic_loss_scaling = enabled
        if growth_interval is not None:
            self.als_growth_interval = _positive("growth_interval", growth_interval)
        if growth_factor is not None:
            self.als_growth_factor = growth_factor
        if backoff_factor is not None:
            self.als_backoff_factor = backoff_factor
        return self

    def setConvolutionDithering(self, enabled: bool) -> _TrainingOptions:  # noqa: N802
        self.convolution_dithering = enabled
        return self


class _PrecisionOptions(_Base):
    """``Options.Precision``: partials type, stochastic rounding, FP exceptions."""

    partials_type: str = Field("", description="Matmul partials (session partialsTypeMatMuls).")
    stochastic_rounding: bool = Field(
        False, description="Session enableStochasticRounding (float16 results)."
    )
    fp_exceptions: bool = Field(
        False, description="Accepted without effect here: JAX does not trap on NaN."
    )
    half_float_casting: HalfFloatCastingBehavior | None = Field(
        None, description="Accepted without effect here: deprecated in PopTorch."
    )
    running_statistics_always_float: bool = Field(
        False, description="Accepted without effect here: deprecated in PopTorch."
    )

    def setPartialsType(self, dtype: Any) -> _PrecisionOptions:  # noqa: N802
        """Matmul/convolution partials: ``float32`` or ``float16`` (also their names)."""
        self.partials_type = _partials_name(dtype)
        return self

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:  # noqa: N802
        self.stochastic_rounding = enabled
        return self

    def enableFloatingPointExceptions(self, enabled: bool) -> _PrecisionOptions:  # noqa: N802
        self.fp_exceptions = enabled
        return self

    def halfFloatCasting(self, half_float_casting: HalfFloatCastingBehavior) -> _PrecisionOptions:  # noqa: N802
        self.half_float_casting = HalfFloatCastingBehavior(half_float_casting)
        return self

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:  # noqa: N802
        self.running_statistics_always_float = value
        return self


def distributed_env(
    environ: Mapping[str, str] | None = None,
    num_name: str = "POPDIST_NUM_INSTANCES",
    index_name: str = "POPDIST_INSTANCE_INDEX",
) -> tuple[int, int]:
    """(process id, number of processes) from the environment ``poprun`` sets; ``(0, 1)``
    when the variables are absent."""
    env = os.environ if environ is None else environ
    if num_name not in env:
        return 0, 1
    num, pid = int(env[num_name]), int(env.get(index_name, "0"))
    if not 0 <= pid < num:
        raise ValueError(PROCESS_MSG.format(pid=pid, n=num))
    return pid, num


class _DistributedOptions(_Base):
    """``Options.Distributed``: which process of a multi-host run this is.

    Read from ``POPDIST_NUM_INSTANCES`` / ``POPDIST_INSTANCE_INDEX`` (set by ``poprun``)
    when the options are created; ``DataLoader`` gives each process its share of the data.
    """

    process_id: int = Field(0, ge=0, description="This process; DataLoader gives it its share.")
    num_processes: int = Field(1, ge=1, description="Processes sharing the dataset.")

    @classmethod
    def from_env(cls) -> _DistributedOptions:
        pid, num = distributed_env()
        return cls(process_id=pid, num_processes=num)

    @property
    def processId(self) -> int:  # noqa: N802
        return self.process_id

    @property
    def numProcesses(self) -> int:  # noqa: N802
        return self.num_processes

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:  # noqa: N802
        if not 0 <= process_id < num_processes:
            raise ValueError(PROCESS_MSG.format(pid=process_id, n=num_processes))
        self.num_processes, self.process_id = num_processes, process_id
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> _DistributedOptions:  # noqa: N802
        """Read the process layout from other variables (e.g. OpenMPI's)."""
        pid, num = distributed_env(None, var_num_processes, var_process_id)
        return self.configureProcessId(pid, num)

    def disable(self) -> _DistributedOptions:
        self.num_processes, self.process_id = 1, 0
        return self


class _JitOptions(_Base):
    """``Options.Jit`` (deprecated in PopTorch). Accepted without effect here: models are
    popxl_addons Modules, never traced."""

    trace_model: bool = True

    def traceModel(self, trace_model: bool) -> _JitOptions:  # noqa: N802
        self.trace_model = trace_model
        return self


class Options(_Base):
    """Every option controlling how a model is compiled and executed.

    Fields use snake_case; PopTorch's camelCase setters set them. Values that the IR's
    session options also hold (replication, accumulation, stochastic rounding, partials,
    caching, log dir, IO tiles) are written there when a model is built.
    """

    model_config = ConfigDict(
        validate_assignment=True, extra="forbid", arbitrary_types_allowed=True
    )

    device_iterations: int = Field(1, ge=1, description="Device iterations per host call.")
    replication_factor: int = Field(1, ge=1, description="Model replicas (data parallel).")
    input_group_size: int = Field(1, ge=1, description="Replicas sharing one input slice.")
    input_group_type: CommGroupType = Field(CommGroupType.Consecutive)
    output_mode: OutputMode = Field(OutputMode.Default)
    output_return_period: int = Field(1, ge=1)
    random_seed: int | None = Field(None, description="Seeds shuffling and weight init.")
    use_ipu_model: bool = Field(False, description="Run on 'ipu_model' instead of 'ipu_hw'.")
    executable_cache_dir: str = Field(
        "",
        description=(
            "Written to the session options (enableEngineCaching, cachePath); compiled "
            "programs persist across processes where the runtime's cache is on (POPXL_CACHE_DIR)."
        ),
    )
    log_dir: str = Field("", description="Session logDir.")
    model_name: str = Field("", description="Prefix of the program's name scope.")
    connection_type: ConnectionType = Field(ConnectionType.Always)
    sync_pattern: SyncPattern = Field(
        SyncPattern.Full,
        description="Accepted without effect here: JAX devices need no sync pattern.",
    )
    auto_round_num_ipus: bool = Field(
        False, description="Accepted without effect here: any number of virtual IPUs runs."
    )
    available_memory_proportion: dict[str, float] = Field(
        default_factory=dict, description="Accepted without effect here: no tile memory planner."
    )
    strategy: Strategy = Field(
        default_factory=PipelinedExecution,
        description=(
            "How the blocks a model marks (poptorch.Block / BeginBlock) are placed on IPUs and "
            "run: sharded, pipelined or phased (see poptorch._staged)."
        ),
    )
    training: _TrainingOptions = Field(default_factory=_TrainingOptions)
    precision: _PrecisionOptions = Field(default_factory=_PrecisionOptions)
    tensor_locations: _TensorLocationOptions = Field(default_factory=_TensorLocationOptions)
    distributed: _DistributedOptions = Field(default_factory=_DistributedOptions.from_env)
    jit: _JitOptions = Field(default_factory=_JitOptions)

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
        """Replicas in one group of ``input_group_size`` read the same slice of the input."""
        if CommGroupType(input_group_type) == CommGroupType.All:
            raise ValueError(INPUT_GROUP_ALL_MSG)
        self.input_group_size = _positive("input_group_size", input_group_size)
        self.input_group_type = CommGroupType(input_group_type)
        return self

    def outputMode(
        self, output_mode: OutputMode, output_return_period: int | None = None
    ) -> Options:  # noqa: N802
        """Which results a call returns (see ``OutputMode``)."""
        mode = OutputMode(output_mode)
        if mode == OutputMode.EveryN and output_return_period is None:
            raise ValueError(EVERY_N_MSG)
        if mode != OutputMode.EveryN and output_return_period is not None:
            raise ValueError(PERIOD_MSG.format(mode=mode.name, period=output_return_period))
        self.output_mode = mode
        self.output_return_period = _positive("output_return_period", output_return_period or 1)
        return self

    def defaultOutputMode(self) -> bool:  # noqa: N802
        """Whether the output mode is still ``OutputMode.Default``."""
        return self.output_mode == OutputMode.Default

    def randomSeed(self, random_seed: int) -> Options:  # noqa: N802
        """Seed data shuffling and weight initialisation."""
        self.random_seed = int(random_seed)
        return self

    def useIpuModel(self, use_model: bool) -> Options:  # noqa: N802
        """Run on the IPU Model device description instead of IPU hardware."""
        self.use_ipu_model = bool(use_model)
        return self

    def enableExecutableCaching(self, path: str | None) -> Options:  # noqa: N802
        """Cache compiled programs in ``path`` (``None`` disables caching)."""
        self.executable_cache_dir = path or ""
        return self

    def logDir(self, log_dir: str) -> Options:  # noqa: N802
        self.log_dir = log_dir
        return self

    def modelName(self, name: str) -> Options:  # noqa: N802
        self.model_name = name
        return self

    def connectionType(self, connection_type: ConnectionType) -> Options:  # noqa: N802
        self.connection_type = ConnectionType(connection_type)
        return self

    def syncPattern(self, sync_pattern: SyncPattern) -> Options:  # noqa: N802
        self.sync_pattern = SyncPattern(sync_pattern)
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:  # noqa: N802
        self.auto_round_num_ipus = auto_round_num_ipus
        return self

    def setAvailableMemoryProportion(
        self, available_memory_proportion: dict[str, float]
    ) -> Options:  # noqa: N802
        values = dict(available_memory_proportion)
        if not all(isinstance(v, (int, float)) and 0 < v <= 1 for v in values.values()):
            raise ValueError(MEMORY_PROPORTION_MSG.format(got=available_memory_proportion))
        self.available_memory_proportion = values
        return self

    def setExecutionStrategy(self, strategy: ExecutionStrategy) -> Options:  # noqa: N802
        """Choose how the model's blocks are placed and scheduled."""
        if not isinstance(strategy, ExecutionStrategy) or not hasattr(strategy, "kind"):
            raise TypeError(STRATEGY_MSG.format(got=type(strategy).__name__))
        self.strategy = strategy  # type: ignore[assignment]  # checked just above
        return self

    def clone(self) -> Options:
        """A deep copy that can be changed without affecting this one."""
        return self.model_copy(deep=True)

    def loadFromFile(self, filepath: str) -> Options:  # noqa: N802
        """Apply one setter call per line of ``filepath`` (``deviceIterations(10)``).

        Blank lines and ``#`` comments are skipped; arguments are Python literals or enum
        members (``OutputMode.All``, optionally prefixed ``poptorch.``).
        """
        with open(filepath, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                line = text.split("#", 1)[0].strip()
                if line:
                    self._apply_line(line, filepath, number)
        return self

    def _apply_line(self, line: str, path: str, number: int) -> None:
        try:
            call = ast.parse(line, mode="eval").body
        except SyntaxError:
            call = None
        if not isinstance(call, ast.Call):
            raise ValueError(CONFIG_LINE_MSG.format(path=path, line=number, text=line))
        names = _dotted(call.func)
        if names is None:
            raise ValueError(CONFIG_LINE_MSG.format(path=path, line=number, text=line))
        target: Any = self
        for name in names:
            if name.startswith("_") or not hasattr(target, name):
                raise ValueError(
                    CONFIG_NAME_MSG.format(path=path, line=number, name=".".join(names))
                )
            target = getattr(target, name)
        if not callable(target):
            raise ValueError(CONFIG_NAME_MSG.format(path=path, line=number, name=".".join(names)))
        args = [_literal(a) for a in call.args]
        kwargs = {k.arg: _literal(k.value) for k in call.keywords if k.arg}
        target(*args, **kwargs)

    def apply_to_session_options(self, session_options: Any, training: bool) -> None:
        """Write the values the IR's session options also hold (one source of truth)."""
        so = session_options
        so.replicatedGraphCount = self.replication_factor
        so.enableReplicatedGraphs = self.replication_factor > 1
        ga = self.training.gradient_accumulation if training else 1
        so.accumulationFactor = ga
        so.enableGradientAccumulation = ga > 1
        so.enableStochasticRounding = self.precision.stochastic_rounding
        so.partialsTypeMatMuls = self.precision.partials_type
        so.enableEngineCaching = bool(self.executable_cache_dir)
        if self.executable_cache_dir:
            so.cachePath = self.executable_cache_dir
        so.logDir = self.log_dir
        so.numIOTiles = self.tensor_locations.num_io_tiles


def _dotted(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


def _literal(node: ast.expr) -> Any:
    names = _dotted(node)
    if names is not None:
        if names[0] == "poptorch":
            names = names[1:]
        if len(names) == 2 and names[0] in ENUMS:
            return ENUMS[names[0]][names[1]]
        if names in (["True"], ["False"], ["None"]):
            return ast.literal_eval(node)
        raise ValueError(f"Unknown name {'.'.join(names)!r} in an options file.")
    return ast.literal_eval(node)


def resolved_output_mode(options: Options, training: bool) -> OutputMode:
    """``OutputMode.Default`` resolved: ``Final`` for training, ``All`` for inference."""
    if options.output_mode != OutputMode.Default:
        return options.output_mode
    return OutputMode.Final if training else OutputMode.All
