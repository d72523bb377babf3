"""Op-table cases: nll_loss and nll_loss_with_softmax_grad."""

import numpy as np

import popxl.ops as ops

from .harness import OpCase, f32


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _onehot(labels, n):
    return (labels[..., None] == np.arange(n)).astype(np.float32)


P = _softmax(f32(4, 5, seed=10))
L = np.array([0, 3, 4, 1], np.int32)
P3 = _softmax(f32(2, 3, 4, seed=11))
L3 = np.array([[0, 1, 3], [2, 2, 0]], np.int32)
L_IGN = np.array([0, 2, 4, 2], np.int32)  # label 2 is ignored below
L_OUT = np.array([-100, 3, -100, 1], np.int32)  # ignore index outside the class range
# PopART's fused op flattens the labels: (2, 20) labels for (40, C) probs (issue 24).
P40 = _softmax(f32(40, 128, seed=14))
L2x20 = ((np.arange(40) * 37) % 128).astype(np.int32).reshape(2, 20)
L2x20_IGN = np.where(np.arange(40).reshape(2, 20) % 7 == 0, -1, L2x20).astype(np.int32)
P_ZERO = np.array([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]], np.float32)  # label prob 0: clamped


def _picked(p, labels):
    return np.take_along_axis(p, labels[..., None].astype(np.int64), -1)[..., 0]


def _nll_ref(reduction, ignore=None, log_prob=False, eps=1e-7):
    def ref(p, labels):
        kept = np.ones(labels.shape, bool) if ignore is None else labels != ignore
        safe = np.where(kept, labels, 0)
        picked = _picked(p, safe).astype(np.float64)
        per = -picked if log_prob else -np.log(np.maximum(picked, eps))
        per = np.where(kept, per, 0.0)
        if reduction == "none":
            out = per
        elif reduction == "sum":
            out = per.sum()
        else:
            out = per.sum() / max(kept.sum(), 1)
        return np.asarray(out).astype(p.dtype)

    return ref


def _softmax_grad_ref(reduction, ignore=None, loss_grad=None):
    """Labels (and a per-sample loss_grad) may hold the samples in any shape: flattened."""

    def ref(p, labels, *rest):
        g = np.float64(loss_grad) if loss_grad is not None else rest[0].astype(np.float64)
        rows = labels.reshape(p.shape[:-1])
        kept = np.ones(rows.shape, bool) if ignore is None else rows != ignore
        safe = np.where(kept, rows, 0)
        p64 = p.astype(np.float64)
        per = np.where(kept, -np.log(_picked(p64, safe) + 1e-7), 0.0)
        if np.size(g) == 1:
            g = np.full(rows.shape, np.ravel(g)[0])
        scale = np.where(kept, np.reshape(g, rows.shape), 0.0)
        n = max(kept.sum(), 1)
        dx = (p64 - _onehot(safe, p.shape[-1])) * scale[..., None]
        if reduction == "none":
            loss = per.reshape(labels.shape)
        elif reduction == "sum":
            loss = per.sum()
        else:
            loss, dx = per.sum() / n, dx / n
        return np.asarray(loss).astype(p.dtype), dx.astype(p.dtype)

    return ref


def _nll(**kw):
    return lambda p, labels: ops.nll_loss(p, labels, **kw)


def _swg(**kw):
    return lambda p, labels, *g: ops.nll_loss_with_softmax_grad(p, labels, *g, **kw)


