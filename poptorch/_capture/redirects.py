"""torch functions whose PopTorch meaning differs from torch's, redirected while capturing.

``torch.bincount``'s output length depends on the data, which a compiled program cannot
have; PopTorch required ``minlength`` and used it as the output length. ``ctc_loss``'s
output shape is fixed but torch's meta reads the lengths (given as lists or tensors). While
a model is exported, a ``TorchFunctionMode`` sends such calls to ``poptorch::`` ops with a
fixed shape (lowered by records in ``poptorch/_aten/``), or refuses them with PopTorch's
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


_CTC_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # torch.ctc_loss's integer codes


def _lengths(lengths: Any) -> torch.Tensor:
    """A batch's lengths as a 1-D int64 tensor (a list becomes a constant)."""
    if isinstance(lengths, torch.Tensor):
        return lengths.reshape(-1).long()
    return torch.tensor(list(lengths), dtype=torch.int64)


def _ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: Any,
    target_lengths: Any,
    blank: int = 0,
    reduction: str | int = "mean",
    zero_infinity: bool = False,
) -> torch.Tensor:
    """``ctc_loss`` as ``poptorch::ctc_loss``: lengths as tensors, an unbatched ``(T, C)``
    input as a batch of one."""
    if isinstance(reduction, int):
        reduction = _CTC_REDUCTIONS[reduction]
    unbatched = log_probs.dim() == 2
    if unbatched:
        log_probs, targets = log_probs.unsqueeze(1), targets.unsqueeze(0)
    loss = _torch_ops.ctc_loss(
        log_probs,
        targets,
        _lengths(input_lengths),
        _lengths(target_lengths),
        int(blank),
        reduction,
        bool(zero_infinity),
    )
    return loss.squeeze(0) if unbatched and reduction == "none" else loss


_CTC = (torch.nn.functional.ctc_loss, torch.ctc_loss)


class Redirects(TorchFunctionMode):
    """Active while torch.export traces the model (see the module's docstring)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _BINCOUNT:
            return _bincount(*args, **kwargs)
        if func in _CTC:
            return _ctc_loss(*args, **kwargs)
        return func(*args, **kwargs)
