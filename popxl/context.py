"""The thread-local building context: current graph, name scopes, placement, ordering.

This is the only mutable global state of the package. Every ``with graph:``,
``name_scope``, ``ipu``, ``io_tiles`` and ``in_sequence`` block pushes onto it and pops
on exit, so a finished program leaves it empty.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .graph import Graph
    from .ir import Ir

NO_GRAPH_MSG = (
    "Trying to access a graph, but no graph has been selected. Hint - try performing the "
    "operations in a context manager (for example `with graph_instance:`) or inside a "
    "function that's called by `popxl.Ir().create_graph()`"
)
NO_MAIN_GRAPH_MSG = (
    "Trying to access the main graph, but no graph has been selected. Hint - use "
    "`with ir.main_graph:` or `with graph_instance:` first."
)
NO_IR_MSG = (
    "Trying to access the current Ir, but no graph has been selected. Hint - use "
    "`with ir.main_graph:` or `with graph_instance:` first."
)
MIXED_IR_MSG = (
    "Trying to a create a context manager nested in another context, when the previous "
    "context's Ir is different. Graph {new!r} belongs to Ir {new_ir}, but the enclosing "
    "context belongs to Ir {old_ir}. Exit the outer context before entering this graph."
)

InSequenceMode = bool | Literal["pass"]


class Context:
    """The building state of one thread."""

    def __init__(self) -> None:
        self.graphs: list[Graph] = []
        self.name_scopes: list[str] = []
        self.ipu_stack: list[int | None] = []
        self.io_tiles_depth = 0
        self.in_sequence_stack: list[InSequenceMode] = []
        self.execution_contexts: list[str] = []
        self.debug_frame_offset = 0

    @property
    def graph(self) -> Graph:
        if not self.graphs:
            raise RuntimeError(NO_GRAPH_MSG)
        return self.graphs[-1]

    @property
    def main_graph(self) -> Graph:
        if not self.graphs:
            raise RuntimeError(NO_MAIN_GRAPH_MSG)
        return self.graphs[0].ir.main_graph

    @property
    def ipu_id(self) -> int:
        return self.ipu_stack[-1] if self.ipu_stack and self.ipu_stack[-1] is not None else 0

    @property
    def io_tile_set(self) -> bool:
        return self.io_tiles_depth > 0

    @property
    def tile_set(self) -> str:
        return "io" if self.io_tiles_depth > 0 else "compute"

    @property
    def execution_context(self) -> str:
        return self.execution_contexts[-1] if self.execution_contexts else "Normal"

    def is_empty(self) -> bool:
        """True when no block of any kind is open (what tests check after each test)."""
        return not (
            self.graphs
            or self.name_scopes
            or self.ipu_stack
            or self.io_tiles_depth
            or self.in_sequence_stack
            or self.execution_contexts
        )

    def push_graph(self, graph: Graph) -> None:
        if self.graphs and self.graphs[0].ir is not graph.ir:
            raise RuntimeError(
                MIXED_IR_MSG.format(new=graph, new_ir=graph.ir, old_ir=self.graphs[0].ir)
            )
        self.graphs.append(graph)

    def pop_graph(self) -> Graph:
        return self.graphs.pop()


class _ThreadContexts(threading.local):
    def __init__(self) -> None:
        self.context = Context()


_local = _ThreadContexts()


def get_current_context() -> Context:
    """The calling thread's building context."""
    return _local.context


def get_current_graph() -> Graph:
    """The graph ops are currently added to (top of the context stack)."""
    return _local.context.graph


def get_main_graph() -> Graph:
    """The main graph of the Ir being built."""
    return _local.context.main_graph


def get_ir() -> Ir:
    """The Ir being built."""
    if not _local.context.graphs:
        raise RuntimeError(NO_IR_MSG)
    return _local.context.graphs[0].ir


gcg = get_current_graph
gmg = get_main_graph
gir = get_ir


