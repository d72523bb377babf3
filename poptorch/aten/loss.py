"""Loss functions, kept whole by the capture (each is one ``aten::<loss>`` op).

Their decompositions spread a loss over a dozen elementwise, gather and reduction ops;
kept whole, the program names the loss (as PopTorch's did) and each record is the loss's
formula in JAX, computed in float32 and returned in the output's dtype. ``reduction`` is
torch's code: 0 none, 1 mean, 2 sum. Integer targets are not differentiated.

A model's training loss is its last output (or what ``poptorch.identity_loss`` marks), so a
loss module's result returned last is what ``trainingModel`` minimises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from torch.ops import aten

import popxl

from .registry import NodeContext, lowering
from .torch_derivatives import abs as abs_
from .torch_derivatives import clamp_min0, hinge

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _reduce(loss: Any, reduction: int) -> Any:
    if reduction == 1:
        return loss.mean()
    if reduction == 2:
        return loss.sum()
    return loss


def _f32(*xs: Any) -> list[Any]:
    return [x.astype(jnp.float32) for x in xs]


def _cast_out(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*arrays: Any, present: tuple, out: str, **attrs: Any) -> Any:
        it = iter(arrays)
        full = [next(it) if p else None for p in present]
        return fn(*full, **attrs).astype(jnp.dtype(out))

    run.__doc__ = fn.__doc__
    return run


_WRAPPED: dict[Callable[..., Any], Callable[..., Any]] = {}


def _jaxfn(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One wrapped function per loss (``ctx.jax`` caches op kinds by name)."""
    if fn not in _WRAPPED:
        _WRAPPED[fn] = _cast_out(fn)
    return _WRAPPED[fn]


def _record(
    ctx: NodeContext, name: str, fn: Callable[..., Any], *tensors: Any, **attrs: Any
) -> popxl.Tensor:
    given = [t for t in tensors if t is not None]
    present = tuple(t is not None for t in tensors)
    nondiff = tuple(i for i, t in enumerate(given) if not t.dtype.is_floating_point)
    reduction = attrs.get("reduction")
    if reduction is not None and reduction not in _REDUCTIONS:
        raise ValueError(f"aten.{name}: unknown reduction code {reduction}; expected 0, 1 or 2.")
    if nondiff:  # an op kind fixes its non-differentiable inputs (ctx.jax caches by name)
        name = f"{name}_nondiff{''.join(str(i) for i in nondiff)}"
    return ctx.jax(
        name,
        _jaxfn(fn),
        *given,
        nondiff=nondiff,
        present=present,
        out=ctx.out_dtype.name,
        **attrs,
    )


# Regression losses ---------------------------------------------------------------------------


def _l1(x: Any, y: Any, reduction: int) -> Any:
    x, y = _f32(x, y)
    return _reduce(abs_(x - y), reduction)


def _mse(x: Any, y: Any, reduction: int) -> Any:
    x, y = _f32(x, y)
    return _reduce(jnp.square(x - y), reduction)


def _smooth_l1(x: Any, y: Any, reduction: int, beta: float) -> Any:
    x, y = _f32(x, y)
    d = abs_(x - y)
    if beta == 0:
        return _reduce(d, reduction)
    return _reduce(jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta), reduction)


