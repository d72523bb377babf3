"""torch functions whose PopTorch meaning differs from torch's, redirected while capturing.

``torch.bincount``'s output length depends on the data, which a compiled program cannot
have; PopTorch required ``minlength`` and used it as the output length. While a model is
exported, a ``TorchFunctionMode`` sends such calls to ``poptorch::`` ops with a fixed shape
(lowered by records in ``poptorch/_aten/poptorch_ops.py``), or refuses them with PopTorch's
message.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import _torch_ops
from ..errors import Error

BINCOUNT_MSG = (
    "Bincount `minlength` must be specified and must be a constant. On the IPU MK2 platform "
    "the minimum length is also the maximum length: pass minlength=N to torch.bincount."
)

_BINCOUNT = (torch.bincount, torch.Tensor.bincount)


def _bincount(
    x: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0
) -> torch.Tensor:
    if not isinstance(minlength, int) or minlength <= 0:
        raise Error(BINCOUNT_MSG, "poptorch", "capture")
    return _torch_ops.bincount(x, weights, minlength)


class Redirects(TorchFunctionMode):
    """Active while torch.export traces the model (see the module's docstring)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _BINCOUNT:
            return _bincount(*args, **kwargs)
        return func(*args, **kwargs)
