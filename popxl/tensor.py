"""Tensors: intermediates, variables and constants, and the functions that create them."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, Union

import numpy as np

from . import context
from . import dtypes as _dtypes
from ._popart_compat import PbTensor
from .errors import UndefinedValue
from .tensor_spec import TensorSpec
from .typing_ import NewAliasAnnotation
from .utils import to_numpy

if TYPE_CHECKING:
    from ._op import Op
    from .dtypes import dtype as DType
    from .graph import Graph
    from .ir import Ir
    from .remote_buffer import RemoteBuffer
    from .replica_grouping import ReplicaGrouping
    from .streams import Stream

# Runtime aliases (users annotate with them), so they use Union rather than "|".
ScalarType = Union[int, float, bool]  # noqa: UP007
HostTensor = Union[np.ndarray, Iterable[ScalarType]]  # noqa: UP007
HostScalarTensor = Union[ScalarType, HostTensor]  # noqa: UP007
TensorLike = Union["Tensor", HostScalarTensor]  # noqa: UP007

TensorByRef = NewAliasAnnotation("TensorByRef", "Tensor")

VARIABLE_OUTSIDE_MAIN_MSG = (
    "You cannot initialise a variable tensor within a graph. It can only be initialised "
    "within the main graph. Current graph: {graph!r}. Create the variable in "
    "`with ir.main_graph:` and pass it to the subgraph as an input."
)
EMPTY_VALUE_MSG = (
    "The value has 0 elements - this is most likely a mistake. If not, initialise the "
    "tensor explicitly with popxl.constant or popxl.variable. Value: {value!r}"
)
RETRIEVAL_MODES = ("one_per_group", "all_replicas")

_TensorT = TypeVar("_TensorT", bound="Tensor")


def _ops() -> Any:
    from . import ops  # noqa: PLC0415  (ops import tensor)

    return ops


class Tensor:
    """A tensor of a graph: an op output, a graph input, a variable or a constant.

    Tensors are created by ops and by ``popxl.variable`` / ``popxl.constant`` /
    ``popxl.graph_input``; they cannot be constructed directly. Operators follow PopXL:
    ``+ - * / % @ ** & | ~`` record ops, Python scalars become constants of this tensor's
    dtype, ``==`` compares identity, and indexing slices, gathers or masks.
    """

    _graph: Graph
    _id: str
    _spec: TensorSpec
    _producer: Op | None
    _consumers: list[Op]
    _stream: Stream | None

    def __init__(self) -> None:
        raise RuntimeError("popxl.Tensor cannot be constructed directly.")

    @classmethod
    def _create(
        cls: type[_TensorT],
        graph: Graph,
        tensor_id: str,
        spec: TensorSpec,
        producer: Op | None = None,
    ) -> _TensorT:
        self = object.__new__(cls)
        self._graph = graph
        self._id = tensor_id
        self._spec = spec
        self._producer = producer
        self._consumers = []
        self._stream = None
        graph._add_tensor(self)
        return self

    # Identity and naming -------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def _pb_tensor(self) -> PbTensor:
        """PopART's tensor handle as real PopXL code uses it (``info.shape()``)."""
        return PbTensor(self)

    @property
    def name(self) -> str:
        gid = self._graph.id
        return self._id[len(gid) + 1 :] if gid else self._id

    @property
    def scope(self) -> str:
        return self._graph.id

    @property
    def ir(self) -> Ir:
        return self._graph.ir

    @property
    def graph(self) -> Graph:
        return self._graph

    # Type and shape ------------------------------------------------------------------

    @property
    def dtype(self) -> DType:
        return self._spec.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._spec.shape

    @property
    def meta_shape(self) -> tuple[int, ...]:
        return self._spec.meta_shape

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.shape, self.dtype, self.meta_shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def nelms(self) -> int:
        return math.prod(self.shape)

    def strides(self, shape: Iterable[int] | None = None) -> tuple[int, ...]:
        """Byte strides of a C-contiguous array of this dtype (and ``shape``)."""
        dims = tuple(self.shape if shape is None else shape)
        return np.empty(dims, dtype=self.dtype.as_numpy()).strides if dims else ()

    @property
    def location_info(self) -> dict[str, Any]:
        return {"remote_buffer": getattr(self, "_remote_buffer", None)}

    # Placement -----------------------------------------------------------------------

    @property
    def ipu(self) -> int:
        """The virtual IPU this tensor lives on, inferred from its producer or consumers."""
        return self._placement("ipu")

    @property
    def tile_set(self) -> str:
        """``"compute"`` or ``"io"``, inferred like ``ipu``."""
        return self._placement("tile_set")

    def _placement(self, what: str) -> Any:
        op = self._producer
        if op is not None:
            # An ipu_copy output lives on its destination; other outputs (io_tile_copy's
            # included) live where their op runs.
            value = op.attrs.get("destination") if what == "ipu" else None
            value = value if value is not None else getattr(op, what)
            if value is not None:
                return value
        if self in self._graph._inputs:
            index = self._graph._inputs.index(self)
            for site in self._graph.ir._call_sites_of(self._graph):
                offset = site.attrs["input_offsets"][site.attrs["graphs"].index(self._graph)]
                return site.inputs[offset + index]._placement(what)
        for consumer in self._consumers:
            value = _input_placement(consumer, what)
            if value is not None:
                return value
        raise UndefinedValue(
            f"The {what} of tensor {self.id} cannot be inferred: it has no producer, call "
            "site or consumer that is placed. Use it in an op first."
        )

    @property
    def in_sync_with_ipu(self) -> bool:
        """Whether the host copy of this variable matches the device (always True for others)."""
        if not isinstance(self, Variable):
            return True
        session = self.ir._session()
        return session is None or not session._host_stale

    # Methods ---------------------------------------------------------------------------

    @property
    def T(self) -> Tensor:
        return _ops().transpose(self)

    @property
    def T_(self) -> Tensor:
        return _ops().transpose_(self)

    def transpose(self, permutation: Iterable[int] | None = None) -> Tensor:
        return _ops().transpose(self, permutation)

    def transpose_(self, permutation: Iterable[int] | None = None) -> Tensor:
        return _ops().transpose_(self, permutation)

    def reshape(self, shape: Iterable[int]) -> Tensor:
        return _ops().reshape(self, shape)

    def reshape_(self, shape: Iterable[int]) -> Tensor:
        return _ops().reshape_(self, shape)

    def flatten(self) -> Tensor:
        return _ops().flatten(self)

    def flatten_(self) -> Tensor:
        return _ops().flatten_(self)

    def squeeze(self, axes: Iterable[int] | None = None) -> Tensor:
        return _ops().squeeze(self, axes)

    def detach(self) -> Tensor:
        return _ops().detach(self)

    def detach_(self) -> Tensor:
        return _ops().detach_(self)

    def copy_to_ipu(self, destination: int, source: int | None = None) -> Tensor:
        return _ops().ipu_copy(self, destination, source)

    def diag(self) -> Tensor:
        """The main diagonal of a 2-D tensor.

        Unlike the original (``flatten()[::cols+1]``), this is right for non-square
        matrices too: it equals ``np.diag``.
        """
        if self.rank != 2:
            raise ValueError("Diag expected a 2d tensor.")
        rows, cols = self.shape
        n = min(rows, cols)
        return self.flatten()[0 : (n - 1) * (cols + 1) + 1 : cols + 1]

    def _ensure_tensor(
        self, value: TensorLike, dtype: DType | None = None, raise_on_empty: bool = True
    ) -> Tensor:
        """``value`` if it is a Tensor, else a constant of ``dtype`` (default: this dtype)."""
        if isinstance(value, Tensor):
            return value
        if value is None:
            # NumPy would turn None into NaN for float dtypes; that is never what was meant.
            raise TypeError(f"None cannot be used as a value for tensor {self.id}.")
        c = constant(value, dtype or self.dtype)
        if raise_on_empty and c.nelms == 0:
            raise ValueError(EMPTY_VALUE_MSG.format(value=value))
        return c

    # Operators -------------------------------------------------------------------------

    def __add__(self, other: TensorLike) -> Tensor:
        return _ops().add(self, self._ensure_tensor(other))

    def __radd__(self, other: TensorLike) -> Tensor:
        return _ops().add(self._ensure_tensor(other), self)

    def __iadd__(self, other: TensorLike) -> Tensor:
        _ops().add_(self, self._ensure_tensor(other))
        return self

    def __sub__(self, other: TensorLike) -> Tensor:
        return _ops().sub(self, self._ensure_tensor(other))

    def __rsub__(self, other: TensorLike) -> Tensor:
        return _ops().sub(self._ensure_tensor(other), self)

    def __mul__(self, other: TensorLike) -> Tensor:
        return _ops().mul(self, self._ensure_tensor(other))

    def __rmul__(self, other: TensorLike) -> Tensor:
        return _ops().mul(self._ensure_tensor(other), self)

    def __truediv__(self, other: TensorLike) -> Tensor:
        return _ops().div(self, self._ensure_tensor(other))

    def __rtruediv__(self, other: TensorLike) -> Tensor:
        return _ops().div(self._ensure_tensor(other), self)

    def __mod__(self, other: TensorLike) -> Tensor:
        return _ops().fmod(self, self._ensure_tensor(other))

    def __rmod__(self, other: TensorLike) -> Tensor:
        return _ops().fmod(self._ensure_tensor(other), self)

    def __pow__(self, other: TensorLike) -> Tensor:
        return _ops().pow(self, other)

    def __rpow__(self, other: HostScalarTensor) -> Tensor:
        return _ops().pow(constant(other), self)

    def __neg__(self) -> Tensor:
        return _ops().negate(self)

    def __matmul__(self, other: TensorLike) -> Tensor:
        return _ops().matmul(self, self._ensure_tensor(other))

    def __rmatmul__(self, other: TensorLike) -> Tensor:
        return _ops().matmul(self._ensure_tensor(other), self)

    def __and__(self, other: TensorLike) -> Tensor:
        return _ops().logical_and(self, self._ensure_tensor(other))

    def __rand__(self, other: TensorLike) -> Tensor:
        return _ops().logical_and(self._ensure_tensor(other), self)

    def __or__(self, other: TensorLike) -> Tensor:
        return _ops().logical_or(self, self._ensure_tensor(other))

    def __ror__(self, other: TensorLike) -> Tensor:
        return _ops().logical_or(self._ensure_tensor(other), self)

    def __invert__(self) -> Tensor:
        return _ops().logical_not(self)

    def __getitem__(self, key: Any) -> Tensor:
        from ._indexing import getitem  # noqa: PLC0415

        return getitem(self, key)

    def __len__(self) -> int:
        if not self.shape:
            raise ValueError("Tensor is a scalar and doesn't have a length.")
        return self.shape[0]

    __iter__ = None
    __contains__ = None
    __array_ufunc__ = None

    def __repr__(self) -> str:
        return f"Tensor[{self._id} {self.dtype!r} {self.shape}]"