def _huber(x: Any, y: Any, reduction: int, delta: float) -> Any:
    x, y = _f32(x, y)
    d = abs_(x - y)
    return _reduce(jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


# Binary classification losses ---------------------------------------------------------------


def _bce(x: Any, y: Any, w: Any, reduction: int) -> Any:
    """torch clamps each log at -100, so a probability of 0 or 1 gives a finite loss."""
    x, y = _f32(x, y)
    log_x = jnp.maximum(jnp.log(x), -100.0)
    log_1mx = jnp.maximum(jnp.log1p(-x), -100.0)
    loss = -(y * log_x + (1 - y) * log_1mx)
    if w is not None:
        loss = loss * w.astype(jnp.float32)
    return _reduce(loss, reduction)


def _bce_logits(x: Any, y: Any, w: Any, pos_weight: Any, reduction: int) -> Any:
    """``(1 - y) x + (1 + (p - 1) y) log(1 + exp(-x))``, with the log-sum-exp kept stable."""
    x, y = _f32(x, y)
    softplus_neg = jnp.log1p(jnp.exp(-abs_(x))) + jnp.maximum(-x, 0)
    if pos_weight is not None:
        log_weight = (pos_weight.astype(jnp.float32) - 1) * y + 1
        loss = (1 - y) * x + log_weight * softplus_neg
    else:
        loss = (1 - y) * x + softplus_neg
    if w is not None:
        loss = loss * w.astype(jnp.float32)
    return _reduce(loss, reduction)


def _soft_margin(x: Any, y: Any, reduction: int) -> Any:
    x, y = _f32(x, y)
    return _reduce(jnp.logaddexp(0.0, -y * x), reduction)


# Divergences and likelihoods ----------------------------------------------------------------


def _kl_div(x: Any, y: Any, reduction: int, log_target: bool) -> Any:
    x, y = _f32(x, y)
    if log_target:
        loss = jnp.exp(y) * (y - x)
    else:
        loss = jax.scipy.special.xlogy(y, y) - y * x
    return _reduce(loss, reduction)


def _poisson_nll(x: Any, y: Any, log_input: bool, full: bool, eps: float, reduction: int) -> Any:
    x, y = _f32(x, y)
    loss = jnp.exp(x) - y * x if log_input else x - y * jnp.log(x + eps)
    if full:
        safe = jnp.where(y > 1, y, 2.0)
        stirling = safe * jnp.log(safe) - safe + 0.5 * jnp.log(2 * math.pi * safe)
        loss = loss + jnp.where(y > 1, stirling, 0.0)
    return _reduce(loss, reduction)


@lowering(aten.kl_div.default, preserve=True)
def _lower_kl_div(
    ctx: NodeContext, x: Any, y: Any, reduction: int = 1, log_target: bool = False
) -> Any:
    return _record(ctx, "kl_div", _kl_div, x, y, reduction=reduction, log_target=bool(log_target))


@lowering(aten.poisson_nll_loss.default, preserve=True)
def _lower_poisson_nll_loss(
    ctx: NodeContext,
    x: Any,
    y: Any,
    log_input: bool,
    full: bool,
    eps: float,
    reduction: int,
) -> Any:
    return _record(
        ctx,
        "poisson_nll_loss",
        _poisson_nll,
        x,
        y,
        log_input=bool(log_input),
        full=bool(full),
        eps=float(eps),
        reduction=reduction,
    )


# Margin and embedding losses ----------------------------------------------------------------


def _hinge_embedding(x: Any, y: Any, margin: float, reduction: int) -> Any:
    (x,) = _f32(x)
    loss = jnp.where(y != 1, clamp_min0(margin - x), 0.0) + jnp.where(y != -1, x, 0.0)
    return _reduce(loss, reduction)


def _margin_ranking(x1: Any, x2: Any, y: Any, margin: float, reduction: int) -> Any:
    x1, x2, y = _f32(x1, x2, y)
    return _reduce(clamp_min0(-y * (x1 - x2) + margin), reduction)


def _cosine_embedding(x1: Any, x2: Any, y: Any, margin: float, reduction: int) -> Any:
    x1, x2 = _f32(x1, x2)
    eps = 1e-12
    dot = (x1 * x2).sum(-1)
    norms = jnp.sqrt(((x1 * x1).sum(-1) + eps) * ((x2 * x2).sum(-1) + eps))
    cos = dot / norms
    loss = jnp.where(y == 1, 1 - cos, 0.0) + jnp.where(y == -1, clamp_min0(cos - margin), 0.0)
    return _reduce(loss, reduction)


def _pairwise_distance(a: Any, b: Any, p: float, eps: float) -> Any:
    d = a - b + eps
    if p == math.inf:
        return abs_(d).max(-1)
    return (abs_(d) ** p).sum(-1) ** (1.0 / p)


def _triplet_margin(
    a: Any, pos: Any, neg: Any, margin: float, p: float, eps: float, swap: bool, reduction: int
) -> Any:
    a, pos, neg = _f32(a, pos, neg)
    d_pos = _pairwise_distance(a, pos, p, eps)
    d_neg = _pairwise_distance(a, neg, p, eps)
    if swap:
        d_neg = jnp.minimum(d_neg, _pairwise_distance(pos, neg, p, eps))
    return _reduce(clamp_min0(margin + d_pos - d_neg), reduction)


def _multilabel_margin(x: Any, y: Any, reduction: int, shape: tuple[int, ...]) -> Any:
    """Each sample's targets are ``y``'s entries before the first -1; every (target,
    non-target) pair adds ``max(0, 1 - (x[target] - x[other])) / C``. A 0-d input is one
    sample of one class, a 1-d input one sample; the result has the captured node's
    ``shape`` (torch's export gives one sample's unreduced loss the shape ``(1,)``)."""
    (x,) = _f32(x)
    squeeze = x.ndim <= 1
    if squeeze:
        x, y = x.reshape(1, -1), y.reshape(1, -1)
    c = x.shape[-1]
    valid = jnp.cumprod(y >= 0, axis=-1).astype(bool)  # (N, C): before the first -1
    safe = jnp.where(valid, y, 0)
    is_target = (jax.nn.one_hot(safe, c) * valid[..., None]).max(axis=1) > 0  # (N, C)
    x_target = jnp.take_along_axis(x, safe, axis=-1)  # (N, C): x at each listed target
    margins = hinge(1 - x_target[:, :, None] + x[:, None, :])  # (N, j, i)
    pairs = valid[:, :, None] & ~is_target[:, None, :]
    loss = jnp.where(pairs, margins, 0.0).sum((1, 2)) / c
    return _reduce(loss[0] if squeeze else loss, reduction).reshape(shape)


@lowering(aten.multilabel_margin_loss.default, preserve=True)
def _lower_multilabel_margin_loss(ctx: NodeContext, x: Any, y: Any, reduction: int = 1) -> Any:
    shape = tuple(int(d) for d in ctx.out_spec(0)[0])
    return _record(
        ctx, "multilabel_margin_loss", _multilabel_margin, x, y, reduction=reduction, shape=shape
    )


# Losses whose record only passes tensors and attributes on: ATen op -> (JAX function, how
# many tensor arguments lead (optional ones may be None), then each further argument in
# ATen's order as (attribute, cast, torch's default)).
_REDUCTION = ("reduction", int, 1)
_MARGIN = ("margin", float, 0.0)
_TABLE_LOSSES: dict[Any, tuple[Callable[..., Any], int, tuple[tuple[str, Any, Any], ...]]] = {
    aten.l1_loss.default: (_l1, 2, (_REDUCTION,)),
    aten.mse_loss.default: (_mse, 2, (_REDUCTION,)),
    aten.smooth_l1_loss.default: (_smooth_l1, 2, (_REDUCTION, ("beta", float, 1.0))),
    aten.huber_loss.default: (_huber, 2, (_REDUCTION, ("delta", float, 1.0))),
    aten.binary_cross_entropy.default: (_bce, 3, (_REDUCTION,)),
    aten.binary_cross_entropy_with_logits.default: (_bce_logits, 4, (_REDUCTION,)),
    aten.soft_margin_loss.default: (_soft_margin, 2, (_REDUCTION,)),
    aten.hinge_embedding_loss.default: (_hinge_embedding, 2, (("margin", float, 1.0), _REDUCTION)),
    aten.margin_ranking_loss.default: (_margin_ranking, 3, (_MARGIN, _REDUCTION)),
    aten.cosine_embedding_loss.default: (_cosine_embedding, 3, (_MARGIN, _REDUCTION)),
    aten.triplet_margin_loss.default: (
        _triplet_margin,
        3,
        (
            ("margin", float, 1.0),
            ("p", float, 2.0),
            ("eps", float, 1e-6),
            ("swap", bool, False),
            _REDUCTION,
        ),
    ),
}


def _table_loss(target: Any, fn: Callable[..., Any], n_tensors: int, params: tuple) -> Any:
    """The record of a ``_TABLE_LOSSES`` entry: arguments given by keyword are placed by
    the op's schema; missing ones take torch's defaults."""
    name = target.overloadpacket.__name__
    schema = [a.name for a in target._schema.arguments]

    def lower(ctx: NodeContext, *args: Any, **kwargs: Any) -> Any:
        values = [*args, *(kwargs.get(n, _UNSET) for n in schema[len(args) :])]
        tensors = [None if v is _UNSET else v for v in values[:n_tensors]]
        rest = values[n_tensors:]
        attrs = {
            attr: cast(default if rest[k] is _UNSET else rest[k])
            for k, (attr, cast, default) in enumerate(params)
        }
        return _record(ctx, name, fn, *tensors, **attrs)

    lower.__name__ = f"_lower_{name}"
    return lower


_UNSET = object()


for _target, (_fn, _n, _params) in _TABLE_LOSSES.items():
    lowering(_target, preserve=True)(_table_loss(_target, _fn, _n, _params))


# Classification losses ----------------------------------------------------------------------


def _class_dim(x: Any) -> int:
    return 0 if x.ndim == 1 else 1


def _nll_terms(logp: Any, t: Any, w: Any, ignore_index: int) -> tuple[Any, Any, Any]:
    """Per-element ``-w[t] * logp[t]``, the per-element weights ``w[t]`` (0 where ignored)
    and the ignore mask, for class-index targets ``t``."""
    dim = _class_dim(logp)
    ignored = t == ignore_index
    safe = jnp.where(ignored, 0, t)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(safe, dim), axis=dim).squeeze(dim)
    weight = jnp.ones_like(picked) if w is None else w.astype(jnp.float32)[safe]
    weight = jnp.where(ignored, 0.0, weight)
    return -picked * weight, weight, ignored


