"""The reference: the program's model run by eager PyTorch on the CPU, with PopTorch's
documented semantics applied where a poptorch call differs from one eager call.

* A call's inputs hold ``device_iterations x accumulation x replicas`` micro-batches along
  dim 0, in that order (replica innermost); the model runs once per micro-batch.
* Training: each device iteration is one optimiser step on the mean of the gradients of
  its ``accumulation x replicas`` micro-batches (``ReductionType.Mean``, PopTorch's
  default; ``Sum`` if asked), each taken with the weights of the step's start.
* The output mode picks what a call returns: ``All`` every micro-batch's results
  (concatenated along dim 0, scalars stacked), ``Final`` the last device iteration's last
  micro-batch of each replica, ``Sum`` each replica's sum over the call, ``EveryN`` every
  micro-batch of each N-th device iteration. ``Default`` is ``All`` for inference and
  ``Final`` for training.
"""

from __future__ import annotations

import contextlib
import functools
import types
from dataclasses import dataclass
from typing import Any

import torch
import torch._decomp
from torch.utils._python_dispatch import TorchDispatchMode

from .program import Mode, Program, make_inputs, make_model

# The optimiser constructors a program may name, evaluated over ``params``.
OPTIMIZER_NAMESPACE = {"torch": torch}


@dataclass
class Result:
    """What a run produced: each call's returned tensors (flattened in return order) and
    the model's parameters and buffers after each call."""

    calls: list[list[torch.Tensor]]
    states: list[dict[str, torch.Tensor]]
    inputs: list[list[torch.Tensor]]  # each call's inputs afterwards (in-place writes)
    gradless: frozenset[str] = frozenset()  # trainable parameters no step gave a gradient


def flatten(value: object) -> list[torch.Tensor]:
    """The tensors of a returned tuple/list/dict/tensor, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for v in value for t in flatten(v)]


def micro_batches(tensors: list[torch.Tensor], count: int) -> list[list[torch.Tensor]]:
    """Split each input along dim 0 into ``count`` equal micro-batches."""
    split = [t.chunk(count) for t in tensors]
    return [[s[k] for s in split] for k in range(count)]


def select(per_micro: list[list[torch.Tensor]], program: Program) -> list[torch.Tensor]:
    """The outputs a call returns, from each micro-batch's outputs (see the module doc)."""
    mode = program.mode
    kind = mode.output_mode
    if kind == "Default":
        kind = "All" if mode.kind == "inference" else "Final"
    per_iter = mode.accumulation * mode.replicas
    r = mode.replicas
    if kind == "All":
        chosen = range(len(per_micro))
    elif kind == "Final":
        chosen = range(len(per_micro) - r, len(per_micro))
    elif kind == "EveryN":
        n = mode.output_period
        its = [d for d in range(mode.device_iterations) if (d + 1) % n == 0]
        chosen = [d * per_iter + j for d in its for j in range(per_iter)]
    else:
        sums = [_sum([per_micro[k] for k in range(rep, len(per_micro), r)]) for rep in range(r)]
        return [_join([s[i] for s in sums]) for i in range(len(sums[0]))]
    rows = [per_micro[k] for k in chosen]
    return [_join([row[i] for row in rows]) for i in range(len(rows[0]))]


def _sum(rows: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [functools.reduce(torch.add, [row[i] for row in rows]) for i in range(len(rows[0]))]


def _join(parts: list[torch.Tensor]) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0]
    if parts[0].dim() == 0:
        return torch.stack(parts)
    return torch.cat(parts)


def make_optimizer(source: str, params: object) -> torch.optim.Optimizer:
    import poptorch  # noqa: PLC0415

    return eval(source, {**OPTIMIZER_NAMESPACE, "poptorch": poptorch, "params": list(params)})  # noqa: S307


def _identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    return {"sum": torch.sum, "mean": torch.mean, "none": lambda t: t}[reduction](x)


def _for_loop(count: int, body: object, inputs: list) -> list:
    for _ in range(count):
        out = body(*inputs)
        inputs = list(out) if isinstance(out, (list, tuple)) else [out]
    return inputs