def _input_placement(consumer: Op, what: str) -> Any:
    """Where ``consumer`` expects its inputs: an ipu_copy reads on its source IPU, an
    io_tile_copy on the tile set opposite to its own."""
    if what == "ipu" and consumer.attrs.get("source") is not None:
        return consumer.attrs["source"]
    if what == "tile_set" and consumer.opdef.key == "io_tile_copy":
        return "io" if consumer.tile_set == "compute" else "compute"
    return getattr(consumer, what)


class Variable(Tensor):
    """A persistent tensor of the main graph whose value the session keeps across runs."""

    _host_data: np.ndarray
    _replica_grouping: ReplicaGrouping
    _retrieval_mode: str
    _remote_buffer: RemoteBuffer | None = None
    _remote_offset: int = 0
    _replica_sharded: bool = False
    _shard_over: int  # set by remote_replica_sharded_variable

    @property
    def replica_grouping(self) -> ReplicaGrouping:
        return self._replica_grouping

    @property
    def retrieval_mode(self) -> str:
        return self._retrieval_mode

    @property
    def shape_on_host(self) -> tuple[int, ...]:
        """Host layout of the data: ``(num_groups, *shape)`` when grouped, else ``shape``."""
        full = self.meta_shape if self._replica_sharded and self.meta_shape else self.shape
        groups = self._replica_grouping.num_groups
        return (groups, *full) if groups > 1 else full

    @property
    def _memmap_arr(self) -> np.memmap | None:
        """The ``np.memmap`` holding the host value when the variable was made from one
        (``VariableFactory.create_tensor(memmap_dir=...)``), else ``None``: PopXL's name."""
        return self._host_data if isinstance(self._host_data, np.memmap) else None

    @property
    def shape_on_replica(self) -> tuple[int, ...]:
        return self.shape

    def copy_to_ipu(self, dst: int, src: int) -> Tensor:  # type: ignore[override]
        return _ops().ipu_copy(self, dst, src)


