"""PopTorch's own ops as torch operators (``torch.ops.poptorch.*``).

They run eagerly on the CPU (so a model using them still runs in plain PyTorch) and appear
as single nodes in a captured graph, where the ATen table lowers them
(``_aten/poptorch_ops.py``). Imported on first use: ``import poptorch`` does not import
torch.
"""

from __future__ import annotations

from typing import Any

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


# Identity-like ops: eager they return a copy, captured they become one marked op each. --------


@torch.library.custom_op("poptorch::ipu_print_tensor", mutates_args=())
def ipu_print_tensor(
    x: torch.Tensor,
    title: str,
    print_gradient: int,
    summarise_threshold: int,
    edge_items: int,
    max_line_width: int,
    digits: int,
    float_format: int,
    separator: str,
    open_bracket: str,
    close_bracket: str,
) -> torch.Tensor:
    """Eagerly (plain PyTorch) the input; on the device it prints the tensor each run."""
    return x.clone()


@torch.library.custom_op("poptorch::nop", mutates_args=())
def nop(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("poptorch::set_available_memory", mutates_args=())
def set_available_memory(x: torch.Tensor, proportion: float) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("poptorch::recomputation_checkpoint", mutates_args=())
def recomputation_checkpoint(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("poptorch::set_matmul_serialization", mutates_args=())
def set_matmul_serialization(
    x: torch.Tensor, mode: str, factor: int, keep_precision: bool
) -> torch.Tensor:
    return x.clone()


def _identity_fake(x: torch.Tensor, *_: object) -> torch.Tensor:
    return torch.empty_like(x)


def _identity_backward(ctx: object, grad: torch.Tensor) -> tuple:
    return (grad, *([None] * ctx.extra))  # type: ignore[attr-defined]


def _identity_setup(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    ctx.extra = len(inputs) - 1  # type: ignore[attr-defined]


for _op in (
    ipu_print_tensor,
    nop,
    set_available_memory,
    recomputation_checkpoint,
    set_matmul_serialization,
):
    _op.register_fake(_identity_fake)
    _op.register_autograd(_identity_backward, setup_context=_identity_setup)


# Dynamic slicing: the start is a tensor (known on the device only). ----------------------------


@torch.library.custom_op("poptorch::dynamic_slice", mutates_args=())
def dynamic_slice(
    x: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int
) -> torch.Tensor:
    begin = int(start.reshape(-1)[0])
    return x.narrow(dim, begin, size)[
        (slice(None),) * (dim % x.dim()) + (slice(None, None, step),)
    ].clone()


@dynamic_slice.register_fake
def _dynamic_slice_fake(
    x: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int
) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = (size + step - 1) // step
    return x.new_empty(shape)


@torch.library.custom_op("poptorch::dynamic_update", mutates_args=())
def dynamic_update(
    x: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
) -> torch.Tensor:
    out = x.clone()
    begin = int(start.reshape(-1)[0])
    out.narrow(dim, begin, size).copy_(src.narrow(dim, 0, size))
    return out


@dynamic_update.register_fake
def _dynamic_update_fake(
    x: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
) -> torch.Tensor:
    return torch.empty_like(x)


def _slice_setup(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    x, dim, start, size, step = inputs
    ctx.shape, ctx.dim, ctx.begin, ctx.size, ctx.step = (  # type: ignore[attr-defined]
        x.shape,
        dim % x.dim(),
        int(start.reshape(-1)[0]),
        size,
        step,
    )


def _slice_backward(ctx: object, grad: torch.Tensor) -> tuple:
    c: Any = ctx
    dx = grad.new_zeros(c.shape)
    index = (slice(None),) * c.dim + (slice(c.begin, c.begin + c.size, c.step),)
    dx[index] = grad
    return dx, None, None, None, None


dynamic_slice.register_autograd(_slice_backward, setup_context=_slice_setup)


def _update_setup(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    x, src, dim, start, size = inputs
    ctx.dim, ctx.begin, ctx.size, ctx.src_shape = (  # type: ignore[attr-defined]
        dim % x.dim(),
        int(start.reshape(-1)[0]),
        size,
        src.shape,
    )


def _update_backward(ctx: object, grad: torch.Tensor) -> tuple:
    c: Any = ctx
    dx = grad.clone()
    dx.narrow(c.dim, c.begin, c.size).zero_()
    dsrc = grad.new_zeros(c.src_shape)
    dsrc.narrow(c.dim, 0, c.size).copy_(grad.narrow(c.dim, c.begin, c.size))
    return dx, dsrc, None, None, None


dynamic_update.register_autograd(_update_backward, setup_context=_update_setup)
