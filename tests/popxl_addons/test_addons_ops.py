"""addons.ops (cross entropy, host IO helpers) against NumPy (reference 1.9)."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons

F32 = popxl.float32

LOGITS = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
LABELS = np.array([0, 3, 1, 2, 3], np.int32)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _ce_ref(x, labels, ignore_index=None, reduction="mean"):
    p = _softmax(x)
    losses = -np.log(p[np.arange(len(labels)), labels])
    keep = np.ones(len(labels), bool) if ignore_index is None else labels != ignore_index
    losses = np.where(keep, losses, 0.0)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / keep.sum()


def _ce_grad_ref(x, labels, ignore_index=None, reduction="mean"):
    keep = np.ones(len(labels), bool) if ignore_index is None else labels != ignore_index
    g = _softmax(x)
    g[np.arange(len(labels)), labels] -= 1.0
    g *= keep[:, None]
    return g / keep.sum() if reduction == "mean" else g


def _run(build):
    ir = popxl.Ir()
    with ir.main_graph:
        outs = build()
        streams = []
        for t in outs:
            streams.append(popxl.d2h_stream(t.shape, t.dtype))
            ops.host_store(streams[-1], t)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    return [result[s] for s in streams]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, 3])
def test_cross_entropy_matches_numpy(reduction, ignore_index):
    (loss,) = _run(
        lambda: [
            addons.ops.cross_entropy(
                popxl.constant(LOGITS), popxl.constant(LABELS), ignore_index, reduction=reduction
            )
        ]
    )
    np.testing.assert_allclose(
        loss, _ce_ref(LOGITS, LABELS, ignore_index, reduction), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignore_index", [None, 3])
def test_cross_entropy_with_grad_scales_only_the_gradient(reduction, ignore_index):
    loss, grad = _run(
        lambda: addons.ops.cross_entropy_with_grad(
            popxl.constant(LOGITS), popxl.constant(LABELS), 4.0, ignore_index, reduction
        )
    )
    np.testing.assert_allclose(
        loss, _ce_ref(LOGITS, LABELS, ignore_index, reduction), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        grad, 4.0 * _ce_grad_ref(LOGITS, LABELS, ignore_index, reduction), rtol=1e-5, atol=1e-6
    )


def test_cross_entropy_with_grad_equals_autodiff_of_cross_entropy():
    def build():
        graph = popxl.gir().create_graph(
            lambda x, y: addons.ops.cross_entropy(x, y),
            popxl.TensorSpec((5, 4), F32),
            popxl.TensorSpec((5,), popxl.int32),
        )
        grad = addons.autodiff(graph, grads_required=[graph.inputs[0]])
        x, y = popxl.constant(LOGITS), popxl.constant(LABELS)
        info = ops.call_with_info(graph, x, y)
        (dx,) = grad.call(
            popxl.constant(np.float32(1.0)), args=grad.grad_graph_info.inputs_dict(info)
        )
        _, dx_direct = addons.ops.cross_entropy_with_grad(x, y)
        return [dx, dx_direct]

    dx, dx_direct = _run(build)
    np.testing.assert_allclose(dx, dx_direct, rtol=1e-5, atol=1e-7)


def test_host_load_makes_a_named_stream_and_casts_the_data():
    ir = popxl.Ir()
    data = np.arange(6, dtype=np.float64).reshape(2, 3)
    with ir.main_graph:
        host, stream, t = addons.ops.host_load(data, F32, "x")
        out_stream = addons.ops.host_store(t * 2.0)
    assert host.dtype == np.float32 and host.shape == (2, 3)
    assert stream.tensor_id == "x_stream" and stream.shape == (2, 3) and stream.dtype == F32
    assert t.name == "x_hostload" and t.shape == (2, 3)
    assert out_stream.tensor_id == "mul_out_stream"
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run({stream: host})[out_stream]
    np.testing.assert_allclose(out, data * 2)


def test_host_load_converts_float_data_to_float8():
    data = np.array([0.5, -3.0, np.nan, 1000.0])
    ir = popxl.Ir()
    with ir.main_graph:
        host, stream, t = addons.ops.host_load(data, popxl.float8_143, "x")
        out_stream = addons.ops.host_store(t)
    # PopXL's structured float8 data: 0.5, -3.0, then NaN (0x80) twice (1000 > 240).
    assert host.dtype == popxl.dtypes.np_dtype_float8_143
    assert host.view(np.uint8).tolist() == [56, 204, 128, 128]
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run({stream: host})[out_stream]
    np.testing.assert_equal(out, host)
