"""What a built PopTorch program holds and how one host call's data is laid out.

``Built`` is the program and the handles the executor needs (streams, weights, optimiser
state and hyper-parameters); ``Interface`` says how the program uses the forward graph's
outputs; ``Layout`` counts what one call runs (device iterations, micro-batches, replicas,
the rows each output store sends), from the options alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import popxl
from popxl.errors import InternalError

from ..enums import CommGroupType, OutputMode, ReductionType
from ..errors import Error
from ..options.core import (
    Options,
    _TensorLocationOptions,
    resolved_output_mode,
)
from ..strategies import PipelinedExecution, ShardedExecution
from . import instances as _instances
from .anchors import Anchors

EVERY_N_MSG = (
    "OutputMode.EveryN with output_return_period {n} needs deviceIterations to be a multiple "
    "of {n}, but deviceIterations is {di}."
)


INPUT_GROUP_MSG = (
    "inputReplicaGrouping group size {k} must divide replicationFactor {r}: each group of "
    "{k} replicas reads one slice of the batch."
)


class ForwardModel(Protocol):
    """What the program builder takes: a popxl_addons ``Module``, or a captured torch model
    (``poptorch.capture.model.CapturedModel``). ``create_graph(*specs)`` builds the forward
    graph for one micro-batch and returns its variable factories and the graph."""

    def create_graph(self, *specs: popxl.TensorSpec) -> tuple[Any, Any]: ...


@dataclass
class Built:
    """The built program and the handles the executor needs."""

    ir: popxl.Ir
    inputs: list[popxl.HostToDeviceStream]
    outputs: list[popxl.DeviceToHostStream]
    output_specs: list[popxl.TensorSpec]
    stores_per_call: int
    weights: dict[str, popxl.Variable]
    state: dict[str, dict[str, popxl.Variable]] = field(default_factory=dict)
    # Keyed by (weight name or group index, attribute); see ``Trainer``.
    hyper: dict[tuple[str | int, str], popxl.Variable] = field(default_factory=dict)
    constants: dict[tuple[str | int, str], float] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    step: popxl.Variable | None = None
    loss_index: int | None = None
    locations: _TensorLocationOptions = field(default_factory=_TensorLocationOptions)
    # Automatic loss scaling: finite optimiser steps in a row (None: the scale is fixed).
    good_steps: popxl.Variable | None = None
    # The execution strategy's blocks, stages and IPUs (and pipeline schedule), if any.
    description: str = ""
    interface: Interface | None = None
    # Options.anchorTensor's tensors and the variables holding them.
    anchors: Anchors | None = None
    # EveryN with gradient accumulation or in an inference pipeline: each output's next
    # row in its holder.
    output_rows: list[popxl.Variable] = field(default_factory=list)

    def forward_interface(self) -> Interface:
        """``interface``, which ``build`` sets before anything reads it."""
        if self.interface is None:
            raise InternalError("the program's forward interface is read before build() sets it")
        return self.interface


@dataclass(frozen=True)
class Interface:
    """How the program uses the forward graph's outputs and named inputs.

    A popxl_addons ``Module`` returns only its outputs and trains every variable. A captured
    torch model (``poptorch.capture``) also returns new values for its buffers (written
    back to their variables after each micro-batch) and for inputs it modifies in place
    (sent to the host after its outputs), and trains only its parameters that require
    gradients.
    """

    n_outputs: int
    state_outputs: tuple[str, ...] = ()
    input_outputs: tuple[int, ...] = ()
    trainable: tuple[str, ...] | None = None  # None: every named input
    loss_index: int | None = None  # None: marked by identity_loss, or the last output
    overlaps: Any = None  # overlapped IO marks (``_capture.overlap.Overlaps``)

    @classmethod
    def of(cls, module: Any, fwd: Any) -> Interface:
        forward = getattr(module, "forward", None)
        if forward is None or not hasattr(forward, "state_outputs"):
            return cls(len(fwd.graph.outputs))
        return cls(
            forward.n_outputs,
            tuple(forward.state_outputs),
            tuple(forward.input_outputs),
            tuple(forward.trainable),
            forward.loss_index,
            forward.overlaps,
        )

    @property
    def host_outputs(self) -> list[int]:
        """Forward outputs sent to the host: the model's, then the modified inputs'."""
        first_input = self.n_outputs + len(self.state_outputs)
        return [*range(self.n_outputs), *range(first_input, first_input + len(self.input_outputs))]

    def state_indices(self) -> list[tuple[int, str]]:
        return [(self.n_outputs + i, name) for i, name in enumerate(self.state_outputs)]

    def trained(self, fwd: Any) -> list[str]:
        names = list(fwd.args.to_dict())
        return names if self.trainable is None else [n for n in names if n in self.trainable]


INFERENCE_ACCUMULATION_MSG = (
    "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it as its "
    "default value (1) when running a poptorch.inferenceModel()."
)


PIPELINED_INFERENCE_HINT = (
    " Use poptorch.Options().deviceIterations to process a sufficient number of batches each "
    "run for pipelined execution instead."
)


def check_inference_accumulation(options: Options) -> None:
    """Inference accumulates nothing: PopTorch refused an inference model with gradient
    accumulation when it was created."""
    if options.Training.gradient_accumulation == 1:
        return
    strategy = options._execution_strategy
    pipelined = isinstance(strategy, PipelinedExecution) and not isinstance(
        strategy, ShardedExecution
    )
    message = INFERENCE_ACCUMULATION_MSG + (PIPELINED_INFERENCE_HINT if pipelined else "")
    raise Error(message, "poptorch_py_error")


@dataclass(frozen=True)
class Layout:
    """How many of everything one host call runs."""

    device_iterations: int
    accumulation: int
    replicas: int
    mode: OutputMode
    period: int
    reduction: ReductionType

    @classmethod
    def of(cls, options: Options, training: bool) -> Layout:
        ga = options.training.gradient_accumulation
        if not training:
            check_inference_accumulation(options)
        mode = resolved_output_mode(options, training)
        di = options.device_iterations
        period = {OutputMode.Final: di, OutputMode.EveryN: options.output_return_period}.get(
            mode, 1
        )
        if di % period:
            raise ValueError(EVERY_N_MSG.format(n=period, di=di))
        r, k = options.replication_factor, options.input_group_size
        if r % k:
            raise ValueError(INPUT_GROUP_MSG.format(k=k, r=r))
        replicas = _instances.global_replicas(options)
        return cls(
            di, ga if training else 1, replicas, mode, period, options.training.reduction_type
        )

    @property
    def rows_per_store(self) -> int:
        """Micro-batch values per output store: ``EveryN`` returns every micro-batch of
        each N-th device iteration (PopART's EveryN anchor: ``steps * accumulation / N``
        values), the other accumulated modes one."""
        return self.accumulation if self.mode == OutputMode.EveryN else 1

    @property
    def stores_per_call(self) -> int:
        if self.mode == OutputMode.All:
            return self.device_iterations * self.accumulation
        if self.mode == OutputMode.Sum:
            return 1
        return self.device_iterations // self.period


def replica_grouping(ir: popxl.Ir, kind: CommGroupType, size: int) -> popxl.ReplicaGrouping:
    """A popxl replica grouping from PopTorch's ``CommGroupType`` and group size."""
    r = ir.replication_factor
    if kind == CommGroupType.All:
        return ir.replica_grouping()
    if kind == CommGroupType.NoGrouping:
        return ir.replica_grouping(group_size=1)
    if kind == CommGroupType.Consecutive:
        return ir.replica_grouping(stride=1, group_size=size)
    return ir.replica_grouping(stride=r // size, group_size=size)
