"""PopTorch's logger (``poptorch::python``) and its levels (``POPTORCH_LOG_LEVEL``)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

logger = logging.getLogger("poptorch::python")

# PopTorch's level names -> (its numeric level, the Python logging level).
LEVELS: dict[str, tuple[int, int]] = {
    "TRACE": (0, logging.DEBUG),
    "TRACE_ALL": (0, logging.DEBUG),
    "DEBUG": (1, logging.DEBUG),
    "DEBUG_IR": (1, logging.DEBUG),
    "INFO": (2, logging.INFO),
    "WARN": (3, logging.WARNING),
    "ERR": (4, logging.ERROR),
    "OFF": (6, logging.CRITICAL),
}
_PUBLIC = ("DEBUG", "ERR", "INFO", "OFF", "TRACE", "WARN")

# PopTorch's own numeric level: TRACE and DEBUG are both Python's DEBUG, but only TRACE writes
# out PopART's IR.
poptorch_level = {"value": LEVELS[os.environ.get("POPTORCH_LOG_LEVEL", "WARN")][0]}


def trace_enabled() -> bool:
    """Whether PopTorch's level is ``TRACE``."""
    return poptorch_level["value"] == 0 and logger.isEnabledFor(logging.DEBUG)


# Levels PopART's own log would use (``poptorch._logging.setPopartLogLevel``).
popart_level = {"value": LEVELS[os.environ.get("POPART_LOG_LEVEL", "WARN")][0]}


class _Formatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        return super().format(record)


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at the time (tests capture it by swapping it)."""

    @property
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _install_handler() -> None:
    if not any(getattr(h, "_poptorch", False) for h in logger.handlers):
        handler = _StdoutHandler()
        handler._poptorch = True  # type: ignore[attr-defined]
        handler.setFormatter(_Formatter())
        logger.addHandler(handler)


def setLogLevel(level: str | int) -> None:  # noqa: N802 (PopTorch's name)
    """How much PopTorch prints: ``TRACE``, ``DEBUG``, ``INFO``, ``WARN``, ``ERR``, ``OFF``
    (or PopTorch's numeric levels 0-6)."""
    if isinstance(level, int):
        for key, (number, _) in LEVELS.items():
            if number == level:
                setLogLevel(key)
                return
        raise ValueError("Invalid log level integer")
    if level not in LEVELS:
        names = ", ".join(_PUBLIC[:-1]) + " and " + _PUBLIC[-1]
        raise ValueError(f"Unknown log level: {level}. Valid values are {names}")
    logger.setLevel(LEVELS[level][1])
    poptorch_level["value"] = LEVELS[level][0]


def setPopartLogLevel(level: str) -> None:  # noqa: N802 (PopTorch's name)
    """The level of PopART's log (the runtime's, ``popxl._log``: the ``"popart"`` logger)."""
    if not isinstance(level, str) or level not in LEVELS:
        raise ValueError("Level must be one of " + ", ".join(LEVELS))
    popart_level["value"] = LEVELS[level][0]
    from popxl import _log as popart_log  # noqa: PLC0415

    logging.getLogger(popart_log.LOGGER_NAME).setLevel(popart_log.LEVELS[level.split("_")[0]])


_install_handler()
logger.propagate = True
setLogLevel(os.environ.get("POPTORCH_LOG_LEVEL", "WARN"))
