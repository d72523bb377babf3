"""Op definitions (the registry) and op records (the IR).

An ``OpDef`` is declared once per op kind and says everything the rest of the system needs:
the PopXL type name shown by ``print_schedule``, direct shape/dtype inference, the JAX
lowering, which inputs it writes in place, whether its output is a view of its inputs,
and how autodiff treats it. An ``Op`` is one use of an ``OpDef`` in a graph: plain data,
no JAX objects.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .errors import PopXLException
from .tensor_spec import TensorSpec

if TYPE_CHECKING:
    from types import FrameType

    from .graph import Graph
    from .tensor import Tensor

Infer = Callable[..., Sequence[TensorSpec]]

# Planning options kept in ``Op.hints`` (PopART's per-op options), and the op types that had
# them. Recorded for the IR's reader; the lowering never sees them (XLA plans memory itself).
AMP_HINT = "available_memory_proportion"
AMP_OP_TYPES = frozenset(
    {"MatMul", "Gather", "GroupedGather", "TiedGather", "Scatter", "ScatterReduce"}
)
CONV_AMP_HINT = "available_memory_proportions"  # convolutions: a list, via ConvOptions
CONV_OP_TYPES = frozenset({"Conv", "ConvTranspose"})
FC_PASS_HINT = "use_fully_connected_pass"
FC_PASS_OP_TYPES = frozenset({"MatMul"})
Lower = Callable[..., Any]


@dataclass(frozen=True, eq=False)
class OpDef:
    """The single definition of one op kind.

    Attributes:
        key: unique registry key (``"add"``, ``"add_"``...).
        type: PopXL type name printed in schedules (``"Add"``, ``"AddLhsInplace"``).
        infer: ``infer(*input_specs, **attrs) -> [TensorSpec, ...]`` for the outputs.
        lower: ``lower(*arrays, **attrs) -> array | tuple``: a pure JAX function. Its
            results are the op's outputs, possibly followed by extra results that
            ``modifies`` writes back into inputs. ``None`` for ops the runtime lowers
            itself (``special``).
        modifies: ``(input index, result index)`` pairs: after the op, the input's storage
            holds that result (in-place ops).
        alias_outputs: ``(output index, input index)`` pairs: the output is a handle on the
            input's storage instead of new storage.
        view_inverse: for view ops (``reshape_``, ``slice_``...): ``inv(input_arrays, new_out,
            **attrs) -> new input arrays``, so writes through the view reach its base.
        special: name of a runtime handler for ops that need more than a pure function
            (subgraph calls, host and remote IO).
        effect: the op has a side effect and must never be dropped.
        grad: ``"vjp"`` (gradient op = ``jax.vjp`` of ``lower``), ``"none"`` (no gradient,
            e.g. integer outputs or host IO), or the name of a structural rule in autodiff.
        nondiff_inputs: input indices that never receive a gradient (indices, seeds).
        grad_needs: ``"inputs"`` when the gradient needs the forward input values, ``"none"``
            when it only needs their shapes (linear ops), so autodiff keeps no activations,
            ``"others"`` when each input's gradient needs only the other inputs' values
            (products), so an input is kept only where another one's gradient is wanted.
        grad_from_output: for an op of one input and one output, its input's gradient as a
            JAX function of the output and the output's cotangent (``(y, dy, **attrs)``):
            relu, softmax. Autodiff then keeps the output rather than the input, as PopART's
            ``ReluGrad`` and ``SoftmaxGrad`` do: the output is often kept anyway (the next
            matmul's gradient reads it), and the input then need not be.
    """

    key: str
    type: str
    infer: Infer
    lower: Lower | None = None
    modifies: tuple[tuple[int, int], ...] = ()
    alias_outputs: tuple[tuple[int, int], ...] = ()
    view_inverse: Callable[..., tuple] | None = None
    special: str | None = None
    effect: bool = False
    grad: str = "vjp"
    nondiff_inputs: tuple[int, ...] = ()
    grad_needs: str = "inputs"
    grad_from_output: Callable[..., Any] | None = None
    doc: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        # An op without a gradient passes none wherever it is differentiated: also inside
        # a loop or call body that a gradient op differentiates as a whole with jax.vjp.
        if self.grad == "none" and self.lower is not None:
            object.__setattr__(self, "lower", _without_gradient(self.lower))

    @property
    def is_view(self) -> bool:
        return self.view_inverse is not None

    @property
    def is_inplace(self) -> bool:
        return bool(self.modifies)


def _without_gradient(lower: Lower) -> Lower:
    """``lower`` whose floating-point results stop gradients (identity when run)."""
    if getattr(lower, "stops_gradient", False):
        return lower

    def lowered(*arrays: Any, **attrs: Any) -> Any:
        import jax  # noqa: PLC0415 (lowering runs under JAX; building an IR does not)

        def stop(x: Any) -> Any:
            dtype = getattr(x, "dtype", None)
            inexact = dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.inexact)
            return jax.lax.stop_gradient(x) if inexact else x

        return jax.tree.map(stop, lower(*arrays, **attrs))

    functools.update_wrapper(lowered, lower)  # its module and name are the op's own
    lowered.stops_gradient = True  # type: ignore[attr-defined]
    return lowered


REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add an op kind to the registry (each key once)."""
    if opdef.key in REGISTRY:
        raise ValueError(f"op '{opdef.key}' is registered twice")
    REGISTRY[opdef.key] = opdef
    return opdef


def define(key: str, type: str, infer: Infer, lower: Lower | None = None, **kw: Any) -> OpDef:  # noqa: A002
    """Declare and register an op kind."""
    return register(OpDef(key, type, infer, lower, **kw))


def define_inplace(base: OpDef, key: str, type: str, input_index: int = 0) -> OpDef:  # noqa: A002
    """The in-place variant of ``base``: writes output 0 into input ``input_index``."""
    return register(
        replace(
            base,
            key=key,
            type=type,
            modifies=((input_index, 0),),
            alias_outputs=((0, input_index),),
        )
    )


def define_view(base: OpDef, key: str, type: str, inverse: Callable[..., tuple]) -> OpDef:  # noqa: A002
    """The aliasing (view) variant of ``base``: its output shares its inputs' storage."""
    return register(replace(base, key=key, type=type, view_inverse=inverse))


class Op:
    """One op in a graph: its kind, attributes, inputs, outputs and placement."""

    __slots__ = (
        "opdef",
        "attrs",
        "inputs",
        "outputs",
        "id",
        "graph",
        "ipu",
        "tile_set",
        "scope",
        "location",
        "modified_inputs",
        "execution_context",
        "hints",
    )

    def __init__(
        self,
        opdef: OpDef,
        attrs: Mapping[str, Any],
        inputs: tuple[Tensor, ...],
        graph: Graph,
        op_id: int,
        ipu: int | None,
        tile_set: str,
        scope: tuple[str, ...],
        location: tuple[str, int] | None,
        execution_context: str = "Normal",
    ) -> None:
        self.opdef = opdef
        self.attrs = dict(attrs)
        self.inputs = inputs
        self.outputs: tuple[Tensor, ...] = ()
        self.id = op_id
        self.graph = graph
        self.ipu = ipu
        self.tile_set = tile_set
        self.scope = scope
        self.location = location
        # Inputs that a call site writes back to the parent (by-ref subgraph inputs).
        self.modified_inputs: set[int] = set()
        self.execution_context = execution_context
        # IPU planning options set by transforms (``available_memory_proportion``,
        # ``use_fully_connected_pass``): recorded and printable, never passed to the lowering.
        self.hints: dict[str, Any] = {}

    @property
    def type(self) -> str:
        return self.opdef.type

    @property
    def called_graphs(self) -> tuple[Graph, ...]:
        graphs = self.attrs.get("graphs")
        return tuple(graphs) if graphs else ()

    @property
    def referenced_graphs(self) -> tuple[Graph, ...]:
        """Graphs this op runs: called graphs, and those of a differentiated forward op."""
        recipe = self.attrs.get("recipe")
        inner = recipe.op.referenced_graphs if recipe is not None else ()
        return self.called_graphs + tuple(inner)

    def modified_input_indices(self) -> set[int]:
        """Inputs whose storage this op writes (in-place ops and by-ref call inputs)."""
        return {i for i, _ in self.opdef.modifies} | self.modified_inputs

    def __repr__(self) -> str:
        return f"{self.type}.{self.id}"


def user_location() -> tuple[str, int] | None:
    """File and line of the first stack frame outside this package."""
    frame: FrameType | None = sys._getframe(1)
    package_dir = __file__.rsplit("/", 1)[0]
    while frame is not None and frame.f_code.co_filename.startswith(package_dir):
        frame = frame.f_back
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno


def core_error(message: str) -> PopXLException:
    """An error the original raised from its C++ core."""
    return PopXLException(message)
