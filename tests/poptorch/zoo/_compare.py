"""Run a model through poptorch and eager torch from the same weights and compare.

``inference_error`` compares the outputs of ``poptorch.inferenceModel`` with the eager
model's (in eval mode); ``training_error`` compares one ``poptorch.trainingModel`` step's
weight updates with one eager ``loss.backward(); optimizer.step()``. Both return relative L2
errors over all the leaves, so a test states its tolerance.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

import poptorch

_DROP_ATTRIBUTES = ("p", "drop_prob", "drop_rate", "dropout", "attention_dropout")


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every dropout and drop-path probability set to zero (in place), so a
    training step is deterministic in both frameworks."""
    for module in model.modules():
        name = type(module).__name__.lower()
        if "drop" not in name and "stochasticdepth" not in name:
            continue
        for attr in _DROP_ATTRIBUTES:
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, 0.0)
    return model


def relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """``|got - want| / |want|`` over all the tensors together (L2)."""
    diff = sum(float((g.double() - w.double()).pow(2).sum()) for g, w in zip(got, want))
    norm = sum(float(w.double().pow(2).sum()) for w in want)
    return (diff / max(norm, 1e-30)) ** 0.5


def _tensors(out: Any) -> list[torch.Tensor]:
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        out = out.to_tuple()
    leaves = pytree.tree_leaves(out)
    return [
        t.detach().float() for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]


def inference_error(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None) -> float:
    """Relative error of poptorch's inference outputs against eager torch's."""
    kwargs = kwargs or {}
    model.eval()
    eager = copy.deepcopy(model)
    with torch.no_grad():
        eager_out = eager(*args, **kwargs)
    got = _tensors(poptorch.inferenceModel(model)(*args, **kwargs))
    want = _tensors(eager_out)  # after poptorch registered the output's types with pytree
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
    return relative(got, want)


def _loss(out: Any) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    return out[-1] if isinstance(out, (tuple, list)) else out


