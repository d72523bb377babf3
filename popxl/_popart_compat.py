"""The PopART internals that real PopXL code reaches into, thin, over this project's objects.

PopXL exposed its C++ IR as ``ir._pb_ir``, ``graph._pb_graph`` and ``tensor._pb_tensor``, and
published code calls a few methods on them (most often ``ir._pb_ir.getSessionOptions()``),
and a few private ``Session`` methods (``_full_input_shape`` here; ``_validate_run_inputs``
and ``_validate_run_outputs`` are the session's own checks, in ``runtime/session/session.py``).
Everything here forwards to the real implementation; nothing holds state of its own.

============================================  ==============================================
PopXL code                                    here
============================================  ==============================================
``ir._pb_ir.getSessionOptions()``             the Ir's ``SessionOptions``
``ir._pb_ir.logIr()``                         every graph's schedule to PopART's log (DEBUG)
``ir._pb_ir.getAllGraphs()``                  ``PbGraph`` views, main graph first
``graph._pb_graph.getOps()``                  ``PbOp`` views (``opType()``: PopXL type name)
``tensor._pb_tensor.info.shape()``            the tensor's shape, as a list
``tensor._pb_tensor.info.data_type_lcase()``  the PopXL dtype name (``"float32"``)
``session._full_input_shape(shape)``          ``[nht if > 1][replicas if > 1] + shape``
============================================  ==============================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._op import AMP_HINT, AMP_OP_TYPES, FC_PASS_HINT, FC_PASS_OP_TYPES

if TYPE_CHECKING:
    from ._op import Op
    from .graph import Graph
    from .ir import Ir
    from .session_options import SessionOptions
    from .tensor import Tensor


class PbIr:
    """``ir._pb_ir``: the view of an ``Ir`` that PopART's ``_internal.ir.Ir`` gave."""

    def __init__(self, ir: Ir) -> None:
        self._ir = ir

    def getSessionOptions(self) -> SessionOptions:  # noqa: N802 (PopART's name)
        """The IR's session options (the same object every call)."""
        return self._ir._session_options

    def getAllGraphs(self) -> list[PbGraph]:  # noqa: N802
        """Every graph of the IR, the main graph first."""
        return [PbGraph(g) for g in self._ir._graphs.values()]

    def getMainGraph(self) -> PbGraph:  # noqa: N802
        return PbGraph(self._ir.main_graph)

    def getId(self) -> int:  # noqa: N802
        return self._ir.id

    def logIr(self) -> None:  # noqa: N802
        """Write every graph's schedule to PopART's log at DEBUG level (``POPART_LOG_LEVEL``)."""
        from . import _log  # noqa: PLC0415

        if not _log.enabled(_log.DEBUG):
            return
        for graph in self._ir._graphs.values():
            _log.debug(f"Graph '{graph.id}':\n{graph.print_schedule()}", module="ir")


class PbGraph:
    """``graph._pb_graph``: PopART's ``_internal.ir.Graph`` view of a ``Graph``."""

    def __init__(self, graph: Graph) -> None:
        self._graph = graph

    @property
    def id(self) -> str:
        return self._graph.id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PbGraph) and other._graph is self._graph

    def __hash__(self) -> int:
        return hash(self._graph)

    def getOps(self) -> list[PbOp]:  # noqa: N802
        """The graph's ops, in schedule order."""
        return [pb_op(op) for op in self._graph._ops]

    def getOpSchedule(self, require_optimal: bool = False) -> list[PbOp]:  # noqa: N802
        """The graph's ops in the order they run (creation order here)."""
        del require_optimal
        return self.getOps()


