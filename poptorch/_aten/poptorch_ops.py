"""PopTorch's own ops (``torch.ops.poptorch.*``, see ``poptorch._torch_ops``)."""

from __future__ import annotations

import torch

import popxl
from popxl import ops

from .. import _torch_ops  # noqa: F401 (registers torch.ops.poptorch)
from ._registry import NodeContext, lowering


@lowering(torch.ops.poptorch.identity_loss.default)
def _lower_identity_loss(ctx: NodeContext, x: popxl.Tensor, reduction: int) -> popxl.Tensor:
    """The loss reduced as asked; the last one marked is the loss ``trainingModel``
    differentiates."""
    if reduction == 0:
        loss = ops.sum(x) if x.rank else ops.identity(x)
    elif reduction == 1:
        loss = ops.mean(x) if x.rank else ops.identity(x)
    else:
        loss = ops.identity(x)
    ctx.translator.losses.append(loss)
    return loss
