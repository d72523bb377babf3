"""PopTorch's own ops as torch operators (``torch.ops.poptorch.*``).

They run eagerly on the CPU (so a model using them still runs in plain PyTorch) and appear
as single nodes in a captured graph, where the ATen table lowers them
(``_aten/poptorch_ops.py``). Imported on first use: ``import poptorch`` does not import
torch.
"""

from __future__ import annotations

import torch

REDUCTIONS = {0: "sum", 1: "mean", 2: "none"}


@torch.library.custom_op("poptorch::identity_loss", mutates_args=())
def identity_loss(x: torch.Tensor, reduction: int) -> torch.Tensor:
    """The loss ``x`` reduced (0: sum, 1: mean, 2: none), marked as the loss to minimise."""
    if reduction == 0:
        return x.sum()
    if reduction == 1:
        return x.mean()
    return x.clone()


@identity_loss.register_fake
def _identity_loss_fake(x: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == 2:
        return torch.empty_like(x)
    return x.new_empty(())


def _identity_loss_backward(ctx: object, grad: torch.Tensor) -> tuple:
    shape, reduction, numel = ctx.shape, ctx.reduction, ctx.numel  # type: ignore[attr-defined]
    if reduction == 2:
        return grad, None
    scale = 1.0 / numel if reduction == 1 else 1.0
    return (grad * scale).expand(shape), None


def _identity_loss_setup(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    x, reduction = inputs
    ctx.shape, ctx.reduction, ctx.numel = x.shape, reduction, x.numel()  # type: ignore[attr-defined]


identity_loss.register_autograd(_identity_loss_backward, setup_context=_identity_loss_setup)
