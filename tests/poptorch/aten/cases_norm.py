"""Cases for ``poptorch/aten/norm.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.ops import aten

from .harness import Case

BN_EVAL = aten._native_batch_norm_legit_no_training.default
BN_TRAIN = aten._native_batch_norm_legit_functional.default
BN_BATCH = aten._native_batch_norm_legit.no_stats
LAYER = aten.native_layer_norm.default
GROUP = aten.native_group_norm.default


def _bn_inputs(*shape: int):
    c = shape[1]
    return lambda: (
        torch.randn(*shape) * 2 + 1,
        torch.randn(c),
        torch.rand(c) + 0.5,
        torch.randn(c),
        torch.randn(c),
    )


def _bn_train(x, rm, rv, w, b):
    """The input normalised by its batch statistics. (An inference model leaves the running
    statistics as they are, as PopTorch did; their update in training is tested in
    ``test_torch_models.py``.)"""
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3, eps=1e-3)


CASES = [
    Case(
        "batch_norm_eval",
        lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, eps=1e-3),
        _bn_inputs(3, 4, 5, 2),
        [BN_EVAL],
        grad_inputs=[0, 3, 4],
    ),
    Case(
        "batch_norm_eval_no_affine",
        lambda x, rm, rv: F.batch_norm(x, rm, rv),
        lambda: _bn_inputs(3, 4, 5)()[:3],
        [BN_EVAL],
        grad_inputs=[0],
    ),
    Case("batch_norm_train", _bn_train, _bn_inputs(3, 4, 5, 2), [BN_TRAIN], grad_inputs=[0, 3, 4]),
    Case(
        "batch_norm_train_3d_no_affine",
        lambda x, rm, rv: _bn_train(x, rm, rv, None, None),
        lambda: _bn_inputs(2, 3, 2, 3, 2)()[:3],
        [BN_TRAIN],
        grad_inputs=[0],
    ),
    Case(
        "batch_norm_batch_stats",
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        lambda: _bn_inputs(4, 3, 5)()[::3][:1] + (torch.randn(3), torch.randn(3)),
        [BN_BATCH],
    ),
    Case(
        "instance_norm",
        lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
        lambda: (torch.randn(2, 3, 4, 5) * 3, torch.randn(3), torch.randn(3)),
        [BN_BATCH],
    ),
    Case(
        "batch_norm_saved_stats",
        lambda x, w, b: torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5),
        lambda: (torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)),
        [BN_BATCH],
    ),
    Case(
        "layer_norm",
        lambda x, w, b: F.layer_norm(x, (4, 5), w, b, eps=1e-3),
        lambda: (torch.randn(2, 3, 4, 5) * 2 + 1, torch.randn(4, 5), torch.randn(4, 5)),
        [LAYER],
    ),
    Case(
        "layer_norm_no_affine",
        lambda x: F.layer_norm(x, (5,)),
        lambda: (torch.randn(3, 5),),
        [LAYER],
    ),
    Case(
        "layer_norm_stats",
        lambda x, w: torch.native_layer_norm(x, (3, 4), w, None, 1e-5),
        lambda: (torch.randn(2, 3, 4), torch.randn(3, 4)),
        [LAYER],
    ),
    Case(
        "group_norm",
        lambda x, w, b: F.group_norm(x, 2, w, b),
        lambda: (torch.randn(3, 6, 4, 2) * 2 + 1, torch.randn(6), torch.randn(6)),
        [GROUP],
    ),
    Case(
        "group_norm_no_affine_stats",
        lambda x: torch.native_group_norm(x, None, None, 2, 6, 5, 3, 1e-5),
        lambda: (torch.randn(2, 6, 5),),
        [GROUP],
    ),
]
