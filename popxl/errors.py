"""Exception types.

``PopXLException`` stands in for the original's ``popart.popart_exception``: it is raised
where PopXL's C++ core raised (dtype mismatches, bad broadcasts, call input mismatches,
modifying ops under autodiff). It subclasses ``ValueError`` so code catching the Python
errors keeps working.

``Error``, ``RecoverableError`` and ``UnrecoverableError`` follow PopTorch's runtime error
model and are raised by the runtime when execution itself fails.
"""

from __future__ import annotations


class PopXLException(ValueError):
    """An error the original raised from its C++ core (``popart.popart_exception``)."""


class UndefinedValue(Exception):
    """Raised by ``Tensor.ipu`` / ``Tensor.tile_set`` when the placement cannot be inferred."""


class Error(Exception):
    """A runtime failure while executing a program.

    Attributes:
        message: what went wrong.
        type: a short category name.
        location: where it happened (op or session call), if known.
    """

    def __init__(self, message: str, type: str = "popxl", location: str = "") -> None:  # noqa: A002
        super().__init__(message)
        self.message = message
        self.type = type
        self.location = location


class RecoverableError(Error):
    """A runtime failure after which the session can be used again.

    Attributes:
        recovery_action: what the user should do (e.g. "RESET" the session state).
    """

    def __init__(
        self, message: str, type: str = "popxl", location: str = "", recovery_action: str = ""
    ) -> None:  # noqa: A002
        super().__init__(message, type, location)
        self.recovery_action = recovery_action


class UnrecoverableError(Error):
    """A runtime failure that leaves the session unusable."""


_INTERNAL_MSG = (
    "internal error{where}: {message}. This is a fault of popxl on JAX, not of the program; "
    "please report it with the program that reached it (print_schedule() of the graph helps)."
)


class InternalError(Error):
    """An inconsistency inside the IR or runtime that user code should never reach.

    Raised where an internal invariant fails, naming the op and graph involved, so that a fault
    of this project reads as one and not as a mistake in the program.

    Attributes:
        op: the name of the op involved, if any.
        graph: the id of the graph involved, if any.
    """

    def __init__(self, message: str, op: object = None, graph: object = None) -> None:
        op_name = getattr(op, "name", op)
        graph_id = getattr(graph, "id", graph)
        parts = [
            f"op `{op_name}`" if op_name is not None else "",
            "the main graph" if graph_id == "" else f"graph `{graph_id}`" if graph_id else "",
        ]
        where = " in ".join(p for p in parts if p)
        super().__init__(
            _INTERNAL_MSG.format(where=f" at {where}" if where else "", message=message), "internal"
        )
        self.op = op_name
        self.graph = graph_id


__all__ = [
    "PopXLException",
    "UndefinedValue",
    "Error",
    "RecoverableError",
    "UnrecoverableError",
    "InternalError",
]
