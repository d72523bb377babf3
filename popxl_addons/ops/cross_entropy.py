"""Softmax cross-entropy, with or without its gradient."""

from __future__ import annotations

from typing import Literal

import popxl
from popxl import ops


def cross_entropy(
    x: popxl.Tensor,
    labels: popxl.Tensor,
    ignore_index: int | None = None,
    reduction: Literal["mean", "sum", "none"] = "mean",
) -> popxl.Tensor:
    """``nll_loss(softmax(x, -1), labels)``: x is ``(*dims, C)``, labels ``(*dims)`` ints."""
    probs = ops.softmax(x, axis=-1)
    return ops.nll_loss(probs, labels, ignore_index=ignore_index, reduction=reduction)


def cross_entropy_with_grad(
    x: popxl.Tensor,
    labels: popxl.Tensor,
    loss_scaling: float | popxl.Tensor = 1,
    ignore_index: int | None = None,
    reduction: Literal["mean", "sum", "none"] = "mean",
) -> tuple[popxl.Tensor, popxl.Tensor]:
    """The loss and its gradient w.r.t. the logits ``x``, to seed backpropagation.

    The loss is not scaled; the gradient is multiplied by ``loss_scaling``. With ``mean``
    both average over the labels that are not ``ignore_index``.
    """
    probs = ops.softmax(x, axis=-1)
    return ops.nll_loss_with_softmax_grad(probs, labels, loss_scaling, ignore_index, reduction)


__all__ = ["cross_entropy", "cross_entropy_with_grad"]
