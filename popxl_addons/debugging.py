"""Printing that can be switched off by log level (``MODEL_LOG_LEVEL``), like Python logging."""

from __future__ import annotations

import os
from typing import Any, Literal

import popxl
from popxl import ops

LEVELS_TYPE = Literal["TRACE", "DEBUG", "INFO", "WARN"]
LEVELS = {"TRACE": 0, "DEBUG": 1, "INFO": 2, "WARN": 3}
BAD_LEVEL_MSG = "MODEL_LOG_LEVEL must be one of {levels}, got {value!r}."


def model_log_level() -> int:
    """The numeric level of the ``MODEL_LOG_LEVEL`` environment variable (default ``INFO``).

    Read at each call, so tests and scripts may change it after import.
    """
    value = os.environ.get("MODEL_LOG_LEVEL", "INFO")
    if value not in LEVELS:
        raise ValueError(BAD_LEVEL_MSG.format(levels=list(LEVELS), value=value))
    return LEVELS[value]


def print_tensor(
    t: popxl.Tensor, *args: Any, level: LEVELS_TYPE = "DEBUG", **kwargs: Any
) -> popxl.Tensor:
    """``popxl.ops.print_tensor(t, *args, **kwargs)`` when ``level`` is enabled, else ``t``.

    With the default ``MODEL_LOG_LEVEL=INFO`` a ``DEBUG`` print records no op at all.
    """
    if model_log_level() <= LEVELS[level]:
        return ops.print_tensor(t, *args, **kwargs)
    return t


def print_text(text: str, num: popxl.Tensor | None = None, level: LEVELS_TYPE = "DEBUG") -> None:
    """Print ``text`` when the program runs (with the value of ``num`` if given).

    Not for gradient graphs made by autodiff; use ``popxl.in_sequence(True)`` to fix its
    position among the other ops.
    """
    if model_log_level() <= LEVELS[level]:
        t = num if num is not None else popxl.constant(())
        ops.print_tensor(t, text)


__all__ = ["print_tensor", "print_text"]
