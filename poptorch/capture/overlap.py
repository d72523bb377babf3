"""Overlapped host IO marks in a captured program (``poptorch.set_overlap_for_input`` and
``poptorch.set_overlap_for_output``).

A mark is valid only where PopTorch accepted it: an input mark must be the only use of a
tensor input of the model, an output mark must be returned by the model, and a tensor with
an output mark must be returned once. ``find`` checks the top-level graph of a capture,
with PopTorch's errors, and says which inputs and outputs overlap in which mode; the marks
it accepted lower as identities, any other (inside a block, or on an intermediate value)
is refused when it is lowered. ``poptorch.execution.program`` puts the host transfers of the marked
tensors on the IO tiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ..errors import Error
from ..ops.torch_ops import NOT_INPUT_MSG, NOT_OUTPUT_MSG, ONLY_OP_MSG, RETURNED_TWICE_MSG

INPUT_MARK = torch.ops.poptorch.set_overlap_for_input.default
OUTPUT_MARK = torch.ops.poptorch.set_overlap_for_output.default

NO_OVERLAP = "no_overlap"


@dataclass
class Overlaps:
    """The overlap modes (``OverlapMode`` values) of the model's tensor inputs and outputs,
    by index, and the mark nodes that set them."""

    inputs: dict[int, str] = field(default_factory=dict)
    outputs: dict[int, str] = field(default_factory=dict)
    marks: set[torch.fx.Node] = field(default_factory=set)

    @property
    def used(self) -> bool:
        """Whether any transfer overlaps (``NoOverlap`` marks change nothing)."""
        return any(m != NO_OVERLAP for m in (*self.inputs.values(), *self.outputs.values()))


def _error(message: str) -> Error:
    return Error(message, "poptorch_cpp_error")


def find(program: ExportedProgram) -> Overlaps:
    """The overlap marks of ``program``'s top-level graph.

    Raises:
        poptorch.Error: a mark PopTorch refused (see the module docstring).
    """
    found = Overlaps()
    _find_inputs(program, found)
    _find_outputs(program, found)
    for node in program.graph.nodes:
        if node.target is INPUT_MARK and node not in found.marks:
            raise _error(NOT_INPUT_MSG)
        if node.target is OUTPUT_MARK and node not in found.marks:
            raise _error(NOT_OUTPUT_MSG)
    return found


def _is_tensor(node: object) -> bool:
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.Tensor)


def _find_inputs(program: ExportedProgram, found: Overlaps) -> None:
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = program.graph_signature.input_specs
    inputs = [nodes[s.arg.name] for s in specs if s.kind == InputKind.USER_INPUT]
    for index, node in enumerate(n for n in inputs if _is_tensor(n)):
        marks = [u for u in node.users if u.target is INPUT_MARK]
        if not marks:
            continue
        if len(node.users) > 1:
            raise _error(ONLY_OP_MSG.format(index=index, name=node.name))
        found.inputs[index] = str(marks[0].args[1])
        found.marks.add(marks[0])


def _find_outputs(program: ExportedProgram, found: Overlaps) -> None:
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    specs = program.graph_signature.output_specs
    returned = [v for s, v in zip(specs, out_node.args[0]) if s.kind == OutputKind.USER_OUTPUT]
    for index, value in enumerate(v for v in returned if _is_tensor(v)):
        if value.target is not OUTPUT_MARK:
            continue
        if _times_returned(value.args[0], returned) > 1:
            raise _error(RETURNED_TWICE_MSG)
        found.outputs[index] = str(value.args[1])
        found.marks.add(value)


def _times_returned(value: torch.fx.Node, returned: list) -> int:
    """How often the model returns ``value``, directly or through output marks."""
    count = sum(1 for v in returned if v is value)
    for user in value.users:
        if user.target is OUTPUT_MARK:
            count += _times_returned(user, returned)
    return count