class PbOp:
    """An op as PopART's ``_internal.ir.Op`` showed it."""

    def __init__(self, op: Op) -> None:
        self._op = op

    @property
    def id(self) -> int:
        return self._op.id

    def opType(self) -> str:  # noqa: N802
        """PopXL's type name of the op (``MatMul``, ``Add``, ``Call``...)."""
        return self._op.type

    def __repr__(self) -> str:
        return f"PbOp({self.opType()}, id={self.id})"

    def getInputTensors(self) -> list[PbTensor]:  # noqa: N802
        return [PbTensor(t) for t in self._op.inputs]

    def getOutputTensors(self) -> list[PbTensor]:  # noqa: N802
        return [PbTensor(t) for t in self._op.outputs]

    def getVirtualGraphId(self) -> int:  # noqa: N802
        """The IPU the op was placed on (``popxl.ipu``)."""
        return self._op.ipu or 0


# PopART's op classes had these methods only where they applied; code tests ``hasattr``.


class PbAmpOp(PbOp):
    """Ops with an available memory proportion (matmul, gather, scatter)."""

    def getAvailableMemoryProportion(self) -> float | None:  # noqa: N802
        return self._op.hints.get(AMP_HINT)

    def setAvailableMemoryProportion(self, value: float | None) -> None:  # noqa: N802
        """Record the planning option on the op (``op.hints``); XLA does not read it."""
        self._op.hints[AMP_HINT] = value


class PbMatMulOp(PbAmpOp):
    """``MatMul``: also the fully-connected pass switch."""

    def useFullyConnectedPass(self) -> bool:  # noqa: N802
        """True unless ``disable_fc_pass`` switched it off (PopART's default is on)."""
        return bool(self._op.hints.get(FC_PASS_HINT, True))

    def setUseFullyConnectedPass(self, value: bool) -> None:  # noqa: N802
        self._op.hints[FC_PASS_HINT] = bool(value)


class PbSubgraphOp(PbOp):
    """Ops that run a graph (call, repeat)."""

    def getCalledGraph(self) -> PbGraph:  # noqa: N802
        return PbGraph(self._op.called_graphs[0])


class PbLoopOp(PbSubgraphOp):
    """``Loop`` (``ops.repeat``)."""

    def getTripCountValue(self) -> int:  # noqa: N802
        return int(self._op.attrs["repeat_count"])


def pb_op(op: Op) -> PbOp:
    """The PopART-style view of ``op``, with the methods its PopART class had."""
    if op.type in FC_PASS_OP_TYPES:
        return PbMatMulOp(op)
    if op.type in AMP_OP_TYPES:
        return PbAmpOp(op)
    if op.type == "Loop":
        return PbLoopOp(op)
    if op.type == "Call":
        return PbSubgraphOp(op)
    return PbOp(op)


class PbTensor:
    """``tensor._pb_tensor``: PopART's ``_internal.ir.Tensor`` view (only ``info`` and ``id``)."""

    def __init__(self, tensor: Tensor) -> None:
        self._tensor = tensor
        self.id = tensor.id
        self.info = PbTensorInfo(tensor)


class PbTensorInfo:
    """PopART's ``TensorInfo`` of a tensor: its shape and data type."""

    def __init__(self, tensor: Tensor) -> None:
        self._tensor = tensor

    def shape(self) -> list[int]:
        return list(self._tensor.shape)

    def data_type_lcase(self) -> str:
        """The data type's lower-case name, which ``popxl.dtype.as_dtype`` reads back."""
        return self._tensor.dtype.name

    def nelms(self) -> int:
        return self._tensor.nelms


class SessionCompat:
    """PopXL's private ``Session`` methods that published code calls (a mixin of
    ``popxl.Session``). The session provides ``ir_`` and ``_nht``."""

    ir_: Ir
    _nht: int

    def _extra_input_dims(self) -> tuple[int, ...]:
        replicas = self.ir_.instance_replication_factor
        return ((self._nht,) if self._nht > 1 else ()) + ((replicas,) if replicas > 1 else ())

    def _full_input_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` with the leading host-transfer and replica dims a run's arrays carry:
        with 8 host transfers and 4 replicas, ``(3, 4)`` becomes ``(8, 4, 3, 4)``."""
        return self._extra_input_dims() + tuple(shape)
