"""The program's ops as PopART's serialized IR (``PoplarExecutor._debugGetPopartIR``).

PopART wrote its IR as JSON: ``{"maingraph": [{"type", "name", "attributes", "inputs",
"outputs"}, ...]}``, one record per op in schedule order, attribute values as strings. The
same shape is built here from the popxl IR, so code that inspects PopTorch programs that way
(counting ``MultiConv`` ops, reading ``group_size`` attributes) keeps working.

PopART had no device-iteration loop and no calls for the model's forward: the program's loops
and every ``Call`` are inlined, so the step's ops all appear in ``"maingraph"``. Loops and
branches of the model itself (``poptorch.for_loop``, ``poptorch.cond``) stay single ops, as
PopART's ``Loop`` and ``If`` did. A pipeline's schedule (``popxl_addons``' pipelining) is
inlined too, so each of its stages' ops appears once, as in PopART's IR, and each stash and
restore between stages is one ``Stash`` / ``Restore`` op. Op names are the op's name scope
(torch module paths written ``layer1/0``) and its type, with PopART's ``:InPlace`` suffix for
in-place variants.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

import popxl
from popxl import _log as popart_log
from popxl._op import REGISTRY
from popxl.context import hint_new_ops
from popxl_addons.transforms.pipelining import PIPELINE_ROLE, RESTORE, SCHEDULE, STASH

from .._log import logger, trace_enabled
from ..capture.scopes import MODULE_PATH

if TYPE_CHECKING:
    from popxl._op import Op

_LOOP = "Loop"
_CALL = "Call"
_IF = "If"
_OUTLINE = "__outline"
# ``poptorch.recomputationCheckpoint``'s op; PopART made it an ``Identity`` named "Checkpoint"
_CHECKPOINT = "poptorch::recomputation_checkpoint"
# ``Op.hints`` key of a call running a ``torch.nn`` block: the block's module path.


# ``Op.hints`` key of the ops of one weight's optimiser update: (PopTorch optimiser type,
# weight name). PopART made each update one op (two for Adam): its serialized IR lists those.
OPTIMIZER_UPDATE = "__optimizer_update"
# The ops PopART's optimisers made per weight, by PopTorch's optimiser type (types not listed
# are shown op by op).
_POPART_UPDATES = {
    "SGD0": ("SGD0VarUpdate",),
    "ADAM": ("AdamUpdater", "AdamVarUpdate"),
    "ADAMW": ("AdamUpdater", "AdamVarUpdate"),
    "ADAMW_NO_BIAS": ("AdamUpdater", "AdamVarUpdate"),
}


def tagged_update(kind: str, weight: str) -> contextlib.AbstractContextManager[None]:
    """Within: the ops made in the current graph are weight ``weight``'s optimiser update
    (of PopTorch optimiser type ``kind``), which the serialized IR shows as PopART's ops."""
    return hint_new_ops(OPTIMIZER_UPDATE, (kind, weight))


def popart_ir_json(ir: popxl.Ir) -> str:
    """``ir`` as PopART's serialized IR, compact JSON (``"name":"layer1/0/Conv"``)."""
    session = ir.session_options
    records: list[dict[str, Any]] = []
    shown: set[tuple[str, str]] = set()
    for scope, op in placed_ops(ir.main_graph):
        update = op.hints.get(OPTIMIZER_UPDATE)
        if update is not None and update[0] in _POPART_UPDATES:
            if update not in shown:
                shown.add(update)
                records.extend(_update_records(*update))
            continue
        records.append(_with_session_attributes(op_record(op, scope), op, session))
    return json.dumps({"maingraph": records}, separators=(",", ":"))


def _update_records(kind: str, weight: str) -> list[dict[str, Any]]:
    """PopART's ops of one weight's update, named after the weight."""
    return [
        {"type": t, "name": f"{t}_{weight}", "attributes": {}, "inputs": [], "outputs": []}
        for t in _POPART_UPDATES[kind]
    ]


