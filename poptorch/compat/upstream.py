"""The private names of PopTorch that its tests and some applications reach into.

PopTorch was a C++ extension (``poptorch.poptorch_core``) with Python internals
(``poptorch._impl``, ``poptorch._logging``). Code written for it imports a few of those
names; this module provides them, thinly, over this package's own implementation, and
registers them as the modules PopTorch had. Nothing else in the package uses them.
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

from .. import _log, _state
from ..errors import Error, RecoverableError, UnrecoverableError


class TestErrorType(enum.Enum):
    """The kinds of error ``_throwTestError`` raises (PopTorch's error categories)."""

    Poptorch = 0
    Popart = 1
    PopartInternal = 2
    Poplibs = 3
    PoplarUnrecoverable = 4
    PoplarUnknown = 5
    PoplarRecoverableFullReset = 6
    PoplarLinkError = 7


_TEST_ERRORS: dict[TestErrorType, tuple[type[Error], str, str]] = {
    TestErrorType.Poptorch: (Error, "poptorch_cpp_error", "test error"),
    TestErrorType.Popart: (Error, "popart_exception", "test error"),
    TestErrorType.PopartInternal: (Error, "popart_internal_exception", "test error"),
    TestErrorType.Poplibs: (Error, "poplibs_exception", "test error"),
    TestErrorType.PoplarUnrecoverable: (
        UnrecoverableError,
        "poplar_unrecoverable_runtime_error",
        "test error",
    ),
    TestErrorType.PoplarUnknown: (Error, "poplar_unknown_runtime_error", "test error"),
    TestErrorType.PoplarRecoverableFullReset: (
        RecoverableError,
        "poplar_recoverable_runtime_error",
        "test error",
    ),
    TestErrorType.PoplarLinkError: (Error, "poplar_link_error", "test error: -lfoo not found"),
}


def _throwTestError(error_type: TestErrorType) -> None:  # noqa: N802
    """Raise the error PopTorch's error-handling tests expect for ``error_type``: its
    location names the two functions it went through, its message does not."""
    cls, kind, message = _TEST_ERRORS[TestErrorType(error_type)]
    location = "throwTestError::bottomLevel\nthrowTestError::topLevel"
    if cls is RecoverableError:
        error: Error = RecoverableError(message, kind, location, recovery_action="FULL_RESET")
    else:
        error = cls(message, kind, location)
    error.args = (f"{message}\n{location}",)
    raise error


def _validateOptions(options: dict[str, Any]) -> None:  # noqa: N802
    """Check PopART session option names given as a dict (``Options._Popart``)."""
    from ..options.core import validate_popart_options  # noqa: PLC0415

    validate_popart_options(options)


def isCompilingWithDispatcher() -> bool:  # noqa: N802
    """True while a model is being captured."""
    return _state.TRACING.get()


def propagateInputShapes(graph: Any) -> None:  # noqa: N802
    """A no-op: TorchScript graphs are not used here (torch.export captures models)."""


def ipuHardwareVersion(num_ipus: int = 1) -> int:  # noqa: N802
    """0: no IPU hardware (models run on JAX's devices)."""
    return 0


def createPoptorchError(msg: str) -> Error:  # noqa: N802
    return Error(msg, "poptorch_py_error")


def _restoreWrapperIfNecessary(obj: Any) -> Any:  # noqa: N802
    return obj


def isDispatchTracing() -> bool:  # noqa: N802
    return _state.TRACING.get()


def _module(name: str, doc: str, **names: Any) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    module.__dict__.update(names)
    sys.modules[name] = module
    return module


poptorch_core = _module(
    "poptorch.poptorch_core",
    "PopTorch's C++ extension's Python-visible names, over this package.",
    Error=Error,
    RecoverableError=RecoverableError,
    UnrecoverableError=UnrecoverableError,
    TestErrorType=TestErrorType,
    _throwTestError=_throwTestError,
    _validateOptions=_validateOptions,
    isCompilingWithDispatcher=isCompilingWithDispatcher,
    propagateInputShapes=propagateInputShapes,
    ipuHardwareVersion=ipuHardwareVersion,
    setLogLevel=lambda level: None,
    setPopartLogLevel=lambda level: None,
)
_impl = _module(
    "poptorch._impl",
    "PopTorch's Python internals that code reaches into.",
    isRunningOnIpu=isCompilingWithDispatcher,
    isDispatchTracing=isDispatchTracing,
    createPoptorchError=createPoptorchError,
    _restoreWrapperIfNecessary=_restoreWrapperIfNecessary,
)
_logging = _module(
    "poptorch._logging",
    "PopTorch's logging functions.",
    logger=_log.logger,
    setLogLevel=_log.setLogLevel,
    setPopartLogLevel=_log.setPopartLogLevel,
)


def _sampler_init(self: Any, data_source: Any = None) -> None:
    """``Sampler.__init__`` as in torch 2.0, which PopTorch was built on: it took the data
    source and ignored it. Later torch dropped the method, so ``super().__init__(data_source)``
    in a batch sampler written for PopTorch raises ``TypeError`` from ``object.__init__``."""


def _restore_sampler_data_source() -> None:
    """Give ``torch.utils.data.Sampler`` torch 2.0's ``__init__`` where the installed torch
    lacks one (subclasses with their own ``__init__`` are unaffected)."""
    from torch.utils.data import Sampler  # noqa: PLC0415  (torch only when poptorch loads)

    if "__init__" not in vars(Sampler):
        Sampler.__init__ = _sampler_init  # type: ignore[method-assign]


_restore_sampler_data_source()
