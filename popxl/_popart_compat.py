"""The PopART internals that real PopXL code reaches into, thin, over this project's objects.

PopXL exposed its C++ IR as ``ir._pb_ir``, ``graph._pb_graph`` and ``tensor._pb_tensor``, and
published code calls a few methods on them (most often
``ir._pb_ir.getSessionOptions()``). Everything here forwards to the real implementation;
nothing holds state of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .ir import Ir
    from .session_options import SessionOptions


class PbIr:
    """``ir._pb_ir``: the view of an ``Ir`` that PopART's ``_internal.ir.Ir`` gave."""

    def __init__(self, ir: Ir) -> None:
        self._ir = ir

    def getSessionOptions(self) -> SessionOptions:  # noqa: N802 (PopART's name)
        """The IR's session options (the same object every call)."""
        return self._ir._session_options