def _nll(logp: Any, t: Any, w: Any, reduction: int, ignore_index: int) -> Any:
    """torch's mean divides by the summed weights of the counted targets."""
    (logp,) = _f32(logp)
    loss, weight, _ = _nll_terms(logp, t, w, ignore_index)
    if reduction == 1:
        return loss.sum() / weight.sum()
    return _reduce(loss, reduction)


def _cross_entropy(
    x: Any, t: Any, w: Any, reduction: int, ignore_index: int, label_smoothing: float
) -> Any:
    (x,) = _f32(x)
    dim = _class_dim(x)
    c = x.shape[dim]
    logp = jax.nn.log_softmax(x, axis=dim)
    shape = [1] * x.ndim
    shape[dim] = c
    w_b = 1.0 if w is None else w.astype(jnp.float32).reshape(shape)
    if jnp.issubdtype(t.dtype, jnp.floating):  # class probabilities
        t = t.astype(jnp.float32)
        if label_smoothing > 0:
            t = t * (1 - label_smoothing) + label_smoothing / c
        loss = -(logp * t * w_b).sum(dim)
        if reduction == 1:
            return loss.sum() / (x.size / c)
        return _reduce(loss, reduction)
    nll = _nll(logp, t, w, reduction, ignore_index)
    if label_smoothing <= 0:
        return nll
    _, weight, ignored = _nll_terms(logp, t, w, ignore_index)
    smooth = jnp.where(ignored, 0.0, -(logp * w_b).sum(dim))
    if reduction == 1:
        smooth = smooth.sum() / weight.sum()
    else:
        smooth = _reduce(smooth, reduction)
    return (1 - label_smoothing) * nll + smooth * (label_smoothing / c)


