"""The ATen op table: one lowering record per ATen op, keyed by the op's overload.

A record turns one node of a captured (core ATen) graph into popxl ops. It is a small
function decorated with ``@lowering(aten.op.overload, ...)``::

    @lowering(aten.relu.default)
    def _lower_relu(ctx, x):
        return ops.relu(x)

It receives a ``NodeContext`` first, then the node's arguments with every graph value
replaced by its popxl tensor (lists of values by lists of tensors); Python scalars, dtypes
and shapes arrive as torch gave them. It returns a tensor, or a tuple for ops with several
outputs (``None`` for outputs nothing reads).

Where popxl has the op with torch's semantics the record calls it, so the program reads
like a hand-written popxl one (``MatMul``, ``Add``, ``Relu``). Where it has not, the record
calls ``ctx.jax(name, fn, ...)``: an op recorded in the IR under the ATen name
(``aten::erf``) with the shapes torch inferred, lowered by the small JAX function ``fn``.
Either way every ATen node is a named op with shapes in the printed program, and autodiff
differentiates it through ``jax.vjp`` of its lowering.

Dtypes: PopTorch ran 64-bit models in 32 bits (int64 -> int32, float64 -> float32); so does
every record (``popxl_dtype``).
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

import popxl
from popxl import ops
from popxl._op import OpDef, define
from popxl.errors import InternalError
from popxl.ops._base import record

from .fx import node_arg

if TYPE_CHECKING:
    from torch.fx import Node

Lowering = Callable[..., Any]

TABLE: dict[Any, Lowering] = {}
# Ops the capture keeps whole (not decomposed by ``run_decompositions``): their records
# lower them directly, e.g. to keep a loss or a fused op one op in the program.
PRESERVED: set[Any] = set()

# Ops of other libraries (``transformers::grouped_mm_fallback``), by qualified name: they
# exist only once their library is imported, which ``import poptorch`` never does.
BY_NAME: dict[str, Lowering] = {}

TWICE_MSG = "ATen op {op} has two lowering records ({a} and {b}); keep one."

# torch dtype -> popxl dtype, 64-bit types narrowed as PopTorch did.
_DTYPES: dict[torch.dtype, popxl.dtype] = {
    torch.float32: popxl.float32,
    torch.float64: popxl.float32,
    torch.float16: popxl.float16,
    torch.int64: popxl.int32,
    torch.int32: popxl.int32,
    torch.int16: popxl.int16,
    torch.int8: popxl.int8,
    torch.uint8: popxl.uint8,
    torch.bool: popxl.bool,
}
UNSUPPORTED_DTYPE_MSG = (
    "{what} has dtype {dtype}, which PopTorch does not support on the IPU. Supported: "
    "float32, float16, int32, int16, int8, uint8, bool (float64 and int64 run as float32 "
    "and int32). Cast it (e.g. .float()) in the model."
)


class Promote(enum.Enum):
    """How a record's operands are cast before it runs (torch's type promotion), declared
    on the record: ``@lowering(aten.atan2.default, promote=Promote.INT_TO_FLOAT)``."""

    # Tensors and scalars among the operands to torch's result dtype of them all.
    DEFAULT = "default"
    # As DEFAULT, except that an op whose output is a float (``sqrt``, ``atan2`` of ints)
    # computes in that float dtype.
    INT_TO_FLOAT = "int_to_float"


def lowering(
    *targets: Any,
    preserve: bool = False,
    promote: Promote | None = None,
    operands: Sequence[int] = (0, 1),
    overloads: Sequence[str] | None = None,
) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of each ATen op in ``targets``.

    A target is an overload (``aten.add.Tensor``) or an overload packet (``aten.remainder``):
    a packet stands for each of its ``overloads`` it has (every overload when None).
    With ``preserve=True`` the capture does not decompose these ops (``run_decompositions``
    would otherwise rewrite them into core ATen ops before the table sees them). With
    ``promote``, the arguments at ``operands`` (those given) arrive as tensors of the dtype
    the policy names.
    """
    found = [o for t in targets for o in _overloads_of(t, overloads)]

    def register(fn: Lowering) -> Lowering:
        record = fn if promote is None else _promoting(fn, promote, tuple(operands))
        for target in found:
            if preserve:
                PRESERVED.add(target)
            if target in TABLE:
                raise ValueError(
                    TWICE_MSG.format(op=target, a=TABLE[target].__name__, b=fn.__name__)
                )
            TABLE[target] = record
        return fn

    return register


