"""``popart``: the names of PopART's Python package that PopXL and PopTorch programs reach.

PopXL shipped inside PopART's package, and code written for it imports ``popart`` for
PopART's enumerations (``popart.SyntheticDataMode``, ``popart.RecomputationType``,
``popart.AccumulateOuterFragmentSchedule``...; ``popart/enums.py``), its logger, its
exception types and a few helpers. Each name here is PopART's, over this project's own
objects; PopART's builder, sessions and ``_internal`` bindings are not provided.

>>> import popart
>>> int(popart.SyntheticDataMode.RandomNormal)
2

Importing ``popart`` imports popxl, but neither torch nor JAX.
"""

from __future__ import annotations

import logging
from typing import Any

from .enums import (
    AccumulateOuterFragmentSchedule as AccumulateOuterFragmentSchedule,
)
from .enums import (
    AutodiffStitchStrategy as AutodiffStitchStrategy,
)
from .enums import (
    BatchSerializationBatchSchedule as BatchSerializationBatchSchedule,
)
from .enums import (
    BatchSerializationMethod as BatchSerializationMethod,
)
from .enums import (
    BatchSerializationTransformContext as BatchSerializationTransformContext,
)
from .enums import CommGroupType as CommGroupType
from .enums import DataType as DataType
from .enums import DeviceConnectionType as DeviceConnectionType
from .enums import DeviceType as DeviceType
from .enums import ExecutionPhaseIOSchedule as ExecutionPhaseIOSchedule
from .enums import ExecutionPhaseSchedule as ExecutionPhaseSchedule
from .enums import GradientTensorTrackingMethod as GradientTensorTrackingMethod
from .enums import InitType as InitType
from .enums import Instrumentation as Instrumentation
from .enums import MeanReductionStrategy as MeanReductionStrategy
from .enums import MergeVarUpdateType as MergeVarUpdateType
from .enums import PatternsLevel as PatternsLevel
from .enums import RecomputationType as RecomputationType
from .enums import RecomputeType as RecomputeType
from .enums import ReductionType as ReductionType
from .enums import ReplicatedTensorSharding as ReplicatedTensorSharding
from .enums import SubgraphCopyingStrategy as SubgraphCopyingStrategy
from .enums import SyncPattern as SyncPattern
from .enums import SyntheticDataMode as SyntheticDataMode
from .enums import TensorStorage as TensorStorage
from .enums import TileSet as TileSet
from .enums import VariableRetrievalMode as VariableRetrievalMode
from .enums import VirtualGraphMode as VirtualGraphMode


def versionString() -> str:  # noqa: N802 (PopART's name)
    """This implementation's version, where PopART gave its own (``"popxl-jax 0.1.0"``)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return f"popxl-jax {version('popxl-jax')}"
    except PackageNotFoundError:
        return "popxl-jax (not installed)"


def getLogger(name: str = "all") -> logging.Logger:  # noqa: N802
    """PopART's logger, the standard ``logging`` logger named ``"popart"`` (PopART's modules
    shared one log; ``name`` picks nothing else here). ``getLogger().setLevel("DEBUG")``
    turns the log on, as ``POPART_LOG_LEVEL`` does."""
    del name
    from popxl import _log  # noqa: PLC0415

    return logging.getLogger(_log.LOGGER_NAME)


# Names looked up when first used (the runtime's DeviceInfo would import JAX).
_LAZY = {
    "popart_exception": ("popxl.errors", "PopXLException"),
    "exception": ("popxl.errors", "PopXLException"),
    "popart_internal_exception": ("popxl.errors", "InternalError"),
    "popart_runtime_error": ("popxl.errors", "Error"),
    "poplar_exception": ("popxl.errors", "Error"),
    "poplar_runtime_error": ("popxl.errors", "Error"),
    "poplar_application_runtime_error": ("popxl.errors", "UnrecoverableError"),
    "poplar_recoverable_runtime_error": ("popxl.errors", "RecoverableError"),
    "poplar_unrecoverable_runtime_error": ("popxl.errors", "UnrecoverableError"),
    "SessionOptions": ("popxl.session_options", "SessionOptions"),
    "DeviceInfo": ("runtime.devices.device", "DeviceInfo"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib  # noqa: PLC0415

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(
        f"module 'popart' has no attribute {name!r}: this project provides PopART's "
        "enumerations, logger, exceptions and version; PopART's builder, sessions and "
        "_internal bindings are not part of it (build the program with popxl instead)"
    )
