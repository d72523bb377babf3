"""``torch.ops.poptorch.push_name_scope(name)`` and ``pop_name_scope()``: PopTorch's name
scopes as calls instead of a ``with`` block.

Applications push and pop them from forward hooks to name each layer's ops (Graphcore's CNNs
register ``push_name_scope(<layer name>)`` before every module's ``forward`` and
``pop_name_scope()`` after it). Each push opens a ``poptorch.NameScope`` (``scopes``) around
the ops the capture records until its pop; in eager torch they do nothing, as in PopTorch.
The ops run their Python body when called, eagerly and while torch.export traces them (as
their fake kernels), so the scope stack follows the calls in order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .scopes import NameScope

_PUSHED: list[NameScope] = []


def _push(name: str) -> None:
    scope = NameScope(name)
    scope.__enter__()
    _PUSHED.append(scope)


def _pop() -> None:
    if _PUSHED:
        _PUSHED.pop().__exit__(None, None, None)


@torch.library.custom_op("poptorch::push_name_scope", mutates_args=())
def push_name_scope(name: str) -> None:
    _push(name)


@torch.library.custom_op("poptorch::pop_name_scope", mutates_args=())
def pop_name_scope() -> None:
    _pop()


push_name_scope.register_fake(_push)
pop_name_scope.register_fake(_pop)


@contextlib.contextmanager
def closing_pushed_scopes() -> Iterator[None]:
    """While active (one trace of a model), scopes pushed and left open are closed at the
    end: a forward that raised between a push and its pop leaves none to a later trace."""
    depth = len(_PUSHED)
    try:
        yield
    finally:
        while len(_PUSHED) > depth:
            _pop()
