"""Run a model through poptorch and eager torch from the same weights and compare.

``inference_error`` compares the outputs of ``poptorch.inferenceModel`` with the eager
model's (in eval mode); ``training_error`` compares one ``poptorch.trainingModel`` step's
weight updates with one eager ``loss.backward(); optimizer.step()``. Both return relative L2
errors over all the leaves, so a test states its tolerance.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
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


def training_errors(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: dict | None = None,
    optimizer: Optimizer = _sgd,
    loss_of: Callable[[Any], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """One training step through poptorch and eager torch from the same weights.

    The model returns its loss (``loss_of(out)``; by default ``out.loss``, or its last
    output). Returns the loss's
    relative error and the relative error of the parameter updates (all parameters
    together), each against eager torch's.
    """
    kwargs = kwargs or {}
    loss_of = loss_of or _loss
    without_dropout(model).train()
    eager = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    opt = optimizer(eager.parameters())
    want_loss = loss_of(eager(*args, **kwargs))
    want_loss.backward()
    opt.step()

    trainer = poptorch.trainingModel(model, optimizer=optimizer(model.parameters()))
    got_loss = loss_of(trainer(*args, **kwargs))
    trainer.copyWeightsToHost()
    got = dict(model.named_parameters())
    names = [n for n, p in eager.named_parameters() if p.requires_grad]
    want_steps = [eager.get_parameter(n).detach() - before[n] for n in names]
    got_steps = [got[n].detach() - before[n] for n in names]
    trainer.detachFromDevice()
    return relative([got_loss.detach()], [want_loss.detach()]), relative(got_steps, want_steps)