CASES = [
    OpCase("nll_loss_mean", ops.nll_loss, [P, L], _nll_ref("mean"), grad=[0]),
    OpCase("nll_loss_sum_3d", _nll(reduction="sum"), [P3, L3], _nll_ref("sum"), grad=[0]),
    OpCase("nll_loss_none_3d", _nll(reduction="none"), [P3, L3], _nll_ref("none"), grad=[0]),
    OpCase(
        "nll_loss_ignore_index_mean",
        _nll(ignore_index=2),
        [P, L_IGN],
        _nll_ref("mean", ignore=2),
        grad=[0],
    ),
    OpCase(
        "nll_loss_ignore_index_out_of_range",
        _nll(ignore_index=-100, reduction="none"),
        [P, L_OUT],
        _nll_ref("none", ignore=-100),
        grad=[0],
    ),
    OpCase(
        "nll_loss_all_ignored_mean_is_zero",
        _nll(ignore_index=2),
        [P, np.full(4, 2, np.int32)],
        _nll_ref("mean", ignore=2),
        grad=[0],
    ),
    OpCase(
        "nll_loss_log_prob",
        _nll(log_prob=True),
        [np.log(P), L],
        _nll_ref("mean", log_prob=True),
        grad=[0],
    ),
    # The clamp at eps is a kink: finite differences cannot check the gradient there.
    OpCase(
        "nll_loss_zero_prob_clamped",
        _nll(reduction="none"),
        [P_ZERO, np.array([0, 2], np.int32)],
        _nll_ref("none"),
        grad=False,
    ),
    OpCase(
        "nll_loss_fp16_clamp_eps",
        _nll(reduction="none"),
        [P_ZERO.astype(np.float16), np.array([0, 2], np.int32)],
        _nll_ref("none", eps=6.104e-5),
        rtol=1e-3,
        grad=False,
    ),
    OpCase(
        "nll_loss_fp16_mean",
        ops.nll_loss,
        [P.astype(np.float16), L],
        _nll_ref("mean", eps=6.104e-5),
        rtol=2e-3,
        atol=1e-3,
        grad=[0],
        grad_rtol=3e-2,
        grad_atol=3e-2,
    ),
    OpCase(
        "nll_loss_uint32_labels",
        _nll(reduction="sum"),
        [P, L.astype(np.uint32)],
        _nll_ref("sum"),
        grad=[0],
    ),
    OpCase(
        "nll_loss_with_softmax_grad_mean",
        ops.nll_loss_with_softmax_grad,
        [P, L],
        _softmax_grad_ref("mean", loss_grad=1.0),
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_sum_float_loss_grad",
        _swg(loss_grad=0.5, reduction="sum"),
        [P3, L3],
        _softmax_grad_ref("sum", loss_grad=0.5),
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_none_per_sample_loss_grad",
        _swg(reduction="none"),
        [P, L, f32(4, seed=12)],
        _softmax_grad_ref("none"),
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_ignore_index_tensor_loss_grad",
        _swg(ignore_index=2),
        [P, L_IGN, np.array(2.0, np.float32)],
        _softmax_grad_ref("mean", ignore=2),
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_all_ignored",
        _swg(ignore_index=-100),
        [P, np.full(4, -100, np.int32)],
        _softmax_grad_ref("mean", ignore=-100, loss_grad=1.0),
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_fp16_probs_fp32_loss_grad",
        _swg(),
        [P.astype(np.float16), L, np.array([4.0], np.float32)],
        _softmax_grad_ref("mean"),
        rtol=2e-3,
        atol=1e-3,
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_fp16_float_loss_grad",
        lambda p, y: ops.nll_loss_with_softmax_grad(p, y, 2.0, reduction="sum"),
        [P.astype(np.float16), L],
        _softmax_grad_ref("sum", loss_grad=2.0),
        rtol=2e-3,
        atol=2e-3,
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_labels_reshaped",
        ops.nll_loss_with_softmax_grad,
        [P40, L2x20],
        _softmax_grad_ref("mean", loss_grad=1.0),
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_labels_reshaped_ignore_index_sum",
        _swg(loss_grad=0.5, ignore_index=-1, reduction="sum"),
        [P40, L2x20_IGN],
        _softmax_grad_ref("sum", ignore=-1, loss_grad=0.5),
        grad=False,
    ),
    OpCase(
        "nll_loss_with_softmax_grad_labels_reshaped_uint32_none_per_sample_loss_grad",
        _swg(reduction="none"),
        [P40, L2x20.astype(np.uint32), f32(2, 20, seed=15)],
        _softmax_grad_ref("none"),
        grad=False,
    ),
    # PopART scales dx by a per-sample loss_grad under any reduction.
    OpCase(
        "nll_loss_with_softmax_grad_mean_per_row_loss_grad",
        _swg(),
        [P, L, f32(4, 1, seed=16)],
        _softmax_grad_ref("mean"),
        grad=False,
    ),
    # The fused op is the gradient of softmax followed by nll_loss.
    OpCase(
        "nll_loss_with_softmax_grad_of_softmax",
        lambda x, y: ops.nll_loss_with_softmax_grad(ops.softmax(x, -1), y)[1],
        [f32(4, 5, seed=13), L],
        lambda x, labels: ((_softmax(x) - _onehot(labels, 5)) / 4).astype(np.float32),
        grad=False,
    ),
]