class Constant(Tensor):
    """A tensor whose value is fixed when the program is built."""

    _data: np.ndarray

    @property
    def data(self) -> np.ndarray:
        return self._data

    def copy_to_ipu(self, dst: int, src: int) -> Tensor:  # type: ignore[override]
        return _ops().ipu_copy(self, dst, src)


# Creation functions ------------------------------------------------------------------


def _host_array(data: Any, dtype: DType | None, downcast: bool, **fp8: Any) -> np.ndarray:
    # Float8 host data (as made by ``host_pow2scale_cast_to_fp8``) names its format, so
    # with no ``dtype`` the tensor takes that format, as in PopXL.
    copy = not isinstance(data, np.memmap)
    return to_numpy(data, dtype, downcast, copy=copy, **fp8)


def _fp8_kwargs(log2_scale: int | None, nan_on_overflow: bool | None) -> dict[str, Any]:
    return {"log2_scale": log2_scale, "nan_on_overflow": nan_on_overflow}


def variable(
    data: HostScalarTensor,
    dtype: DType | None = None,
    name: str | None = None,
    downcast: bool = True,
    replica_grouping: ReplicaGrouping | None = None,
    retrieval_mode: str | None = None,
    log2_scale: int | None = None,
    nan_on_overflow: bool | None = None,
    *,
    grouping: ReplicaGrouping | None = None,
) -> Variable:
    """Create a variable in the main graph, initialised with ``data``.

    Args:
        data: initial value. With a ``replica_grouping`` of G > 1 groups the leading axis
            holds one value per group: ``(G, *shape)``.
        dtype: element type; inferred from ``data`` when None (64-bit types downcast).
        name: tensor name (default ``"t"``), de-duplicated with ``__t<k>``.
        downcast: turn 64-bit host data into 32-bit when ``dtype`` is None.
        replica_grouping: which replicas share a value (default: all replicas one group).
        retrieval_mode: ``"one_per_group"`` (default) or ``"all_replicas"``.
        log2_scale, nan_on_overflow: float8 host conversion options.
        grouping: another name for ``replica_grouping``, the one the PopXL user guide's
            distributed example passes (keyword only; give one of the two).

    Raises:
        ValueError: outside the main graph, a bad retrieval mode, group data of the wrong
            leading size, or both ``grouping`` and ``replica_grouping``.
    """
    if grouping is not None:
        if replica_grouping is not None:
            raise ValueError(
                "Pass the replica grouping once: `replica_grouping=` or its other name "
                "`grouping=`, not both."
            )
        replica_grouping = grouping
    graph = context.get_current_graph()
    if graph is not graph.ir.main_graph:
        raise ValueError(VARIABLE_OUTSIDE_MAIN_MSG.format(graph=graph))
    arr = _host_array(data, dtype, downcast, **_fp8_kwargs(log2_scale, nan_on_overflow))
    return _variable_of(arr, dtype, name, replica_grouping, retrieval_mode)


