"""``popxl.Module``: a class whose ``build`` method describes a graph."""

from __future__ import annotations

from typing import Any


class Module:
    """Base class for reusable graph builders.

    Subclasses implement ``build``; ``ir.create_graph(module, ...)`` traces it into a
    subgraph named after the class, and calling the module runs ``build`` inline in the
    current graph.
    """

    def build(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} must implement build(self, ...) to describe its graph."
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.build(*args, **kwargs)


__all__ = ["Module"]
