"""Tensors of the training step the host asks for by name (``Options.anchorTensor``).

PopTorch let a program return tensors besides the model's outputs, named as PopART named
them: a weight by its own name (the value the forward pass reads), ``Gradient___<weight>``
(a micro-batch's gradient of a weight, loss-scaled as the backward makes it),
``UpdatedVar___<weight>`` (the weight after the optimiser step) and
``finalLossScale`` (the loss scaling a step used, with automatic loss scaling). Each gets
a variable of the program written where the tensor is made, in the anchor's output mode:

* ``Final``: the last value of the run;
* ``All``, ``Sum``, ``EveryN``: every value of the run, in a ring buffer indexed by a
  counter (one slot per micro-batch for gradients, per device iteration for the step's
  tensors); the host returns them all, their sum, or every N-th.

``getAnchoredTensor(short_name)`` reads the variable after a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import popxl
from popxl import ops

from .._log import logger
from ..enums import OutputMode
from ..errors import Error

GRADIENT = "Gradient___"
UPDATED = "UpdatedVar___"
LOSS_SCALE = "finalLossScale"

# PopART's names of the return types, as its log printed them.
_LABELS = {
    OutputMode.All: "ALL",
    OutputMode.EveryN: "EVERYN",
    OutputMode.Final: "FINAL",
    OutputMode.Sum: "Sum",
}

UNKNOWN_MSG = (
    "anchorTensor({short!r}, {long!r}): the program has no tensor of that name. The names "
    "that can be anchored are {names}."
)
STAGED_MSG = (
    "anchorTensor({short!r}, {long!r}): tensors can be anchored only in a program without "
    "blocks placed on several IPUs; remove the anchor or the blocks."
)


@dataclass
class Anchor:
    """One anchored tensor and, once the program writes it, its variable."""

    short: str
    long: str
    mode: OutputMode
    period: int
    held: popxl.Variable | None = None
    scalar: bool = False

    def label(self) -> str:
        return f"{_LABELS[self.mode]}/{self.period}"


class Anchors:
    """The anchors of one program (see the module's docstring)."""

    def __init__(self, anchors: list[Anchor], micro_batches: int, iterations: int) -> None:
        self.anchors = anchors
        self.micro_batches = micro_batches  # gradients one run makes, per weight
        self.iterations = iterations  # optimiser steps one run makes
        self.available: dict[str, None] = {}  # the names asked about, in order (a set)

    @classmethod
    def of(cls, options: Any, default_mode: OutputMode, micro: int, steps: int) -> Anchors:
        anchors = [
            Anchor(
                short,
                a.long_name,
                default_mode if a.use_default_mode or a.output_mode is None else a.output_mode,
                a.output_return_period,
            )
            for short, a in options.anchored_tensors.items()
        ]
        return cls(anchors, micro, steps)

    def wanted(self, long_name: str) -> bool:
        self.available[long_name] = None
        return any(a.long == long_name for a in self.anchors)

    def gradient(self, weight: str, g: popxl.Tensor) -> None:
        self._capture(GRADIENT + weight, g, self.micro_batches)

    def weight(self, name: str, value: popxl.Tensor) -> None:
        """A weight, under its own name: the value each micro-batch's forward pass reads
        (before the step's update, which ``UpdatedVar___<name>`` gives)."""
        self._capture(name, value, self.micro_batches)

    def step(self, long_name: str, t: popxl.Tensor) -> None:
        """A tensor of the optimiser step (one per device iteration)."""
        self._capture(long_name, t, self.iterations)

    def _capture(self, long_name: str, t: popxl.Tensor, per_run: int) -> None:
        if not self.wanted(long_name):
            return
        for a in self.anchors:
            if a.long != long_name:
                continue
            if popxl.gcg() is not popxl.gcg().ir.main_graph:
                raise Error(STAGED_MSG.format(short=a.short, long=a.long), "poptorch_cpp_error")
            logger.debug("Anchoring tensor %s %s", a.long, a.label())
            if a.mode == OutputMode.Final:
                a.held = popxl.variable(
                    np.zeros(t.shape, t.dtype.as_numpy()), t.dtype, f"anchor/{a.short}"
                )
                ops.var_updates.copy_var_update_(a.held, t)
                continue
            shape = t.shape or (1,)
            a.scalar = not t.shape
            a.held = popxl.variable(
                np.zeros((per_run, *shape), t.dtype.as_numpy()), t.dtype, f"anchor/{a.short}"
            )
            counter = popxl.variable(np.zeros((1,), np.uint32), popxl.uint32, f"anchor/{a.short}/i")
            row = ops.reshape(t, (1, *shape))
            ops.dynamic_update_(a.held, counter, row, axes=[0], sizes=[1], no_overlap=True)
            ops.increment_mod_(counter, 1, per_run)

    def check(self) -> None:
        """Every anchor found a tensor (called once the program is built)."""
        for a in self.anchors:
            if a.held is None:
                names = ", ".join(sorted(self.available)) or "none (an inference program)"
                raise Error(
                    UNKNOWN_MSG.format(short=a.short, long=a.long, names=names),
                    "poptorch_cpp_error",
                )

    def variables(self) -> dict[str, popxl.Variable]:
        return {a.short: a.held for a in self.anchors if a.held is not None}

    def value(self, short: str, data: np.ndarray) -> np.ndarray:
        """What ``getAnchoredTensor`` returns from the variable's data."""
        a = next(a for a in self.anchors if a.short == short)
        if a.mode == OutputMode.Final:
            return data
        if a.scalar:
            data = data.reshape(data.shape[:1])
        if a.mode == OutputMode.Sum:
            return data.sum(axis=0)
        if a.mode == OutputMode.EveryN:
            return data[a.period - 1 :: a.period]
        return data
