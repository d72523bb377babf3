"""PopTorch's own ops as torch operators (``torch.ops.poptorch.*``).

They run eagerly on the CPU (so a model using them still runs in plain PyTorch) and appear
as single nodes in a captured graph, where the ATen table lowers them
(``poptorch/ops/lowerings.py``). Imported on first use: ``import poptorch`` does not import
torch.
"""

from __future__ import annotations

import json
from typing import Any

import torch

REDUCTIONS = {0: "sum", 1: "mean", 2: "none"}


# PopTorch's errors for misplaced overlap marks (checked by ``poptorch.capture.overlap``).
ONLY_OP_MSG = (
    "poptorch.set_overlap_for_input must be the only op applied to an input. This is not "
    "the case for input {index} to the model ({name}): use the tensor it returns instead "
    "of the input."
)
NOT_INPUT_MSG = (
    "poptorch.set_overlap_for_input applied on a node which is not a tensor input to the model."
)
RETURNED_TWICE_MSG = (
    "poptorch.set_overlap_for_output cannot be used with a tensor that is returned twice. "
    "Please check all returned tensors including those nested in tuples/lists."
)
NOT_OUTPUT_MSG = (
    "poptorch.set_overlap_for_output applied on a node which is not a tensor output to the model."
)


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


@torch.library.custom_op("poptorch::set_overlap_for_input", mutates_args=())
def set_overlap_for_input(x: torch.Tensor, mode: str) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("poptorch::set_overlap_for_output", mutates_args=())
def set_overlap_for_output(x: torch.Tensor, mode: str) -> torch.Tensor:
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
    set_overlap_for_input,
    set_overlap_for_output,
):
    _op.register_fake(_identity_fake)
    _op.register_autograd(_identity_backward, setup_context=_identity_setup)


# Dynamic slicing: the start is a tensor (known on the device only). ----------------------------


@torch.library.custom_op("poptorch::dynamic_slice", mutates_args=())
def dynamic_slice(
    x: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int
) -> torch.Tensor:
    begin = int(start.reshape(-1)[0])
    # Sizes the device program refuses (see the record) still run here, as empty slices.
    return x.narrow(dim, begin, max(size, 0))[
        (slice(None),) * (dim % x.dim()) + (slice(None, None, step),)
    ].clone()


@dynamic_slice.register_fake
def _dynamic_slice_fake(
    x: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int
) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = max(size + step - 1, 0) // step
    return x.new_empty(shape)


@torch.library.custom_op("poptorch::dynamic_update", mutates_args=())
def dynamic_update(
    x: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
) -> torch.Tensor:
    out = x.clone()
    begin = int(start.reshape(-1)[0])
    out.narrow(dim, begin, max(size, 0)).copy_(src.narrow(dim, 0, max(size, 0)))
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


# Control flow: markers around a body traced once (``poptorch.for_loop`` / ``poptorch.cond``).
# The capture turns the nodes between them into a popxl subgraph (``_capture/control.py``).
# Eagerly they copy their inputs; the Python functions never call them outside a capture.


