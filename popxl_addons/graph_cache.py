"""Graph caching: build a graph once per (function, argument specs, placement)."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import popxl
from popxl import ops


def bound_arguments(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> inspect.BoundArguments:
    """``inspect.signature(fn).bind(*args, **kwargs)`` with defaults applied."""
    plain = inspect.isfunction(fn) or inspect.ismethod(fn) or not callable(fn)
    # mypy rejects reading ``__call__`` off a Callable type (a checker limitation).
    target = fn if plain else fn.__call__  # type: ignore[operator]
    bound = inspect.signature(target).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def tensor_arguments(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[popxl.Tensor]:
    """The tensors among ``fn``'s arguments in the order ``ir.create_graph(fn, ...)`` makes
    their graph inputs: signature order, with lists, ``*args`` and ``**kwargs`` expanded."""
    tensors: list[popxl.Tensor] = []
    for value in bound_arguments(fn, *args, **kwargs).arguments.values():
        if isinstance(value, dict):
            value = list(value.values())
        items = value if isinstance(value, (list, tuple)) else [value]
        tensors += [t for t in items if isinstance(t, popxl.Tensor)]
    return tensors


def tensor_hash(t: popxl.Tensor | popxl.TensorSpec) -> int:
    """Hash of a tensor's spec: tensors and specs of equal shape/dtype/meta-shape agree."""
    return hash((tuple(t.shape), t.dtype, tuple(t.meta_shape)))


def argument_hash(arg: Any) -> int:
    """A hash of a graph-building argument (specs for tensors, contents for containers)."""
    from .graph import BoundGraph, GraphWithNamedArgs  # noqa: PLC0415

    if isinstance(arg, (popxl.Tensor, popxl.TensorSpec)):
        return tensor_hash(arg)
    if isinstance(arg, BoundGraph):
        return hash((arg.graph, tuple((k, tensor_hash(v)) for k, v in arg.args.items())))
    if isinstance(arg, GraphWithNamedArgs):
        return hash(arg.graph)
    if isinstance(arg, (tuple, list)):
        return hash(tuple(argument_hash(a) for a in arg))
    if isinstance(arg, dict):
        return hash(tuple((k, argument_hash(v)) for k, v in arg.items()))
    return hash(arg)


def get_function_hash(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Hash of ``fn``, its arguments and the current IPU / tile-set placement."""
    ctx = popxl.context.get_current_context()
    bound = bound_arguments(fn, *args, **kwargs)
    values = [argument_hash(v) for v in bound.arguments.values()]
    return hash((fn, ctx.ipu_id, ctx.io_tile_set, *values))


class GraphCache:
    """Reuse graphs built from the same function and argument specs (per Ir).

    Cached graphs are the same objects, so changes made to one after it is cached are seen
    by every user.
    """

    def __init__(self) -> None:
        # Each entry keeps its function and arguments alive: hashes of plain objects come from
        # id(), and a dead object's id can be reused by a new one, which would then hit its graph.
        self._cache: weakref.WeakKeyDictionary[popxl.Ir, dict[int, tuple[popxl.Graph, Any]]] = (
            weakref.WeakKeyDictionary()
        )

    def create_graph(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> popxl.Graph:
        """The cached graph for these arguments, or a new one from ``ir.create_graph``."""
        ir = popxl.gir()
        graphs = self._cache.setdefault(ir, {})
        key = get_function_hash(fn, *args, **kwargs)
        if key not in graphs:
            graphs[key] = (ir.create_graph(fn, *args, **kwargs), (fn, args, kwargs))
        return graphs[key][0]


_FUNCTION_CACHE = GraphCache()


def function(fn: Callable[..., Any]) -> Callable[..., tuple[popxl.Tensor, ...]]:
    """Decorator: each call builds (or reuses) a graph of ``fn`` and calls it.

    >>> import popxl
    >>> @function
    ... def double(x):
    ...     return x + x
    """

    def call(*args: Any, **kwargs: Any) -> tuple[popxl.Tensor, ...]:
        graph = _FUNCTION_CACHE.create_graph(fn, *args, **kwargs)
        return ops.call(graph, *tensor_arguments(fn, *args, **kwargs))

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call.__name__ = getattr(fn, "__name__", "function")
    return call


__all__ = [
    "GraphCache",
    "function",
    "bound_arguments",
    "tensor_arguments",
    "tensor_hash",
    "argument_hash",
    "get_function_hash",
]
