"""The optimiser of a torch model: a ``torch.optim`` or ``poptorch.optim`` optimiser over the
model's parameters, bound to their names (the program names weights as the model does).

``torch.optim.SGD``, ``Adam``, ``AdamW`` and ``RMSprop`` are read as PopTorch read them
(attributes left at torch's defaults are constants, ``lr`` is always variable); their
``state_dict()`` stays torch's own. ``poptorch.optim`` optimisers read their state from the
device (``poptorch.optim.Optimizer.state_dict``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._names import tree_key
from . import optimizers as optim
from .link import Bound


def names_of(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its name in ``model`` (as the program names its weights)."""
    return {id(p): tree_key(n) for n, p in model.named_parameters()}


def bind(optimizer: Any, model: torch.nn.Module) -> Bound:
    """``optimizer`` (None: PopTorch's default ``SGD(model.parameters(), lr=0.01)``) bound
    to ``model``'s parameter names."""
    if optimizer is None:
        optimizer = optim.SGD(model.parameters(), lr=0.01)
    return Bound(optimizer, names_of(model))