def _cond(
    condition: torch.Tensor,
    then_body: object,
    then_inputs: list,
    else_body: object,
    else_inputs: list,
) -> list:
    out = then_body(*then_inputs) if bool(condition) else else_body(*else_inputs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


# PopTorch's ops as plain torch, so the reference model runs none of poptorch's code: the
# loss marker reduces, the device loop and branch run in Python, a block is its module.
# (poptorch.optim's optimisers are torch optimisers; LAMB's step is poptorch's own.)
EAGER_POPTORCH = types.SimpleNamespace(
    identity_loss=_identity_loss,
    for_loop=_for_loop,
    cond=_cond,
    BeginBlock=lambda module, *args, **kwargs: module,
)


def run_eager(
    program: Program, float64: bool = False, nudge: bool = False, decomposed: bool = False
) -> Result:
    """Every call of the program in eager PyTorch. The arbiters of a disagreement (see
    ``runner.check``): with ``float64`` its floating weights and inputs in float64; with
    ``nudge`` each floating input moved by about one rounding error of its dtype; with
    ``decomposed`` each op that has one computed by torch's own Python decomposition
    (``torch._decomp``) instead of its native kernel."""
    with _Decomposed() if decomposed else contextlib.nullcontext():
        return _run_eager(program, float64, nudge)


class _Decomposed(TorchDispatchMode):
    """Eager torch with each op that has a decomposition in ``torch._decomp`` computed by
    it (one level: the decomposition's own ops run natively). Autograd is unchanged: the
    derivative formulas stay torch's, only the kernels' arithmetic is the decomposed one
    (GroupNorm as ``(x - mean) * rstd`` rather than the native kernel's fused
    ``x * scale + shift``)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch._decomp.decomposition_table

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        decomposition = self.table.get(func)
        if decomposition is not None:
            try:
                out = decomposition(*args, **kwargs)
            except Exception:  # noqa: BLE001 (a decomposition eager cannot run: the kernel)
                out = NotImplemented
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def _run_eager(program: Program, float64: bool, nudge: bool) -> Result:
    model = make_model(program, {"poptorch": EAGER_POPTORCH})
    if float64:
        model = model.double()
    mode = program.mode
    optimizer = (
        make_optimizer(mode.optimizer, model.parameters()) if mode.kind == "training" else None
    )
    calls, states, written = [], [], []
    for c in range(mode.calls):
        if c == 1 and mode.set_optimizer:
            set_learning_rate(optimizer, mode.set_optimizer)
        call_inputs = make_inputs(program, c)
        if float64:
            call_inputs = [t.double() if t.is_floating_point() else t for t in call_inputs]
        if nudge:
            call_inputs = [_nudged(t, c) for t in call_inputs]
        inputs = micro_batches(call_inputs, mode.micro_batches())
        if optimizer is None:
            with torch.no_grad():
                per_micro = [flatten(model(*mb)) for mb in inputs]
        else:
            per_micro = _train_call(model, optimizer, inputs, mode)
        calls.append([t.detach() for t in select(per_micro, program)])
        states.append(state_of(model))
        written.append(call_inputs)
    gradless = (
        frozenset(n for n, p in model.named_parameters() if p.requires_grad and p.grad is None)
        if optimizer is not None
        else frozenset()
    )
    return Result(calls, states, written, gradless)


def _nudged(t: torch.Tensor, call: int) -> torch.Tensor:
    """``t`` with each element moved by a few units in the last place at most (seeded)."""
    if not t.is_floating_point():
        return t
    gen = torch.Generator().manual_seed(7919 + call)
    shift = (torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1) * 4
    return (t.double() * (1 + shift * torch.finfo(t.dtype).eps)).to(t.dtype)


def _train_call(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: list, mode: Mode
) -> list[list[torch.Tensor]]:
    """One optimiser step per ``accumulation * replicas`` micro-batches, reduced as PopTorch's
    ``MeanReductionStrategy.Post`` does: each micro-batch's gradient is that of the loss
    times the loss scaling (the backward's seed, in the loss's dtype), the gradients are
    summed in float32, and the sum is unscaled and divided once before the step. (Dividing
    the loss first, as eager torch users do, overflows later in float16: a program whose
    float16 gradients overflow then differs from PopTorch's on purpose, program 8000024025.)"""
    per_step = mode.accumulation * mode.replicas
    scaling = float(getattr(optimizer, "loss_scaling", 1.0))
    unscale = gradient_divisor(mode) * scaling
    params = [p for p in model.parameters() if p.requires_grad]
    per_micro = []
    for start in range(0, len(inputs), per_step):
        optimizer.zero_grad()
        sums: dict[int, torch.Tensor] = {}
        for mb in inputs[start : start + per_step]:
            out = flatten(model(*mb))
            loss = out[-1]
            if loss.requires_grad:  # else no parameter reaches the loss: all are gradless
                seed = torch.full_like(loss, scaling)
                grads = torch.autograd.grad(loss, params, seed, allow_unused=True)
                for i, g in enumerate(grads):
                    if g is not None:
                        wide = g.to(torch.promote_types(g.dtype, torch.float32))
                        sums[i] = sums[i] + wide if i in sums else wide
            per_micro.append([t.detach() for t in out])
        for i, total in sums.items():
            params[i].grad = (total / unscale).to(params[i].dtype)
        optimizer.step()
    return per_micro


def gradient_divisor(mode: Mode) -> int:
    """What the sum of a step's micro-batch gradients is divided by: their number for
    ``ReductionType.Mean``, 1 for ``Sum``."""
    return mode.accumulation * mode.replicas if mode.reduction == "Mean" else 1


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: str) -> None:
    for group in optimizer.param_groups:
        group["lr"] = float(lr)


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
