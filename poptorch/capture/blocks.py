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
computes the same function of their weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

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


@dataclass
class BlockGroup:
    """Identical children; the first is the representative."""

    members: list[Block] = field(default_factory=list)
    # Output metadata per call signature (see ``_fake``).
    outputs: dict[Any, Any] = field(default_factory=dict)


_BLOCKS: dict[int, Block] = {}
_GROUPS: dict[int, BlockGroup] = {}


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
        args, kwargs = _rebuild(blk, tensors[: blk.n_inputs])
        from .redirects import Redirects  # noqa: PLC0415 (as the block's own capture runs it)

        with Redirects():
            out = _original_forward(blk.module)(*args, **kwargs)
        flat, out_spec = pytree.tree_flatten(out)
        if not all(isinstance(t, torch.Tensor) for t in flat):
            raise _NotABlock("its forward returns non-tensor values")
        group.outputs[signature] = ([(t.shape, t.dtype) for t in flat], out_spec)
    metas, _ = group.outputs[signature]
    return [torch.empty(shape, dtype=dtype) for shape, dtype in metas]


class _NotABlock(Exception):
    """A child that cannot run as an opaque block (the parent is then exported flat)."""


def _original_forward(module: torch.nn.Module) -> Any:
    return type(module).forward.__get__(module)


def _rebuild(blk: Block, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    it = iter(tensors)
    flat = [next(it) if c is _TENSOR else c for c in blk.constants]
    return pytree.tree_unflatten(flat, blk.spec)


class _Tensor:
    def __repr__(self) -> str:
        return "<tensor>"


_TENSOR = _Tensor()


def output_structure(blk: Block, tensors: list[torch.Tensor]) -> Any:
    """The pytree spec of a block call's outputs (after the fake run)."""
    group = _GROUPS[blk.group]
    signature = (
        blk.spec,
        blk.constants,
        tuple((tuple(t.shape), t.dtype) for t in tensors),
    )
    return group.outputs[signature][1]


def _plain_attributes(module: torch.nn.Module) -> dict[str, Any]:
    return {k: v for k, v in vars(module).items() if k not in _MODULE_INTERNALS}


def _same_values(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    try:
        return bool(a == b)
    except Exception:  # values that do not compare: treat as different
        return a is b


def identical(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Same class, weights' names/shapes/dtypes, plain attributes and children, recursively."""
    if type(a) is not type(b):
        return False
    if a._forward_hooks or a._forward_pre_hooks or b._forward_hooks or b._forward_pre_hooks:
        return False
    for get in (
        lambda m: m._parameters,
        lambda m: m._buffers,
    ):
        da, db = get(a), get(b)
        if list(da) != list(db):
            return False
        for k in da:
            x, y = da[k], db[k]
            if (x is None) != (y is None):
                return False
            if x is not None and (x.shape != y.shape or x.dtype != y.dtype):
                return False
            if x is not None and isinstance(x, torch.nn.Parameter) != isinstance(
                y, torch.nn.Parameter
            ):
                return False
            if x is not None and x.requires_grad != y.requires_grad:
                return False
    pa, pb = _plain_attributes(a), _plain_attributes(b)
    if pa.keys() != pb.keys() or not all(_same_values(pa[k], pb[k]) for k in pa):
        return False
    if list(a._modules) != list(b._modules):
        return False
    return all(
        (x is None and y is None) or (x is not None and y is not None and identical(x, y))
        for x, y in zip(a._modules.values(), b._modules.values())
    )


def _has_state(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def find_groups(
    model: torch.nn.Module, min_size: int = 2
) -> list[list[tuple[str, torch.nn.Module]]]:
    """Groups of identical children of the model's ``ModuleList``s and ``Sequential``s.

    Only children with weights count (a stack of activations gains nothing), and a module
    that is itself inside a group is not searched again.
    """
    groups: list[list[tuple[str, torch.nn.Module]]] = []
    taken: set[int] = set()

    def visit(prefix: str, module: torch.nn.Module) -> None:
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            pending: list[list[tuple[str, torch.nn.Module]]] = []
            for name, child in module.named_children():
                if not _has_state(child) or id(child) in taken:
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
        flat, spec = pytree.tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        constants = tuple(_TENSOR if isinstance(a, torch.Tensor) else a for a in flat)
        if blk.spec is not None and (blk.spec, blk.constants) != (spec, constants):
            # Called again with other arguments: this call is captured inline.
            return _original_forward(blk.module)(*args, **kwargs)
        blk.spec, blk.constants, blk.n_inputs = spec, constants, len(tensors)
        state = dict(blk.module.named_parameters()) | dict(blk.module.named_buffers())
        outs = block_op(tensors + [state[n] for n in blk.state_names], key)
        out_spec = output_structure(blk, tensors)
        return pytree.tree_unflatten(outs, out_spec)

    return forward


@contextlib.contextmanager
def as_blocks(groups: list[list[tuple[str, torch.nn.Module]]]) -> Iterator[dict[int, Block]]:
    """While active, every child of ``groups`` runs as a ``block`` op; yields the blocks by
    key (the op's ``key`` argument)."""
    blocks: dict[int, Block] = {}
    patched: list[torch.nn.Module] = []
    try:
        for members in groups:
            group = BlockGroup()
            gid = max(_GROUPS, default=0) + 1
            _GROUPS[gid] = group
            for path, module in members:
                names = [n for n, _ in module.named_parameters()]
                names += [n for n, _ in module.named_buffers()]
                key = max(_BLOCKS, default=0) + 1
                blk = Block(module, path, gid, names)
                _BLOCKS[key] = blk
                blocks[key] = blk
                group.members.append(blk)
                module.forward = _calling(blk, key)
                patched.append(module)
        yield blocks
    finally:
        for module in patched:
            module.__dict__.pop("forward", None)
        for key, blk in blocks.items():
            _BLOCKS.pop(key, None)
            _GROUPS.pop(blk.group, None)


def is_block_node(target: Any) -> bool:
    return target is torch.ops.poptorch_capture.block.default


NotABlock = _NotABlock
