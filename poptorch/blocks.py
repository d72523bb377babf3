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

from .errors import Error

ASSIGNED_MSG = (
    "module has already been assigned to a block. It starts block (user_id, ipu_id) = "
    "{mark}; call poptorch.removeBlocks(module) first to assign it another."
)
BEGIN_BLOCK_MSG = (
    "BeginBlock expects a torch.nn.Module, a popxl_addons Module (with a build method) or "
    "a function, got {got}."
)


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
        if user_id is None:  # PopTorch's automatic ids: "0", "1"... for unnamed blocks
            user_id = str(self.count)
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


# Torch models: blocks are annotations on the captured graph's nodes -------------------------
#
# While a torch model is captured, starting a block enters an annotation context
# (``torch.fx.traceback.annotate``) that stays entered until the capture ends, so every node
# traced after it carries ``meta["custom"][BLOCK_KEY] = (user_id, ipu_id)`` until the next
# block starts; the translator turns changes of that annotation into block marks.

BLOCK_KEY = "poptorch_block"
# The annotation after a ``with Block(...)`` ends in a torch model: no block is active, and an
# op traced there is refused, as PopTorch refused it.
NO_ACTIVE_BLOCK = ("", -1)
_CAPTURE: contextvars.ContextVar[contextlib.ExitStack | None] = contextvars.ContextVar(
    "poptorch_block_capture", default=None
)
_AUTO_IDS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "poptorch_block_ids", default=None
)


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Scope of one torch model's capture: block annotations opened in it close at its end."""
    with contextlib.ExitStack() as stack:
        token = _CAPTURE.set(stack)
        ids = _AUTO_IDS.set([0])
        try:
            yield
        finally:
            _AUTO_IDS.reset(ids)
            _CAPTURE.reset(token)


def _begin_torch_block(user_id: str | None, ipu_id: int | None) -> str | None:
    """Start block ``user_id`` in the torch model being captured; returns its id (an
    unnamed block's automatic one), or ``None`` outside a capture."""
    stack = _CAPTURE.get()
    if stack is None:
        return None
    counter = _AUTO_IDS.get()
    if user_id is None and counter is not None:  # PopTorch's automatic ids: "0", "1"...
        user_id = str(counter[0])
        counter[0] += 1
    from torch.fx import traceback as fx_traceback  # noqa: PLC0415 (torch models only)

    stack.enter_context(fx_traceback.annotate({BLOCK_KEY: (str(user_id), ipu_id)}))
    return str(user_id)


def _end_torch_block() -> None:
    stack = _CAPTURE.get()
    if stack is None:
        return
    from torch.fx import traceback as fx_traceback  # noqa: PLC0415 (torch models only)

    stack.enter_context(fx_traceback.annotate({BLOCK_KEY: NO_ACTIVE_BLOCK}))


def mark_node_block(recorder: Recorder | None, annotation: tuple[str, int | None]) -> None:
    """Start the block a captured node is annotated with (the translator calls this when
    the annotation changes)."""
    if recorder is not None:
        recorder.begin(*annotation)


def current_recorder() -> Recorder | None:
    return _RECORDER.get()


# A torch module's BeginBlock (user_id, ipu_id), in its __dict__ (copied with it).
_BLOCK_MARK = "_poptorch_block"


class _Ids:
    """PopTorch's private names of a block's ids (``Block._user_id``, ``._ipu_id``)."""

    user_id: str | None
    ipu_id: int | None

    @property
    def _user_id(self) -> str | None:
        return self.user_id

    @property
    def _ipu_id(self) -> int | None:
        return self.ipu_id


class Block(_Ids, contextlib.ContextDecorator):
    """Start block ``user_id`` (on IPU ``ipu_id``) with the ops created in this scope.

    In a popxl_addons ``Module``'s ``build`` or a torch model's ``forward`` (while it is
    captured); outside both it does nothing, so the model still runs in plain PyTorch.

    Args:
        user_id: the block's name, used by ``Stage(...)``; default ``"<n>"``, counting the
            unnamed blocks from 0 (PopTorch's automatic ids).
        ipu_id: the block's IPU when the strategy does not place its stage.
    """

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None) -> None:
        self.user_id, self.ipu_id = user_id, ipu_id

    def __enter__(self) -> Block:
        recorder = _RECORDER.get()
        if recorder is not None:
            recorder.begin(self.user_id, self.ipu_id)
        _begin_torch_block(self.user_id, self.ipu_id)
        return self

    def __exit__(self, *exc: Any) -> None:
        """In a torch model, the block ends here: the ops that follow must be in another
        block. In a popxl_addons ``Module`` it goes on until the next one starts."""
        _end_torch_block()

    @staticmethod
    def start(user_id: str | None = None, ipu_id: int | None = None) -> None:
        """Start block ``user_id`` (on IPU ``ipu_id``) here: the ops that follow belong to
        it until the next block starts (``with Block(...)`` without the indentation)."""
        Block(user_id, ipu_id).__enter__()

    @staticmethod
    def useAutoId() -> None:  # noqa: N802 (PopTorch's name)
        """Number the unnamed blocks that follow from ``"0"`` again (they are numbered
        ``"0"``, ``"1"``... from the start of each capture anyway)."""
        counter = _AUTO_IDS.get()
        if counter is not None:
            counter[0] = 0
        recorder = _RECORDER.get()
        if recorder is not None:
            recorder.count = 0


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


