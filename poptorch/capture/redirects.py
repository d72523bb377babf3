"""torch functions whose PopTorch meaning differs from torch's, redirected while capturing.

``torch.bincount``'s output length depends on the data, which a compiled program cannot
have; PopTorch required ``minlength`` and used it as the output length. ``one_hot`` needs
its class count for the same reason. ``ctc_loss``'s output shape is fixed but torch's meta reads the lengths (given as lists or tensors). While
a model is exported, a ``TorchFunctionMode`` sends such calls to ``poptorch::`` ops with a
fixed shape (lowered by records in ``poptorch/aten/``), or refuses them with PopTorch's
message. ``gaussian_nll_loss`` checks that no variance is negative with a Python ``if`` on
tensor values, which a compiled program cannot take (PopTorch's tracing did not take it
either): it runs without that check.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import Error
from ..ops import torch_ops as _torch_ops

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


ONE_HOT_MSG = "OneHot num classes must be specified and must be constant."

_ONE_HOT = (torch.nn.functional.one_hot,)


def _one_hot(x: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``one_hot`` with its class count given: without one, the output size is data-dependent."""
    if not isinstance(num_classes, int) or num_classes <= 0:
        raise Error(ONE_HOT_MSG, "poptorch", "capture")
    return torch.nn.functional.one_hot(x, num_classes)


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

VAR_SIZE_MSG = "var is of incorrect size"


def _variance_like(x: torch.Tensor, var: torch.Tensor | float) -> torch.Tensor:
    """``gaussian_nll_loss``'s variance broadcastable to ``x``, as torch shapes it: the same
    size, ``x``'s size without its last dim (a homoscedastic variance), or one dim of size
    1 where ``x``'s is not."""
    if not isinstance(var, torch.Tensor):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        return var * torch.ones_like(x)
    if var.shape == x.shape:
        return var
    if var.shape == x.shape[:-1]:
        return var.unsqueeze(-1)
    if var.dim() == x.dim() and sum(v for a, v in zip(x.shape, var.shape) if a != v) == 1:
        return var
    raise ValueError(VAR_SIZE_MSG)


def _gaussian_nll_loss(
    x: torch.Tensor,
    target: torch.Tensor,
    var: torch.Tensor | float,
    full: bool = False,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.gaussian_nll_loss`` without its value check (a variance below ``eps``, negative
    included, is clamped to ``eps``)."""
    var = _variance_like(x, var)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    # torch clamps under no_grad: the gradient passes the clamp as if it were not there.
    var = var + (var.clamp(min=eps) - var).detach()
    loss = 0.5 * (torch.log(var) + (x - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    if reduction == "none":
        return loss
    return loss.mean() if reduction == "mean" else loss.sum()


def _is_ipu(device: Any) -> bool:
    return (isinstance(device, str) and device.split(":")[0] == "ipu") or (
        isinstance(device, torch.device) and device.type == "ipu"
    )


def _on_capture_device(args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``device="ipu"`` (or ``.to("ipu")``) as the capture's own device."""
    if _is_ipu(kwargs.get("device")):
        kwargs = {**kwargs, "device": "cpu"}
    if any(_is_ipu(a) for a in args):
        args = tuple("cpu" if _is_ipu(a) else a for a in args)
    return args, kwargs


_F = torch.nn.functional
_WEIGHTED = (
    _F.linear,
    _F.bilinear,
    _F.conv1d,
    _F.conv2d,
    _F.conv3d,
    _F.conv_transpose1d,
    _F.conv_transpose2d,
    _F.conv_transpose3d,
)


def _in_activation_type(args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A weighted layer's floating-point tensors cast to its input's floating-point type."""
    x = args[0] if args else None
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return args, kwargs

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(x.dtype) if value.dtype != x.dtype else value
        return value

    return (x, *map(cast, args[1:])), {k: cast(v) for k, v in kwargs.items()}


@contextlib.contextmanager
def masks_as_given() -> Iterator[None]:
    """``torch.nn.Transformer*``'s causal-mask detection answering from ``is_causal`` only
    (see the module's docstring)."""
    from torch.nn.modules import transformer  # noqa: PLC0415

    detect = transformer._detect_is_causal_mask

    def from_flag(mask: Any, is_causal: bool | None = None, size: int | None = None) -> bool:
        return is_causal is True

    transformer._detect_is_causal_mask = from_flag
    try:
        yield
    finally:
        transformer._detect_is_causal_mask = detect


class Redirects(TorchFunctionMode):
    """Active while torch.export traces the model (see the module's docstring)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        args, kwargs = _on_capture_device(args, kwargs or {})
        if func in _WEIGHTED:
            args, kwargs = _in_activation_type(args, kwargs)
        if func in _BINCOUNT:
            return _bincount(*args, **kwargs)
        if func in _ONE_HOT:
            return _one_hot(*args, **kwargs)
        if func in _CTC:
            return _ctc_loss(*args, **kwargs)
        if func is _F.gaussian_nll_loss:
            return _gaussian_nll_loss(*args, **kwargs)
        return func(*args, **kwargs)
