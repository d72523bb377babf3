"""Compile hooks: user callables run just before and just after a program is compiled.

``registerPreCompileHook(fn)`` / ``registerPostCompileHook(fn)`` add ``fn`` (no arguments)
to a process-wide list; every executor calls the list in registration order around its
compile step. Each returns a handle whose ``remove()`` takes the hook out again.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

NOT_CALLABLE_MSG = "{kind}-compile hook must be callable, got {got!r} of type {type}."

_PRE: dict[int, Callable[[], None]] = {}
_POST: dict[int, Callable[[], None]] = {}
_ids = itertools.count()


class HookHandle:
    """Removes one registered hook (``torch.utils.hooks.RemovableHandle``'s ``remove``)."""

    def __init__(self, hooks: dict[int, Callable[[], None]], key: int) -> None:
        self._hooks, self._key = hooks, key

    def remove(self) -> None:
        """Unregister the hook (a no-op if it is already gone)."""
        self._hooks.pop(self._key, None)

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _register(hooks: dict[int, Callable[[], None]], hook: Any, kind: str) -> HookHandle:
    if not callable(hook):
        # RuntimeError, as PopTorch raised.
        raise RuntimeError(NOT_CALLABLE_MSG.format(kind=kind, got=hook, type=type(hook).__name__))
    key = next(_ids)
    hooks[key] = hook
    return HookHandle(hooks, key)


def registerPreCompileHook(hook: Callable[[], None]) -> HookHandle:  # noqa: N802
    """Call ``hook()`` before each model is compiled; ``.remove()`` on the result undoes it.

    Raises:
        RuntimeError: ``hook`` is not callable.
    """
    return _register(_PRE, hook, "Pre")


def registerPostCompileHook(hook: Callable[[], None]) -> HookHandle:  # noqa: N802
    """Call ``hook()`` after each model is compiled; ``.remove()`` on the result undoes it.

    Raises:
        RuntimeError: ``hook`` is not callable.
    """
    return _register(_POST, hook, "Post")


_depth = 0


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Run the pre-compile hooks on entry and the post-compile hooks on a successful exit;
    nested uses (a torch capture around the program build) run them once."""
    global _depth
    outer = _depth == 0
    if outer:
        for hook in list(_PRE.values()):
            hook()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    if outer:
        for hook in list(_POST.values()):
            hook()
