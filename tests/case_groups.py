"""Checking table cases several to a program, and naming the failing case when a group fails
(the ATen table, ``tests/poptorch/aten``, and the op table, ``tests/popxl/ops``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Case = TypeVar("Case")


def each_alone_if_failing(
    together: Callable[[], None], alone: Callable[[Case], None], cases: Sequence[Case]
) -> None:
    """``together()`` checks every case of ``cases`` at once; if it fails, each case is
    checked ``alone``, so the first that fails alone raises naming itself. A group failing
    although each of its cases passes alone fails as it is (the cases interfered)."""
    if len(cases) == 1:
        alone(cases[0])
        return
    try:
        together()
    except Exception:
        for case in cases:
            alone(case)
        raise