@contextlib.contextmanager
def name_scope(name: str) -> Iterator[list[str]]:
    """Prefix the names of tensors created inside with ``name/``.

    >>> import popxl
    >>> ir = popxl.Ir()
    >>> with ir.main_graph, popxl.name_scope("foo"):
    ...     popxl.variable(1, name="bar").name
    'foo/bar'
    """
    ctx = _local.context
    ctx.name_scopes.append(name)
    try:
        yield list(ctx.name_scopes)
    finally:
        ctx.name_scopes.pop()


@contextlib.contextmanager
def ipu(ipu: int | None) -> Iterator[int | None]:  # noqa: A001 (public API name)
    """Place ops created inside on virtual IPU ``ipu`` (``None`` removes the annotation)."""
    ctx = _local.context
    ctx.ipu_stack.append(ipu)
    try:
        yield ipu
    finally:
        ctx.ipu_stack.pop()


@contextlib.contextmanager
def io_tiles() -> Iterator[None]:
    """Place ops created inside on the IO tiles."""
    ctx = _local.context
    ctx.io_tiles_depth += 1
    try:
        yield
    finally:
        ctx.io_tiles_depth -= 1


@contextlib.contextmanager
def in_sequence(mode: InSequenceMode = True) -> Iterator[None]:
    """Order ops by creation inside the block (also usable as a decorator).

    This runtime always executes ops in creation order, which satisfies every ordering
    ``in_sequence`` can ask for, so the block only records the mode.
    """
    if mode is None:
        raise TypeError("`None` cannot be passed to `in_sequence`. Try `False` instead.")
    if mode not in (True, False, "pass"):
        raise ValueError(f"in_sequence mode must be True, False or 'pass', got {mode!r}.")
    ctx = _local.context
    ctx.in_sequence_stack.append(mode)
    try:
        yield
    finally:
        ctx.in_sequence_stack.pop()


@contextlib.contextmanager
def hint_new_ops(key: str, value: Any, types: tuple[str, ...] = ()) -> Iterator[None]:
    """Within: each op made in the current graph (of one of ``types``, if given) gets
    ``op.hints[key] = value``, a note for the tools that read the program later."""
    graph = get_current_graph()
    start = len(graph._ops)
    try:
        yield
    finally:
        for op in graph._ops[start:]:
            if not types or op.type in types:
                op.hints[key] = value


@contextlib.contextmanager
def _execution_context(name: str) -> Iterator[None]:
    """Run ops created inside as part of another program fragment (e.g. weights_from_host)."""
    ctx = _local.context
    ctx.execution_contexts.append(name)
    try:
        yield
    finally:
        ctx.execution_contexts.pop()


@contextlib.contextmanager
def debug_context_frame_offset(i: int) -> Iterator[None]:
    """Skip ``i`` more stack frames when recording an op's source location."""
    ctx = _local.context
    ctx.debug_frame_offset += i
    try:
        yield
    finally:
        ctx.debug_frame_offset -= i


def get_source_location(offset: int = 0) -> tuple[str, int] | None:
    """``(filename, line)`` of the user code that created an op."""
    frame = inspect.currentframe()
    depth = offset + _local.context.debug_frame_offset + 1
    while frame is not None and depth > 0:
        frame = frame.f_back
        depth -= 1
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno


def op_debug_context(name_or_fn: str | Callable) -> Callable:
    """Decorator kept for API compatibility; debug info has no numeric effect here."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    if callable(name_or_fn):
        return decorate(name_or_fn)
    return decorate


__all__ = [
    "Context",
    "get_current_context",
    "get_current_graph",
    "get_main_graph",
    "get_ir",
    "gcg",
    "gmg",
    "gir",
    "in_sequence",
    "name_scope",
    "ipu",
    "io_tiles",
    "debug_context_frame_offset",
    "get_source_location",
    "op_debug_context",
]
