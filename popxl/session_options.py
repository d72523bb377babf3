"""PopART's session options, the one place the runtime reads its configuration from.

Real PopXL programs reach the options through ``ir._pb_ir.getSessionOptions()`` and set them
by PopART's names (``opts.numIOTiles = 32``). ``SessionOptions`` is a pydantic model with those
names, types and defaults: assignments are validated, and an unknown name raises an
``AttributeError`` naming the closest valid option.

Each field's description says what the option does here, or that it is accepted without effect.
"""

from __future__ import annotations

import difflib
import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class VirtualGraphMode(enum.Enum):
    """PopART's ``VirtualGraphMode``: how ops are assigned to (virtual) IPUs."""

    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3


class SessionOptions(BaseModel):
    """The session options of one ``popxl.Ir`` (PopART's ``SessionOptions``).

    >>> import popxl
    >>> opts = popxl.Ir()._pb_ir.getSessionOptions()
    >>> opts.numIOTiles = 32
    >>> opts.numIOTile = 1
    Traceback (most recent call last):
    ...
    AttributeError: 'SessionOptions' has no option 'numIOTile'; did you mean 'numIOTiles'?
    """

    model_config = ConfigDict(validate_assignment=True, extra="forbid", use_enum_values=False)

    numIOTiles: int = Field(
        0,
        ge=0,
        description="Tiles per IPU reserved for IO; bounds what `popxl.io_tiles()` may use.",
    )
    enableStochasticRounding: bool = Field(
        False, description="Stochastic rounding where PopXL applied it."
    )
    partialsTypeMatMuls: str = Field(
        "", description="Partials type of matmuls ('', 'float', 'half')."
    )
    engineOptions: dict[str, str] = Field(
        default_factory=dict, description="Poplar engine options."
    )
    enableEngineCaching: bool = Field(
        False, description="Persist compiled programs in `cachePath`."
    )
    cachePath: str = Field(
        "session_cache", description="Folder of the persistent compiled-program cache."
    )
    aliasZeroCopy: bool = Field(True, description="PopART's alias zero-copy optimisation.")
    throwIfLog2ScaleTensorNotInRange: bool = Field(
        True, description="Pow2-scaled ops check their log2 scale is in [-32, 32)."
    )
    virtualGraphMode: VirtualGraphMode = Field(
        VirtualGraphMode.Manual, description="How ops are placed on IPUs."
    )
    useHostCopyOps: bool = Field(True, description="Host transfers as explicit ops.")
    explicitRecomputation: bool = Field(True, description="Recomputation as explicit IR.")
    enableExplicitMainLoops: bool = Field(True, description="Main loops as explicit IR.")
    constantWeights: bool = Field(True, description="Weights may be constant for inference.")
    logDir: str = Field("", description="Where logs and DOT files are written.")
    dotChecks: set[str] = Field(
        default_factory=set, description="DOT checkpoints to write to `logDir`."
    )
    globalReplicationFactor: int = Field(1, ge=1, description="Replicas across all instances.")
    globalReplicaOffset: int = Field(0, ge=0, description="This instance's first global replica.")
    enableDistributedReplicatedGraphs: bool = Field(
        False, description="Replication spans instances."
    )
    replicatedGraphCount: int = Field(1, ge=1, description="Replicas in this instance.")
    enableReplicatedGraphs: bool = Field(False, description="Replication is enabled.")
    accumulationFactor: int = Field(1, ge=1, description="Gradient accumulation factor.")
    enableGradientAccumulation: bool = Field(False, description="Gradient accumulation is enabled.")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self).model_fields and not name.startswith("_"):
            raise AttributeError(_unknown_option(name))
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattr__(name)  # type: ignore[misc]
        raise AttributeError(_unknown_option(name))


def _unknown_option(name: str) -> str:
    close = difflib.get_close_matches(name, list(SessionOptions.model_fields), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"'SessionOptions' has no option '{name}'{hint}"
