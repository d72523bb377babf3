"""PopART's session options, the one place the runtime reads its configuration from.

Real PopXL programs reach the options through ``ir._pb_ir.getSessionOptions()`` and set them
by PopART's names (``opts.numIOTiles = 32``). ``SessionOptions`` is a pydantic model with those
names, types and the defaults ``popxl.Ir()`` gives them (PopXL's ``Ir`` overrides a few of
PopART's own defaults: ``virtualGraphMode``, ``useHostCopyOps``, ``aliasZeroCopy``,
``enableExplicitMainLoops``, ``explicitRecomputation``, ``enableInplaceAmbiguityChecking``,
``enableVariablesCaching`` and ``decomposeGradSum``). Assignments are validated, and an
unknown name raises an ``AttributeError`` naming the closest valid option.

Each field's description says what the option does here, or that it is accepted without
effect and why.

Replication: ``Ir.replication_factor`` is ``getGlobalReplicationFactor()`` (all replicas of
all instances) and ``Ir.instance_replication_factor`` is ``replicatedGraphCount`` (the
replicas this process runs); this instance's replicas are the global replicas
``globalReplicaOffset .. globalReplicaOffset + replicatedGraphCount - 1``
(``replica_offsets()``).
"""

from __future__ import annotations

import difflib
import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

NO_EFFECT = "Accepted without effect here: "


class VirtualGraphMode(enum.IntEnum):
    """PopART's ``VirtualGraphMode``: how ops are assigned to (virtual) IPUs (``popart`` has
    the same class; these are ``IntEnum``s, as PopART's enums convert with ``int()``)."""

    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3


class SyntheticDataMode(enum.IntEnum):
    """PopART's ``SyntheticDataMode``: where host-to-device streams take their data."""

    Off = 0  # from the host
    Zeros = 1
    RandomNormal = 2  # ~N(0, 1)
    RandomUniform = 3  # uniform on [-1, 1)


class RecomputationType(enum.IntEnum):
    """PopART's ``RecomputationType``: which forward values the backward pass recomputes
    instead of keeping (``autoRecomputation``; C++'s ``None`` is ``NoRecompute``)."""

    NoRecompute = 0
    Standard = 1
    NormOnly = 2
    Pipeline = 3
    RecomputeAll = 4


class ExecutionPhaseIOSchedule(enum.IntEnum):
    """PopART's ``ExecutionPhaseIOSchedule``: when phased tensors are loaded."""

    Preload = 0
    OnDemand = 1


class ExecutionPhaseSchedule(enum.IntEnum):
    """PopART's ``ExecutionPhaseSchedule``: how phases are interleaved."""

    Interleaving = 0
    Batch = 1
    BatchClusteredIO = 2


def _enum_by_name(cls: type[enum.Enum], value: Any) -> Any:
    """Take a member of ``cls``, or of an enum with the same member names (``popart``'s own
    ``VirtualGraphMode``), or a member's name or value."""
    if isinstance(value, cls):
        return value
    name = value.name if isinstance(value, enum.Enum) else value
    if isinstance(name, str) and name in cls.__members__:
        return cls[name]
    if isinstance(name, int) and not isinstance(name, bool):
        return cls(name)
    choices = ", ".join(cls.__members__)
    raise ValueError(f"expected a {cls.__name__} ({choices}), got {value!r}")


class _Options(BaseModel):
    """Validated assignment, unknown names rejected with the closest valid one."""

    model_config = ConfigDict(validate_assignment=True, extra="forbid")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self).model_fields and not name.startswith("_"):
            raise AttributeError(_unknown_option(type(self), name))
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattr__(name)  # type: ignore[misc]
        raise AttributeError(_unknown_option(type(self), name))


class ExecutionPhaseSettings(_Options):
    """PopART's ``ExecutionPhaseSettings`` (``opts.executionPhaseSettings.phases = 2``)."""

    phases: int = Field(
        0,
        ge=0,
        description=NO_EFFECT + "PopXL programs phase their execution explicitly (calls, "
        "remote loads/stores); PopART's implicit phasing is never run.",
    )
    stages: int = Field(2, ge=1, description=NO_EFFECT + "see `phases`.")
    weightIOSchedule: ExecutionPhaseIOSchedule = Field(
        ExecutionPhaseIOSchedule.Preload, description=NO_EFFECT + "see `phases`."
    )
    activationIOSchedule: ExecutionPhaseIOSchedule = Field(
        ExecutionPhaseIOSchedule.Preload, description=NO_EFFECT + "see `phases`."
    )
    optimizerStateIOSchedule: ExecutionPhaseIOSchedule = Field(
        ExecutionPhaseIOSchedule.OnDemand, description=NO_EFFECT + "see `phases`."
    )
    accumulatorIOSchedule: ExecutionPhaseIOSchedule = Field(
        ExecutionPhaseIOSchedule.Preload, description=NO_EFFECT + "see `phases`."
    )
    schedule: ExecutionPhaseSchedule = Field(
        ExecutionPhaseSchedule.Interleaving, description=NO_EFFECT + "see `phases`."
    )

    @field_validator(
        "weightIOSchedule", "activationIOSchedule", "optimizerStateIOSchedule",
        "accumulatorIOSchedule", mode="before",
    )  # fmt: skip
    @classmethod
    def _io_schedule(cls, value: Any) -> Any:
        return _enum_by_name(ExecutionPhaseIOSchedule, value)

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, value: Any) -> Any:
        return _enum_by_name(ExecutionPhaseSchedule, value)