def _clones(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


def _empties(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in tensors]


@torch.library.custom_op("poptorch::start_for_loop", mutates_args=())
def start_for_loop(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The loop body's inputs (copies: the body receives them by value)."""
    return _clones(inputs)


@torch.library.custom_op("poptorch::end_for_loop", mutates_args=())
def end_for_loop(
    outputs: list[torch.Tensor], body_inputs: list[torch.Tensor], count: int
) -> list[torch.Tensor]:
    """The loop's results: ``outputs`` after ``count`` iterations of the body."""
    return _clones(outputs)


@torch.library.custom_op("poptorch::start_if_block", mutates_args=())
def start_if_block(condition: torch.Tensor) -> torch.Tensor:
    return condition.clone()


@torch.library.custom_op("poptorch::start_else_block", mutates_args=())
def start_else_block(then_outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return _clones(then_outputs)


@torch.library.custom_op("poptorch::end_if_block", mutates_args=())
def end_if_block(
    then_outputs: list[torch.Tensor], else_outputs: list[torch.Tensor], condition: torch.Tensor
) -> list[torch.Tensor]:
    return _clones(then_outputs if bool(condition.reshape(-1)[0]) else else_outputs)


start_for_loop.register_fake(_empties)
start_else_block.register_fake(_empties)


@end_for_loop.register_fake
def _end_for_loop_fake(
    outputs: list[torch.Tensor], body_inputs: list[torch.Tensor], count: int
) -> list[torch.Tensor]:
    return _empties(outputs)


@start_if_block.register_fake
def _start_if_block_fake(condition: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(condition)


@end_if_block.register_fake
def _end_if_block_fake(
    then_outputs: list[torch.Tensor], else_outputs: list[torch.Tensor], condition: torch.Tensor
) -> list[torch.Tensor]:
    return _empties(then_outputs)


# Host callbacks (``poptorch.CPU``): the callable is found by ``token`` at run time. -----------

CPU_CALLBACKS: dict[int, Any] = {}


def _specs_from_json(out_specs: str) -> list[tuple[list[int], torch.dtype]]:
    return [(shape, getattr(torch, dtype)) for shape, dtype in json.loads(out_specs)]


def specs_to_json(tensors: Any) -> str:
    """Shapes and dtypes of ``tensors`` as the ``out_specs`` string of an op's schema."""
    return json.dumps([[list(t.shape), str(t.dtype).replace("torch.", "")] for t in tensors])


@torch.library.custom_op("poptorch::call_cpu_op", mutates_args=())
def call_cpu_op(
    inputs: list[torch.Tensor], cpu_id: str, token: int, out_specs: str
) -> list[torch.Tensor]:
    """The outputs of the host function registered as ``token`` (called eagerly)."""
    outs = CPU_CALLBACKS[token](*inputs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    return [o.detach().clone() for o in outs]


@call_cpu_op.register_fake
def _call_cpu_op_fake(
    inputs: list[torch.Tensor], cpu_id: str, token: int, out_specs: str
) -> list[torch.Tensor]:
    return [torch.empty(shape, dtype=dtype) for shape, dtype in _specs_from_json(out_specs)]


# Custom ops from the popxl registry (``poptorch.custom_op``). ---------------------------------


@torch.library.custom_op("poptorch::custom_operation", mutates_args=())
def custom_operation(
    inputs: list[torch.Tensor],
    name: str,
    domain: str,
    domain_version: int,
    out_specs: str,
    attributes: str,
) -> list[torch.Tensor]:
    """Eagerly: the registered op's JAX implementation on the CPU."""
    from popxl import custom_ops  # noqa: PLC0415

    op = custom_ops.get(name, domain, domain_version)
    attrs = op.check_attributes(json.loads(attributes))
    outs = op.lower(*(_to_jax(t) for t in inputs), **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [_from_jax(o, dtype) for o, (_, dtype) in zip(outs, _specs_from_json(out_specs))]


@custom_operation.register_fake
def _custom_operation_fake(
    inputs: list[torch.Tensor],
    name: str,
    domain: str,
    domain_version: int,
    out_specs: str,
    attributes: str,
) -> list[torch.Tensor]:
    return [torch.empty(shape, dtype=dtype) for shape, dtype in _specs_from_json(out_specs)]


def _to_jax(t: torch.Tensor) -> Any:
    import jax.numpy as jnp  # noqa: PLC0415

    return jnp.asarray(t.detach().cpu().numpy())


def _from_jax(a: Any, dtype: torch.dtype) -> torch.Tensor:
    import numpy as np  # noqa: PLC0415

    return torch.from_numpy(np.array(a)).to(dtype)


def _custom_operation_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.save_for_backward(*inputs[0])
    ctx.key = inputs[1:4]
    ctx.attributes = inputs[5]


def _custom_operation_backward(ctx: Any, grads: list[torch.Tensor]) -> tuple:
    """Eager gradient: JAX's VJP of the op (the registered one, if any)."""
    import jax  # noqa: PLC0415

    from popxl import custom_ops  # noqa: PLC0415

    op = custom_ops.get(*ctx.key)
    attrs = op.check_attributes(json.loads(ctx.attributes))
    xs = ctx.saved_tensors
    outs, pullback = jax.vjp(lambda *a: op.lower(*a, **attrs), *(_to_jax(x) for x in xs))
    single = not isinstance(outs, tuple)
    cots = [_to_jax(g).astype(o.dtype) for g, o in zip(grads, (outs,) if single else outs)]
    dxs = pullback(cots[0] if single else tuple(cots))
    return (
        [_from_jax(d, x.dtype) if x.is_floating_point() else None for d, x in zip(dxs, xs)],
        None,
        None,
        None,
        None,
        None,
    )


custom_operation.register_autograd(
    _custom_operation_backward, setup_context=_custom_operation_setup
)


# CTC beam search decoding (inference only). ----------------------------------------------------


@torch.library.custom_op("poptorch::ctc_beam_search_decoder", mutates_args=())
def ctc_beam_search_decoder(
    probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_width: int, top_paths: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eagerly: the device decoder (``_aten.poptorch_ops.ctc_beam_search``) run by JAX."""
    from .ctc_search import ctc_beam_search  # noqa: PLC0415 (JAX when the op runs)

    log_probs, path_lengths, paths = ctc_beam_search(
        _to_jax(probs.float()), _to_jax(lengths.int()), blank, beam_width, top_paths
    )
    return (
        _from_jax(log_probs, probs.dtype),
        _from_jax(path_lengths, torch.int32),
        _from_jax(paths, torch.int32),
    )


@ctc_beam_search_decoder.register_fake
def _ctc_fake(
    probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_width: int, top_paths: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    steps, batch, _ = probs.shape
    return (
        probs.new_empty((batch, top_paths)),
        torch.empty((batch, top_paths), dtype=torch.int32),
        torch.empty((batch, top_paths, steps), dtype=torch.int32),
    )


# bincount: on the IPU the output length is fixed when compiling. PopTorch required
# ``minlength`` and made it the maximum length too (values >= minlength are not counted).


def _bincount_dtype(weights: torch.Tensor | None) -> torch.dtype:
    """torch.bincount's result dtype: int64 counts, float32 sums of float32 weights, else
    float64 sums."""
    if weights is None:
        return torch.int64
    return torch.float32 if weights.dtype == torch.float32 else torch.float64


@torch.library.custom_op("poptorch::bincount", mutates_args=())
def bincount(x: torch.Tensor, weights: torch.Tensor | None, minlength: int) -> torch.Tensor:
    kept = x < minlength
    w = None if weights is None else weights[kept]
    return torch.bincount(x[kept], w, minlength).to(_bincount_dtype(weights))


@bincount.register_fake
def _(x: torch.Tensor, weights: torch.Tensor | None, minlength: int) -> torch.Tensor:
    return x.new_empty((minlength,), dtype=_bincount_dtype(weights))


# ctc_loss: torch's op has a data-dependent meta (it reads the lengths); this one takes the
# lengths as tensors and has a fixed output shape, so it can be captured whole.


@torch.library.custom_op("poptorch::ctc_loss", mutates_args=())
def ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    reduction: str,
    zero_infinity: bool,
) -> torch.Tensor:
    """``torch.nn.functional.ctc_loss`` of batched ``(T, N, C)`` log-probabilities."""
    return torch.nn.functional.ctc_loss(
        log_probs,
        targets,
        input_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
    )


@ctc_loss.register_fake
def _ctc_loss_fake(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    reduction: str,
    zero_infinity: bool,
) -> torch.Tensor:
    if reduction == "none":
        return log_probs.new_empty((log_probs.shape[1],))
    return log_probs.new_empty(())


def _ctc_loss_setup(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    ctx.inputs = inputs  # type: ignore[attr-defined]


def _ctc_loss_backward(ctx: object, grad: torch.Tensor) -> tuple:
    """Eagerly: torch's own gradient (w.r.t. ``log_probs`` only)."""
    inputs = ctx.inputs  # type: ignore[attr-defined]
    log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_inf = inputs
    with torch.enable_grad():
        x = log_probs.detach().requires_grad_()
        loss = torch.nn.functional.ctc_loss(
            x,
            targets,
            input_lengths,
            target_lengths,
            blank=blank,
            reduction=reduction,
            zero_infinity=zero_inf,
        )
        (g,) = torch.autograd.grad(loss, x, grad)
    return g, None, None, None, None, None, None


ctc_loss.register_autograd(_ctc_loss_backward, setup_context=_ctc_loss_setup)