def _with_session_attributes(record: dict[str, Any], op: Op, session: Any) -> dict[str, Any]:
    """The attributes PopART's matmuls and convolutions took from the session options:
    their partials type (``MatMulPartialsType::FLOAT``; ``partialsType[k]`` per convolution)."""
    if record["type"] == "MatMul":
        partials = op.attrs.get("partials_type") or session.partialsTypeMatMuls or "float"
        record["attributes"]["partialsType"] = f"MatMulPartialsType::{str(partials).upper()}"
    elif record["type"] == "Conv" and "partialsType" in session.convolutionOptions:
        record["attributes"]["partialsType[0]"] = session.convolutionOptions["partialsType"]
    return record


def log_lowered(ir: popxl.Ir) -> None:
    """Log the step's ops: PopTorch's ``Graph lowered to PopART {...}`` (its DEBUG level),
    and one ``Op "name", id of type ...`` entry per op in PopART's log (its DEBUG level)."""
    debug_poptorch = logger.isEnabledFor(logging.DEBUG)
    debug_popart = popart_log.enabled(popart_log.DEBUG)
    if not (debug_poptorch or debug_popart):
        return
    step = placed_ops(ir.main_graph)
    if trace_enabled():  # PopTorch wrote PopART's IR out at its most verbose
        logger.debug("Popart IR: %s", popart_ir_json(ir))
    if debug_poptorch:
        logger.debug("Graph lowered to PopART {")
        for scope, op in step:
            outs = ", ".join(_tensor_text(t) for t in op.outputs)
            logger.debug("  %s (%s) -> (%s)", op_name(op, scope), op.type, outs)
        logger.debug("}")
    for scope, op in step if debug_popart else ():
        popart_log.debug(_op_entry(op, scope), "ir")


def _op_entry(op: Op, scope: tuple[str, ...]) -> str:
    """An op as PopART's log listed it: name, id and type, tensors, attributes; outline
    attributes (``poptorch.Attribute(__outline=...)``) as ``key: key:value``. A blank line
    ends the entry."""
    lines = [f'Op "{op_name(op, scope)}", {op.id} of type ai.graphcore.{op.type}:1']
    lines.append("  inputs: " + ", ".join(_tensor_text(t) for t in op.inputs))
    lines.append("  outputs: " + ", ".join(_tensor_text(t) for t in op.outputs))
    for key, value in op_record(op, scope)["attributes"].items():
        if key != _OUTLINE:
            lines.append(f"  {key}: {value}")
    for key, value in (op.hints.get(_OUTLINE) or {}).items():
        lines.append(f"  outline attribute {key}: {key}:{value}")
    return "\n".join(lines) + "\n"


def _tensor_text(t: popxl.Tensor) -> str:
    return f"{t.name} {t.dtype.name}{list(t.shape)}"


Frame = tuple[tuple[str, ...], tuple[str, ...]]


def placed_ops(
    graph: popxl.Graph, program_level: bool = True, frame: Frame = ((), ())
) -> list[tuple[tuple[str, ...], Op]]:
    """The ops ``graph`` runs, with calls inlined (and, at the program level, its loops),
    each with its name scope where it runs. ``frame`` is the enclosing call's scope (with the
    module path of the ``torch.nn`` block it runs, ``MODULE_PATH``) and the scope its graph
    was built under."""
    found: list[tuple[tuple[str, ...], Op]] = []
    for op in graph._ops:
        scope = _placed(op.scope, frame)
        role = op.hints.get(PIPELINE_ROLE)
        schedule = program_level and role == SCHEDULE  # a pipeline's: its stages' ops once
        inline = (op.type == _CALL and role is None) or schedule
        inline = inline or (op.type == _LOOP and program_level)
        if not inline:
            found.append((scope, op))
            continue
        path = op.hints.get(MODULE_PATH)
        inner = ((*scope, path) if path else scope, op.scope)
        called = op.called_graphs[:1] if op.type == _IF else op.called_graphs  # not the skip
        for g in called:
            found.extend(placed_ops(g, program_level and (op.type == _LOOP or schedule), inner))
    return found


