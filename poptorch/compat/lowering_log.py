"""PopTorch's DEBUG account of where each op of the model runs.

When PopTorch lowered a model it logged, per op, the PopART tensors the op produced and where
it was placed: ``... was lowered to l1/Mul:0 [float32(2, 5), mode(Pipelined), ipu(1),
stage(1)]``, and the session options the execution strategy implied (``enablePipelining set
to value 1``, the phase settings of phased execution). Programs (and PopTorch's tests) read
placements from that log, so the same lines are written here from the built program.

Tensor ids follow PopART: ``<scope>/<OpType>:<output index>``, a repeated id getting ``/1``,
``/2``... in lowering order. Phases are numbered as PopTorch numbered them: spread out when
the tensor liveness leaves room for off-chip transfers between phases.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._log import logger
from ..capture.scopes import MODULE_PATH
from ..enums import Liveness
from ..strategies import ParallelPhasedExecution, SerialPhasedExecution, ShardedExecution
from .popart_ir import op_name, placed_ops

if TYPE_CHECKING:
    import popxl
    from popxl._op import Op


class BlockPlan(Protocol):
    """What the log reads of a block's plan (``poptorch.execution.staged.BlockPlan``): its
    op range, stage, phase and IPU."""

    start: int
    stop: int
    stage: int
    phase: int
    ipu: int


# How far apart PopTorch put consecutive forward phases, per tensor liveness.
_PHASE_STRIDE = {
    Liveness.AlwaysLive: 1,
    Liveness.OffChipAfterFwd: 1,
    Liveness.OffChipAfterFwdNoOverlap: 2,
    Liveness.OffChipAfterEachPhase: 4,
}
# Phases PopART added after the forward so that no tensor is live into the backward.
_OFF_CHIP_GAP = 3
# Losses PopTorch lowered as several PopART ops: their types, the first taking the shape of
# the loss's input, the others that of the loss.
_POPART_PARTS = {
    "aten::l1_loss": ("Sub", "L1", "IdentityLoss"),
    "aten::mse_loss": ("Sub", "Mul", "IdentityLoss"),
}
_PHASED_LOCATIONS = (
    "location_activation",
    "location_weight",
    "location_optimizer",
    "location_accumulator",
)


def log_placements(graph: popxl.Graph, plans: Sequence[BlockPlan], strategy: Any) -> None:
    """Log the session options ``strategy`` implies and one line per op of the model's
    forward ``graph`` with its place, ``plans`` giving the op ranges of its blocks."""
    if not logger.isEnabledFor(logging.DEBUG):
        return
    phased = isinstance(strategy, (SerialPhasedExecution, ParallelPhasedExecution))
    stride = _PHASE_STRIDE[Liveness(strategy.liveness)] if phased else 1
    for name, value in _strategy_options(strategy, plans, stride):
        logger.debug("%s set to value %s", name, value)
    ids: dict[str, int] = {}
    for scope, op, plan in _ops_with_plans(graph, plans):
        place = _placement(strategy, plan, stride)
        for kind, name, outputs in _as_popart_ops(op, scope):
            names = ", ".join(_tensor_id(name, i, ids) for i in range(len(outputs)))
            shapes = ", ".join(_type_and_shape(t) for t in outputs)
            logger.debug("%s was lowered to %s [%s,%s]", kind, names, shapes, place)


def _strategy_options(
    strategy: Any, plans: Sequence[BlockPlan], stride: int
) -> Iterator[tuple[str, Any]]:
    if not isinstance(strategy, (SerialPhasedExecution, ParallelPhasedExecution)):
        used_ipus = {p.ipu for p in plans} or {0}
        pipelined = not isinstance(strategy, ShardedExecution) and len(used_ipus) > 1
        yield "enablePipelining", int(pipelined)
        return
    yield "enablePipelining", 0
    phases = max((p.phase for p in plans), default=0) * stride + 1
    if Liveness(strategy.liveness) != Liveness.AlwaysLive:
        phases += _OFF_CHIP_GAP
    elif strategy.separate_backward_phase:
        phases += 1
    yield "executionPhaseSettings.phases", phases
    yield "executionPhaseSettings.stages", 1 if isinstance(strategy, SerialPhasedExecution) else 2
    for location in _PHASED_LOCATIONS:
        yield location, "useOnChipStorage(False)"


def _ops_with_plans(
    graph: popxl.Graph, plans: Sequence[BlockPlan]
) -> Iterator[tuple[tuple[str, ...], Op, BlockPlan | None]]:
    """The forward's ops in lowering order (block calls inlined), each with its name scope
    and its block."""
    for index, op in enumerate(graph._ops):
        plan = next((p for p in plans if p.start <= index < p.stop), None)
        if op.type != "Call":
            yield op.scope, op, plan
            continue
        path = op.hints.get(MODULE_PATH)
        frame = ((*op.scope, path) if path else op.scope, op.scope)
        for called in op.called_graphs:
            for scope, inner in placed_ops(called, False, frame):
                yield scope, inner, plan


def _as_popart_ops(op: Op, scope: tuple[str, ...]) -> list[tuple[str, str, Sequence[popxl.Tensor]]]:
    """``op`` as the PopART ops PopTorch logged for it: (type, name, outputs)."""
    parts = _POPART_PARTS.get(op.type)
    if parts is None or op.attrs.get("reduction", 1) == 0 or not op.inputs:
        return [(op.type, op_name(op, scope), op.outputs)]
    base = op_name(op, scope).rsplit(op.type, 1)[0]
    first, *rest = parts
    found = [(first, f"{base}{first}", [op.inputs[0]])]
    return found + [(kind, f"{base}{kind}", op.outputs) for kind in rest]


def _tensor_id(name: str, index: int, seen: dict[str, int]) -> str:
    base = f"{name}:{index}"
    count = seen.get(base, 0)
    seen[base] = count + 1
    return f"{base}/{count}" if count else base


def _type_and_shape(t: popxl.Tensor) -> str:
    return f"{t.dtype.name}({', '.join(str(d) for d in t.shape)})"


def _placement(strategy: Any, plan: BlockPlan | None, stride: int) -> str:
    ipu = plan.ipu if plan is not None else 0
    if isinstance(strategy, (SerialPhasedExecution, ParallelPhasedExecution)):
        phase = (plan.phase if plan is not None else 0) * stride
        return f" mode(Phased), ipu({ipu}), phase({phase})"
    mode = "Sharded" if isinstance(strategy, ShardedExecution) else "Pipelined"
    stage = plan.stage if plan is not None else 0
    return f" mode({mode}), ipu({ipu}), stage({stage})"
