"""The sub-objects of ``poptorch.Options``: ``Training``, ``Precision``,
``TensorLocations`` (with ``TensorLocationSettings``), ``Distributed``, ``Jit``, and the
anchored tensors. ``poptorch.options`` re-exports them under PopTorch's names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field, PrivateAttr

import popxl

from .._log import logger
from ..enums import MeanReductionStrategy, OutputMode, ReductionType
from ..optim.optimizers import as_dtype
from .base import (
    INVALID_ATTRIBUTE_MSG,
    TYPE_MSG,
    OptionValueError,
    _Base,
    _bool,
    _enum_member,
    _int,
    _PopartOptions,
    _positive,
)

PARTIALS_MSG = "setPartialsType accepts float32 ('float') or float16 ('half'), got {got!r}."
ACTIVATION_RTS_MSG = (
    "Activations cannot use replicated tensor sharding: each replica computes its own "
    "activations. Shard weights, optimiser state or accumulators instead."
)
IO_TILES_MSG = (
    "The {kind} location loads or stores through IO tiles, but no IO tiles are reserved. "
    "Reserve some with options.TensorLocations.numIOTiles(32)."
)
NUM_IO_TILES_MSG = "numIOTiles must be an even number between 32 and 192."
PROCESS_MSG = "Invalid process id {pid}: it must be in [0, {n}) for {n} processes."
TRACE_MODEL_MSG = "options.Jit.traceModel(True) is no longer supported"


def _partials_name(dtype: Any) -> str:
    try:
        resolved = as_dtype(dtype)
    except ValueError:
        raise OptionValueError(PARTIALS_MSG.format(got=dtype)) from None
    if resolved not in (popxl.float16, popxl.float32):
        raise OptionValueError(PARTIALS_MSG.format(got=dtype))
    return "half" if resolved == popxl.float16 else "float"


class _PopartBacked(_Base):
    """A sub-object whose setters store PopART options in the owning ``Options``' ``_Popart``
    (PopTorch's ``Precision`` and ``Training`` did): linked when the ``Options`` is created,
    validated or copied; a standalone one keeps its own."""

    _popart: _PopartOptions | None = PrivateAttr(None)

    @property
    def _popart_options(self) -> _PopartOptions:
        popart = self._popart
        if popart is None:
            popart = _PopartOptions()
            self.__pydantic_private__["_popart"] = popart  # type: ignore[index]
        return popart

    def _option(self, key: str, default: Any) -> Any:
        return self._popart_options.options.get(key, default)


class _JitOptions(_Base):
    """``Options.Jit`` (deprecated in PopTorch): models are captured with ``torch.export``,
    never traced with ``torch.jit``."""

    def traceModel(self, trace_model: bool) -> _JitOptions:  # noqa: N802
        """Deprecated: ``False`` is the only mode (and the default); ``True`` raises."""
        logger.warning(
            "[Deprecated] Do not call options.Jit.traceModel(): options.Jit.traceModel(False) "
            "is the default and True is not supported."
        )
        if trace_model:
            raise OptionValueError(TRACE_MODEL_MSG)
        return self


class _PrecisionOptions(_PopartBacked):
    """``Options.Precision``: partials type, stochastic rounding, floating point exceptions."""

    @property
    def partials_type(self) -> str:
        """``"float"``, ``"half"`` or ``""`` (unset): the session's ``partialsTypeMatMuls``."""
        return str(self._option("partialsTypeMatMuls", ""))

    @property
    def stochastic_rounding(self) -> bool:
        """Session ``enableStochasticRounding`` (float16 results)."""
        return bool(self._option("enableStochasticRounding", False))

    @property
    def fp_exceptions(self) -> bool:
        """Accepted without effect here: JAX does not trap floating point exceptions."""
        return bool(self._option("enableFloatingPointChecks", False))

    def setPartialsType(self, dtype: Any) -> _PrecisionOptions:  # noqa: N802
        """Matmul/convolution partials: ``torch.float32`` / ``torch.float16`` (also numpy
        dtypes and the names ``"float"`` / ``"half"``)."""
        name = _partials_name(dtype)
        self._popart_options.set("partialsTypeMatMuls", name)
        self._popart_options._merge("convolutionOptions", {"partialsType": name})
        return self

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:  # noqa: N802
        """Round float16 results stochastically (session ``enableStochasticRounding``)."""
        self._popart_options.set(
            "enableStochasticRounding", _bool("enableStochasticRounding", enabled)
        )
        return self

    def enableFloatingPointExceptions(self, enabled: bool) -> _PrecisionOptions:  # noqa: N802
        """Accepted without effect here: JAX does not trap floating point exceptions."""
        _bool("enableFloatingPointExceptions", enabled)
        self._popart_options.set("enableFloatingPointChecks", enabled)
        return self

    def halfFloatCasting(self, half_float_casting: Any) -> _PrecisionOptions:  # noqa: N802
        """Deprecated in PopTorch, no effect: mixed float16/float32 operations follow
        PyTorch's type promotion (upcast to float32)."""
        logger.warning(
            "[Deprecated] Do not call options.Precision.halfFloatCasting(): HalfUpcastToFloat "
            "is the only behaviour and matches PyTorch's."
        )
        return self

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:  # noqa: N802
        """Deprecated in PopTorch, no effect: running statistics keep the model's dtype."""
        if not isinstance(value, bool):
            raise OptionValueError("runningStatisticsAlwaysFloat needs to be set to a bool")
        logger.warning(
            "[Deprecated] Do not call options.Precision.runningStatisticsAlwaysFloat(): False "
            "is the only behaviour and matches PyTorch's."
        )
        return self


class _TrainingOptions(_PopartBacked):
    """``Options.Training``: gradient accumulation, its reductions, automatic loss scaling."""

    gradient_accumulation: int = Field(1, ge=1, description="Micro-batches per optimiser step.")
    reduction_type: ReductionType = Field(
        ReductionType.Mean, description="Mean or Sum over micro-batches and replicas."
    )
    mean_reduction_strategy: MeanReductionStrategy = Field(
        MeanReductionStrategy.Post,
        description=(
            "Accepted without effect here: the program always sums the micro-batch gradients "
            "in the accumulator and divides once per step (Post); Running gives the same "
            "values up to rounding."
        ),
    )
    als_growth_interval: int = Field(2000, ge=1, description="Finite steps before growing.")
    als_growth_factor: float = Field(2.0, gt=1.0, description="Scale growth on success.")
    als_backoff_factor: float = Field(0.5, gt=0.0, lt=1.0, description="Scale cut on overflow.")

    @classmethod
    def _set_aliases(cls) -> dict[str, str]:
        return {
            "accumulation_and_replication_reduction_type": "reduction_type",
            "meanAccumulationAndReplicationReductionStrategy": "mean_reduction_strategy",
        }

    @property
    def accumulation_and_replication_reduction_type(self) -> ReductionType:
        return self.reduction_type

    @property
    def meanAccumulationAndReplicationReductionStrategy(self) -> MeanReductionStrategy:  # noqa: N802
        return self.mean_reduction_strategy

    @property
    def automatic_loss_scaling(self) -> bool:
        """Adapt the loss scaling while training: starting from the optimiser's
        ``loss_scaling``, a step whose gradients are not all finite is skipped and the
        scale multiplied by ``als_backoff_factor``; after ``als_growth_interval`` finite
        steps in a row it is multiplied by ``als_growth_factor``."""
        return bool(self._option("automaticLossScalingSettings.enabled", False))

    @property
    def convolution_dithering(self) -> bool:
        """Accepted without effect here: no convolution tile layouts in XLA."""
        conv = self._option("convolutionOptions", {})
        return str(conv.get("enableConvDithering", False)).lower() == "true"

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:  # noqa: N802
        """Accumulate ``gradient_accumulation`` micro-batches per optimiser step."""
        self.gradient_accumulation = _positive("gradientAccumulation", gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(  # noqa: N802
        self, reduction_type: ReductionType
    ) -> _TrainingOptions:
        """Reduce gradients over micro-batches and replicas by their mean or their sum."""
        if not isinstance(reduction_type, ReductionType) or (
            reduction_type == ReductionType.NoReduction
        ):
            raise OptionValueError(
                "accumulationAndReplicationReductionType must be set to "
                "poptorch.ReductionType.Mean or poptorch.ReductionType.Sum (must be "
                "ReductionType.Mean or ReductionType.Sum): gradients of several micro-batches "
                "must be combined."
            )
        self.reduction_type = reduction_type
        return self

    def setMeanAccumulationAndReplicationReductionStrategy(  # noqa: N802
        self, mean_reduction_strategy: MeanReductionStrategy
    ) -> _TrainingOptions:
        """When a Mean reduction divides (accepted without effect here, see
        ``mean_reduction_strategy``)."""
        self.mean_reduction_strategy = _enum_member(
            MeanReductionStrategy, mean_reduction_strategy, "mean_reduction_strategy"
        )
        return self

    def setAutomaticLossScaling(
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
        _bool("setAutomaticLossScaling", enabled)
        if growth_interval is not None:
            self.als_growth_interval = _positive("growth_interval", growth_interval)
        if growth_factor is not None:
            self.als_growth_factor = growth_factor
        if backoff_factor is not None:
            self.als_backoff_factor = backoff_factor
        self._popart_options.set("automaticLossScalingSettings.enabled", enabled)
        return self

    def setConvolutionDithering(self, enabled: bool) -> _TrainingOptions:  # noqa: N802
        """Accepted without effect here: no convolution tile layouts in XLA."""
        _bool("setConvolutionDithering", enabled)
        self._popart_options._merge("convolutionOptions", {"enableConvDithering": enabled})
        return self

    def _adopt_optimizer(self, optimizer: Any, compiled: bool) -> None:
        """PopTorch's default mean reduction strategy for ``optimizer``: ``Running`` when it
        accumulates in float16 (``accum_type``) without ``use_combined_accum``, else left as
        set (``Post`` by default). Once the model is compiled the strategy cannot change."""
        accum = getattr(optimizer, "accum_type", None)
        half = accum is not None and str(accum) in ("torch.float16", "float16")
        if not half or getattr(optimizer, "use_combined_accum", False):
            return
        running = MeanReductionStrategy.Running
        if compiled and self.mean_reduction_strategy != running:
            raise ValueError(
                "Invalid optimizer: the new optimizer would require changing options.Training."
                "meanAccumulationAndReplicationReductionStrategy to "
                "poptorch.MeanReductionStrategy.Running but the executable is already compiled."
            )
        frozen = self._is_frozen()
        self._set_frozen(False)
        self.mean_reduction_strategy = running
        self._set_frozen(frozen)

    def toDict(self) -> dict[str, Any]:  # noqa: N802
        return {
            "gradient_accumulation": self.gradient_accumulation,
            "accumulation_and_replication_reduction_type": int(self.reduction_type),
            "meanAccumulationAndReplicationReductionStrategy": int(self.mean_reduction_strategy),
        }


class TensorLocationSettings(_Base):
    """Where one class of tensors (weights, optimiser state, accumulators, activations) lives.

    ``useOnChipStorage(False)`` (with ``minElementsForOffChip``) puts weights, optimiser
    state and accumulators in remote buffers (streaming memory) that the program loads where
    they are used and stores after updates; for activations, the forward values the
    backward reads are stored after the forward and loaded back for the backward.
    ``useReplicatedTensorSharding(True)`` (with ``minElementsForReplicatedTensorSharding``)
    shards weights, optimiser state and accumulators over the replicas of their group:
    gradients are reduced-scattered, each replica updates its shard and weights are
    all-gathered where used. ``useIOTilesToLoad`` / ``useIOTilesToStore`` run the remote
    loads / stores on the IO tiles (reserve them with ``numIOTiles``). See
    ``poptorch.execution.storage``.

    >>> TensorLocationSettings().useOnChipStorage(False).on_chip
    False
    """

    on_chip: bool | None = Field(None, description="True: on-chip; False: streaming memory.")
    replicated_tensor_sharding: bool = Field(False, description="Shard over replicas.")
    min_elements_off_chip: int = Field(0, ge=0, description="Smaller tensors stay on chip.")
    min_elements_rts: int = Field(0, ge=0, description="Smaller tensors are not sharded.")
    io_tiles_to_load: bool = Field(False, description="Load through IO tiles.")
    io_tiles_to_store: bool = Field(False, description="Store through IO tiles.")

    def useOnChipStorage(self, use: bool | None = True) -> TensorLocationSettings:  # noqa: N802
        """Keep the tensors on chip (True), in streaming memory (False) or leave it to the
        strategy (None)."""
        self.on_chip = None if use is None else _bool("useOnChipStorage", use)
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        """Shard the tensors over replicas (weights and optimiser state)."""
        self.replicated_tensor_sharding = _bool("useReplicatedTensorSharding", use)
        return self

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:  # noqa: N802
        """Tensors with fewer elements stay on chip."""
        self.min_elements_off_chip = _int("minElementsForOffChip", min_elements)
        return self

    def minElementsForReplicatedTensorSharding(  # noqa: N802
        self, min_elements: int
    ) -> TensorLocationSettings:
        """Tensors with fewer elements are not sharded."""
        self.min_elements_rts = _int("minElementsForReplicatedTensorSharding", min_elements)
        return self

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        """Load the tensors through IO tiles."""
        self.io_tiles_to_load = _bool("useIOTilesToLoad", use)
        return self

    def useIOTilesToStore(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        """Store the tensors through IO tiles (RTS tensors)."""
        self.io_tiles_to_store = _bool("useIOTilesToStore", use)
        return self

    def toDict(self) -> dict[str, int]:  # noqa: N802
        """The settings that were set, under PopTorch's names (booleans as 0/1)."""
        names = {
            "min_elements_off_chip": "minElementsForOffChip",
            "min_elements_rts": "minElementsForReplicatedTensorSharding",
            "on_chip": "onChip",
            "replicated_tensor_sharding": "useReplicatedTensorSharding",
            "io_tiles_to_load": "useIOTilesToLoad",
            "io_tiles_to_store": "useIOTilesToStore",
        }
        values = {
            names[f]: int(getattr(self, f))
            for f in names
            if f in self.model_fields_set and getattr(self, f) is not None
        }
        return values

    def _needs_io_tiles(self) -> bool:
        """Whether tensors under these settings go through IO tiles (only remote or sharded
        tensors are loaded and stored)."""
        moved = self.on_chip is False or self.replicated_tensor_sharding
        return moved and (self.io_tiles_to_load or self.io_tiles_to_store)


TENSOR_KINDS = ("activation", "weight", "optimizer", "accumulator")


class _TensorLocationOptions(_Base):
    """``Options.TensorLocations``: the location settings of each tensor class."""

    weight: TensorLocationSettings = Field(default_factory=TensorLocationSettings)
    optimizer: TensorLocationSettings = Field(default_factory=TensorLocationSettings)
    accumulator: TensorLocationSettings = Field(default_factory=TensorLocationSettings)
    activation: TensorLocationSettings = Field(default_factory=TensorLocationSettings)
    num_io_tiles: int = Field(0, ge=0, description="IO tiles per IPU (session numIOTiles).")

    def _location(self, kind: str, location: Any) -> TensorLocationSettings:
        if not isinstance(location, TensorLocationSettings):
            raise OptionValueError(
                TYPE_MSG.format(
                    name=f"set{kind.title()}Location",
                    expected="a TensorLocationSettings",
                    got=location,
                )
            )
        return location.model_copy(deep=True)

    def setWeightLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:  # noqa: N802
        self.weight = self._location("weight", location)
        return self

    def setOptimizerLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:  # noqa: N802
        self.optimizer = self._location("optimizer", location)
        return self

    def setAccumulatorLocation(  # noqa: N802
        self, location: TensorLocationSettings
    ) -> _TensorLocationOptions:
        self.accumulator = self._location("accumulator", location)
        return self

    def setActivationLocation(  # noqa: N802
        self, location: TensorLocationSettings
    ) -> _TensorLocationOptions:
        """Off chip: the forward values the backward needs go through streaming memory."""
        settings = self._location("activation", location)
        if settings.replicated_tensor_sharding:
            raise OptionValueError(ACTIVATION_RTS_MSG)
        self.activation = settings
        return self

    def numIOTiles(self, num_tiles: int) -> _TensorLocationOptions:  # noqa: N802
        """Reserve ``num_tiles`` IO tiles per IPU: an even number from 32 to 192 (bounds
        ``popxl.io_tiles()``)."""
        ok = isinstance(num_tiles, int) and not isinstance(num_tiles, bool)
        if not ok or not 32 <= num_tiles <= 192 or num_tiles % 2:
            raise OptionValueError(NUM_IO_TILES_MSG)
        self.num_io_tiles = num_tiles
        return self

    def check_io_tiles(self) -> None:
        """Raise if tensors would be loaded or stored through IO tiles but none are
        reserved."""
        for kind in TENSOR_KINDS:
            if getattr(self, kind)._needs_io_tiles() and self.num_io_tiles == 0:
                raise OptionValueError(IO_TILES_MSG.format(kind=kind))

    def _set_location(self, kind: str) -> dict[str, int]:
        if kind not in self.model_fields_set:
            raise AttributeError(INVALID_ATTRIBUTE_MSG.format(name=f"location_{kind}"))
        return getattr(self, kind).toDict()

    @property
    def location_weight(self) -> dict[str, int]:
        """The weight settings as PopTorch's dictionary (``{"onChip": 0, ...}``)."""
        return self._set_location("weight")

    @property
    def location_optimizer(self) -> dict[str, int]:
        return self._set_location("optimizer")

    @property
    def location_accumulator(self) -> dict[str, int]:
        return self._set_location("accumulator")

    @property
    def location_activation(self) -> dict[str, int]:
        return self._set_location("activation")

    def toDict(self) -> dict[str, Any]:  # noqa: N802
        out: dict[str, Any] = {}
        if "num_io_tiles" in self.model_fields_set:
            out["numIOTiles"] = self.num_io_tiles
        for kind in TENSOR_KINDS:
            if kind in self.model_fields_set:
                out[f"location_{kind}"] = getattr(self, kind).toDict()
        return out


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
        raise OptionValueError(PROCESS_MSG.format(pid=pid, n=num))
    return pid, num


class _DistributedOptions(_Base):
    """``Options.Distributed``: which process of a multi-host run this is.

    Read when the options are created from ``POPDIST_NUM_INSTANCES`` /
    ``POPDIST_INSTANCE_INDEX`` (set by ``poprun``), else from OpenMPI's
    ``OMPI_COMM_WORLD_SIZE`` / ``OMPI_COMM_WORLD_RANK`` as PopTorch did;
    ``DataLoader`` gives each process its share of the data.
    """

    process_id: int = Field(0, ge=0, description="This process; DataLoader gives it its share.")
    num_processes: int = Field(1, ge=1, description="Processes sharing the dataset.")

    @classmethod
    def from_env(cls) -> _DistributedOptions:
        pid, num = distributed_env()
        if "POPDIST_NUM_INSTANCES" not in os.environ:
            pid, num = distributed_env(None, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
        return cls(process_id=pid, num_processes=num)

    @classmethod
    def _set_aliases(cls) -> dict[str, str]:
        return {
            "distributed_process_id": "process_id",
            "num_distributed_processes": "num_processes",
        }

    @property
    def processId(self) -> int:  # noqa: N802
        return self.process_id

    @property
    def numProcesses(self) -> int:  # noqa: N802
        return self.num_processes

    @property
    def distributed_process_id(self) -> int:
        return self.process_id

    @property
    def num_distributed_processes(self) -> int:
        return self.num_processes

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:  # noqa: N802
        """This is process ``process_id`` of ``num_processes``."""
        _int("process_id", process_id)
        _int("num_processes", num_processes, 1)
        if not 0 <= process_id < num_processes:
            raise OptionValueError(PROCESS_MSG.format(pid=process_id, n=num_processes))
        self.checkIsFrozen()
        self.num_processes, self.process_id = num_processes, process_id
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> _DistributedOptions:  # noqa: N802
        """Read the process layout from other variables (e.g. OpenMPI's)."""
        pid, num = distributed_env(None, var_num_processes, var_process_id)
        return self.configureProcessId(pid, num)

    def disable(self) -> _DistributedOptions:
        """Ignore the environment: a single process."""
        return self.configureProcessId(0, 1)

    def toDict(self) -> dict[str, Any]:  # noqa: N802
        return {
            "num_distributed_processes": self.num_processes,
            "distributed_process_id": self.process_id,
            "ipuof_configs": {},
        }


class AnchoredTensor(_Base):
    """One ``Options.anchorTensor``: a named tensor of the program to return (see
    ``poptorch.execution.anchors``)."""

    long_name: str
    use_default_mode: bool
    output_mode: OutputMode | None
    output_return_period: int = Field(1, ge=1)

    def as_list(self) -> list[Any]:
        """PopTorch's form: ``[long_name, use_default_mode, output_mode, period]``."""
        mode = None if self.output_mode is None else int(self.output_mode)
        return [self.long_name, self.use_default_mode, mode, self.output_return_period]
