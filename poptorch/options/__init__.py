"""``poptorch.Options``: how a model is compiled and run.

* ``core``: ``Options`` itself, with PopTorch's fluent setters;
* ``groups``: its sub-objects (``Training``, ``Precision``, ``TensorLocations``,
  ``Distributed``, ``Jit``);
* ``base``: the freezing, attribute errors and argument checks they share;
* ``popart``: the option dictionary PopTorch's backend received (``toDict``);
* ``text``: options written as text (``loadFromFile``, ``POPTORCH_DEFAULT_OPTIONS``).
"""

from __future__ import annotations

from .base import ConfigFileError as ConfigFileError
from .base import OptionValueError as OptionValueError
from .core import Options as Options
from .core import batches_per_call as batches_per_call
from .core import resolved_output_mode as resolved_output_mode
from .groups import AnchoredTensor as AnchoredTensor
from .groups import TensorLocationSettings as TensorLocationSettings
from .groups import _DistributedOptions as _DistributedOptions
from .groups import distributed_env as distributed_env

__all__ = [
    "AnchoredTensor",
    "ConfigFileError",
    "OptionValueError",
    "Options",
    "TensorLocationSettings",
    "batches_per_call",
    "distributed_env",
    "resolved_output_mode",
]