Optimizer = Callable[[Any], torch.optim.Optimizer]


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def _eager_step(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    optimizer: Optimizer,
    loss_of: Any,
    steps: int = 1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The last loss and the parameters after ``steps`` eager steps of (a copy of) ``model``."""
    opt = optimizer(model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(model(*args, **kwargs))
        loss.backward()
        opt.step()
    return loss.detach(), {n: p.detach() for n, p in model.named_parameters()}


def _double(value: Any) -> Any:
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.double() if t.is_floating_point() else t, value
    )


@dataclass
class Step:
    """One training step of a model through poptorch and eager torch."""

    loss_error: float  # poptorch's loss against eager torch's (relative)
    update_error: float  # poptorch's parameter updates against eager torch's (relative L2)
    # Against eager torch in float64, when asked for: poptorch's error and float32 eager
    # torch's error (how well float32 can do at all).
    update_error_float64: float | None = None
    eager_error_float64: float | None = None


def training_step(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: dict | None = None,
    optimizer: Optimizer = _sgd,
    loss_of: Callable[[Any], torch.Tensor] | None = None,
    float64: bool = False,
) -> Step:
    """One training step through poptorch and eager torch from the same weights.

    The model returns its loss (``loss_of(out)``; by default ``out.loss``, or its last
    output). With ``float64`` the updates are also compared with an eager step in float64.
    """
    kwargs = kwargs or {}
    loss_of = loss_of or _loss
    without_dropout(model).train()
    exact = copy.deepcopy(model).double() if float64 else None
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    want_loss, want = _eager_step(copy.deepcopy(model), args, kwargs, optimizer, loss_of)

    trainer = poptorch.trainingModel(model, optimizer=optimizer(model.parameters()))
    got_loss = loss_of(trainer(*args, **kwargs)).detach()
    trainer.copyWeightsToHost()
    got = {n: p.detach() for n, p in model.named_parameters()}
    trainer.detachFromDevice()
    names = [n for n, p in model.named_parameters() if p.requires_grad]

    def steps(params: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [params[n].double() - before[n].double() for n in names]

    step = Step(relative([got_loss], [want_loss]), relative(steps(got), steps(want)))
    if exact is not None:
        _, exact_params = _eager_step(exact, _double(args), _double(kwargs), optimizer, loss_of)
        step.update_error_float64 = relative(steps(got), steps(exact_params))
        step.eager_error_float64 = relative(steps(want), steps(exact_params))
    return step


@dataclass
class Steps:
    """Several training steps of a model through poptorch and eager torch."""

    loss_error: float  # the last loss, poptorch's against eager torch's (relative)
    moved_error: float  # the parameters' total movement, poptorch's against eager's
    # Eager torch from a copy with its weights nudged by float32 rounding (``nudged``) against
    # eager torch: how far rounding alone takes these steps.
    rounding: float


def _eager_steps(
    model: torch.nn.Module, args: tuple, kwargs: dict, optimizer: Optimizer, steps: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The last loss and each parameter's movement over ``steps`` eager steps of ``model``."""
    before = [p.detach().clone() for p in model.parameters()]
    loss, after = _eager_step(model, args, kwargs, optimizer, _loss, steps)
    return loss, [a.double() - b.double() for a, b in zip(after.values(), before)]


def several_steps(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: dict | None = None,
    optimizer: Optimizer = _sgd,
    reference: Optimizer | None = None,
    steps: int = 3,
) -> Steps:
    """``steps`` training steps through poptorch (``optimizer``) and eager torch
    (``reference``, by default the same) from the same weights, and from nudged weights in
    eager torch."""
    kwargs = kwargs or {}
    without_dropout(model).train()
    reference = reference or optimizer
    want_loss, want = _eager_steps(copy.deepcopy(model), args, kwargs, reference, steps)
    _, rounded = _eager_steps(nudged(model, seed=0), args, kwargs, reference, steps)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = poptorch.trainingModel(model, optimizer=optimizer(model.parameters()))
    for _ in range(steps):
        got_loss = _loss(trainer(*args, **kwargs)).detach()
    trainer.copyWeightsToHost()
    trainer.detachFromDevice()
    got = [p.detach().double() - b.double() for p, b in zip(model.parameters(), before)]
    return Steps(relative([got_loss], [want_loss]), relative(got, want), relative(rounded, want))


def training_errors(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: dict | None = None,
    optimizer: Optimizer = _sgd,
    loss_of: Callable[[Any], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """``training_step``'s loss and update errors against eager torch."""
    step = training_step(model, args, kwargs, optimizer, loss_of)
    return step.loss_error, step.update_error


def _float64_errors(step: Step) -> tuple[float, float]:
    """poptorch's and eager float32's distances from the float64 update."""
    assert step.update_error_float64 is not None and step.eager_error_float64 is not None
    return step.update_error_float64, step.eager_error_float64


def nudged(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with each floating weight moved at random by one unit in the last
    place up, down or not at all: the size of a float32 rounding error."""
    copied = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copied.parameters():
            if not p.is_floating_point():
                continue
            way = torch.randint(-1, 2, p.shape, generator=generator).to(p.dtype)
            p.copy_(torch.where(way == 0, p, torch.nextafter(p, way * torch.inf)))
    return copied


def assert_trains_as_eager(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: dict | None = None,
    loss_of: Callable[[Any], torch.Tensor] | None = None,
    tol: float = 1e-2,
    nudges: int = 3,
) -> list[Step]:
    """One step's loss (1e-4) and updates (``tol``, relative L2) agree with eager torch's.

    Some steps are ill-conditioned in float32 (``README.md``, "Ill-conditioned steps"): batch
    norm over a batch of two through 50 layers (ResNet-50), or one ReLU input within float32
    rounding of zero, whose gradient then goes either way. A step off by more than ``tol`` is
    retried from ``nudges`` copies of the weights each moved by float32 rounding (``nudged``),
    every side against eager torch in float64 from the same copy. It passes when poptorch's
    best update is within ``tol`` of float64's, or within 1.5 times the farthest eager
    float32 lands from it (how far float32 rounding alone can take this step): a real fault
    errs from every copy, rounding only from some, or by no more than eager's.
    """
    pristine = copy.deepcopy(model)
    first = training_step(model, args, kwargs, loss_of=loss_of)
    assert first.loss_error < 1e-4, first
    if first.update_error < tol:
        return [first]
    steps = [
        training_step(nudged(pristine, seed), args, kwargs, loss_of=loss_of, float64=True)
        for seed in range(nudges)
    ]
    best = min(_float64_errors(s)[0] for s in steps)
    rounding = max(_float64_errors(s)[1] for s in steps)
    assert best < max(tol, 1.5 * rounding), (first, steps)
    return [first, *steps]
