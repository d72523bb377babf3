"""Printing and placement ops: ``print_tensor``, ``ipu_copy``, ``io_tile_copy``,
``remote_code_load``.

The copies are identities that record where their output lives (which IPU, which tile set):
``Tensor.ipu`` and ``Tensor.tile_set`` read it back. ``remote_code_load`` only loads code on
the IPU, so it checks its arguments and records nothing.
"""

from __future__ import annotations

import sys
from typing import Any, Literal

import numpy as np

from .. import context
from .._op import define
from ..errors import UndefinedValue
from ..graph import Graph
from ..tensor import Tensor
from ._base import jax, record

# print_tensor ------------------------------------------------------------------------------

FLOAT_FORMATS = ("auto", "fixed", "scientific", "none")


def _format(array: np.ndarray, fmt: dict[str, Any]) -> str:
    """``array`` as text, honouring print_tensor's formatting arguments."""
    digits, kind = fmt["digits"], fmt["float_format"]
    options: dict[str, Any] = {
        "max_line_width": fmt["max_line_width"],
        "separator": fmt["separator"],
        "threshold": fmt["summarise_threshold"],
        "edgeitems": fmt["edge_items"],
    }
    if kind == "auto":
        options |= {"precision": digits, "floatmode": "maxprec"}
    elif kind == "fixed":
        options |= {"precision": digits, "floatmode": "fixed", "suppress_small": True}
    elif kind == "scientific":
        options["formatter"] = {"float_kind": lambda v: f"{v:.{digits}e}"}
    else:  # "none": the shortest text that round-trips
        options["floatmode"] = "unique"
    text = np.array2string(np.asarray(array), **options)
    return text.replace("[", fmt["open_bracket"]).replace("]", fmt["close_bracket"])


def print_to_stderr(title: str, array: np.ndarray, fmt: dict[str, Any]) -> None:
    """Write ``title: values`` to stderr (used at run time, from inside the compiled step)."""
    sys.stderr.write(f"{title}: {_format(array, fmt)}\n")
    sys.stderr.flush()


def _print_tensor(t: Any, *, title: str, print_self: bool, print_gradient: bool, **fmt: Any) -> Any:
    if print_self:
        # Ordered: prints appear in program order. XLA orders callbacks on one device
        # only; a step over several devices (replicas or IPUs on their own devices) prints
        # from each, unordered between devices (effects keep them from being dropped).
        printer = lambda a: print_to_stderr(title, a, fmt)  # noqa: E731
        jax.debug.callback(printer, t, ordered=not _over_several_devices())
    return t