def lowering_by_name(name: str) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of the op ``name``
    (``"library::op"``, every overload) of a library poptorch does not import."""

    def register(fn: Lowering) -> Lowering:
        if name in BY_NAME:
            raise ValueError(TWICE_MSG.format(op=name, a=BY_NAME[name].__name__, b=fn.__name__))
        BY_NAME[name] = fn
        return fn

    return register


def lowering_of(target: Any) -> Lowering | None:
    """The record of the op ``target`` (an ATen overload, or another library's op), or None."""
    found = TABLE.get(target)
    if found is None and isinstance(target, torch._ops.OpOverload):
        found = BY_NAME.get(target._schema.name)
    return found


def _overloads_of(target: Any, names: Sequence[str] | None) -> list[Any]:
    if not isinstance(target, torch._ops.OpOverloadPacket):
        return [target]
    available = target.overloads()
    chosen = [n for n in (available if names is None else names) if n in available]
    if not chosen:
        raise ValueError(f"{target} has none of the overloads {list(names or [])}.")
    return [getattr(target, n) for n in chosen]


def promotion_dtype(ctx: NodeContext, promote: Promote, operands: Sequence[int]) -> popxl.dtype:
    """The dtype ``promote`` casts the node's ``operands`` to."""
    out_dtype = ctx.out_dtype
    if promote is Promote.INT_TO_FLOAT and out_dtype.is_floating_point:
        return out_dtype
    given = [i for i in operands if i < len(ctx.node.args) and ctx.node.args[i] is not None]
    return promoted_dtype(ctx.node, *given)


def _promoting(fn: Lowering, promote: Promote, operands: tuple[int, ...]) -> Lowering:
    @functools.wraps(fn)
    def lower(ctx: NodeContext, *args: Any, **kwargs: Any) -> Any:
        dtype = promotion_dtype(ctx, promote, operands)
        cast = [
            ctx.tensor(a, dtype) if i in operands and a is not None else a
            for i, a in enumerate(args)
        ]
        return fn(ctx, *cast, **kwargs)

    return lower


def popxl_dtype(dtype: torch.dtype, what: str = "A tensor") -> popxl.dtype:
    """The popxl dtype a torch dtype runs as (64-bit types narrowed)."""
    if dtype not in _DTYPES:
        raise TypeError(UNSUPPORTED_DTYPE_MSG.format(what=what, dtype=dtype))
    return _DTYPES[dtype]


def torch_dtype(dtype: popxl.dtype) -> torch.dtype:
    """The torch dtype of a popxl dtype (the 32-bit one for narrowed types)."""
    for t, p in _DTYPES.items():
        if p is dtype and t not in (torch.float64, torch.int64):
            return t
    raise TypeError(f"popxl dtype {dtype} has no torch counterpart here.")


# JAX-lowered ops ---------------------------------------------------------------------------

_JAX_OPS: dict[tuple[str, tuple[int, ...]], OpDef] = {}


def _infer_from_attrs(*_specs: Any, _out: tuple, **_attrs: Any) -> list[popxl.TensorSpec]:
    return [popxl.TensorSpec(shape, popxl.dtypes.dtype.from_name(d)) for shape, d in _out]


def jax_opdef(
    name: str,
    fn: Callable[..., Any],
    nondiff: Sequence[int] = (),
    grad_from_output: Callable[..., Any] | None = None,
) -> OpDef:
    """The op kind ``aten::<name>`` (or ``name`` itself when it has a ``::`` namespace)
    lowered by ``fn(*arrays, **attrs)``; one per name and set of non-differentiable inputs
    (the printed type is the name either way). ``grad_from_output``: see ``OpDef``."""
    cache_key = (name, tuple(nondiff))
    if cache_key in _JAX_OPS:
        return _JAX_OPS[cache_key]

    def lower(*arrays: Any, _out: tuple, **attrs: Any) -> Any:
        return fn(*arrays, **attrs)

    type_name = name if "::" in name else f"aten::{name}"
    key = type_name if not nondiff else f"{type_name}#nondiff{','.join(map(str, nondiff))}"
    opdef = define(
        key,
        type_name,
        _infer_from_attrs,
        lower,
        grad="vjp",
        nondiff_inputs=tuple(nondiff),
        grad_from_output=grad_from_output,
        doc=fn.__doc__ or "",
    )
    _JAX_OPS[cache_key] = opdef
    return opdef


# The per-node context ------------------------------------------------------------------------


def _meta_specs(val: Any) -> list[tuple[tuple[int, ...], str] | None]:
    """(shape, popxl dtype name) of each output a node's ``meta['val']`` describes."""
    if isinstance(val, torch.Tensor):
        return [(tuple(int(d) for d in val.shape), popxl_dtype(val.dtype).name)]
    if isinstance(val, (tuple, list)):
        out: list[tuple[tuple[int, ...], str] | None] = []
        for v in val:
            out.extend(_meta_specs(v) if isinstance(v, torch.Tensor) else [None])
        return out
    return []


class Translator(Protocol):
    """What a record may ask of the capture translating its node (``poptorch.capture``)."""

    training: bool
    options: Any
    # The losses marked so far (``poptorch.identity_loss``), the last one being the model's.
    losses: list[popxl.Tensor]
    # The overlapped IO marks the capture accepted (``poptorch.set_overlap_for_*``).
    overlap_marks: set[Node]

    def next_seed(self) -> popxl.Tensor: ...

    def describe(self, node: Node) -> str:
        """``module path (Class), file:line`` of the user's code that made ``node``."""
        ...


@dataclass
class NodeContext:
    """What a lowering record may ask about the node it lowers."""

    node: Node
    translator: Translator

    # -- the node's outputs, as torch inferred them ---------------------------------------

    @property
    def out_val(self) -> Any:
        return self.node.meta.get("val")

    def out_spec(self, i: int = 0) -> tuple[tuple[int, ...], popxl.dtype]:
        specs = _meta_specs(self.out_val)
        s = specs[i]
        if s is None:
            raise InternalError(f"output {i} of {self.node.target} is not a tensor")
        return s[0], popxl.dtypes.dtype.from_name(s[1])

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.out_spec(0)[0]

    @property
    def out_dtype(self) -> popxl.dtype:
        return self.out_spec(0)[1]

    def dtype_of(self, arg_index: int) -> popxl.dtype:
        """The (narrowed) dtype torch gave argument ``arg_index`` of the node."""
        arg = node_arg(self.node, arg_index)
        return popxl_dtype(arg.meta["val"].dtype)

    @property
    def training(self) -> bool:
        return self.translator.training

    @property
    def options(self) -> Any:
        """The model's ``poptorch.Options`` (None when the model is captured without any)."""
        return self.translator.options

    def output_used(self, i: int) -> bool:
        """Whether anything reads output ``i`` of a multi-output node (``node[i]``)."""
        return any(
            u.target is operator.getitem and u.args[1] == i and u.users for u in self.node.users
        )

    # -- building -------------------------------------------------------------------------

    def jax(
        self,
        name: str,
        fn: Callable[..., Any],
        *inputs: popxl.Tensor,
        nondiff: Sequence[int] = (),
        outputs: Sequence[tuple[tuple[int, ...], popxl.dtype]] | None = None,
        grad_from_output: Callable[..., Any] | None = None,
        **attrs: Any,
    ) -> Any:
        """Record ``aten::<name>`` lowered by ``fn(*arrays, **attrs)`` (its gradient from
        its output by ``grad_from_output(y, dy, **attrs)`` where given).

        The output specs are the node's (or ``outputs``); returns one tensor, or a tuple
        when there are several outputs.
        """
        if outputs is None:
            specs = [s for s in _meta_specs(self.out_val) if s is not None]
        else:
            specs = [(tuple(shape), dtype.name) for shape, dtype in outputs]
        opdef = jax_opdef(name, fn, nondiff, grad_from_output)
        named = {f"in{i}": t for i, t in enumerate(inputs)}
        outs = record(opdef, named, {**attrs, "_out": tuple(specs)})
        return outs[0] if len(outs) == 1 else tuple(outs)

    def constant(self, value: Any, dtype: popxl.dtype | None = None) -> popxl.Tensor:
        """A constant tensor in the current graph (default dtype: the node's output's)."""
        dtype = dtype or self.out_dtype
        return popxl.constant(np.asarray(value, dtype.as_numpy()), dtype)

    def tensor(self, value: Any, dtype: popxl.dtype | None = None) -> popxl.Tensor:
        """``value`` as a tensor of ``dtype`` (default: the node's output dtype): tensors are
        cast if needed, Python scalars become constants."""
        dtype = dtype or self.out_dtype
        if isinstance(value, popxl.Tensor):
            return value if value.dtype == dtype else ops.cast(value, dtype)
        return self.constant(value, dtype)

    def seed(self) -> popxl.Tensor:
        """A fresh random seed for one random op (see ``Options.randomSeed``)."""
        return self.translator.next_seed()

    # -- errors ---------------------------------------------------------------------------

    def where(self) -> str:
        """``module path (Class), file:line`` of the user's code that made this node."""
        return self.translator.describe(self.node)


def promoted_dtype(node: Node, *indices: int) -> popxl.dtype:
    """torch's result dtype of the node's arguments at ``indices`` (tensors and scalars),
    narrowed; what arithmetic and comparisons compute in."""
    values: list[Any] = []
    for i in indices:
        arg: Any = node.args[i] if i < len(node.args) else None
        values.append(arg.meta["val"] if hasattr(arg, "meta") else arg)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if len(values) == 1:
        return popxl_dtype(tensors[0].dtype)
    result = torch.result_type(values[0], values[1])
    for v in values[2:]:
        result = torch.promote_types(result, torch.result_type(v, v))
    return popxl_dtype(result)
