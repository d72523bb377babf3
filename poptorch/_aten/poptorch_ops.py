"""PopTorch's own ops (``torch.ops.poptorch.*``, see ``poptorch._torch_ops``)."""

from __future__ import annotations

from typing import Any

import torch

import popxl
from popxl import ops
from popxl._op import AMP_HINT
from popxl.ops import misc
from popxl.ops._base import record

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


_FLOAT_FORMATS = ("auto", "fixed", "scientific", "none")


@lowering(torch.ops.poptorch.ipu_print_tensor.default)
def _lower_ipu_print_tensor(
    ctx: NodeContext,
    x: popxl.Tensor,
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
) -> popxl.Tensor:
    """PopXL's ``PrintTensor`` op with PopTorch's formatting (its separators and brackets
    may be several characters, which popxl's public ``print_tensor`` does not accept)."""
    attrs = {
        "title": title,
        "print_self": True,
        "print_gradient": bool(print_gradient),
        "summarise_threshold": int(summarise_threshold),
        "edge_items": int(edge_items),
        "max_line_width": int(max_line_width),
        "digits": int(digits),
        "float_format": _FLOAT_FORMATS[float_format],
        "separator": separator,
        "open_bracket": open_bracket,
        "close_bracket": close_bracket,
    }
    return record(misc.PRINT_TENSOR, {"t": x}, attrs, ["print_out"])[0]


def _identity(x: Any) -> Any:
    return x


@lowering(torch.ops.poptorch.nop.default)
def _lower_nop(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    return ctx.jax("poptorch::nop", _identity, x)


@lowering(torch.ops.poptorch.recomputation_checkpoint.default)
def _lower_recomputation_checkpoint(ctx: NodeContext, x: popxl.Tensor) -> popxl.Tensor:
    return ctx.jax("poptorch::recomputation_checkpoint", _identity, x)


@lowering(torch.ops.poptorch.set_available_memory.default)
def _lower_set_available_memory(
    ctx: NodeContext, x: popxl.Tensor, proportion: float
) -> popxl.Tensor:
    """The hint goes on the op that made ``x`` (as PopART's ``availableMemoryProportion``)."""
    if not 0.0 <= proportion <= 1.0:
        raise ValueError(
            f"set_available_memory: the proportion must be between 0 and 1, got {proportion}."
        )
    producer = x._producer
    if producer is not None:
        producer.hints[AMP_HINT] = float(proportion)
    return x


@lowering(torch.ops.poptorch.set_matmul_serialization.default)
def _lower_set_matmul_serialization(
    ctx: NodeContext, x: popxl.Tensor, mode: str, factor: int, keep_precision: bool
) -> popxl.Tensor:
    producer = x._producer
    if producer is not None:
        producer.hints["serialization"] = (mode, int(factor), bool(keep_precision))
    return x


@lowering(torch.ops.poptorch.dynamic_slice.default)
def _lower_dynamic_slice(
    ctx: NodeContext, x: popxl.Tensor, dim: int, start: popxl.Tensor, size: int, step: int
) -> popxl.Tensor:
    d = dim % x.rank
    index = ops.reshape(ctx.tensor(start, popxl.uint32), (1,))
    sliced = ops.dynamic_slice(x, index, [d], [size], no_overlap=False)
    if step == 1:
        return sliced
    return ops.slice(sliced, [0], [size], [step], [d])


@lowering(torch.ops.poptorch.dynamic_update.default)
def _lower_dynamic_update(
    ctx: NodeContext, x: popxl.Tensor, src: popxl.Tensor, dim: int, start: popxl.Tensor, size: int
) -> popxl.Tensor:
    d = dim % x.rank
    index = ops.reshape(ctx.tensor(start, popxl.uint32), (1,))
    if src.shape[d] != size:
        src = ops.slice(src, [0], [size], [1], [d])
    return ops.dynamic_update(x, index, src, [d], [size], no_overlap=False)
