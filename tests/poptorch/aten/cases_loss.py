"""Cases for ``poptorch/aten/loss.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.ops import aten

from .harness import Case

_REDUCTIONS = ("none", "mean", "sum")


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _signs(*shape: int) -> torch.Tensor:
    return torch.randint(0, 2, shape) * 2 - 1


def _each_reduction(name, fn, inputs, op, **kw):
    """One case per reduction (``fn(*inputs, reduction=r)``)."""
    return [
        Case(f"{name}_{r}", lambda *xs, r=r: fn(*xs, reduction=r), inputs, [op], **kw)
        for r in _REDUCTIONS
    ]


CASES = [
    *_each_reduction(
        "l1_loss", F.l1_loss, lambda: (_randn(3, 4), _randn(3, 4)), aten.l1_loss.default
    ),
    *_each_reduction(
        "mse_loss", F.mse_loss, lambda: (_randn(3, 4), _randn(3, 4)), aten.mse_loss.default
    ),
    Case(
        "smooth_l1_loss",
        lambda x, y: F.smooth_l1_loss(x, y, beta=0.5),
        lambda: (_randn(3, 4), _randn(3, 4)),
        [aten.smooth_l1_loss.default],
    ),
    Case(
        "smooth_l1_loss_beta0",  # F.smooth_l1_loss calls l1_loss for beta 0
        lambda x, y: aten.smooth_l1_loss.default(x, y, 2, 0.0),
        lambda: (_randn(3, 4), _randn(3, 4)),
        [aten.smooth_l1_loss.default],
    ),
    Case(
        "huber_loss",
        lambda x, y: F.huber_loss(x, y, reduction="none", delta=0.7),
        lambda: (_randn(3, 4), _randn(3, 4)),
        [aten.huber_loss.default],
    ),
    Case(
        "bce",
        lambda x, y, w: F.binary_cross_entropy(x, y, w),
        lambda: (torch.rand(3, 4) * 0.9 + 0.05, torch.rand(3, 4), torch.rand(3, 4)),
        [aten.binary_cross_entropy.default],
        grad_inputs=[0],  # torch does not differentiate the target
    ),
    Case(
        "bce_saturated",
        lambda x, y: F.binary_cross_entropy(x, y, reduction="none"),
        lambda: (torch.tensor([0.0, 1.0, 0.5, 1.0]), torch.tensor([1.0, 0.0, 0.5, 1.0])),
        [aten.binary_cross_entropy.default],
        grad=False,
    ),
    *_each_reduction(
        "bce_with_logits",
        lambda x, y, w, p, reduction: F.binary_cross_entropy_with_logits(
            x, y, w, pos_weight=p, reduction=reduction
        ),
        lambda: (_randn(5, 3) * 4, torch.rand(5, 3), torch.rand(5, 3), torch.rand(3)),
        aten.binary_cross_entropy_with_logits.default,
        grad_inputs=[0, 1],  # torch does not differentiate the weights
    ),
    Case(
        "bce_with_logits_stable",
        lambda x, y: F.binary_cross_entropy_with_logits(x, y),
        lambda: (torch.tensor([88.0, -90.0]), torch.tensor([0.5, 0.25])),
        [aten.binary_cross_entropy_with_logits.default],
        half=False,
    ),
    Case(
        "soft_margin_loss",
        lambda x, y: F.soft_margin_loss(x, y),
        lambda: (_randn(4, 3), _signs(4, 3)),
        [aten.soft_margin_loss.default],
    ),
    *[
        Case(
            f"kl_div_{r}_{'log' if log else 'prob'}",
            lambda x, y, r=r, log=log: F.kl_div(x, y, reduction=r, log_target=log),
            lambda log=log: (
                _randn(3, 5).log_softmax(1),
                _randn(3, 5) if log else torch.rand(3, 5) * 2,
            ),
            [aten.kl_div.default],
            grad_inputs=[0, 1] if log else [0],
        )
        for r in ("batchmean", "none")
        for log in (False, True)
    ],
    *[
        Case(
            f"poisson_nll_loss_{log}_{full}",
            lambda x, y, log=log, full=full: F.poisson_nll_loss(x, y, log_input=log, full=full),
            lambda: (torch.rand(10) + 0.1, torch.poisson(torch.rand(10) * 5)),
            [aten.poisson_nll_loss.default],
            grad_inputs=[0],
        )
        for log in (False, True)
        for full in (False, True)
    ],
    # gaussian_nll_loss runs without torch's check that no variance is negative (see
    # poptorch/capture/redirects.py); variances below eps = 0.1 are clamped, and the gradient
    # passes the clamp as torch's does.
    *_each_reduction(
        "gaussian_nll_loss",
        lambda x, y, v, reduction: F.gaussian_nll_loss(x, y, v, eps=0.1, reduction=reduction),
        lambda: (_randn(3, 4), _randn(3, 4), torch.rand(3, 4) * 0.4 + 0.01),
        aten.log.default,
    ),
    Case(
        "gaussian_nll_loss_homoscedastic_full",
        lambda x, y, v: F.gaussian_nll_loss(x, y, v, full=True, reduction="sum"),
        lambda: (_randn(3, 4), _randn(3, 4), torch.rand(3) + 0.1),
        [aten.log.default],
    ),
    Case(
        "gaussian_nll_loss_one_variance_per_row",
        lambda x, y, v: F.gaussian_nll_loss(x, y, v, reduction="none"),
        lambda: (_randn(3, 4), _randn(3, 4), torch.rand(3, 1) + 0.1),
        [aten.log.default],
    ),
    Case(
        "gaussian_nll_loss_float_variance",
        lambda x, y: F.gaussian_nll_loss(x, y, 0.5),
        lambda: (_randn(3, 4), _randn(3, 4)),
        [aten.log.default],
    ),
    Case(
        "hinge_embedding_loss",
        lambda x, y: F.hinge_embedding_loss(x, y, margin=0.7, reduction="none"),
        lambda: (_randn(10), _signs(10)),
        [aten.hinge_embedding_loss.default],
    ),
    Case(
        "margin_ranking_loss",
        lambda a, b, y: F.margin_ranking_loss(a, b, y, margin=0.3),
        lambda: (_randn(4, 5), _randn(4, 5), _signs(4, 5)),
        [aten.margin_ranking_loss.default],
    ),
    # At the hinge (a tie of the two inputs, or x at the margin) torch's clamp_min gives the
    # derivative to nothing (or, in older torch, to the input), not half of it.
    Case(
        "margin_ranking_loss_ties",
        lambda a, b, y: F.margin_ranking_loss(a, b, y, margin=0.0),
        lambda: (lambda a: (a, a.clone(), _signs(4, 5)))(_randn(4, 5)),
        [aten.margin_ranking_loss.default],
    ),
    Case(
        "hinge_embedding_loss_at_margin",
        lambda x, y: F.hinge_embedding_loss(x, y, margin=0.5, reduction="none"),
        lambda: (torch.full((6,), 0.5), -torch.ones(6, dtype=torch.int64)),
        [aten.hinge_embedding_loss.default],
    ),
    Case(
        "cosine_embedding_loss",
        lambda a, b, y: F.cosine_embedding_loss(a, b, y, margin=0.2, reduction="sum"),
        lambda: (_randn(6, 3), _randn(6, 3), _signs(6)),
        [aten.cosine_embedding_loss.default],
        atol=1e-4,
    ),
    *[
        Case(
            f"triplet_margin_loss_p{p}_{'swap' if swap else 'plain'}",
            lambda a, b, c, p=p, swap=swap: F.triplet_margin_loss(
                a, b, c, margin=0.8, p=p, swap=swap
            ),
            lambda: (_randn(10, 5), _randn(10, 5), _randn(10, 5)),
            [aten.triplet_margin_loss.default],
            atol=1e-4,
        )
        for p in (2.0, 3.0)
        for swap in (False, True)
    ],
    Case(
        "multilabel_margin_loss",
        lambda x, y: F.multilabel_margin_loss(x, y, reduction="none"),
        lambda: (_randn(3, 5), torch.tensor([[3, 0, -1, 1, 2], [1, 2, 3, 4, 0], [-1, 2, 0, 0, 0]])),
        [aten.multilabel_margin_loss.default],
        half=False,  # torch has no float16 multilabel_margin_loss on the CPU
    ),
    # One sample (1-d input) and one sample of one class (0-d): torch's export gives the
    # unreduced loss the shape (1,) where eager gives (), hence the reshape.
    Case(
        "multilabel_margin_loss_one_sample",
        lambda x, y: F.multilabel_margin_loss(x, y, reduction="none").reshape(1),
        lambda: (_randn(5), torch.tensor([3, 0, -1, 1, 2])),
        [aten.multilabel_margin_loss.default],
        half=False,
    ),
    Case(
        "multilabel_margin_loss_0d",
        lambda x, y: F.multilabel_margin_loss(x, y, reduction="none").reshape(1),
        lambda: (torch.randn(()), torch.tensor(0)),
        [aten.multilabel_margin_loss.default],
        half=False,
    ),
    *_each_reduction(
        "nll_loss",
        lambda x, t, w, reduction: F.nll_loss(x, t, w, reduction=reduction, ignore_index=2),
        lambda: (_randn(6, 4).log_softmax(1), torch.tensor([0, 2, 3, 1, 2, 3]), torch.rand(4)),
        aten.nll_loss_nd.default,
        grad_inputs=[0],
    ),
    Case(
        "nll_loss2d",
        lambda x, t: F.nll_loss(x, t, reduction="sum"),
        lambda: (_randn(2, 3, 4, 4).log_softmax(1), torch.randint(0, 3, (2, 4, 4))),
        [aten.nll_loss_nd.default],
    ),
    Case(
        "nll_loss_ops",
        lambda x, t, x2, t2: (
            aten.nll_loss.default(x, t),
            aten.nll_loss2d.default(x2, t2, None, 2),
        ),
        lambda: (
            _randn(5, 3),
            torch.randint(0, 3, (5,)),
            _randn(2, 3, 4, 4),
            torch.randint(0, 3, (2, 4, 4)),
        ),
        [aten.nll_loss.default, aten.nll_loss2d.default],
    ),
    *_each_reduction(
        "cross_entropy",
        lambda x, t, reduction: F.cross_entropy(x, t, reduction=reduction),
        lambda: (_randn(1, 10, 2, 3), torch.randint(0, 10, (1, 2, 3))),
        aten.cross_entropy_loss.default,
    ),
    *[
        Case(
            f"cross_entropy_weighted_{r}",
            lambda x, t, w, r=r: F.cross_entropy(
                x, t, w, ignore_index=1, label_smoothing=0.2, reduction=r
            ),
            lambda: (_randn(6, 4), torch.tensor([0, 1, 3, 1, 2, 3]), torch.rand(4)),
            [aten.cross_entropy_loss.default],
            grad_inputs=[0],
        )
        for r in _REDUCTIONS
    ],
    Case(
        "cross_entropy_unbatched",
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
        lambda: (_randn(5), torch.tensor(3)),
        [aten.cross_entropy_loss.default],
    ),
    *[
        Case(
            f"cross_entropy_probabilities_{r}",
            lambda x, t, w, r=r: F.cross_entropy(x, t, w, label_smoothing=0.1, reduction=r),
            lambda: (_randn(4, 3, 2), torch.rand(4, 3, 2).softmax(1), torch.rand(3)),
            [aten.cross_entropy_loss.default],
            grad_inputs=[0, 1],
        )
        for r in ("mean", "none")
    ],
]


# CTC (``F.ctc_loss`` is redirected to ``poptorch::ctc_loss`` while capturing) ----------------

_CTC = torch.ops.poptorch.ctc_loss.default


def _ctc_inputs(
    steps: int, batch: int, classes: int, width: int, blank: int, input_lengths: list[int]
) -> tuple:
    """Log-probabilities, padded targets without the blank, and the two length tensors."""
    log_probs = _randn(steps, batch, classes).log_softmax(-1)
    targets = torch.randint(0, classes - 1, (batch, width))
    targets[targets >= blank] += 1
    target_lengths = torch.randint(1, width + 1, (batch,))
    return log_probs, targets, torch.tensor(input_lengths), target_lengths


def _concatenated(targets: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    return torch.cat([t[:n] for t, n in zip(targets, lengths)])


CASES += [
    *[
        Case(
            f"ctc_loss_padded_{r}",
            lambda lp, t, il, tl, r=r: F.ctc_loss(lp, t, il, tl, reduction=r),
            lambda: _ctc_inputs(8, 3, 5, 4, 0, [8, 6, 7]),
            [_CTC],
            half=False,  # torch's CPU kernel has no float16
            grad_inputs=[0],
        )
        for r in _REDUCTIONS
    ],
    Case(
        "ctc_loss_concatenated_list_lengths",
        lambda lp, t: F.ctc_loss(lp, _concatenated(t, [2, 4, 1]), [8, 5, 7], [2, 4, 1]),
        lambda: _ctc_inputs(8, 3, 5, 4, 0, [8, 5, 7])[:2],
        [_CTC],
        half=False,
        grad_inputs=[0],
    ),
    Case(
        "ctc_loss_module_blank3_repeats",
        lambda lp, t, il, tl: torch.nn.CTCLoss(blank=3, reduction="sum")(lp, t, il, tl),
        lambda: (
            _randn(7, 2, 5).log_softmax(-1),
            torch.tensor([[1, 1, 2, 2], [4, 4, 4, 0]]),
            torch.tensor([7, 6]),
            torch.tensor([4, 3]),
        ),
        [_CTC],
        half=False,
        grad_inputs=[0],
    ),
    Case(
        "ctc_loss_zero_infinity",  # sample 1 cannot fit 3 repeated labels in 4 steps
        lambda lp, t: F.ctc_loss(lp, t, [6, 4], [3, 3], reduction="none", zero_infinity=True),
        lambda: (_randn(6, 2, 4).log_softmax(-1), torch.tensor([[1, 2, 3], [2, 2, 2]])),
        [_CTC],
        half=False,
        grad_inputs=[0],
    ),
    Case(
        "ctc_loss_impossible",  # an infinite loss (and, as torch's, a NaN gradient)
        lambda lp, t: F.ctc_loss(lp, t, [6, 4], [3, 3], reduction="none"),
        lambda: (_randn(6, 2, 4).log_softmax(-1), torch.tensor([[1, 2, 3], [2, 2, 2]])),
        [_CTC],
        half=False,
        grad=False,
    ),
    Case(
        "ctc_loss_unbatched",
        lambda lp, t: F.ctc_loss(lp, t, torch.tensor(6), torch.tensor(2), reduction="none"),
        lambda: (_randn(6, 4).log_softmax(-1), torch.tensor([3, 1])),
        [_CTC],
        half=False,
        grad_inputs=[0],
    ),
]
