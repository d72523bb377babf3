"""Loss ops: negative log likelihood, plain and fused with the softmax gradient.

Both take class probabilities ``probs`` of shape ``(*batch, C)`` and integer ``labels`` of
shape ``batch``. Every leading dimension counts as a sample dimension: ``mean`` divides by
the number of samples, or by the number of non-ignored samples (at least 1) when an
``ignore_index`` is given. Ignored samples contribute 0 to the loss and to the gradient.
As in PopART, ``nll_loss_with_softmax_grad`` flattens both, so its labels may arrange the
samples in any shape with ``prod(batch)`` elements; ``nll_loss`` wants exactly ``batch``.
"""

from __future__ import annotations

from typing import Any, Literal

from .. import context, dtypes
from .._op import core_error, define
from ..tensor import Tensor, constant
from ._base import check_in_graph, jax, jnp, nelms, record, spec

REDUCTION_TYPE = Literal["mean", "sum", "none"]
REDUCTIONS = ("mean", "sum", "none")

# Probabilities are clamped to eps before the log (nll_loss) so log(0) stays finite.
NLL_EPS = 1e-7
NLL_EPS_FP16 = 6.104e-5
SOFTMAX_GRAD_EPS = 1e-7

BAD_REDUCTION_MSG = "reduction must be one of 'mean', 'sum' or 'none', got {value!r}."
LABELS_SHAPE_MSG = (
    "{op}: the labels must have the shape of probs without its last (class) dimension: "
    "probs has shape {probs}, so labels should have shape {want}, but they have shape {got}."
)
LABELS_COUNT_MSG = (
    "nll_loss_with_softmax_grad: there must be one label per row of probs: probs has shape "
    "{probs}, {want} rows of {classes} classes, but labels of shape {got} hold {count}. "
    "Labels may have any shape with {want} elements."
)
LABELS_DTYPE_MSG = (
    "{op}: labels must have an integer dtype, got {got}. Cast them with ops.cast(labels, "
    "popxl.int32)."
)
PROBS_DTYPE_MSG = "{op}: probs must have a floating point dtype, got {got}."
LOSS_GRAD_MSG = (
    "nll_loss_with_softmax_grad: loss_grad must be a float tensor with one element, the "
    "labels' shape {labels} (one per sample), or a shape that broadcasts to probs' shape "
    "{probs} once 1s are appended to its rank; got dtype {dtype} and shape {shape}."
)


def _check_reduction(reduction: Any) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(BAD_REDUCTION_MSG.format(value=reduction))
    return reduction


def _check_probs_labels(op: str, probs: Any, labels: Any, *, flat: bool = False) -> None:
    """Float probs with a class dimension and integer labels, one per sample.

    ``flat``: only the number of labels must match (PopART's fused op flattens both).
    """
    if not probs.dtype.is_floating_point:
        raise core_error(PROBS_DTYPE_MSG.format(op=op, got=probs.dtype.name))
    if not labels.dtype.is_int:
        raise core_error(LABELS_DTYPE_MSG.format(op=op, got=labels.dtype.name))
    want = tuple(probs.shape[:-1])
    if flat and probs.shape and nelms(labels.shape) != nelms(want):
        raise core_error(
            LABELS_COUNT_MSG.format(
                probs=probs.shape,
                want=nelms(want),
                classes=probs.shape[-1],
                got=labels.shape,
                count=nelms(labels.shape),
            )
        )
    if not probs.shape or (not flat and tuple(labels.shape) != want):
        raise core_error(
            LABELS_SHAPE_MSG.format(op=op, probs=probs.shape, want=want, got=labels.shape)
        )


def _loss_shape(labels: Any, reduction: str) -> tuple[int, ...]:
    return tuple(labels.shape) if reduction == "none" else ()


def _label_mask(labels: Any, ignore_index: int | None, num_classes: int) -> tuple[Any, Any]:
    """(kept samples, labels safe to index with: ignored and out-of-range ones clipped)."""
    if ignore_index is None:
        kept = jnp.ones(labels.shape, bool)
    else:
        kept = labels != ignore_index
    safe = jnp.clip(jnp.where(kept, labels, 0).astype(jnp.int32), 0, num_classes - 1)
    return kept, safe


def _pick(probs: Any, safe_labels: Any) -> Any:
    return jnp.take_along_axis(probs, safe_labels[..., None], axis=-1)[..., 0]


