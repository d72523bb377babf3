"""Composite ATen ops the table has no record for, lowered through their decompositions.

The capture normally decomposes the whole exported program to core ATen
(``run_decompositions``). That can fail where a decomposition gives a result laid out
differently from the op it replaces and a later ``view`` of it was traced against the
original strides (HF GPT-2: ``scaled_dot_product_attention``, then a ``view`` of its
transposed output). The capture then decomposes less (``capture.export``), keeping such ops
whole; each is lowered here by decomposing that one node on its own, from its recorded
inputs, and lowering the core ATen ops it becomes through the table, in the node's name
scope. popxl tensors have no strides, so the node's layout no longer matters.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from ..aten import PRESERVED
from .composite_ops import composite_ops_cached, registrations

if TYPE_CHECKING:
    from .control import Translator

# Node metadata the ops of a decomposition inherit (for names, scopes and error messages).
_INHERITED = ("stack_trace", "nn_module_stack", "custom", "source_fn_stack", "from_node")


def decomposition_table() -> dict[Any, Any]:
    """torch.export's core ATen decompositions, less the ops the table keeps whole (a new
    dict each call)."""
    return dict(_core_table())


def _core_table() -> dict[Any, Any]:
    """The decompositions, worked out once per set of registered ops (building them took
    0.15 s a capture); not to be changed by the caller."""
    global _table
    key = (registrations(), len(PRESERVED))
    if _table is None or _table[0] != key:
        with composite_ops_cached():
            table = torch.export.default_decompositions()
            for op in PRESERVED:
                table.pop(op, None)
            _table = (key, dict(table))
    return _table[1]


_table: tuple[Any, dict[Any, Any]] | None = None


def decomposable(target: Any) -> bool:
    """Whether ``target`` is an ATen op that torch decomposes (into core ATen ops)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return target in _core_table() or target._can_decompose()


def decompose(node: torch.fx.Node) -> torch.fx.GraphModule:
    """The core ATen graph of ``node`` alone: one placeholder per tensor argument (in
    ``pytree`` order of ``(args, kwargs)``)."""
    values = pytree.tree_map_only(torch.fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs))
    leaves, spec = pytree.tree_flatten(values)
    is_tensor = [isinstance(v, torch.Tensor) for v in leaves]
    op: Any = node.target

    def run(*tensors: torch.Tensor) -> Any:
        given = iter(tensors)
        args, kwargs = pytree.tree_unflatten(
            [next(given) if t else v for v, t in zip(leaves, is_tensor)], spec
        )
        return op(*args, **kwargs)

    examples = [v for v, t in zip(leaves, is_tensor) if t]
    fake_mode = detect_fake_mode(examples)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        gm = make_fx(run, decomposition_table=decomposition_table())(*examples)
    for inner in gm.graph.nodes:
        for key in _INHERITED:
            if key in node.meta:
                inner.meta.setdefault(key, node.meta[key])
    return gm


def lower(translator: Translator, node: torch.fx.Node) -> Any:
    """Lower ``node`` through the table by way of its decomposition (see the module
    docstring); returns what the translator keeps for the node."""
    gm = decompose(node)
    if any(n.op == "call_function" and n.target is node.target for n in gm.graph.nodes):
        raise NotImplementedError(f"{node.target} does not decompose")
    inputs = pytree.tree_leaves(
        pytree.tree_map_only(torch.fx.Node, translator.env.__getitem__, (node.args, node.kwargs))
    )
    values = pytree.tree_leaves(
        pytree.tree_map_only(torch.fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs))
    )
    given = iter([x for x, v in zip(inputs, values) if isinstance(v, torch.Tensor)])
    result: Any = None
    for inner in gm.graph.nodes:
        if inner.op == "placeholder":
            translator.env[inner] = next(given)
        elif inner.op == "call_function":
            translator.env[inner] = translator._lower(inner)
        elif inner.op == "output":
            result = translator._arg(inner.args[0])
    return tuple(result) if isinstance(result, list) else result
