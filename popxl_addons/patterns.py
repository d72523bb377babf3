"""PopART's pre-alias patterns as IR passes: ``apply_pre_alias_patterns(ir, level)``.

PopART rewrote every graph with "patterns" before its alias (in-place) analysis. The
*mandatory* ones turned gradient ops into ordinary forward ops; the *default* ones also
removed ops that do nothing. Here each pattern is a rewrite of this project's IR that keeps
every tensor's value: gradient ops (lowered as ``jax.vjp``) of elementwise ops become the
plain ``Mul``/``Neg``/``ReduceSum`` ops that compute them, and no-op ops become
``Identity`` ops that are then removed. The schedule (``print_schedule``) shows the result.

=================================  =======  =================================================
pattern (PopART's name)            level    rewrite
=================================  =======  =================================================
``MulArgGradOp``                   minimal  ``MulGrad`` -> ``Mul`` (+ ``ReduceSum`` to shape)
``SubtractArg1GradOp``             minimal  ``SubGrad`` -> ``Neg``/identity (+ ``ReduceSum``)
``AddArgGradOp``                   minimal  ``AddGrad`` -> identity (+ ``ReduceSum``)
``NegGradOp``                      minimal  ``NegateGrad`` -> ``Neg``
``MatMulGradOp``                   minimal  ``MatMulGrad`` -> ``MatMul`` with ``Transpose``
                                            (2-D rhs; PopART's MatMulLhs/RhsGradOp)
``OpToIdentity``                   default  same-shape ``Reshape``, same-type ``Cast``,
                                            identity ``Transpose``, one-input ``Concat``,
                                            ``x * 1``, ``x / 1``, and the
                                            ``ReplicatedAllReduceTP``/``...Strided`` of
                                            identical inputs (forward of ``f``, gradient
                                            of ``g``) -> ``Identity``
``TransposeToIdentityOrReshape``   default  ``Transpose`` moving only size-1 axes ->
                                            ``Reshape``
``NegativeOneScale``               default  ``x * -1`` -> ``Neg``
``PreUniRepl``                     default  remove ``Identity`` ops whose input and output
                                            are never written in place
=================================  =======  =================================================

``"all"`` runs the same patterns as ``"default"``: PopART's extra all-level patterns
(LSTM, SplitGather, TiedGather, Slice2SliceSubsample) target ops or IPU tile layouts this
IR does not have. Patterns run over every graph until none applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

import popxl
from popxl import ops
from popxl._op import Op
from popxl.tensor import Constant

from ._ir_edit import insert_before, modified_storages, remove_op, replace_op_kind, replace_uses
from .ops._native import ALL_REDUCE_PAIRS

Level = Literal["no_patterns", "minimal", "default", "all"]
LEVELS: dict[str, int] = {"no_patterns": 0, "minimal": 1, "default": 2, "all": 3}
patterns_level = LEVELS  # the original's name (it mapped to PopART's PatternsLevel)
BAD_LEVEL_MSG = "level must be one of {levels}, got {level!r}."
MAX_SWEEPS = 100


@dataclass(frozen=True)
class Pattern:
    """One rewrite. ``apply(graph, op, storage)`` returns whether it rewrote ``op``."""

    name: str
    level: int
    apply: Callable[[popxl.Graph, Op, _Storage], bool]


class _Storage:
    """Which storages of a graph some op writes, computed once per sweep on first use.

    Stays valid during the sweep: the rewrites never add in-place ops or views."""

    def __init__(self, graph: popxl.Graph) -> None:
        self._graph = graph
        self._state: tuple[Callable[[popxl.Tensor], popxl.Tensor], set[popxl.Tensor]] | None
        self._state = None

    def is_written(self, t: popxl.Tensor) -> bool:
        if self._state is None:
            self._state = modified_storages(self._graph)
        find, written = self._state
        return find(t) in written


# Helpers ------------------------------------------------------------------------------------


def _scalar_constant(t: popxl.Tensor) -> float | None:
    if isinstance(t, Constant) and t.shape == () and t.dtype.is_floating_point:
        return float(np.asarray(t._data))
    return None


def _scaled_input(op: Op, factor: float) -> popxl.Tensor | None:
    """For ``x * c`` / ``c * x`` (or ``x / c`` when ``c`` is 1) with ``c`` a scalar constant
    equal to ``factor``: ``x``, provided the output is exactly ``x``'s shape and type."""
    if op.opdef.key == "mul":
        pairs = [(op.inputs[0], op.inputs[1]), (op.inputs[1], op.inputs[0])]
    elif op.opdef.key == "div" and factor == 1.0:
        pairs = [(op.inputs[0], op.inputs[1])]
    else:
        return None
    out = op.outputs[0]
    for x, c in pairs:
        if _scalar_constant(c) == factor and x.shape == out.shape and x.dtype == out.dtype:
            return x
    return None


