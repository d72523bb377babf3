"""nll_loss / nll_loss_with_softmax_grad: argument errors, output names and op types."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException


def _inputs(
    probs_shape=(4, 5), labels_shape=(4,), probs_dtype=popxl.float32, labels_dtype=popxl.int32
):
    probs = popxl.variable(np.full(probs_shape, 0.2), probs_dtype, name="probs")
    labels = popxl.variable(np.zeros(labels_shape), labels_dtype, name="labels")
    return probs, labels


@pytest.mark.parametrize("fn", [ops.nll_loss, ops.nll_loss_with_softmax_grad])
def test_unknown_reduction_is_a_value_error(fn):
    with popxl.Ir().main_graph:
        probs, labels = _inputs()
        with pytest.raises(ValueError, match="reduction must be one of .* got 'avg'"):
            fn(probs, labels, reduction="avg")


def test_nll_loss_labels_must_match_probs_without_class_dim():
    # PopART's NllOp::setup refused any other label shape, even with as many elements.
    with popxl.Ir().main_graph:
        probs, labels = _inputs((4, 5), (2, 2))
        with pytest.raises(PopXLException, match=r"labels should have shape \(4,\).*\(2, 2\)"):
            ops.nll_loss(probs, labels)


def test_softmax_grad_labels_may_hold_the_samples_in_any_shape():
    with popxl.Ir().main_graph:
        probs, labels = _inputs((40, 128), (2, 20))
        loss, dx = ops.nll_loss_with_softmax_grad(probs, labels, reduction="none")
        assert (loss.shape, dx.shape) == ((2, 20), (40, 128))


def test_softmax_grad_needs_one_label_per_sample():
    with popxl.Ir().main_graph:
        probs, labels = _inputs(labels_shape=(5,))
        with pytest.raises(PopXLException, match=r"4 rows of 5 classes, but labels of shape"):
            ops.nll_loss_with_softmax_grad(probs, labels)


@pytest.mark.parametrize("fn", [ops.nll_loss, ops.nll_loss_with_softmax_grad])
def test_labels_must_be_integer(fn):
    with popxl.Ir().main_graph:
        probs, labels = _inputs(labels_dtype=popxl.float32)
        with pytest.raises(PopXLException, match="labels must have an integer dtype, got float32"):
            fn(probs, labels)


def test_probs_must_be_float():
    with popxl.Ir().main_graph:
        probs, labels = _inputs(probs_dtype=popxl.int32)
        with pytest.raises(PopXLException, match="probs must have a floating point dtype"):
            ops.nll_loss(probs, labels)


def test_labels_must_be_a_tensor():
    with popxl.Ir().main_graph:
        probs, _ = _inputs()
        with pytest.raises(TypeError, match="`labels` is not a Tensor"):
            ops.nll_loss(probs, np.zeros(4, np.int32))


def test_nll_loss_names_type_and_shapes():
    with popxl.Ir().main_graph:
        probs, labels = _inputs((2, 3, 5), (2, 3), popxl.float16)
        loss = ops.nll_loss(probs, labels)
        none = ops.nll_loss(probs, labels, reduction="none")
        assert loss.name == "loss" and none.name.startswith("loss__t")
        assert loss._producer.type == "Nll"
        assert (loss.shape, loss.dtype) == ((), popxl.float16)
        assert none.shape == (2, 3)


def test_softmax_grad_names_type_and_float_loss_grad_is_float32_constant():
    with popxl.Ir().main_graph:
        probs, labels = _inputs(probs_dtype=popxl.float16)
        loss, dx = ops.nll_loss_with_softmax_grad(probs, labels, 0.5)
        op = loss._producer
        assert (loss.name, dx.name) == ("loss", "dx")
        assert op.type == "NllLossWithSoftmaxGradDirect"
        assert op.inputs[2].dtype == popxl.float32 and op.inputs[2].shape == ()
        assert (dx.shape, dx.dtype, loss.dtype) == ((4, 5), popxl.float16, popxl.float16)


def test_softmax_grad_loss_grad_must_broadcast_to_probs():
    with popxl.Ir().main_graph:
        probs, labels = _inputs()
        grad = popxl.variable(np.ones(3, np.float32))
        with pytest.raises(PopXLException, match=r"loss_grad must be a float tensor with one"):
            ops.nll_loss_with_softmax_grad(probs, labels, grad)
        # One factor per sample is fine under any reduction (PopART scaled dx by it).
        per_sample = popxl.variable(np.ones(4, np.float32))
        _, dx = ops.nll_loss_with_softmax_grad(probs, labels, per_sample, reduction="mean")
        assert dx.shape == (4, 5)


def test_softmax_grad_loss_grad_must_be_float():
    with popxl.Ir().main_graph:
        probs, labels = _inputs()
        grad = popxl.variable(1, popxl.int32)
        with pytest.raises(PopXLException, match="got dtype int32"):
            ops.nll_loss_with_softmax_grad(probs, labels, grad)