@lowering(aten.nll_loss_nd.default, aten.nll_loss.default, aten.nll_loss2d.default, preserve=True)
def _lower_nll_loss(
    ctx: NodeContext,
    x: Any,
    target: Any,
    weight: Any = None,
    reduction: int = 1,
    ignore_index: int = -100,
) -> Any:
    return _record(
        ctx,
        "nll_loss",
        _nll,
        x,
        target,
        weight,
        reduction=reduction,
        ignore_index=int(ignore_index),
    )


@lowering(aten.cross_entropy_loss.default, preserve=True)
def _lower_cross_entropy_loss(
    ctx: NodeContext,
    x: Any,
    target: Any,
    weight: Any = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Any:
    return _record(
        ctx,
        "cross_entropy_loss",
        _cross_entropy,
        x,
        target,
        weight,
        reduction=reduction,
        ignore_index=int(ignore_index),
        label_smoothing=float(label_smoothing),
    )


# Connectionist temporal classification ------------------------------------------------------

_NEG_INF = -jnp.inf


def _logsumexp(*xs: Any) -> Any:
    """``log(sum(exp(x)))`` elementwise; -inf where all are -inf, with zero gradients there
    (``jax.nn.logsumexp``'s would be 0/0)."""
    m = jax.lax.stop_gradient(xs[0])
    for x in xs[1:]:
        m = jnp.maximum(m, jax.lax.stop_gradient(x))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    total = sum(jnp.exp(x - m) for x in xs)
    reached = total > 0
    return jnp.where(reached, jnp.log(jnp.where(reached, total, 1.0)) + m, _NEG_INF)


@jax.custom_vjp
def _ctc_softmax_term(lp: Any, live: Any, poison: Any) -> Any:
    """Zero per sample; its gradient is ``exp(lp)`` at live steps (plus ``poison``).

    torch's CTC gradient is ``exp(lp) - posterior`` rather than ``-posterior``: the
    gradient w.r.t. the logits when ``lp`` is their log-softmax (whose backward then passes
    it on unchanged). Added to the loss, this term gives torch's gradient."""
    return jnp.zeros(lp.shape[1], lp.dtype)


def _ctc_softmax_term_fwd(lp: Any, live: Any, poison: Any) -> tuple[Any, Any]:
    return _ctc_softmax_term(lp, live, poison), (lp, live, poison)


def _ctc_softmax_term_bwd(res: Any, g: Any) -> tuple[Any, Any, Any]:
    lp, live, poison = res
    grad = jnp.where(live > 0, jnp.exp(lp) + poison[None, :, None], 0.0) * g[None, :, None]
    return grad, jnp.zeros_like(live), jnp.zeros_like(poison)


_ctc_softmax_term.defvjp(_ctc_softmax_term_fwd, _ctc_softmax_term_bwd)


def _ctc(
    lp: Any,
    targets: Any,
    input_lengths: Any,
    target_lengths: Any,
    blank: int,
    reduction: int,
    zero_infinity: bool,
) -> Any:
    """The CTC forward algorithm in log space over ``(T, N, C)`` log-probabilities.

    Targets are padded ``(N, S)`` or the batch's concatenated ``(sum(target_lengths),)``.
    ``alpha[s]`` is the log-probability of the first ``t + 1`` steps ending in state ``s``
    of the target with blanks around each label; a sample's steps past its input length
    leave it unchanged. As torch: ``mean`` divides each loss by its target length (at
    least 1) before averaging, ``zero_infinity`` gives impossible alignments a zero loss and
    gradient, and without it their gradient is NaN."""
    (lp,) = _f32(lp)
    steps, batch, classes = lp.shape
    in_len = input_lengths.astype(jnp.int32)
    tgt_len = target_lengths.astype(jnp.int32)
    targets = targets.astype(jnp.int32)
    if targets.ndim == 1:  # concatenated: each sample's labels start after the previous ones
        total = max(targets.shape[0], 1)
        starts = jnp.cumsum(tgt_len) - tgt_len
        index = starts[:, None] + jnp.arange(total)[None, :]
        targets = jnp.pad(targets, (0, 1))[jnp.clip(index, 0, total - 1)]
    width = targets.shape[1]
    in_target = jnp.arange(width)[None, :] < tgt_len[:, None]
    labels = jnp.where(in_target, jnp.clip(targets, 0, classes - 1), blank)
    states = 2 * width + 1
    ext = jnp.full((batch, states), blank, jnp.int32).at[:, 1::2].set(labels)
    skip = jnp.zeros((batch, states), bool).at[:, 3::2].set(labels[:, 1:] != labels[:, :-1])
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (steps, batch, states)), axis=2)

    first = jnp.arange(states)[None, :] < jnp.where(tgt_len > 0, 2, 1)[:, None]
    alpha = jnp.where(first, emit[0], _NEG_INF)
    empty = jnp.where(jnp.arange(states) == 0, 0.0, _NEG_INF)[None, :]
    alpha = jnp.where((in_len > 0)[:, None], alpha, empty)

    def shift(a: Any, k: int) -> Any:  # state s gets state s - k's value
        return jnp.pad(a, ((0, 0), (k, 0)), constant_values=_NEG_INF)[:, :states]

    def step(alpha: Any, x: tuple[Any, Any]) -> tuple[Any, None]:
        e, t = x
        skipped = jnp.where(skip, shift(alpha, 2), _NEG_INF)
        new = _logsumexp(alpha, shift(alpha, 1), skipped) + e
        return jnp.where((t < in_len)[:, None], new, alpha), None

    if steps > 1:
        alpha, _ = jax.lax.scan(step, alpha, (emit[1:], jnp.arange(1, steps)))
    last = jnp.take_along_axis(alpha, (2 * tgt_len)[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(alpha, jnp.maximum(2 * tgt_len - 1, 0)[:, None], axis=1)[:, 0]
    before = jnp.where(tgt_len > 0, before, _NEG_INF)
    nll = -_logsumexp(last, before)

    impossible = jax.lax.stop_gradient(nll) == jnp.inf
    live = (jnp.arange(steps)[:, None] < in_len[None, :])[:, :, None]
    poison = jnp.where(impossible & (not zero_infinity), jnp.nan, 0.0)
    loss = nll + _ctc_softmax_term(lp, live.astype(jnp.float32), poison)
    if zero_infinity:
        loss = jnp.where(impossible, 0.0, loss)
    if reduction == 1:
        return (loss / jnp.maximum(tgt_len, 1).astype(jnp.float32)).mean()
    return _reduce(loss, reduction)


# The ATen ops PopTorch turned into a loss (an ``identityloss``) when it canonicalised a
# graph: torch's loss functions (PopTorch's own losses are in ``poptorch.ops.lowerings``). A
# training graph must end in one.
LOSS_OPS = frozenset(
    {
        aten.l1_loss.default,
        aten.mse_loss.default,
        aten.smooth_l1_loss.default,
        aten.huber_loss.default,
        aten.binary_cross_entropy.default,
        aten.binary_cross_entropy_with_logits.default,
        aten.soft_margin_loss.default,
        aten.kl_div.default,
        aten.poisson_nll_loss.default,
        aten.hinge_embedding_loss.default,
        aten.margin_ranking_loss.default,
        aten.cosine_embedding_loss.default,
        aten.triplet_margin_loss.default,
        aten.multilabel_margin_loss.default,
        aten.nll_loss_nd.default,
        aten.nll_loss.default,
        aten.nll_loss2d.default,
        aten.cross_entropy_loss.default,
    }
)