class SessionOptions(_Options):
    """The session options of one ``popxl.Ir`` (PopART's ``SessionOptions``).

    >>> import popxl
    >>> opts = popxl.Ir()._pb_ir.getSessionOptions()
    >>> opts.numIOTiles = 32
    >>> opts.numIOTile = 1
    Traceback (most recent call last):
    ...
    AttributeError: 'SessionOptions' has no option 'numIOTile'; did you mean 'numIOTiles'?
    """

    # Placement and tiles -------------------------------------------------------------------
    numIOTiles: int = Field(
        0,
        ge=0,
        description="Tiles per IPU reserved for IO. `popxl.io_tiles()` needs at least one: "
        "the session refuses a program placing ops on IO tiles while this is 0.",
    )
    virtualGraphMode: VirtualGraphMode = Field(
        VirtualGraphMode.Manual,
        description=NO_EFFECT + "PopXL always places ops by hand (`popxl.ipu`), which is "
        "the Manual mode `popxl.Ir` sets; other modes were never supported by PopXL.",
    )
    syntheticDataMode: SyntheticDataMode = Field(
        SyntheticDataMode.Off,
        description="Anything but Off runs without host transfers: every `host_load` "
        "reads data made on the device (zeros, or fixed normal or uniform draws, the same "
        "each run) and `host_store` sends nothing, so the host's outputs stay zero "
        "(runtime/lowering/host_io.py).",
    )
    # Numerics ------------------------------------------------------------------------------
    enableStochasticRounding: bool = Field(
        False,
        description="Round stochastically (unbiased, deterministic) when `ops.cast` turns "
        "float32 into float16, as the IPU's hardware rounding did "
        "(runtime/lowering/stochastic_rounding.py).",
    )
    partialsTypeMatMuls: str = Field(
        "",
        description="Default partials type of matmuls: '' (the op's dtype), 'float' or "
        "'half'. Ops without an explicit `partials_type` record this one.",
    )
    throwIfLog2ScaleTensorNotInRange: bool = Field(
        True,
        description="Pow2-scaled ops (`matmul_pow2scaled`, `conv_pow2scaled`, float8 casts) "
        "raise at run time when their log2 scale is outside [-32, 32).",
    )
    # Compilation and caching ---------------------------------------------------------------
    engineOptions: dict[str, str] = Field(
        default_factory=dict,
        description="Poplar engine options. They take part in the compiled-program cache "
        "key (a changed option misses the cache); otherwise " + NO_EFFECT.lower() + "XLA "
        "compiles the program, not Poplar.",
    )
    enableEngineCaching: bool = Field(
        False,
        description="Save compiled programs in `cachePath` and load them from there in "
        "later sessions and processes.",
    )
    cachePath: str = Field(
        "session_cache", description="Folder of the compiled-program cache (see above)."
    )
    constantWeights: bool = Field(
        True,
        description=NO_EFFECT + "weights are runtime state, never folded into the program.",
    )
    # IR transforms PopXL fixes -------------------------------------------------------------
    aliasZeroCopy: bool = Field(
        True, description=NO_EFFECT + "XLA decides buffer reuse; PopART's pass never runs."
    )
    useHostCopyOps: bool = Field(
        True,
        description=NO_EFFECT + "host transfers are always explicit `host_load`/`host_store` "
        "ops, the only mode PopXL supports.",
    )
    explicitRecomputation: bool = Field(
        True, description=NO_EFFECT + "recomputation is always explicit IR in PopXL."
    )
    autoRecomputation: RecomputationType = Field(
        RecomputationType.NoRecompute,
        description="Recorded; PopXL programs recompute explicitly "
        "(`popxl_addons.transforms.recompute_graph`), and PopTorch models record PopTorch's "
        "`autoRecomputation` here. Recomputation changes memory use, never values.",
    )
    enableExplicitMainLoops: bool = Field(
        True, description=NO_EFFECT + "main loops are always explicit IR in PopXL."
    )
    enableInplaceAmbiguityChecking: bool = Field(
        True,
        description=NO_EFFECT + "in-place ops run in creation order, so there is no "
        "ambiguous schedule to check.",
    )
    enableVariablesCaching: bool = Field(
        False,
        description=NO_EFFECT + "device-to-host weight transfers always write straight into "
        "the session's host copies (PopART's d2h weight-buffer elision, which PopXL enabled "
        "by setting this to False).",
    )
    decomposeGradSum: bool = Field(
        True, description=NO_EFFECT + "autodiff sums gradients as it goes."
    )
    executionPhaseSettings: ExecutionPhaseSettings = Field(
        default_factory=ExecutionPhaseSettings,
        description=NO_EFFECT + "see `ExecutionPhaseSettings.phases`.",
    )
    convolutionOptions: dict[str, str] = Field(
        default_factory=dict,
        description=NO_EFFECT + "Poplar convolution planning options; XLA plans convolutions.",
    )
    # Logging ---------------------------------------------------------------------------------
    logDir: str = Field(
        "",
        description="Folder for DOT files (`ir.dot_checkpoint`); '' means the current folder.",
    )
    dotChecks: set[str] = Field(
        default_factory=set,
        description="Which `ir.dot_checkpoint` names write a DOT file ('ALL' for every "
        "one), merged with the colon-separated `POPART_DOT_CHECKS` environment variable. When "
        "both are empty, every checkpoint is written.",
    )
    # Replication ------------------------------------------------------------------------------
    enableReplicatedGraphs: bool = Field(
        False, description="Replication in this instance; set by `Ir.replication_factor`."
    )
    replicatedGraphCount: int = Field(
        1,
        ge=1,
        description="Replicas this instance runs (`Ir.instance_replication_factor`) when "
        "`enableReplicatedGraphs`; set by `Ir.replication_factor`.",
    )
    enableDistributedReplicatedGraphs: bool = Field(
        False, description="Replicas span several instances (processes)."
    )
    globalReplicationFactor: int = Field(
        1,
        ge=1,
        description="Replicas of all instances (`Ir.replication_factor`) when "
        "`enableDistributedReplicatedGraphs`.",
    )
    globalReplicaOffset: int = Field(
        0,
        ge=0,
        description="The global index of this instance's first replica when "
        "`enableDistributedReplicatedGraphs` (see `replica_offsets`).",
    )
    # Gradient accumulation ------------------------------------------------------------------
    enableGradientAccumulation: bool = Field(
        False,
        description=NO_EFFECT + "PopXL accumulates gradients explicitly (e.g. "
        "`ops.var_updates.accumulate_` in a `repeat`); PopART's implicit accumulation never runs.",
    )
    accumulationFactor: int = Field(
        1, ge=1, description=NO_EFFECT + "see `enableGradientAccumulation`."
    )

    @field_validator("virtualGraphMode", mode="before")
    @classmethod
    def _virtual_graph_mode(cls, value: Any) -> Any:
        return _enum_by_name(VirtualGraphMode, value)

    @field_validator("autoRecomputation", mode="before")
    @classmethod
    def _auto_recomputation(cls, value: Any) -> Any:
        return _enum_by_name(RecomputationType, value)

    @field_validator("syntheticDataMode", mode="before")
    @classmethod
    def _synthetic_data_mode(cls, value: Any) -> Any:
        return _enum_by_name(SyntheticDataMode, value)

    @field_validator("engineOptions", "convolutionOptions", mode="before")
    @classmethod
    def _string_values(cls, value: Any) -> Any:
        return _StringDict(value) if isinstance(value, dict) else value

    def model_post_init(self, context: Any) -> None:
        # `opts.engineOptions[k] = v` (PopXL's idiom) bypasses assignment validation, so the
        # dicts validate their own items.
        for name in ("engineOptions", "convolutionOptions"):
            object.__setattr__(self, name, _StringDict(getattr(self, name)))

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in ("engineOptions", "convolutionOptions"):
            object.__setattr__(self, name, _StringDict(getattr(self, name)))

    def getGlobalReplicationFactor(self) -> int:  # noqa: N802 (PopART's name)
        """All replicas of all instances (PopART's rule)."""
        if self.enableDistributedReplicatedGraphs:
            return self.globalReplicationFactor
        return self.replicatedGraphCount if self.enableReplicatedGraphs else 1

    def instance_replication_factor(self) -> int:
        """Replicas run by this instance."""
        return self.replicatedGraphCount if self.enableReplicatedGraphs else 1

    def replica_offsets(self) -> range:
        """The global indices of this instance's replicas.

        >>> opts = SessionOptions(enableReplicatedGraphs=True, replicatedGraphCount=2,
        ...     enableDistributedReplicatedGraphs=True, globalReplicationFactor=8,
        ...     globalReplicaOffset=4)
        >>> list(opts.replica_offsets())
        [4, 5]
        """
        offset = self.globalReplicaOffset if self.enableDistributedReplicatedGraphs else 0
        return range(offset, offset + self.instance_replication_factor())


class _StringDict(dict[str, str]):
    """A dict of option strings that rejects anything else as it is set."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__()
        for key, value in dict(items).items():
            self[key] = value

    def __setitem__(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"Engine/convolution options map strings to strings, got {key!r}: {value!r}. "
                'Pass the value as a string, e.g. opts.engineOptions["opt.enableInlining"] '
                '= "false".'
            )
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


def _unknown_option(cls: type, name: str) -> str:
    close = difflib.get_close_matches(name, list(cls.model_fields), n=1)  # type: ignore[attr-defined]
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"'{cls.__name__}' has no option '{name}'{hint}"


__all__ = [
    "ExecutionPhaseIOSchedule",
    "ExecutionPhaseSchedule",
    "ExecutionPhaseSettings",
    "RecomputationType",
    "SessionOptions",
    "SyntheticDataMode",
    "VirtualGraphMode",
]
