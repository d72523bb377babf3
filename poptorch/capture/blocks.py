"""Repeated submodules captured once: the blocks of an ``nn.ModuleList`` / ``nn.Sequential``.

A transformer is N identical layers. Exporting all of them makes capture time, IR size and
compile time grow with N; PopTorch users' models are deep, so instead each group of
identical children is captured once and called once per child, the way popxl-addons
programs are written (one layer graph, N calls), which the runtime lowers so that XLA
compiles the layer once.

While the whole model is exported, every child of such a group runs as one opaque op
(``poptorch_capture::block``) whose inputs are the child's tensor arguments followed by its
parameters and buffers; its output shapes come from running the child's own ``forward``
on the fake inputs once per distinct input signature. The representative child is then
exported on its own, and the translator turns each ``block`` node into a call of that one
subgraph with the child's own weights.

Children are *identical* when they have the same class, the same parameter and buffer
names, shapes and dtypes, and equal plain attributes, recursively: then their ``forward``
computes the same function of their weights. One kind of difference is allowed: integer
attributes such as HuggingFace's ``layer_idx``, which a layer keeps only to find its slot in
a key/value cache. While a block's forward runs for its output shapes and for its capture,
such an attribute holds a value that refuses every use (``_Unread``) except as the index of a
cache update, so a forward that computes anything from it is exported inline instead.

A HuggingFace ``DynamicCache`` passed to the blocks (a decoder called with ``use_cache``) is
replaced, inside the block, by a cache that only records each ``update``: the block returns the
keys and values it would have stored, and the parent stores them in the real cache under the
member's own index, so the cache the user gets back is the one eager torch fills. An
``EncoderDecoderCache`` (Whisper, BART) is replaced by one whose self- and cross-attention
caches record so, and which says that no layer's cross-attention keys are stored yet. This
holds while the cache holds nothing yet for the layer (the first call's prefill), which is
checked. Caches are read through ``transformers_cache``, which works with 4.x and 5.x releases.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import transformers_cache as tc
from .transformers_cache import is_cache

# Attributes every nn.Module has that say nothing about what forward computes.
_MODULE_INTERNALS = frozenset(
    {
        "_parameters",
        "_buffers",
        "_modules",
        "_non_persistent_buffers_set",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_is_full_backward_hook",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
        "forward",
    }
)


@dataclass
class Block:
    """One child module running as an opaque op during the parent's export."""

    module: torch.nn.Module
    path: str  # the child's path in the model ("layers.3")
    group: int  # children of one group share a representative
    state_names: list[str]  # its parameters then buffers, relative names
    # Filled while exporting: how the child was called.
    spec: Any = None
    constants: tuple = ()
    n_inputs: int = 0
    # The integer attributes that differ between its group's members ("self_attn.layer_idx").
    index_attrs: tuple[str, ...] = ()


@dataclass
class BlockGroup:
    """Identical children; the first is the representative."""

    members: list[Block] = field(default_factory=list)
    # Output metadata per call signature (see ``_fake``).
    outputs: dict[Any, Any] = field(default_factory=dict)


_BLOCKS: dict[int, Block] = {}
# The caches (by id) the block calls of the current export were passed.
_SEEN_CACHES: set[int] = set()
_GROUPS: dict[int, BlockGroup] = {}
# Group ids and block keys are never reused in a process: a repeated block's own capture
# finds its groups after its parent's are gone, and the translator keeps every level's
# subgraphs by group in one table (Res2Net's bottlenecks hold repeated norms whose calls
# looked like the parent's repeated convolutions' when both groups had id 1).
_NEXT_ID = itertools.count(1)


