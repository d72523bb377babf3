"""Scopes a torch model's ``forward`` opens around ops: ``NameScope`` and ``Attribute``.

While a model is captured, each scope is an annotation on the captured graph's nodes
(``torch.fx.traceback.annotate``); the translator then names the node's popxl ops under the
name scopes (after the torch module path) and records the attributes on them (``Op.hints``,
shown by ``_debugGetPopartIR`` and PopART's log). Outside a capture both do nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

NAME_SCOPE_KEY = "poptorch_name_scope"
# The hint naming the torch module an op (a call of a block) runs: PopART's op names.
MODULE_PATH = "module_path"
ATTRIBUTE_KEY = "poptorch_attributes"
ATTRIBUTE_VALUE_MSG = (
    "poptorch.Attribute({name}=...) takes a dict of attribute keys to values, e.g. "
    "poptorch.Attribute(__outline={{'layer': 'embedding'}}); got {got!r}."
)


def _tracing() -> bool:
    from .. import _state  # noqa: PLC0415

    return _state.TRACING.get()


def _annotation(key: str) -> Any:
    from torch.fx import traceback as fx_traceback  # noqa: PLC0415 (torch models only)

    return (fx_traceback.current_meta.get("custom") or {}).get(key)


class _Annotating(contextlib.AbstractContextManager):
    """Enters one node annotation while a model is being captured."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None

    def _value(self) -> tuple[str, Any]:
        raise NotImplementedError

    def __enter__(self) -> Any:
        if _tracing():
            from torch.fx import traceback as fx_traceback  # noqa: PLC0415

            self._stack = contextlib.ExitStack()
            key, value = self._value()
            self._stack.enter_context(fx_traceback.annotate({key: value}))
        return self

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


# The modules whose ``forward`` is running while a model is captured, and that model: a
# name scope's depth is its place among them (the model is depth 1), so it knows where it
# sits among the module paths.
_RUNNING: list[Any] = []
_ROOT: list[Any] = []


@contextlib.contextmanager
def tracking_module_depth(model: Any) -> Iterator[None]:
    """While active (a capture of ``model``), keep the stack of running modules."""
    from torch.nn.modules import module as torch_module  # noqa: PLC0415

    def enter(module: Any, *_: Any) -> None:
        _RUNNING.append(module)

    def leave(module: Any, *_: Any) -> None:
        if _RUNNING and _RUNNING[-1] is module:
            _RUNNING.pop()

    saved = (list(_RUNNING), list(_ROOT))
    _RUNNING.clear()
    _ROOT[:] = [model]
    pre = torch_module.register_module_forward_pre_hook(enter)
    post = torch_module.register_module_forward_hook(leave, always_call=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        _RUNNING[:], _ROOT[:] = saved


def _depth() -> int:
    """How many modules, the captured model first, run the current ``forward``."""
    for i, module in enumerate(_RUNNING):
        if _ROOT and module is _ROOT[0]:
            return len(_RUNNING) - i
    return 1


class NameScope(_Annotating):
    """Name the ops created in this scope ``name/...``, after the path of the module whose
    ``forward`` opens it and before the paths of the modules called inside.

    >>> with poptorch.NameScope("attention"):  # doctest: +SKIP
    ...     y = x @ w
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        if not isinstance(name, str) or not name:
            raise ValueError(f"poptorch.NameScope takes a non-empty name, got {name!r}.")
        self.name = name

    def _value(self) -> tuple[str, Any]:
        outer = _annotation(NAME_SCOPE_KEY) or ()
        return NAME_SCOPE_KEY, (*outer, (self.name, _depth()))


class Attribute(_Annotating):
    """Attach attributes to the ops created in this scope, e.g. PopART's outlining hints
    ``poptorch.Attribute(__outline={"layer": "embedding"})``. Each keyword is an attribute
    holding a dict; nested scopes add to (or override keys of) the outer ones.

    The attributes are recorded on the ops for the IR's reader (``_debugGetPopartIR``,
    PopART's log); XLA decides outlining itself, so the numbers do not change.
    """

    def __init__(self, **attributes: dict[str, Any]) -> None:
        super().__init__()
        for name, value in attributes.items():
            if not isinstance(value, dict):
                raise ValueError(ATTRIBUTE_VALUE_MSG.format(name=name, got=value))
        self.attributes = attributes

    def _value(self) -> tuple[str, Any]:
        merged = {k: dict(v) for k, v in (_annotation(ATTRIBUTE_KEY) or {}).items()}
        for name, values in self.attributes.items():
            merged.setdefault(_unmangled(name), {}).update(
                {str(k): str(v) for k, v in values.items()}
            )
        return ATTRIBUTE_KEY, merged


def scope_path(module_paths: list[str], name_scopes: tuple[tuple[str, int], ...]) -> str:
    """The name scope of a captured node: the path of the innermost module it runs in
    (torch's dotted path, the root's ``""`` first in ``module_paths``), with each
    ``NameScope`` placed after the module whose ``forward`` opened it (its ``depth``):
    ``layer1/attention/0`` for a scope ``attention`` opened in ``layer1`` around ``layer1.0``."""
    parts: list[str] = []
    start = ""  # where the current run of module path starts
    for level, path in enumerate(module_paths or [""]):
        opened = [name for name, depth in name_scopes if depth == level + 1]
        if opened:
            parts.append(_relative(path, start))
            parts.extend(opened)
            start = path
    last = module_paths[-1] if module_paths else ""
    parts.append(_relative(last, start))
    parts.extend(name for name, depth in name_scopes if depth > max(len(module_paths), 1))
    return "/".join(p for p in parts if p)


def _relative(path: str, start: str) -> str:
    if not start:
        return path
    return path[len(start) + 1 :] if path.startswith(start + ".") else ""


def _unmangled(name: str) -> str:
    """``__outline`` as written: Python renames ``__x`` keywords used inside a class body
    (a model's ``forward``) to ``_Class__x``."""
    head, sep, rest = name.partition("__")
    if sep and head.startswith("_") and len(head) > 1 and rest:
        return "__" + rest
    return name