def _reduce(per_sample: Any, kept: Any, reduction: str) -> Any:
    if reduction == "none":
        return per_sample
    total = jnp.sum(per_sample)
    if reduction == "sum":
        return total
    return total / _mean_divisor(kept)


def _mean_divisor(kept: Any) -> Any:
    return jnp.maximum(jnp.sum(kept.astype(jnp.float32)), 1.0)


# nll_loss --------------------------------------------------------------------------------


def _nll_infer(
    probs: Any, labels: Any, *, ignore_index: Any, reduction: str, log_prob: bool
) -> list:
    _check_probs_labels("nll_loss", probs, labels)
    return [spec(_loss_shape(labels, reduction), probs.dtype)]


def _lower_nll(
    probs: Any, labels: Any, *, ignore_index: Any, reduction: str, log_prob: bool
) -> Any:
    kept, safe = _label_mask(labels, ignore_index, probs.shape[-1])
    picked = _pick(probs, safe)
    if log_prob:
        per_sample = -picked.astype(jnp.float32)
    else:
        eps = NLL_EPS_FP16 if probs.dtype == jnp.float16 else NLL_EPS
        clamped = jnp.maximum(picked, jnp.asarray(eps, picked.dtype))
        per_sample = -jnp.log(clamped.astype(jnp.float32))
    per_sample = jnp.where(kept, per_sample, 0.0)
    return _reduce(per_sample, kept, reduction).astype(probs.dtype)


NLL = define("nll_loss", "Nll", _nll_infer, _lower_nll, nondiff_inputs=(1,))


def nll_loss(
    probs: Tensor,
    labels: Tensor,
    ignore_index: int | None = None,
    reduction: REDUCTION_TYPE = "mean",
    log_prob: bool = False,
) -> Tensor:
    """Negative log likelihood loss of ``labels`` under the class probabilities ``probs``.

    Per sample the loss is ``-log(max(probs[..., label], eps))`` with ``eps = 1e-7``
    (``6.104e-5`` for float16), or ``-probs[..., label]`` when ``log_prob`` is True (the
    input already holds log-probabilities). ``mean`` divides the summed loss by the number of
    samples (all leading dimensions), or by ``max(#non-ignored, 1)`` with ``ignore_index``;
    ``sum`` adds them up; ``none`` returns one loss per sample (the shape of ``labels``).
    The output has ``probs``' dtype. Differentiable with respect to ``probs``.

    See also ``torch.nn.functional.nll_loss`` (which takes log-probabilities).

    Args:
        probs: probabilities of shape ``(*batch, C)``, float16 or float32.
        labels: class indices of shape ``batch``, any integer dtype.
        ignore_index: samples whose label equals this contribute nothing.
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.
        log_prob: ``probs`` are log-probabilities.

    Returns:
        The loss tensor, named ``loss``.

    Raises:
        ValueError: an unknown ``reduction``.
        PopXLException: non-integer labels, or labels whose shape is not ``probs.shape[:-1]``.
    """
    attrs = {
        "ignore_index": None if ignore_index is None else int(ignore_index),
        "reduction": _check_reduction(reduction),
        "log_prob": bool(log_prob),
    }
    return record(NLL, {"probs": probs, "labels": labels}, attrs, ["loss"])[0]


# nll_loss_with_softmax_grad ----------------------------------------------------------------


def _loss_grad_view(loss_grad: Any, labels: Any, probs: Any) -> tuple[int, ...] | None:
    """The shape ``loss_grad`` takes to scale the rows of ``dx`` (None: it does not fit).

    One element scales everything; the labels' shape gives one factor per sample; otherwise,
    as in PopART, 1s are appended up to probs' rank and the result broadcasts to probs.
    """
    shape, rows = tuple(loss_grad.shape), tuple(probs.shape[:-1])
    if nelms(shape) == 1:
        return ()
    if shape == tuple(labels.shape):
        return (*rows, 1)
    padded = shape + (1,) * (len(probs.shape) - len(shape))
    fits = len(padded) == len(probs.shape)
    if fits and all(g in (1, p) for g, p in zip(padded, probs.shape)):
        return padded
    return None


