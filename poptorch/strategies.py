"""Execution strategies: ``Stage``, ``Phase`` and the four ways of running them.

A strategy names the model's blocks (``Stage("A", "B").ipu(1)``), groups stages into
phases, and says how they run. A model marks its blocks with ``poptorch.Block`` /
``poptorch.BeginBlock`` (see ``blocks``); ``trainingModel`` / ``inferenceModel`` then cut
the forward graph into per-block subgraphs placed on the stages' IPUs and run them
sharded, pipelined (``popxl_addons.pipelined_execution``) or phased (weights in remote
buffers per phase); see ``_staged``. A model that marks no blocks runs on one IPU
whatever the strategy. The validation PopTorch did when the strategy was declared (IPU
parity of parallel phases, stage counts per phase) happens here.

>>> s = ParallelPhasedExecution(Phase(Stage("0"), Stage("1")), Phase(Stage("2"), Stage("3")))
>>> _ = s.phase(0).ipus(0, 2)
>>> s.phase(1).ipus(1, 2)
Traceback (most recent call last):
...
ValueError: ParallelPhasedExecution runs odd phases on odd IPUs, but phase 1 was given IPU 2. Place phase 1 on IPUs 1, 3, 5...
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .enums import AutoStage, Liveness

PHASE_RANGE_MSG = "{cls} has {n} phases; phase {i} does not exist."
IPUS_COUNT_MSG = (
    "Phase with {stages} stages was given {ipus} IPUs: give one IPU per stage, e.g. "
    "phase.ipus({example})."
)
PARITY_MSG = (
    "ParallelPhasedExecution runs {kind} phases on {kind} IPUs, but phase {i} was given IPU "
    "{ipu}. Place phase {i} on IPUs {hint}..."
)
STAGE_ARG_MSG = "Stage block ids must be strings (block user ids), got {got!r}."


class _Model(BaseModel):
    model_config = ConfigDict(validate_assignment=True, extra="forbid")


class Stage(_Model):
    """The blocks that run on one IPU."""

    blocks: list[str] = Field(default_factory=list)
    ipu_id: int | None = None

    def __init__(self, *block_ids: str, **data: Any) -> None:
        if block_ids:
            for b in block_ids:
                if not isinstance(b, str):
                    raise TypeError(STAGE_ARG_MSG.format(got=b))
            data["blocks"] = list(block_ids)
        super().__init__(**data)

    def ipu(self, ipu: int) -> Stage:
        """Run this stage on IPU ``ipu``."""
        self.ipu_id = ipu
        return self


class Phase(_Model):
    """Stages that run at the same time (one per IPU of a group)."""

    stages: list[Stage] = Field(default_factory=list)
    parity: int | None = Field(None, description="0/1: the phase must use even/odd IPUs.")

    def __init__(self, *arg: Any, **data: Any) -> None:
        if arg:
            data["stages"] = [a if isinstance(a, Stage) else Stage(a) for a in arg]
        super().__init__(**data)

    def ipus(self, *ipus: int) -> Phase:
        """Place the phase's stages on ``ipus``, in order."""
        if self.parity is not None:
            _check_parity(self.parity, ipus)
        if len(ipus) != len(self.stages):
            example = ", ".join(str(i) for i in range(len(self.stages)))
            raise ValueError(
                IPUS_COUNT_MSG.format(stages=len(self.stages), ipus=len(ipus), example=example)
            )
        for stage, ipu in zip(self.stages, ipus):
            stage.ipu(ipu)
        return self


class ExecutionStrategy(_Model):
    """Base of the four strategies."""

    stages: list[Stage] = Field(default_factory=list)
    auto_stage: AutoStage = AutoStage.SameAsIpu

    def stage(self, block_id: str) -> Stage:
        """The stage holding ``block_id`` (created if new)."""
        for s in self.stages:
            if block_id in s.blocks:
                return s
        new = Stage(block_id)
        self.stages.append(new)
        return new


class PipelinedExecution(ExecutionStrategy):
    """Stages on consecutive IPUs, pipelined over micro-batches (the default)."""

    kind: Literal["PipelinedExecution"] = "PipelinedExecution"

    def __init__(self, *args: Any, **data: Any) -> None:
        if args and isinstance(args[0], AutoStage):
            data["auto_stage"] = args[0]
        elif args:
            data["stages"] = [a if isinstance(a, Stage) else Stage(a) for a in args]
        super().__init__(**data)


class ShardedExecution(PipelinedExecution):
    """Stages on several IPUs, one at a time (no pipelining)."""

    kind: Literal["ShardedExecution"] = "ShardedExecution"  # type: ignore[assignment]


class _PhasedExecution(ExecutionStrategy):
    phases: list[Phase] = Field(default_factory=list)
    liveness: Liveness = Field(
        Liveness.AlwaysLive,
        description=(
            "AlwaysLive: activations stay on chip; any OffChipAfter* value: the activations "
            "the backward needs are stored to streaming memory after the forward and "
            "loaded back for the backward."
        ),
    )
    separate_backward_phase: bool = Field(
        False,
        description=(
            "Accepted without effect here: PopTorch only renumbers the backward phases; the "
            "program here always runs the backward of each phase in reverse phase order."
        ),
    )

    def __init__(self, *phases: Any, **data: Any) -> None:
        if phases:
            data["phases"] = [_as_phase(p) for p in phases]
        super().__init__(**data)

    def phase(self, phase: int) -> Phase:
        if not 0 <= phase < len(self.phases):
            raise IndexError(
                PHASE_RANGE_MSG.format(cls=type(self).__name__, n=len(self.phases), i=phase)
            )
        return self.phases[phase]

    def setTensorsLiveness(self, liveness: Liveness) -> _PhasedExecution:  # noqa: N802
        self.liveness = Liveness(liveness)
        return self

    def useSeparateBackwardPhase(self, use: bool = True) -> _PhasedExecution:  # noqa: N802
        self.separate_backward_phase = use
        return self


def _as_phase(p: Any) -> Phase:
    """A phase from a ``Phase``, a list of stages / block ids, or one stage / block id."""
    if isinstance(p, Phase):
        return p
    return Phase(*p) if isinstance(p, (list, tuple)) else Phase(p)


class SerialPhasedExecution(_PhasedExecution):
    """Phases one after another on one group of IPUs."""

    kind: Literal["SerialPhasedExecution"] = "SerialPhasedExecution"


def _check_parity(index: int, ipus: tuple[int, ...]) -> None:
    kind, first = ("even", 0) if index % 2 == 0 else ("odd", 1)
    for ipu in ipus:
        if ipu % 2 != first:
            hint = ", ".join(str(first + 2 * k) for k in range(3))
            raise ValueError(PARITY_MSG.format(kind=kind, i=index, ipu=ipu, hint=hint))


class ParallelPhasedExecution(_PhasedExecution):
    """Phases alternating between two IPU groups: even phases on even IPUs, odd on odd."""

    kind: Literal["ParallelPhasedExecution"] = "ParallelPhasedExecution"

    @model_validator(mode="after")
    def _number_phases(self) -> ParallelPhasedExecution:
        for i, phase in enumerate(self.phases):
            if phase.parity != i:
                object.__setattr__(phase, "parity", i)
        return self


Strategy = Annotated[
    PipelinedExecution | ShardedExecution | SerialPhasedExecution | ParallelPhasedExecution,
    Field(discriminator="kind"),
]
