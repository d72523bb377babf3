"""Blocks: how a ``Module`` names the parts that execution strategies place on IPUs.

PopTorch marks blocks on ``torch.nn`` modules; here a popxl_addons ``Module`` marks them
while its ``build`` runs, in two ways that mirror PopTorch's:

* ``with poptorch.Block("decoder", ipu_id=1): ...`` inside ``build``: block ``"decoder"``
  starts with the ops created in the scope (ops after the scope, e.g. the loss, stay in it
  until the next block starts, as in PopTorch);
* ``poptorch.BeginBlock(self.layer2, "layer2", ipu_id=1)`` on a sub-module (usually in
  ``__init__``): calling it starts block ``"layer2"``, which lasts until the next block
  starts.

Ops created before any block belong to the first block. ``ipu_id`` is the block's IPU
unless the execution strategy places its stage (``Stage("layer2").ipu(1)``); a block
without ``user_id`` is named ``"block<n>"``. Outside ``trainingModel``/``inferenceModel``
the markers do nothing, so a module stays usable on its own.

>>> import popxl, popxl_addons as addons
>>> class Two(addons.Module):
...     def build(self, x):
...         with Block("first", ipu_id=0):
...             y = x + 1
...         with Block("second", ipu_id=1):
...             return y * 2
>>> with popxl.Ir().main_graph, recording() as blocks:
...     _ = Two().create_graph(popxl.TensorSpec((2,), popxl.float32))
>>> [(b.user_id, b.ipu_id, b.start) for b in blocks.marks]
[('first', 0, 0), ('second', 1, 1)]
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import popxl

BEGIN_BLOCK_MSG = "BeginBlock expects a popxl_addons Module (with a build method), got {got}."


@dataclass(frozen=True)
class Mark:
    """Block ``user_id`` starts at op ``start`` of ``graph`` (in creation order)."""

    graph: popxl.Graph
    start: int
    user_id: str
    ipu_id: int | None


@dataclass
class Recorder:
    """The block starts recorded while a model's graph is built."""

    marks: list[Mark] = field(default_factory=list)
    count: int = 0

    def begin(self, user_id: str | None, ipu_id: int | None) -> Mark:
        graph = popxl.gcg()
        if user_id is None:
            user_id = f"block{self.count}"
        self.count += 1
        mark = Mark(graph, len(graph._ops), str(user_id), ipu_id)
        self.marks.append(mark)
        return mark


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "poptorch_blocks", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Record the blocks that ``Block`` / ``BeginBlock`` mark in this scope."""
    recorder = Recorder()
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


class Block(contextlib.ContextDecorator):
    """Start block ``user_id`` (on IPU ``ipu_id``) with the ops created in this scope.

    Args:
        user_id: the block's name, used by ``Stage(...)``; default ``"block<n>"``.
        ipu_id: the block's IPU when the strategy does not place its stage.
    """

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None) -> None:
        self.user_id, self.ipu_id = user_id, ipu_id

    def __enter__(self) -> Block:
        recorder = _RECORDER.get()
        if recorder is not None:
            recorder.begin(self.user_id, self.ipu_id)
        return self

    def __exit__(self, *exc: Any) -> None:
        """The block goes on until the next one starts."""

    @staticmethod
    def useAutoId() -> None:  # noqa: N802 (PopTorch's name)
        """Name the following blocks ``block0``, ``block1``... (the default here)."""


class _BlockStartingBuild:
    """A module's ``build`` that first starts a block (picklable, unlike a closure, so
    executors of the module can still be saved)."""

    def __init__(self, build: Any, user_id: str | None, ipu_id: int | None) -> None:
        self.build, self.user_id, self.ipu_id = build, user_id, ipu_id
        functools.update_wrapper(self, build)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        recorder = _RECORDER.get()
        if recorder is not None:
            recorder.begin(self.user_id, self.ipu_id)
        return self.build(*args, **kwargs)


def BeginBlock(  # noqa: N802 (PopTorch's name)
    module: Any, user_id: str | None = None, ipu_id: int | None = None
) -> Any:
    """Make every call of ``module`` start block ``user_id`` (on IPU ``ipu_id``); the block
    lasts until the next one starts. Returns ``module``.

    Raises:
        TypeError: ``module`` has no ``build`` method.
    """
    build = getattr(module, "build", None)
    if not callable(build):
        raise TypeError(BEGIN_BLOCK_MSG.format(got=type(module).__name__))
    if isinstance(build, _BlockStartingBuild):
        build = build.build
    module.build = _BlockStartingBuild(build, user_id, ipu_id)
    return module