@torch.library.custom_op("poptorch_capture::block", mutates_args=())
def block_op(tensors: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    """A repeated child module, called as one op while its parent is exported."""
    raise RuntimeError(
        "poptorch_capture::block only exists while poptorch exports a model; it never runs."
    )


@block_op.register_fake
def _fake(tensors: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    blk = _BLOCKS[key]
    group = _GROUPS[blk.group]
    signature = (
        blk.spec,
        blk.constants,
        tuple((tuple(t.shape), t.dtype) for t in tensors[: blk.n_inputs]),
    )
    if signature not in group.outputs:
        from .redirects import Redirects  # noqa: PLC0415 (as the block's own capture runs it)

        with Redirects(), _running(blk) as run:
            out = run(*tensors[: blk.n_inputs])
        flat, out_spec = pytree.tree_flatten(out[0])
        if not all(isinstance(t, torch.Tensor) for t in flat):
            raise _NotABlock("its forward returns non-tensor values")
        flat += [t for kv in out[1] for t in kv]
        group.outputs[signature] = ([(t.shape, t.dtype) for t in flat], out_spec, run.writes)
    metas = group.outputs[signature][0]
    return [torch.empty(shape, dtype=dtype) for shape, dtype in metas]


class _NotABlock(Exception):
    """A child that cannot run as an opaque block (the parent is then exported flat)."""


def _original_forward(module: torch.nn.Module) -> Any:
    return type(module).forward.__get__(module)


class _Tensor:
    def __repr__(self) -> str:
        return "<tensor>"


_TENSOR = _Tensor()


def output_structure(blk: Block, tensors: list[torch.Tensor]) -> tuple[Any, list]:
    """The pytree spec of a block call's outputs (after the fake run), and where each pair
    of key/value outputs after them goes: the index attribute (or the int) of a cache update."""
    group = _GROUPS[blk.group]
    signature = (
        blk.spec,
        blk.constants,
        tuple((tuple(t.shape), t.dtype) for t in tensors),
    )
    _, out_spec, writes = group.outputs[signature]
    return out_spec, writes


def _plain_attributes(module: torch.nn.Module) -> dict[str, Any]:
    return {k: v for k, v in vars(module).items() if k not in _MODULE_INTERNALS}


def _same_values(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, functools.partial):  # one per layer (Gemma's GELU), equal by identity
        return (
            a.func is b.func
            and len(a.args) == len(b.args)
            and all(_same_values(x, y) for x, y in zip(a.args, b.args))
            and a.keywords.keys() == b.keywords.keys()
            and all(_same_values(a.keywords[k], b.keywords[k]) for k in a.keywords)
        )
    try:
        return bool(a == b)
    except Exception:  # values that do not compare: treat as different
        return a is b


def identical(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Same class, weights' names/shapes/dtypes, plain attributes and children, recursively,
    but for integer attributes (see ``differing_indices``)."""
    return differing_indices(a, b) is not None


def differing_indices(a: torch.nn.Module, b: torch.nn.Module, prefix: str = "") -> list[str] | None:
    """The paths of the integer attributes in which ``a`` and ``b`` differ, or None if they
    differ in anything else: class, hooks, weights' names/shapes/dtypes, other attributes or
    children, recursively."""
    if type(a) is not type(b):
        return None
    if a._forward_hooks or a._forward_pre_hooks or b._forward_hooks or b._forward_pre_hooks:
        return None
    if not (_same_state(a._parameters, b._parameters) and _same_state(a._buffers, b._buffers)):
        return None
    pa, pb = _plain_attributes(a), _plain_attributes(b)
    if pa.keys() != pb.keys() or list(a._modules) != list(b._modules):
        return None
    found = []
    for k in pa:
        if _same_values(pa[k], pb[k]):
            continue
        if not (_is_index(pa[k]) and _is_index(pb[k])):
            return None
        found.append(prefix + k)
    for name, x in a._modules.items():
        y = b._modules[name]
        if (x is None) != (y is None):
            return None
        if x is not None and y is not None:
            inner = differing_indices(x, y, f"{prefix}{name}.")
            if inner is None:
                return None
            found += inner
    return found


def _is_index(value: Any) -> bool:
    return type(value) is int


def _same_state(da: dict, db: dict) -> bool:
    if list(da) != list(db):
        return False
    for k in da:
        x, y = da[k], db[k]
        if (x is None) != (y is None):
            return False
        if x is None:
            continue
        if x.shape != y.shape or x.dtype != y.dtype or x.requires_grad != y.requires_grad:
            return False
        if isinstance(x, torch.nn.Parameter) != isinstance(y, torch.nn.Parameter):
            return False
    return True


def _has_state(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def _updates_statistics(module: torch.nn.Module) -> bool:
    """Whether a call of ``module`` updates batch-norm running statistics (a training
    BatchNorm that tracks them): such a module writes its buffers, so it cannot be a block."""
    return any(
        isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.training and m.track_running_stats
        for m in module.modules()
    )


def find_groups(
    model: torch.nn.Module, min_size: int = 2
) -> list[list[tuple[str, torch.nn.Module]]]:
    """Groups of identical children of the model's ``ModuleList``s and ``Sequential``s.

    Only children with weights count (a stack of activations gains nothing), children
    that update batch-norm statistics do not (a block cannot write its buffers, and knowing
    it here saves exporting the model twice), and a module that is itself inside a group is
    not searched again.
    """
    groups: list[list[tuple[str, torch.nn.Module]]] = []
    taken: set[int] = set()

    def visit(prefix: str, module: torch.nn.Module) -> None:
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            pending: list[list[tuple[str, torch.nn.Module]]] = []
            for name, child in module.named_children():
                if not _has_state(child) or id(child) in taken or _updates_statistics(child):
                    continue
                path = f"{prefix}{name}"
                for g in pending:
                    if identical(g[0][1], child):
                        g.append((path, child))
                        break
                else:
                    pending.append([(path, child)])
            for g in pending:
                if len(g) >= min_size and len({id(m) for _, m in g}) == len(g):
                    groups.append(g)
                    taken.update(id(m) for _, m in g)
        for name, child in module.named_children():
            if id(child) not in taken:
                visit(f"{prefix}{name}.", child)

    visit("", model)
    return groups


def _calling(blk: Block, key: int) -> Any:
    def forward(*args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs), is_leaf=is_cache)
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        constants = tuple(_TENSOR if isinstance(a, torch.Tensor) else a for a in flat)
        if blk.spec is not None and (blk.spec, blk.constants) != (spec, constants):
            # Called again with other arguments: this call is captured inline.
            return _original_forward(blk.module)(*args, **kwargs)
        blk.spec, blk.constants, blk.n_inputs = spec, constants, len(tensors)
        if any(is_cache(c) and _holds_keys(c) for c in constants) and blk.index_attrs:
            raise _NotABlock("the cache it is passed already holds keys and values")
        state = dict(blk.module.named_parameters()) | dict(blk.module.named_buffers())
        outs = block_op(tensors + [state[n] for n in blk.state_names], key)
        out_spec, writes = output_structure(blk, tensors)
        n_out = len(outs) - 2 * len(writes)
        if writes:
            _store(blk, [c for c in constants if is_cache(c)], writes, outs[n_out:])
        return pytree.tree_unflatten(outs[:n_out], out_spec)

    return forward


def _store(blk: Block, caches: list, writes: list, kvs: list[torch.Tensor]) -> None:
    """Put the keys and values a block call returned into the parent's cache, as its
    forward's ``cache.update`` calls would have (and mark an encoder-decoder cache's layer
    whose cross-attention keys it stored, as the forward's attention does)."""
    (cache,) = caches
    targets = tc.attention_caches(cache)
    for i, (part, where) in enumerate(writes):
        index = _attribute(blk.module, where) if isinstance(where, str) else where
        target = targets[part]
        kind = tc.layer_kind(target, index)
        if tc.layer_holds_keys(target, index) or kind not in (None, *_RECORDABLE_LAYERS):
            raise _NotABlock("its cache layer already holds keys and values")
        target.update(kvs[2 * i], kvs[2 * i + 1], index)
        if part == tc.CROSS_ATTENTION:
            cache.is_updated[index] = True


def _holds_keys(cache: Any) -> bool:
    """Whether ``cache`` held keys when the first block call of this export was passed it
    (after that, ``_store`` checks each layer it fills)."""
    if id(cache) in _SEEN_CACHES:
        return False
    kinds = {k for c in tc.attention_caches(cache).values() for k in tc.layer_kinds(c)}
    others = kinds - _RECORDABLE_LAYERS
    if others:  # a state-space model's (Mamba's): no keys and values to record
        raise _NotABlock(f"its cache holds {', '.join(sorted(others))}s")
    _SEEN_CACHES.add(id(cache))
    return tc.holds_keys(cache)


def _attribute(module: torch.nn.Module, path: str) -> Any:
    *parents, name = path.split(".")
    for p in parents:
        module = getattr(module, p)
    return getattr(module, name)


# Cache layers whose ``update`` returns just the new keys and values when they hold none yet.
_RECORDABLE_LAYERS = frozenset({"DynamicLayer", "DynamicSlidingWindowLayer"})


class _Unread:
    """An index attribute's value while a block's forward runs for all members: any use but
    as a cache update's index means the members compute different things."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise _NotABlock(f"its forward computes with {self.path}, which differs between them")

    __index__ = __int__ = __float__ = __bool__ = __hash__ = __format__ = __str__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _refuse
    __pow__ = __rpow__ = __neg__ = __pos__ = __abs__ = __and__ = __or__ = __xor__ = _refuse

    def __repr__(self) -> str:
        return f"<{self.path}: differs between the repeated blocks>"


def _recording_cache(cache: Any, writes: list) -> Any:
    """A stand-in for ``cache`` (a ``DynamicCache``, or an ``EncoderDecoderCache`` of two)
    inside a block: ``update`` records where the keys and values go (which of the cache's
    caches, which layer) and returns them as an empty layer would; anything else the block
    asks of the cache would depend on other layers, so it makes the block inline."""
    parts = tc.attention_caches(cache)
    if any(type(c).__name__ != "DynamicCache" for c in parts.values()):
        kinds = ", ".join(sorted({type(c).__name__ for c in parts.values()}))
        raise _NotABlock(f"it is passed a {type(cache).__name__} ({kinds})")
    recorders = {
        part: _recorder(type(c), {"update": _recorded_update(part, writes)}, part is not None)
        for part, c in parts.items()
    }
    if None in recorders:
        return recorders[None]
    named: dict[str, Any] = {str(part): r for part, r in recorders.items()}
    return _recorder(type(cache), {**named, "is_updated": _NothingUpdated()})


def _recorded_update(part: str | None, writes: list) -> Any:
    def update(keys: Any, values: Any, layer_idx: Any, *_: Any, **__: Any) -> Any:
        where = layer_idx.path if isinstance(layer_idx, _Unread) else int(layer_idx)
        writes.append(((part, where), keys, values))
        return keys, values

    return update


def _recorder(base: type, answers: dict[str, Any], truthy: bool = False) -> Any:
    """An instance of a subclass of ``base`` (so it passes the forward's isinstance checks)
    holding nothing, that has only the attributes ``answers``; with ``truthy``, it is true
    (see ``_NothingUpdated``)."""

    class Recording(base):
        def __init__(self) -> None:
            pass

        def __getattribute__(self, name: str) -> Any:
            if name in answers:
                return answers[name]
            if name.startswith("__"):
                return object.__getattribute__(self, name)
            raise _NotABlock(f"its forward uses the cache's {name}")

        if truthy:

            def __bool__(self) -> bool:
                return True

    return Recording()


class _NothingUpdated:
    """An encoder-decoder cache's ``is_updated`` inside a block: no layer's cross-attention
    keys are stored yet (checked), so the attention computes and stores them. It asks
    ``cache and is_updated`` first, where the truth of the cross-attention cache would
    depend on other layers; the recorder of that cache is true, and this answer decides.
    The mark the attention then sets is the parent's to set (``_store``)."""

    def get(self, _layer: Any, default: Any = None) -> bool:
        return False

    def __getitem__(self, _layer: Any) -> bool:
        return False

    def __setitem__(self, _layer: Any, _value: Any) -> None:
        pass


class _Run:
    """``blk``'s forward as a function of its tensor arguments alone, returning its outputs
    and the key/value pairs it stored in a cache; ``writes`` says where each pair goes."""

    def __init__(self, blk: Block) -> None:
        self.blk = blk
        self.writes: list = []

    def __call__(self, *tensors: torch.Tensor) -> tuple[Any, tuple]:
        recorded: list = []
        it = iter(tensors)
        flat = [
            next(it) if c is _TENSOR else _recording_cache(c, recorded) if is_cache(c) else c
            for c in self.blk.constants
        ]
        args, kwargs = pytree.tree_unflatten(flat, self.blk.spec)
        out = _original_forward(self.blk.module)(*args, **kwargs)
        self.writes = [where for where, _, _ in recorded]
        return out, tuple((k, v) for _, k, v in recorded)


@contextlib.contextmanager
def _running(blk: Block) -> Iterator[_Run]:
    """While active, ``blk``'s index attributes are ``_Unread``; yields its ``_Run``."""
    paths = blk.index_attrs
    saved = [_attribute(blk.module, p) for p in paths]
    try:
        for p in paths:
            _set_attribute(blk.module, p, _Unread(p))
        yield _Run(blk)
    finally:
        for p, value in zip(paths, saved):
            _set_attribute(blk.module, p, value)


def _set_attribute(module: torch.nn.Module, path: str, value: Any) -> None:
    *parents, name = path.split(".")
    for p in parents:
        module = getattr(module, p)
    object.__setattr__(module, name, value)


@contextlib.contextmanager
def as_representative(blk: Block) -> Iterator[None]:
    """While active, ``blk.module``'s forward is ``_Run``'s (tensor arguments in, outputs then
    recorded keys and values out), for the capture of the subgraph every member calls."""
    with _running(blk) as run:

        def forward(*tensors: torch.Tensor) -> tuple[Any, tuple]:
            return run(*tensors)

        blk.module.forward = forward
        try:
            yield
        finally:
            blk.module.__dict__.pop("forward", None)


@contextlib.contextmanager
def as_blocks(groups: list[list[tuple[str, torch.nn.Module]]]) -> Iterator[dict[int, Block]]:
    """While active, every child of ``groups`` runs as a ``block`` op; yields the blocks by
    key (the op's ``key`` argument)."""
    blocks: dict[int, Block] = {}
    patched: list[torch.nn.Module] = []
    try:
        for members in groups:
            first = members[0][1]
            differ = {p for _, m in members[1:] for p in differing_indices(first, m) or ()}
            group = BlockGroup()
            gid = next(_NEXT_ID)
            _GROUPS[gid] = group
            for path, module in members:
                names = [n for n, _ in module.named_parameters()]
                names += [n for n, _ in module.named_buffers()]
                key = next(_NEXT_ID)
                blk = Block(module, path, gid, names, index_attrs=tuple(sorted(differ)))
                _BLOCKS[key] = blk
                blocks[key] = blk
                group.members.append(blk)
                module.forward = _calling(blk, key)
                patched.append(module)
        yield blocks
    finally:
        for module in patched:
            module.__dict__.pop("forward", None)
        _SEEN_CACHES.clear()
        for key, blk in blocks.items():
            _BLOCKS.pop(key, None)
            _GROUPS.pop(blk.group, None)


def is_block_node(target: Any) -> bool:
    return target is torch.ops.poptorch_capture.block.default


NotABlock = _NotABlock
