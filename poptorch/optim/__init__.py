"""``poptorch.optim``: PopTorch's optimisers and how a program's optimiser step is made.

* ``optimizers``: ``SGD``, ``Adam``, ``AdamW``, ``RMSprop``, ``LAMB`` and ``VariableAttributes``,
  the classes users construct;
* ``rules``: what the compiled step computes for each optimiser kind (a ``Spec``);
* ``convert``: reading a ``poptorch.optim`` or ``torch.optim`` optimiser into a ``Spec``;
* ``binding``: a torch model's optimiser bound to its parameters' names;
* ``link``: the optimiser of a compiled model, its hyper-parameters and state on the device.
"""

from __future__ import annotations

from .optimizers import LAMB as LAMB
from .optimizers import SGD as SGD
from .optimizers import Adam as Adam
from .optimizers import AdamW as AdamW
from .optimizers import Optimizer as Optimizer
from .optimizers import RMSProp as RMSProp
from .optimizers import RMSprop as RMSprop
from .optimizers import VariableAttributes as VariableAttributes

__all__ = ["VariableAttributes", "Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "RMSProp", "LAMB"]
