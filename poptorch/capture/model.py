"""A captured ``torch.nn`` model in the shape the program builder takes.

``poptorch.execution.program.build`` builds every PopTorch program from an object with ``create_graph(*specs)``
returning ``(variable factories, GraphWithNamedArgs)``, as a popxl_addons ``Module`` has.
``CapturedModel`` is that object for a torch model: ``create_graph`` translates the captured
ATen program into the IR being built and keeps the ``Forward`` that says which outputs are
the model's, which update buffers, and which parameters train.
"""

from __future__ import annotations

from typing import Any

import popxl
from popxl_addons import GraphWithNamedArgs
from popxl_addons.variable_factory import NamedVariableFactories, VariableFactory

from .export import Capture
from .translate import SEED_NAME, Forward, translate

SPEC_MISMATCH_MSG = (
    "Input {i} has shape {got} and dtype {got_dtype} per micro-batch, but the model was "
    "captured for shape {want} and dtype {want_dtype}."
)


class CapturedModel:
    """``create_graph`` for a captured torch model (see the module docstring)."""

    def __init__(
        self, capture: Capture, training: bool, seed: int | None, options: Any = None
    ) -> None:
        self.capture = capture
        self.training = training
        self.seed = seed
        self.options = options
        self.forward: Forward | None = None

    @property
    def name(self) -> str:
        return type(self.capture.module).__name__

    def create_graph(self, *specs: popxl.TensorSpec) -> tuple[NamedVariableFactories, Any]:
        forward = translate(self.capture, self.training, self.name, self.options)
        for i, (spec, t) in enumerate(zip(specs, forward.inputs)):
            if tuple(spec.shape) != tuple(t.shape) or spec.dtype != t.dtype:
                raise ValueError(
                    SPEC_MISMATCH_MSG.format(
                        i=i, got=spec.shape, got_dtype=spec.dtype, want=t.shape, want_dtype=t.dtype
                    )
                )
        facts = forward.factories
        if SEED_NAME in forward.args.to_dict():
            facts.insert(SEED_NAME, _seed_factory(self.seed))
        self.forward = forward
        return facts, GraphWithNamedArgs(forward.graph, forward.args)


def _seed_factory(seed: int | None) -> VariableFactory:
    """The random seed: one per replica (replicas draw different numbers), from
    ``Options.randomSeed`` or, when unset, from NumPy's global generator."""
    import numpy as np  # noqa: PLC0415

    ir = popxl.gcg().ir
    replicas = ir.replication_factor
    base = int(np.random.randint(0, 2**31 - 1)) if seed is None else int(seed)
    values = popxl.create_seeds(base, replicas=replicas)
    grouping = ir.replica_grouping(group_size=1)
    rows = iter(list(values.reshape(-1, 2)))
    return VariableFactory(rows, popxl.uint32, SEED_NAME, replica_grouping=grouping)