def _unbroadcast(g: popxl.Tensor, shape: tuple[int, ...]) -> popxl.Tensor:
    """Sum ``g`` over the axes NumPy broadcasting added to a tensor of ``shape``."""
    if g.shape == shape:
        return g
    lead = g.rank - len(shape)
    axes = list(range(lead)) + [
        lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1
    ]
    summed = ops.sum(g, axes, keepdims=True)
    return summed if summed.shape == shape else ops.reshape(summed, shape)


# Default patterns -------------------------------------------------------------------------


def _is_noop(op: Op) -> popxl.Tensor | None:
    """The input ``op`` returns unchanged, or None."""
    key, ins, out = op.opdef.key, op.inputs, op.outputs
    if key == "reshape" and ins[0].shape == out[0].shape:
        return ins[0]
    if key == "cast" and ins[0].dtype == out[0].dtype:
        return ins[0]
    if key == "transpose" and tuple(op.attrs["permutation"]) == tuple(range(ins[0].rank)):
        return ins[0]
    if key == "concat" and len(ins) == 1:
        return ins[0]
    if key in ALL_REDUCE_PAIRS and op.attrs["identical_inputs"]:
        return ins[0]  # the original's canBeReplacedByIdentity: inputs already agree
    return _scaled_input(op, 1.0)


def _op_to_identity(graph: popxl.Graph, op: Op, storage: _Storage) -> bool:
    x = _is_noop(op)
    if x is None:
        return False
    replace_op_kind(op, "identity", (x,))
    return True


def _transpose_to_reshape(graph: popxl.Graph, op: Op, storage: _Storage) -> bool:
    if op.opdef.key != "transpose":
        return False
    perm, shape = op.attrs["permutation"], op.inputs[0].shape
    moved = [axis for axis in perm if shape[axis] != 1]
    if moved != sorted(moved) or tuple(perm) == tuple(range(len(perm))):
        return False
    replace_op_kind(op, "reshape", op.inputs, shape=op.outputs[0].shape)
    return True


def _negative_one_scale(graph: popxl.Graph, op: Op, storage: _Storage) -> bool:
    x = _scaled_input(op, -1.0)
    if x is None:
        return False
    replace_op_kind(op, "negate", (x,))
    return True


def _remove_identity(graph: popxl.Graph, op: Op, storage: _Storage) -> bool:
    if op.opdef.key != "identity":
        return False
    (x,), (y,) = op.inputs, op.outputs
    if y in graph._outputs:
        return False
    if storage.is_written(x) or storage.is_written(y):
        return False  # the copy is observable: one side changes later
    replace_uses(graph, y, x)
    remove_op(graph, op)
    return True


# Minimal patterns: gradient ops as forward ops ----------------------------------------------


def _input_grad(key: str, k: int, g: popxl.Tensor, values: tuple[Any, ...]) -> popxl.Tensor:
    """The gradient w.r.t. input ``k`` of forward op ``key``, from the cotangent ``g`` and
    the forward input values (before unbroadcasting)."""
    if key == "matmul":
        x, w = values
        if k == 0:
            return ops.matmul(g, ops.transpose(w))  # (..., m, n) @ (n, k)
        rows = int(np.prod(x.shape[:-1]))
        x2 = ops.reshape(x, (rows, x.shape[-1]))
        return ops.matmul(ops.transpose(x2), ops.reshape(g, (rows, g.shape[-1])))
    if key == "mul":
        return g * values[1 - k]
    if key == "negate" or (key == "sub" and k == 1):
        return ops.negate(g)
    return g  # add, and sub's first input


def _supported_forward(fwd: Op) -> bool:
    """Shapes the rewrites handle: any for elementwise ops; for matmul an ``(..., m, k)``
    lhs, a 2-D rhs and no output-type change."""
    if fwd.opdef.key != "matmul":
        return True
    x, w = fwd.inputs
    return x.rank >= 2 and w.rank == 2 and fwd.outputs[0].dtype == x.dtype == w.dtype


