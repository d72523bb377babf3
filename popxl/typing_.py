"""Annotation sentinels such as ``popxl.TensorByRef``."""

from __future__ import annotations

from typing import Any


def NewAliasAnnotation(name: str, tp: Any) -> Any:  # noqa: N802 (public API name)
    """Create an annotation-only sentinel named ``name`` standing for type ``tp``.

    Annotating a parameter of a graph function with the sentinel marks the graph input as
    passed by reference. Calling the sentinel is an error.
    """

    def sentinel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"`{name}` is an annotation for graph function parameters, not a function. "
            f"Use it as `def fn(x: popxl.{name}): ...`."
        )

    sentinel.__name__ = name
    sentinel.__qualname__ = name
    sentinel.__supertype__ = tp  # type: ignore[attr-defined]  # function attribute, like NewType
    return sentinel


__all__ = ["NewAliasAnnotation"]