class _BlockStartingFunction(_Ids):
    """A function whose calls start a block: ``BeginBlock(fn, user_id, ipu_id)`` (picklable
    when ``fn`` is)."""

    def __init__(self, fn: Any, user_id: str | None, ipu_id: int | None) -> None:
        self.fn, self.user_id, self.ipu_id = fn, user_id, ipu_id
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        recorder = _RECORDER.get()
        if recorder is not None:
            recorder.begin(self.user_id, self.ipu_id)
        # Lasts until the next block; an unnamed one keeps its first automatic id, as the
        # module's own block in every call (PopTorch's LegacyBeginBlockFn).
        self.user_id = _begin_torch_block(self.user_id, self.ipu_id) or self.user_id
        return self.fn(*args, **kwargs)


class _BeginBlockHook:
    """A torch module's forward pre-hook starting a block (a class, so models pickle)."""

    def __init__(self, user_id: str | None, ipu_id: int | None) -> None:
        self.user_id, self.ipu_id = user_id, ipu_id

    def __call__(self, module: Any, args: Any) -> None:
        # An unnamed block keeps the automatic id of its first call: a module called twice
        # (GPT-2's tied LM head) is one block, as PopTorch's _BlockHook made it.
        self.user_id = _begin_torch_block(self.user_id, self.ipu_id) or self.user_id


def _is_torch_module(module: Any) -> bool:
    return any(c.__module__ == "torch.nn.modules.module" for c in type(module).__mro__)


def BeginBlock(  # noqa: N802 (PopTorch's name)
    layer_to_call: Any, user_id: str | None = None, ipu_id: int | None = None
) -> Any:
    """Make every call of ``layer_to_call`` start block ``user_id`` (on IPU ``ipu_id``); the
    block lasts until the next one starts. Returns ``layer_to_call``.

    ``layer_to_call`` (PopTorch's name; programs also pass it by keyword) is a
    ``torch.nn.Module`` (a forward pre-hook marks the block while the model is captured) or
    a popxl_addons ``Module``.

    Raises:
        TypeError: ``layer_to_call`` is neither.
        poptorch.Error: the torch module already starts a block (``removeBlocks`` first).
    """
    module = layer_to_call
    if _is_torch_module(module):
        if "_poptorch_block_hook" in module.__dict__:
            raise Error(ASSIGNED_MSG.format(mark=module.__dict__.get(_BLOCK_MARK)))
        handle = module.register_forward_pre_hook(_BeginBlockHook(user_id, ipu_id))
        module.__dict__["_poptorch_block_hook"] = handle
        module.__dict__[_BLOCK_MARK] = (user_id, ipu_id)
        return module
    if not hasattr(module, "build") and callable(module):
        return _BlockStartingFunction(module, user_id, ipu_id)  # PopTorch's legacy use
    build = getattr(module, "build", None)
    if not callable(build):
        raise TypeError(BEGIN_BLOCK_MSG.format(got=type(module).__name__))
    if isinstance(build, _BlockStartingBuild):
        build = build.build
    module.build = _BlockStartingBuild(build, user_id, ipu_id)
    return module


def removeBlocks(module: Any) -> None:  # noqa: N802 (PopTorch's name)
    """Remove the ``BeginBlock`` marks of ``module`` and of its sub-modules."""
    modules = module.modules() if _is_torch_module(module) else [module]
    for m in modules:
        handle = m.__dict__.pop("_poptorch_block_hook", None)
        m.__dict__.pop(_BLOCK_MARK, None)
        if handle is not None:
            handle.remove()


def module_repr(module: Any) -> str:
    """``repr(module)`` with each sub-module that ``BeginBlock`` marked shown as
    ``BeginBlock(user_id=..., ipu_id=...)`` before its own repr."""
    from torch.nn.modules.module import _addindent  # noqa: PLC0415 (torch models only)

    lines = module.extra_repr().split("\n") if module.extra_repr() else []
    for key, child in module._modules.items():
        if child is not None:
            lines.append(f"({key}): " + _addindent(module_repr(child), 2))
    mark = module.__dict__.get(_BLOCK_MARK)
    head = f"BeginBlock(user_id={mark[0]}, ipu_id={mark[1]}) " if mark else ""
    head += module._get_name() + "("
    if not lines:
        return head + ")"
    if len(lines) == 1 and not module._modules:
        return head + lines[0] + ")"
    return head + "\n  " + "\n  ".join(lines) + "\n)"


def BlockFunction(  # noqa: N802 (PopTorch's name)
    user_id: str | None = None, ipu_id: int | None = None
) -> Any:
    """Decorator: calls of the decorated function start block ``user_id`` on ``ipu_id``."""

    def decorate(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Block(user_id, ipu_id):
                return fn(*args, **kwargs)

        return wrapper

    return decorate