def _variable_of(
    arr: np.ndarray,
    dtype: DType | None,
    name: str | None,
    replica_grouping: ReplicaGrouping | None,
    retrieval_mode: str | None = None,
) -> Variable:
    """A main-graph variable holding ``arr`` itself as its initial host value."""
    graph = context.get_current_graph()
    if graph is not graph.ir.main_graph:
        raise ValueError(VARIABLE_OUTSIDE_MAIN_MSG.format(graph=graph))
    grouping, mode = _grouping_and_mode(graph.ir, replica_grouping, retrieval_mode)
    shape = _per_group_shape(arr, grouping, name)
    dt = dtype or _dtypes.dtype.as_dtype(arr.dtype)
    var = Variable._create(graph, graph._create_tensor_id(name), TensorSpec(shape, dt))
    _init_variable(var, arr, grouping, mode)
    return var


def variable_sharing_memory(
    data: np.ndarray,
    dtype: DType,
    name: str | None = None,
    replica_grouping: ReplicaGrouping | None = None,
) -> Variable:
    """``variable``, but the initial host value is a read-only view of ``data`` (of exactly
    ``dtype``) rather than a copy: for a caller that owns host data holding the model's
    current value anyway (PopTorch's torch parameters), which would otherwise be held twice.
    The program reads it when a session first writes the weights to the device; later
    changes to ``data`` show in the Ir's initial value.

    Raises:
        TypeError: ``data`` is not a NumPy array of ``dtype``.
    """
    if not isinstance(data, np.ndarray) or data.dtype != dtype.as_numpy():
        raise TypeError(
            f"variable_sharing_memory needs a NumPy array of {dtype}, got "
            f"{type(data).__name__} of {getattr(data, 'dtype', None)}; use popxl.variable."
        )
    view = data.view()
    view.flags.writeable = False
    return _variable_of(view, dtype, name, replica_grouping)