def _nll_softmax_grad_infer(
    probs: Any, labels: Any, loss_grad: Any, *, ignore_index: Any, reduction: str
) -> list:
    _check_probs_labels("nll_loss_with_softmax_grad", probs, labels, flat=True)
    view = _loss_grad_view(loss_grad, labels, probs)
    if not loss_grad.dtype.is_floating_point or view is None:
        raise core_error(
            LOSS_GRAD_MSG.format(
                labels=labels.shape,
                probs=probs.shape,
                dtype=loss_grad.dtype.name,
                shape=loss_grad.shape,
            )
        )
    return [spec(_loss_shape(labels, reduction), probs.dtype), spec(probs.shape, probs.dtype)]


def _lower_nll_softmax_grad(
    probs: Any, labels: Any, loss_grad: Any, *, ignore_index: Any, reduction: str
) -> tuple:
    p = probs.astype(jnp.float32)
    rows = labels.reshape(p.shape[:-1])
    kept, safe = _label_mask(rows, ignore_index, p.shape[-1])
    per_sample = jnp.where(kept, -jnp.log(_pick(p, safe) + SOFTMAX_GRAD_EPS), 0.0)
    onehot = jax.nn.one_hot(safe, p.shape[-1], dtype=jnp.float32)
    grad_scale = loss_grad.astype(jnp.float32).reshape(_loss_grad_view(loss_grad, labels, p))
    grad_scale = jnp.where(kept[..., None], grad_scale, 0.0)
    if reduction == "mean":
        grad_scale = grad_scale / _mean_divisor(kept)
    dx = (p - onehot) * grad_scale
    loss = _reduce(per_sample.reshape(labels.shape), kept, reduction)
    return loss.astype(probs.dtype), dx.astype(probs.dtype)


NLL_SOFTMAX_GRAD = define(
    "nll_loss_with_softmax_grad",
    "NllLossWithSoftmaxGradDirect",
    _nll_softmax_grad_infer,
    _lower_nll_softmax_grad,
    grad="none",
)


def nll_loss_with_softmax_grad(
    probs: Tensor,
    labels: Tensor,
    loss_grad: float | Tensor = 1,
    ignore_index: int | None = None,
    reduction: REDUCTION_TYPE = "mean",
) -> tuple[Tensor, Tensor]:
    """NLL loss ``l`` together with ``dE/dx``, where ``probs = softmax(x)``.

    A fused forward-and-backward op: ``loss_grad`` is ``dE/dl`` (1 when ``E = l``) and the
    returned gradient is ``dx = (probs - onehot(labels)) * loss_grad``, divided by the number
    of samples (non-ignored samples, at least 1, with ``ignore_index``) for ``mean``; rows of
    ignored samples are 0. The loss is ``-log(probs[..., label] + 1e-7)`` per sample, reduced
    like ``nll_loss``. The op itself has no gradient (it already is one).

    Args:
        probs: softmax probabilities of shape ``(*batch, C)``.
        labels: class indices, any integer dtype, one per sample: shape ``batch`` or any
            shape with as many elements (they are flattened, as in PopART); ``loss`` for
            ``reduction='none'`` has the labels' shape.
        loss_grad: ``dE/dl``: a Python number (becomes a float32 constant) or a float tensor
            with one element, with the labels' shape (one factor per sample), or with a
            shape that broadcasts to ``probs``' once 1s are appended to its rank. A float32
            ``loss_grad`` may be used with float16 ``probs``.
        ignore_index: samples whose label equals this are ignored.
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.

    Returns:
        ``(loss, dx)``, named ``loss`` and ``dx``, both of ``probs``' dtype; ``dx`` has the
        shape of ``probs``.

    Raises:
        ValueError: an unknown ``reduction``.
        PopXLException: non-integer labels, a number of labels other than the number of
            rows of ``probs``, or a ``loss_grad`` of the wrong shape or dtype.
    """
    attrs = {
        "ignore_index": None if ignore_index is None else int(ignore_index),
        "reduction": _check_reduction(reduction),
    }
    check_in_graph(context.get_current_graph(), probs=probs, labels=labels)
    if not isinstance(loss_grad, Tensor):
        loss_grad = constant(loss_grad, dtypes.float32)
    inputs = {"probs": probs, "labels": labels, "loss_grad": loss_grad}
    loss, dx = record(NLL_SOFTMAX_GRAD, inputs, attrs, ["loss", "dx"])
    return loss, dx