def _over_several_devices() -> bool:
    """Whether the step being traced runs over a mesh of several devices (``shard_map``)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and mesh.size > 1


PRINT_TENSOR = define(
    "print_tensor",
    "PrintTensor",
    lambda t, **_: [t],
    _print_tensor,
    effect=True,
    grad="print",
)


def print_tensor(
    t: Tensor,
    title: str | None = None,
    print_self: bool = True,
    print_gradient: bool = False,
    summarise_threshold: int = 1000,
    edge_items: int = 3,
    max_line_width: int = 75,
    digits: int = 8,
    float_format: Literal["auto", "fixed", "scientific", "none"] = "auto",
    separator: str = " ",
    open_bracket: str = "[",
    close_bracket: str = "]",
) -> Tensor:
    """Print ``t`` to stderr when the program runs, and return a pass-through copy.

    Printing happens at run time, once per execution of the op (per replica when
    replicated), as ``<title>: <values>``. Arrays with more than ``summarise_threshold``
    elements show ``edge_items`` items at each edge of every dimension.

    Args:
        t: the tensor to print.
        title: the label; default ``print_<t.name>``.
        print_self: print ``t`` in the forward pass.
        print_gradient: print ``t``'s gradient (titled ``<title>_gradient``) when the graph
            is differentiated with ``transforms.autodiff``.
        summarise_threshold, edge_items, max_line_width: layout, as in ``np.array2string``.
        digits: digits after the decimal point for floats.
        float_format: ``"auto"``, ``"fixed"``, ``"scientific"`` or ``"none"`` (shortest
            round-trip text).
        separator, open_bracket, close_bracket: single characters used in the output.

    Returns:
        A copy of ``t`` (``print_out``); use it downstream so the print is ordered with
        the computation.

    Raises:
        ValueError: ``separator`` or a bracket is not exactly one character.
        KeyError: an unknown ``float_format``.
    """
    for name, char in (
        ("separator", separator),
        ("open_bracket", open_bracket),
        ("close_bracket", close_bracket),
    ):
        if not isinstance(char, str) or len(char) != 1:
            raise ValueError(f"{name} must be exactly one character, got {char!r}.")
    if float_format not in FLOAT_FORMATS:
        raise KeyError(f"Unknown float_format {float_format!r}; use one of {FLOAT_FORMATS}.")
    fmt = {
        "summarise_threshold": int(summarise_threshold),
        "edge_items": int(edge_items),
        "max_line_width": int(max_line_width),
        "digits": int(digits),
        "float_format": float_format,
        "separator": separator,
        "open_bracket": open_bracket,
        "close_bracket": close_bracket,
    }
    attrs = {
        "title": title if title is not None else f"print_{_name(t)}",
        "print_self": bool(print_self),
        "print_gradient": bool(print_gradient),
        **fmt,
    }
    return record(PRINT_TENSOR, {"t": t}, attrs, ["print_out"])[0]


def _name(t: Any) -> str:
    return t.name if isinstance(t, Tensor) else "t"


# Copies between IPUs and tile sets --------------------------------------------------------

IPU_COPY = define("ipu_copy", "IpuCopy", lambda t, **_: [t], lambda t, **_: t)
IO_TILE_COPY = define("io_tile_copy", "IoTileCopy", lambda t: [t], lambda t: t)


def ipu_copy(t: Tensor, destination: int, source: int | None = None) -> Tensor:
    """Copy ``t`` to IPU ``destination``; the result's ``ipu`` is ``destination``.

    All IPUs share one address space here, so the copy is an identity; it records the
    placement that ``Tensor.ipu`` reports and ``popxl.ipu`` blocks rely on.

    Args:
        t: the tensor to copy.
        destination: the IPU the copy lives on.
        source: the IPU ``t`` lives on; inferred from ``t`` when None.

    Returns:
        The copy, named ``<t.name>_c<destination>``.

    Raises:
        ValueError: ``source`` is None and ``t``'s IPU cannot be inferred.
    """
    if source is None and isinstance(t, Tensor):
        try:
            source = t.ipu
        except UndefinedValue:
            raise ValueError(
                f'Could not infer the ipu for Tensor to be copied "{t}". Please specify '
                "`source` when copying this tensor (it has no producer or consumer that "
                "places it)."
            ) from None
    attrs = {"destination": int(destination), "source": None if source is None else int(source)}
    return record(IPU_COPY, {"t": t}, attrs, [f"{_name(t)}_c{int(destination)}"])[0]


def io_tile_copy(t: Tensor) -> Tensor:
    """Copy ``t`` between the compute tiles and the IO tiles.

    The copy lives on the tile set the op runs on and reads ``t`` from the other one:
    inside ``popxl.io_tiles()`` it moves a compute tensor to the IO tiles, outside it
    moves an IO tensor back. An identity on the values.

    Returns:
        The copy, named ``<t.name>_iotilecopy``.
    """
    return record(IO_TILE_COPY, {"t": t}, {}, [f"{_name(t)}_iotilecopy"])[0]


# remote_code_load -------------------------------------------------------------------------

CODE_DESTINATIONS = ("executable", "compute_buffer", "io_buffer")


def remote_code_load(
    graph: Graph, destination: Literal["executable", "compute_buffer", "io_buffer"]
) -> None:
    """Load ``graph``'s code from streaming memory to ``destination`` (an IPU hint).

    Code always lives with the executable here, so this only checks its arguments and
    records no op.

    Raises:
        TypeError: ``graph`` is not a Graph.
        ValueError: ``graph`` is the current graph, or an unknown ``destination``.
        NotImplementedError: ``"compute_buffer"`` or ``"io_buffer"`` (as in PopXL).
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"remote_code_load needs a Graph, got {type(graph).__name__}.")
    if graph is context.get_current_graph():
        raise ValueError(
            f"Cannot remote-load the code of graph {graph.id or 'main'} from inside itself: "
            "call remote_code_load from the graph that calls it."
        )
    if destination not in CODE_DESTINATIONS:
        raise ValueError(
            f"Invalid remote_code_load destination {destination!r}; use one of {CODE_DESTINATIONS}."
        )
    if destination != "executable":
        raise NotImplementedError(
            f"remote_code_load destination {destination!r} is not supported; only "
            "'executable' is (as in PopXL)."
        )