def _grouping_and_mode(
    ir: Ir, grouping: ReplicaGrouping | None, mode: str | None
) -> tuple[ReplicaGrouping, str]:
    mode = "one_per_group" if mode is None else mode
    if mode not in RETRIEVAL_MODES:
        raise ValueError(f"retrieval_mode must be one of {RETRIEVAL_MODES}, got {mode!r}.")
    return (grouping or ir.replica_grouping()), mode


def _per_group_shape(
    arr: np.ndarray, grouping: ReplicaGrouping, name: str | None
) -> tuple[int, ...]:
    groups = grouping.num_groups
    if groups == 1:
        return arr.shape
    if arr.ndim == 0 or arr.shape[0] != groups:
        raise ValueError(
            f"Variable '{name or 't'}' uses {grouping} with {groups} groups, so its data needs "
            f"a leading axis of size {groups} (one value per group); got shape {arr.shape}."
        )
    return arr.shape[1:]


MEMMAP_NON_CONST_MSG = (
    "In creation of variable {name}, you have passed np.memmap data and a non-const replica "
    "grouping, which requires us to make a copy of your np.memmap data. Your variable will "
    "be treated as NOT an np.memmap: weights_to_host will not write to the file. Use a "
    "grouping with a constant stride (ir.replica_grouping(stride, group_size)) to keep it "
    "memory-mapped."
)


def _init_variable(var: Variable, arr: np.ndarray, grouping: ReplicaGrouping, mode: str) -> None:
    if isinstance(arr, np.memmap) and not grouping.is_const:
        # PopXL logged this through PopART's logger, on stderr.
        sys.stderr.write(f"Warning: {MEMMAP_NON_CONST_MSG.format(name=var.id)}\n")
        arr = np.array(arr)
    var._host_data = arr
    var._replica_grouping = grouping
    var._retrieval_mode = mode
    var.ir._variables.append(var)


def constant(
    data: HostScalarTensor,
    dtype: DType | None = None,
    name: str | None = None,
    downcast: bool = True,
    log2_scale: int | None = None,
    nan_on_overflow: bool | None = None,
) -> Constant:
    """Create a constant in the current graph.

    Python ints become int32, floats float32 (unless ``dtype`` is given); 64-bit NumPy data
    is downcast to 32-bit unless ``downcast=False``.
    """
    graph = context.get_current_graph()
    arr = _host_array(data, dtype, downcast, **_fp8_kwargs(log2_scale, nan_on_overflow))
    dt = dtype or _dtypes.dtype.as_dtype(arr.dtype)
    const = Constant._create(graph, graph._create_tensor_id(name), TensorSpec(arr.shape, dt))
    arr.flags.writeable = False
    const._data = arr
    return const


def graph_input(
    shape: Iterable[int],
    dtype: DType,
    name: str | None = None,
    by_ref: bool = False,
    meta_shape: Iterable[int] | None = None,
) -> Tensor:
    """Add an input to the current graph (after the existing ones).

    Args:
        shape, dtype, meta_shape: the input's spec.
        name: tensor name inside the graph.
        by_ref: pass the caller's tensor by reference, so in-place writes inside the graph
            reach it after the call.
    """
    graph = context.get_current_graph()
    spec = TensorSpec(tuple(shape), dtype, tuple(meta_shape or ()))
    t = Tensor._create(graph, graph._create_tensor_id(name), spec)
    graph._inputs.append(t)
    if by_ref:
        graph._by_ref_inputs.add(t)
    return t


def graph_output(t: Tensor) -> None:
    """Mark ``t`` (a tensor of the current graph) as the graph's next output."""
    graph = context.get_current_graph()
    if not isinstance(t, Tensor):
        raise TypeError(f"graph_output expects a popxl.Tensor, got {type(t).__name__}.")
    if t not in graph:
        raise ValueError(
            f"The tensor {t.id} is not in the current graph {graph.id!r}, so it cannot be "
            "an output of it. Only tensors created in the graph (or its inputs) can be outputs."
        )
    graph._outputs.append(t)


__all__ = [
    "Tensor",
    "Variable",
    "Constant",
    "TensorByRef",
    "TensorLike",
    "HostTensor",
    "HostScalarTensor",
    "ScalarType",
    "variable",
    "constant",
    "graph_input",
    "graph_output",
]