def _rewritable_grad(op: Op, names: tuple[str, ...]) -> bool:
    """A gradient op of one of ``names`` whose forward inputs are distinct, own their
    storage and whose single output has a cotangent."""
    recipe = op.attrs.get("recipe")
    if recipe is None or not op.opdef.type.endswith("Grad"):
        return False
    fwd = recipe.op
    if fwd.opdef.key not in names or fwd.opdef.modifies or len(fwd.outputs) != 1:
        return False
    simple = recipe.roots == fwd.inputs and recipe.present == (True,)
    return simple and _supported_forward(fwd)


def _grad_to_forward_ops(graph: popxl.Graph, op: Op, names: tuple[str, ...]) -> bool:
    if not _rewritable_grad(op, names):
        return False
    recipe = op.attrs["recipe"]
    # The forward values the gradient op takes; None where the gradients asked for do not
    # read them (a product's operand whose own gradient is all that is wanted).
    taken = iter(op.inputs[:-1])
    values = tuple(next(taken) if need else None for need in recipe.needed)
    g = op.inputs[-1]
    key = recipe.op.opdef.key
    with insert_before(op):
        new = []
        for old, k in zip(op.outputs, recipe.grad_for):
            t = _unbroadcast(_input_grad(key, k, g, values), recipe.roots[k].shape)
            # A graph output keeps a tensor of its own rather than becoming the cotangent.
            new.append(ops.identity(t) if t is g and old in graph._outputs else t)
    for old, t in zip(op.outputs, new):
        replace_uses(graph, old, t)
    remove_op(graph, op)
    return True


def _grad_pattern(*names: str) -> Callable[[popxl.Graph, Op, _Storage], bool]:
    return lambda graph, op, _: _grad_to_forward_ops(graph, op, names)


PATTERNS: tuple[Pattern, ...] = (
    Pattern("MulArgGradOp", 1, _grad_pattern("mul")),
    Pattern("SubtractArg1GradOp", 1, _grad_pattern("sub")),
    Pattern("AddArgGradOp", 1, _grad_pattern("add")),
    Pattern("NegGradOp", 1, _grad_pattern("negate")),
    Pattern("MatMulGradOp", 1, _grad_pattern("matmul")),
    Pattern("OpToIdentity", 2, _op_to_identity),
    Pattern("TransposeToIdentityOrReshape", 2, _transpose_to_reshape),
    Pattern("NegativeOneScale", 2, _negative_one_scale),
    Pattern("PreUniRepl", 2, _remove_identity),
)


def _sweep(graph: popxl.Graph, patterns: list[Pattern], counts: dict[str, int]) -> bool:
    changed = False
    storage = _Storage(graph)
    for op in list(graph._ops):
        if op not in graph._ops:
            continue
        for pattern in patterns:
            if pattern.apply(graph, op, storage):
                counts[pattern.name] += 1
                changed = True
                break
    return changed


def apply_pre_alias_patterns(ir: popxl.Ir, level: Level = "default") -> dict[str, int]:
    """Rewrite every graph of ``ir`` with the pre-alias patterns of ``level``, in place.

    The rewrites keep every tensor's value (see the table in the module docstring):

    * ``"no_patterns"``: nothing.
    * ``"minimal"``: the mandatory patterns (gradient ops of ``Add``/``Sub``/``Mul``/``Neg``
      and ``MatMul`` become forward ops).
    * ``"default"`` and ``"all"``: also no-op removal.

    Args:
        ir: every graph of it is rewritten.
        level: which patterns run.

    Returns:
        How many times each pattern applied, by PopART's pattern name (0 when it did not).

    Raises:
        ValueError: an unknown level.

    >>> import numpy as np, popxl
    >>> from popxl import ops
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     x = popxl.variable(np.ones((2, 3), np.float32))
    ...     y = ops.reshape(x, (2, 3)) * -1.0
    >>> counts = apply_pre_alias_patterns(ir)
    >>> counts["OpToIdentity"], counts["PreUniRepl"], counts["NegativeOneScale"]
    (1, 1, 1)
    >>> [op.type for op in ir.main_graph._ops]
    ['Neg']
    """
    if level not in LEVELS:
        raise ValueError(BAD_LEVEL_MSG.format(levels=list(LEVELS), level=level))
    enabled = [p for p in PATTERNS if p.level <= min(LEVELS[level], 2)]
    counts = dict.fromkeys((p.name for p in PATTERNS), 0)
    for graph in list(ir._graphs.values()):
        for _ in range(MAX_SWEEPS):
            if not _sweep(graph, enabled, counts):
                break
    return counts


__all__ = ["apply_pre_alias_patterns", "PATTERNS", "Pattern"]
