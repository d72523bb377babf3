"""Recording ops: input checks, shape inference helpers and the lazy JAX handles lowerings use.

Every public op function validates its arguments and then calls ``record`` with its
registry entry. Lowerings refer to ``jnp`` / ``lax`` from here; those import JAX on first
use, so ``import popxl`` stays light.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import context
from .._op import Op, OpDef, core_error, user_location
from ..dtypes import dtype as DType
from ..tensor import Tensor
from ..tensor_spec import TensorSpec

if TYPE_CHECKING:
    from ..graph import Graph


class _LazyModule:
    """A module proxy that imports on first attribute access."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


jnp: Any = _LazyModule("jax.numpy")
lax: Any = _LazyModule("jax.lax")
jax: Any = _LazyModule("jax")


def chosen_precision() -> str | None:
    """The precision the user set with ``jax.default_matmul_precision`` (None: not set)."""
    return jax.config.jax_default_matmul_precision


def dot_precision(dtype: Any) -> Any:
    """The precision of a matmul or convolution on ``dtype`` operands.

    float32 operands multiply in IEEE float32, as on the IPU (GPUs would otherwise use
    TensorFloat-32, about three decimal digits), unless the user chose a precision with
    ``jax.default_matmul_precision``; then that choice applies (``None`` here).
    """
    if chosen_precision() is not None:
        return None
    if np.dtype(dtype) in (np.float32, np.float64):
        return lax.Precision.HIGHEST
    return None


NOT_A_TENSOR_MSG = (
    "The input `{name}` is not a Tensor. It has type {type}. Convert it first, e.g. with "
    "popxl.constant(value) inside the graph."
)
NOT_IN_GRAPH_MSG = (
    "The input tensor `{name}` is not in the current Graph {graph}. Tensor {tensor} belongs "
    "to graph {owner!r}; pass it to the subgraph as an input instead of capturing it."
)
DIFFERENT_IPUS_MSG = "The inputs `{a}` and `{b}` are located on different IPUs: {x} != {y}."
DIFFERENT_TILES_MSG = "The inputs `{a}` and `{b}` are located on different tile sets: {x} != {y}."


def check_in_graph(graph: Graph, **tensors: Any) -> None:
    """Raise unless every named value is a Tensor of ``graph``."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(NOT_A_TENSOR_MSG.format(name=name, type=type(t).__name__))
        if t._graph is not graph:
            raise ValueError(
                NOT_IN_GRAPH_MSG.format(
                    name=name, graph=graph.id or "main", tensor=t.id, owner=t._graph.id or "main"
                )
            )


def _known(t: Tensor, what: str) -> Any:
    try:
        return t._placement(what)
    except Exception:  # placement not inferable yet: nothing to compare
        return None


def check_tensor_ipu_and_tile_set(**tensors: Tensor) -> None:
    """Raise if two inputs are known to live on different IPUs or tile sets."""
    items = list(tensors.items())
    if len(items) < 2:
        return
    for what, msg in (("ipu", DIFFERENT_IPUS_MSG), ("tile_set", DIFFERENT_TILES_MSG)):
        first_name, first_value = None, None
        for name, t in items:
            if t._producer is None and not t._consumers:
                continue
            value = _known(t, what)
            if value is None:
                continue
            if first_value is None:
                first_name, first_value = name, value
            elif value != first_value:
                raise ValueError(msg.format(a=first_name, b=name, x=first_value, y=value))


def record(
    opdef: OpDef,
    inputs: Mapping[str, Tensor],
    attrs: Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
    *,
    check_placement: bool = True,
) -> list[Tensor]:
    """Check the inputs, infer the outputs and add one op to the current graph.

    Args:
        opdef: the registry entry.
        inputs: the op's inputs by parameter name (names appear in error messages).
        attrs: hashable attributes passed to inference and lowering.
        names: output tensor names (before scoping and de-duplication).

    Returns:
        The output tensors.
    """
    graph = context.get_current_graph()
    check_in_graph(graph, **inputs)
    if check_placement:
        check_tensor_ipu_and_tile_set(**inputs)
    attrs = dict(attrs or {})
    in_tensors = tuple(inputs.values())
    specs = opdef.infer(*(t._spec for t in in_tensors), **attrs)
    return list(add_op(graph, opdef, in_tensors, attrs, specs, names).outputs)


def add_op(
    graph: Graph,
    opdef: OpDef,
    inputs: tuple[Tensor, ...],
    attrs: dict[str, Any],
    specs: Sequence[TensorSpec],
    names: Sequence[str] | None,
) -> Op:
    """Append an op with already-inferred output specs (used by ``record`` and transforms)."""
    ctx = context.get_current_context()
    ir = graph.ir
    ipu = ctx.ipu_stack[-1] if ctx.ipu_stack else 0
    op = Op(
        opdef,
        attrs,
        inputs,
        graph,
        ir._next_op_id(),
        ipu,
        ctx.tile_set,
        tuple(ctx.name_scopes),
        user_location(),
        ctx.execution_context,
    )
    names = list(names or [])
    outputs = []
    for i, spec in enumerate(specs):
        name = names[i] if i < len(names) else f"{opdef.key}_out{i}"
        outputs.append(Tensor._create(graph, graph._create_tensor_id(name), spec, op))
    op.outputs = tuple(outputs)
    graph._ops.append(op)
    for t in inputs:
        t._consumers.append(op)
    for graph_called in op.called_graphs:
        ir._call_sites.setdefault(graph_called, []).append(op)
    for hook in list(graph._hooks.values()):
        hook(op)
    return op


# Shape and dtype helpers ------------------------------------------------------------------


def spec(shape: Iterable[int], dtype: DType, meta_shape: Iterable[int] = ()) -> TensorSpec:
    return TensorSpec(tuple(shape), dtype, tuple(meta_shape))


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting of shapes; raises ``PopXLException`` when they do not broadcast."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise core_error(
            f"np broadcasting failed on shapes {', '.join(map(str, shapes))}: they are not "
            "compatible. Reshape or slice the inputs so each dimension matches or is 1."
        ) from None


def same_dtype(op_name: str, *specs: TensorSpec) -> DType:
    """The common dtype of ``specs``; raises ``PopXLException`` if they differ.

    PopART checked binary ops this way and never promoted. Its two exceptions are made by the
    callers: ``mul`` of float16 by a float32 scalar (float16 result) and ``matmul`` of
    float16 with float32 (the left operand's dtype).
    """
    first = specs[0].dtype
    for other in specs[1:]:
        if other.dtype is not first:
            raise core_error(
                f"{op_name}: np broadcasting failed, incompatible types {first.name} and "
                f"{other.dtype.name}. PopXL does not promote dtypes; cast one input with "
                "ops.cast first."
            )
    return first


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in ``[0, rank)``; negative axes count from the end."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{what} {axis} is out of range for a tensor of rank {rank}.")
    return axis % rank if rank else 0


def normalize_axes(
    axes: int | np.integer | Iterable[int | np.integer] | None, rank: int
) -> tuple[int, ...]:
    """Sorted, non-negative axes; None means all axes."""
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, (int, np.integer)):
        axes = [int(axes)]
    out = sorted({normalize_axis(int(a), rank) for a in axes})
    return tuple(out)


def nelms(shape: Iterable[int]) -> int:
    return math.prod(shape)


def as_tensor(graph_tensor: Tensor, value: Any, dtype: DType | None = None) -> Tensor:
    """``value`` as a tensor in the current graph (constants take ``dtype``)."""
    return graph_tensor._ensure_tensor(value, dtype)
