"""PopART's log: what the runtime reports (transfers, compilation, the executable cache).

PopXL programs and tests turn PopART's log on with the ``POPART_LOG_LEVEL`` environment
variable (``TRACE``, ``DEBUG``, ``INFO``, ``WARN``, ``ERR``, ``CRITICAL``, ``OFF``) or with
``popart.getLogger().setLevel("DEBUG")``, i.e. the standard ``logging`` logger named
``"popart"``. Either makes messages at that level or above go to standard error in PopART's
default format, ``<UTC time> popart:<module> <pid>.<thread> <level letter>: <message>``
(``2024-01-31T12:00:00.000000Z popart:devicex 4242.4242 T: ...``), and the messages keep
PopART's wording, so code that watches the log keeps working. Both settings are read at each
message.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import threading

TRACE = 5
DEBUG = logging.DEBUG
INFO = logging.INFO
WARN = logging.WARNING
ERR = logging.ERROR
CRITICAL = logging.CRITICAL
OFF = CRITICAL + 10

LEVELS = {
    "TRACE": TRACE,
    "DEBUG": DEBUG,
    "INFO": INFO,
    "WARN": WARN,
    "ERR": ERR,
    "CRITICAL": CRITICAL,
    "OFF": OFF,
}
_LETTERS = {TRACE: "T", DEBUG: "D", INFO: "I", WARN: "W", ERR: "E"}
LOGGER_NAME = "popart"
_LOGGER = logging.getLogger(LOGGER_NAME)  # the same object every getLogger(LOGGER_NAME) returns


def threshold() -> int:
    """The lowest level that is written: the more verbose of ``POPART_LOG_LEVEL`` and the
    ``"popart"`` logger's own level (OFF when neither is set)."""
    env = os.environ.get("POPART_LOG_LEVEL", "").strip().upper()
    level = LEVELS.get(env, OFF)
    logger_level = _LOGGER.level
    if logger_level != logging.NOTSET:
        level = min(level, logger_level)
    return level


def enabled(level: int) -> bool:
    return level >= threshold()


def log(level: int, message: str, module: str = "session") -> None:
    """Write ``message`` to standard error if ``level`` is enabled."""
    if not enabled(level):
        return
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    letter = _LETTERS.get(level, "C")
    where = f"{os.getpid()}.{threading.get_native_id()}"
    print(f"{now} popart:{module} {where} {letter}: {message}", file=sys.stderr, flush=True)


def trace(message: str, module: str = "session") -> None:
    log(TRACE, message, module)


def debug(message: str, module: str = "session") -> None:
    log(DEBUG, message, module)


def info(message: str, module: str = "session") -> None:
    log(INFO, message, module)


__all__ = ["debug", "enabled", "info", "log", "threshold", "trace"]
