"""Run a program through poptorch and through the eager reference, and compare them.

Tolerances come from the dtypes a program computes in (a unit roundoff per dtype) and the
op classes it uses (how many roundings an output element accumulates), never from one
case. A program poptorch refuses at capture is a *refusal*, accepted when the error names
the op or the model's line and the user's model is unchanged.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

import poptorch

from ..differential.runner import Outcome
from .program import FLOATS, Input, Mode, Program, make_inputs, make_model
from .reference import Result, flatten, make_optimizer, run_eager, set_learning_rate, state_of

__all__ = ["Outcome", "Refusal", "assert_agrees", "check", "compare", "run_poptorch", "tolerance"]

# Unit roundoff of each float dtype.
ROUNDOFF = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
# How many roundings an element of each op class accumulates, relative to one
# elementwise op (reductions and contractions sum many terms, norms divide by a
# computed deviation, recurrences repeat).
OP_CLASS = {
    "elementwise": 8,
    "activation": 8,
    "view": 1,
    "index": 1,
    "creation": 1,
    "reduce": 32,
    "matmul": 64,
    "conv": 64,
    "pool": 16,
    "norm": 128,
    "loss": 64,
    "attention": 128,
    "rnn": 256,
    "embedding": 1,
    "structure": 8,
    "dtype": 8,
}
# Weights after optimiser steps: adaptive optimisers divide by a root mean square, so a
# gradient's relative error reaches the step almost unscaled.
OPTIMIZER_CLASS = {"SGD": 4, "Adam": 16, "AdamW": 16, "RMSprop": 16, "LAMB": 16, "Adagrad": 16}


# Faults found and kept in ``found_faults.py`` awaiting a fix, as (label, whether a
# program's mode and failure message are that fault's): the campaign counts them apart.
# Empty while no fault is open.
KNOWN_FAULTS: tuple[tuple[str, Callable[[Mode, str], bool]], ...] = ()


@dataclass
class Refusal:
    """poptorch refused the program at capture, as it should refuse invalid programs."""

    program: Program
    reason: str


@dataclass
class IllConditioned:
    """poptorch and eager torch disagree, but rounding alone moves eager torch's result as
    far (a normalisation of values that cancel to nearly zero): see ``_rounding_decides``."""

    program: Program
    message: str


def tolerance(program: Program, dtype: str) -> tuple[float, float]:
    """(rtol, atol relative to the value's magnitude) for a value of ``dtype``."""
    if dtype not in FLOATS:
        return 0.0, 0.0
    dtypes = {i.spec.dtype for i in program.inputs} | {
        s.spec.dtype for s in program.stmts if s.spec is not None
    }
    lowest = max((ROUNDOFF[d] for d in dtypes | {dtype} if d in ROUNDOFF), default=ROUNDOFF[dtype])
    families = [s.family for s in program.stmts] or list(program.families)
    factor = max((OP_CLASS[f] for f in families), default=8)
    if program.mode.kind == "training":
        name = program.mode.optimizer.split("(")[0].rsplit(".", 1)[-1]
        factor *= OPTIMIZER_CLASS[name] * program.mode.calls
    rtol = min(lowest * factor, 0.2)
    return rtol, rtol


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> str | None:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != reference {want.dtype}"
    if rtol == 0:
        if torch.equal(got, want):
            return None
        return f"values differ:\n  got  {got.flatten()[:12].tolist()}\n  want {want.flatten()[:12].tolist()}"
    g, w = got.double(), want.double()
    finite = w[torch.isfinite(w)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    if torch.allclose(g, w, rtol=rtol, atol=atol * scale, equal_nan=True):
        return None
    diff = (g - w).abs().flatten().nan_to_num(float("inf"))
    k = int(diff.argmax())
    return (
        f"values differ (rtol {rtol:.2g}, atol {atol * scale:.2g}):\n"
        f"  got  {got.flatten()[:8].tolist()}\n  want {want.flatten()[:8].tolist()}\n"
        f"  worst: element {k}, got {got.flatten()[k].item()}, want {want.flatten()[k].item()}"
    )


# The IPU has no 64-bit types: PopTorch returns int64 and float64 results as 32-bit ones.
RETURNED_AS = {torch.int64: torch.int32, torch.float64: torch.float32}


def compare(program: Program, got: Result, want: Result) -> str | None:
    """The first difference between poptorch's results and the reference's, if any."""
    for c, (outs, refs) in enumerate(zip(got.calls, want.calls)):
        if len(outs) != len(refs):
            return f"call {c}: {len(outs)} outputs, reference {len(refs)}"
        for i, (o, r) in enumerate(zip(outs, refs)):
            r = r.to(RETURNED_AS.get(r.dtype, r.dtype))
            msg = _close(o, r, *tolerance(program, str(r.dtype).removeprefix("torch.")))
            if msg:
                return f"call {c} output {i}: {msg}"
    for c, (outs, refs) in enumerate(zip(got.inputs, want.inputs)):
        for i, (o, r) in enumerate(zip(outs, refs)):
            msg = _close(o, r, *tolerance(program, str(r.dtype).removeprefix("torch.")))
            if msg:
                return f"call {c} input {i} (written in place): {msg}"
    for c, (got_state, want_state) in enumerate(zip(got.states, want.states)):
        msg = _compare_state(program, got_state, want_state)
        if msg:
            return f"{msg} (after call {c})"
    return None


def _compare_state(program: Program, got: dict, want: dict) -> str | None:
    for name, want_value in want.items():
        if name not in got:
            return f"state {name}: missing after the run"
        dtype = str(want_value.dtype).removeprefix("torch.")
        msg = _close(got[name], want_value, *tolerance(program, dtype))
        if msg:
            return f"state {name}: {msg}"
    return None


def _options(program: Program) -> poptorch.Options:
    mode = program.mode
    opts = eval(mode.options_source(), {"poptorch": poptorch})  # noqa: S307 (our own source)
    if mode.accumulation > 1:
        opts.Training.gradientAccumulation(mode.accumulation)
    if mode.reduction != "Mean":
        reduction = getattr(poptorch.ReductionType, mode.reduction)
        opts.Training.accumulationAndReplicationReductionType(reduction)
    return opts


class CaptureError(Exception):
    """poptorch raised while capturing and compiling (a refusal, if it is a good one)."""

    def __init__(self, error: BaseException, unchanged: bool) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.unchanged = unchanged


def run_poptorch(program: Program) -> Result:
    """Every call of the program through a poptorch model; weights read back after each."""
    model = make_model(program)
    mode = program.mode
    opts = _options(program)
    before = state_of(model)
    optimizer = None
    try:
        if mode.kind == "training":
            optimizer = make_optimizer(mode.optimizer, model.parameters())
            pm = poptorch.trainingModel(model, opts, optimizer)
        else:
            pm = poptorch.inferenceModel(model, opts)
        pm.compile(*make_inputs(program, 0))
    except Exception as e:  # noqa: BLE001 (any refusal is judged by the caller)
        after = state_of(model)
        same = before.keys() == after.keys() and all(
            torch.equal(before[k], after[k]) for k in before
        )
        raise CaptureError(e, same) from e
    calls, states, written = [], [], []
    for c in range(mode.calls):
        if c == 1 and mode.set_optimizer:
            set_learning_rate(optimizer, mode.set_optimizer)
            pm.setOptimizer(optimizer)
        inputs = make_inputs(program, c)
        calls.append([t.detach().clone() for t in flatten(pm(*inputs))])
        pm.copyWeightsToHost()
        states.append(state_of(model))
        written.append(inputs)
    pm.destroy()
    return Result(calls, states, written)


def _names_the_op(program: Program, message: str) -> bool:
    """Whether a refusal's message says what was refused: an ATen op, the model's line,
    the input or weight (a dtype the IPU lacks), or the optimiser."""
    words = ["aten.", "aten::", "Model", "line ", "forward", "Input ", "Weight ", "Buffer "]
    if program.mode.optimizer:
        words.append(program.mode.optimizer.split("(")[0].rsplit(".", 1)[-1])
    return any(w in message for w in words)


def check(program: Program) -> Outcome | Refusal | IllConditioned | None:
    """Run one program both ways: ``None`` when they agree, a ``Refusal`` when poptorch
    refused it properly (a program eager torch cannot run either, such as a value-dependent
    shape summed over micro-batches, must be refused), ``IllConditioned`` when they
    disagree only as float32 rounding makes eager torch disagree with itself in float64,
    an ``Outcome`` (a disagreement or crash) otherwise."""
    try:
        want = run_eager(program)
    except Exception:  # noqa: BLE001 (valid only if poptorch refuses it too)
        want = None
        failed = "reference failed:\n" + traceback.format_exc(limit=-4)
    try:
        got = run_poptorch(program)
    except CaptureError as e:
        if not e.unchanged:
            return Outcome(program, f"refusal changed the user's model: {e}")
        if not _names_the_op(program, str(e)):
            return Outcome(program, f"refusal names no op or line: {e}")
        return Refusal(program, str(e))
    except Exception:  # noqa: BLE001 (any crash of a captured program is a finding)
        trace = traceback.format_exc(limit=-6)
        return _outcome(program, "poptorch failed:\n" + trace)
    if want is None:
        return Outcome(program, failed)
    msg = compare(program, got, want)
    if msg is None:
        return None
    if _rounding_decides(program, got, want):
        return IllConditioned(program, msg)
    return _outcome(program, msg)


def _rounding_decides(program: Program, got: Result, want: Result) -> bool:
    """Whether rounding alone moves eager torch's result as far: its float32 result is out
    of tolerance of its float64 one and poptorch's is no further from float64's; or inputs
    moved by one rounding error move eager's result out of tolerance and at least as far
    as poptorch's is (within 1.5 times, as the zoo accepts); or torch's own core ATen
    decompositions of its kernels give a result out of tolerance of its native kernels'
    and poptorch's agrees with it (torch disagrees with itself: a kernel's rounding
    decides, as when a normalisation of one value feeds a kink at 0)."""
    try:
        exact = run_eager(program, float64=True)
        nudged = run_eager(program, nudge=True)
        decomposed = run_eager(program, decomposed=True)
    except Exception:  # noqa: BLE001 (no arbiter: the disagreement stands)
        return False
    if compare(program, want, exact) is not None:
        if _distance(got, exact) <= 1.5 * _distance(want, exact):
            return True
    if compare(program, nudged, want) is not None:
        if _distance(got, want) <= 1.5 * _distance(nudged, want):
            return True
    return (
        compare(program, decomposed, want) is not None and compare(program, got, decomposed) is None
    )


def _distance(a: Result, b: Result) -> float:
    """The largest absolute difference between two runs' floating results."""
    pairs = [p for x, y in zip(a.calls, b.calls) for p in zip(x, y)]
    pairs += [p for x, y in zip(a.inputs, b.inputs) for p in zip(x, y)]
    pairs += [(x[k], y[k]) for x, y in zip(a.states, b.states) for k in x if k in y]
    worst = 0.0
    for x, y in pairs:
        if x.is_floating_point() and y.is_floating_point() and x.shape == y.shape:
            diff = (x.double() - y.double()).abs().nan_to_num(nan=float("inf"))
            worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst


def _outcome(program: Program, message: str) -> Outcome:
    """A finding, labelled as a known fault when it is one (``KNOWN_FAULTS``)."""
    for label, matches in KNOWN_FAULTS:
        if matches(program.mode, message):
            return Outcome(program, f"known fault ({label}): {message}")
    return Outcome(program, message)


def assert_agrees(
    source: str,
    inputs: list[Input],
    mode: Mode,
    seed: int,
    families: tuple[str, ...] = (),
    may_refuse: bool = True,
) -> None:
    """Fail unless poptorch runs the model of ``source`` as eager torch does, or refuses it
    properly where ``may_refuse`` (the check a kept case makes; see ``shrink.as_pytest``;
    a case of a wrong refusal passes ``may_refuse=False``)."""
    program = Program(seed, (), inputs, [], [], [], mode=mode, raw=source, families=families)
    result = check(program)
    assert not isinstance(result, Outcome), result.message if result else ""
    assert may_refuse or not isinstance(result, Refusal), f"refused: {result.reason}"