def _placed(scope: tuple[str, ...], frame: Frame) -> tuple[str, ...]:
    placed_at, built_under = frame
    if scope[: len(built_under)] == built_under:
        scope = scope[len(built_under) :]
    return (*placed_at, *scope)


def _popart_type(op: Op) -> tuple[str, dict[str, Any]]:
    """The type PopART gave the op of an ATen record with a PopART counterpart, and the
    attributes PopART's op had that the record's do not (other ops keep their own type)."""
    if op.type == _CHECKPOINT:  # PopART's ``checkpointOutput``: an Identity op
        return "Identity", {}
    if op.hints.get(PIPELINE_ROLE) in (STASH, RESTORE):  # a pipeline stash's or restore's call
        return op.hints[PIPELINE_ROLE], {}
    if op.type == "aten::grouped_scatter":
        return "ScatterReduce", {}
    if op.type == "aten::scatter" and op.attrs.get("reduce", "none") != "none":
        return "ScatterReduce", {"group_size": 1}
    return op.type, {}


def op_record(op: Op, scope: tuple[str, ...] | None = None) -> dict[str, Any]:
    """One op as PopART serialized it (named under ``scope``, by default its own)."""
    kind, extra = _popart_type(op)
    attributes: dict[str, str] = {k: _text(v) for k, v in extra.items()}
    for key, value in [*op.attrs.items(), *op.hints.items()]:
        if key in (OPTIMIZER_UPDATE, PIPELINE_ROLE):
            continue
        if _is_records(value):  # one record per part (MultiConv's convolutions): per field
            for field in dict(value[0]):
                attributes[field] = _text([dict(r).get(field) for r in value])
        elif _serializable(value):
            attributes[key] = _text(value)
    return {
        "type": kind,
        "name": op_name(op, scope),
        "attributes": attributes,
        "inputs": [_tensor_record(t) for t in op.inputs],
        "outputs": [_tensor_record(t) for t in op.outputs],
    }


def op_name(op: Op, scope: tuple[str, ...] | None = None) -> str:
    """``scope/Type``: the name scope with torch's dotted module paths split on ``/``; an
    in-place variant is named after its out-of-place type with ``:InPlace``."""
    role = op.hints.get(PIPELINE_ROLE)
    base = role if role in (STASH, RESTORE) else op.type
    base, suffix = ("Checkpoint" if op.type == _CHECKPOINT else base), ""
    key = op.opdef.key
    if op.opdef.is_inplace and key.endswith("_") and key[:-1] in REGISTRY:
        base, suffix = REGISTRY[key[:-1]].type, ":InPlace"
    parts = op.scope if scope is None else scope
    prefix = "/".join(part.replace(".", "/") for part in parts if part)
    return f"{prefix}/{base}{suffix}" if prefix else f"{base}{suffix}"


def _tensor_record(t: popxl.Tensor) -> dict[str, str]:
    return {"name": t.name, "type": t.dtype.name, "shape": _text(tuple(t.shape))}


def _is_records(value: Any) -> bool:
    """A tuple of records, each a tuple of ``(field, value)`` pairs."""
    return (
        isinstance(value, tuple)
        and bool(value)
        and all(
            isinstance(r, tuple)
            and bool(r)
            and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in r)
            for r in value
        )
    )


def _serializable(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, popxl.dtype, popxl.Graph)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_serializable(v) for v in value)
    if isinstance(value, dict):
        return all(_serializable(v) for v in value.values())
    return False


def _text(value: Any) -> str:
    """An attribute value as PopART wrote it: a string; sequences as ``[a, b]``."""
    if isinstance(value, popxl.dtype):
        return value.name
    if isinstance(value, popxl.Graph):
        return value.id
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_text(v)}" for k, v in value.items()) + "}"
    return str(value)
