"""The program's optimiser for a torch model's ``torch.optim`` / ``poptorch.optim`` optimiser.

Parameter groups hold torch parameters; the program names weights by their torch names, so
each group becomes the list of its parameters' names.
"""

from __future__ import annotations

from typing import Any

import torch

from . import optim

UNKNOWN_OPTIMIZER_MSG = (
    "Unsupported optimizer type {got}: use poptorch.optim (SGD, Adam, AdamW, RMSprop, LAMB) or "
    "torch.optim.SGD, Adam, AdamW or RMSprop."
)
FOREIGN_PARAM_MSG = (
    "The optimizer holds a parameter of shape {shape} that is not a parameter of the model "
    "being trained. Build the optimizer from model.parameters()."
)

_BY_NAME = {
    "SGD": optim.SGD,
    "Adam": optim.Adam,
    "AdamW": optim.AdamW,
    "RMSprop": optim.RMSprop,
    "LAMB": optim.LAMB,
}
_TORCH_ONLY_KEYS = {"params", "foreach", "maximize", "capturable", "differentiable", "fused", "initial_lr"}


def names_of(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def convert(optimizer: Any, model: torch.nn.Module) -> optim.Optimizer:
    """A ``poptorch.optim`` description of ``optimizer`` over ``model``'s parameter names."""
    if optimizer is None:
        return optim.SGD(lr=0.01)
    if isinstance(optimizer, optim.Optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    cls = _BY_NAME.get(type(optimizer).__name__)
    if cls is None or not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(UNKNOWN_OPTIMIZER_MSG.format(got=type(optimizer).__name__))
    ids = names_of(model)
    groups = []
    for group in optimizer.param_groups:
        names = []
        for p in group["params"]:
            if id(p) not in ids:
                raise ValueError(FOREIGN_PARAM_MSG.format(shape=tuple(p.shape)))
            names.append(ids[id(p)])
        hyper = {k: v for k, v in group.items() if k not in _TORCH_ONLY_KEYS}
        groups.append({"params": names, **hyper})
    return cls(groups)
