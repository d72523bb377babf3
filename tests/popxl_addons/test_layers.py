"""popxl_addons.layers: each layer built, bound, called and run, against NumPy oracles."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.layers import Conv2D, Embedding, GroupNorm, LayerNorm, Linear
from popxl_addons.layers.init import truncated_normal

# A tiny harness: inputs through host streams, outputs back through host streams ----------


def run_layer(layer, inputs, *args, replication=1, weights=None, **kwargs):
    """Build ``layer`` on ``inputs`` (one host array per tensor argument; with replication,
    stacked per replica) in a fresh Ir, run it once and return
    ``(outputs, variables, host weights by flat key, factories)``.

    ``layer`` may be a function of the Ir (to make replica groupings of that Ir).
    ``weights(variables)`` may return ``{variable: array}`` written before the run.
    """
    ir = popxl.Ir(replication=replication)
    if not isinstance(layer, addons.Module):
        layer = layer(ir)
    with ir.main_graph:
        streams, tensors = [], []
        for i, a in enumerate(inputs):
            shape = a.shape[1:] if replication > 1 else a.shape
            stream = popxl.h2d_stream(shape, popxl.dtype.as_dtype(a.dtype), f"in{i}")
            streams.append(stream)
            tensors.append(ops.host_load(stream, f"x{i}"))
        facts, graph = layer.create_graph(*tensors, *args, **kwargs)
        variables = facts.init()
        outs = graph.bind(variables).call(*tensors)
        out_streams = []
        for i, out in enumerate(outs):
            out_streams.append(popxl.d2h_stream(out.shape, out.dtype, f"out{i}"))
            ops.host_store(out_streams[-1], out)
    with popxl.Session(ir, "ipu_model") as session:
        if weights is not None:
            session.write_variables_data(weights(variables))
        results = session.run(dict(zip(streams, inputs)))
    data = session.get_tensors_data(variables.tensors)
    host = {key: data[var] for key, var in variables.to_dict().items()}
    return [results[s] for s in out_streams], variables, host, facts


def factory_specs(facts):
    return [(key, f.shape, f.dtype) for key, f in facts.to_dict().items()]


@pytest.fixture
def seeded():
    np.random.seed(1234)


# truncated_normal ------------------------------------------------------------------------


def test_truncated_normal_is_bounded_scaled_and_reproducible():
    np.random.seed(0)
    a = truncated_normal((200, 50))
    np.random.seed(0)
    b = truncated_normal((200, 50))
    assert a.shape == (200, 50) and a.dtype == np.float64
    np.testing.assert_array_equal(a, b)
    assert np.abs(a).max() <= 0.04
    # the std of a standard normal truncated to [-2, 2] is about 0.8796
    assert a.std() == pytest.approx(0.02 * 0.8796, rel=0.03)
    assert abs(a.mean()) < 0.001


def test_truncated_normal_takes_a_generator_std_and_scalar_shape():
    x = truncated_normal(10_000, std=1.5, rng=np.random.default_rng(3))
    assert x.shape == (10_000,) and np.abs(x).max() <= 3.0 and np.abs(x).max() > 2.5
    assert truncated_normal((), rng=np.random.default_rng(0)).shape == ()


# Linear ----------------------------------------------------------------------------------


def test_linear_matches_numpy_and_declares_weight_then_bias(seeded):
    x = np.random.rand(3, 4).astype(np.float32)
    (y,), variables, w, facts = run_layer(Linear(6), [x])
    assert factory_specs(facts) == [
        ("weight", (4, 6), popxl.float32),
        ("bias", (6,), popxl.float32),
    ]
    assert variables.weight.name == "weight" and variables.bias.name == "bias"
    assert np.abs(w["weight"]).max() <= 0.04 and w["weight"].std() > 0.01
    np.testing.assert_array_equal(w["bias"], np.zeros(6, np.float32))
    np.testing.assert_allclose(y, x @ w["weight"] + w["bias"], rtol=1e-5, atol=1e-6)


def test_linear_with_written_bias_and_without_bias(seeded):
    x = np.random.rand(2, 5, 3).astype(np.float32)
    bias = np.arange(4, dtype=np.float32)
    (y,), _, w, _ = run_layer(Linear(4), [x], weights=lambda v: {v.bias: bias})
    np.testing.assert_allclose(y, x @ w["weight"] + bias, rtol=1e-5, atol=1e-6)

    (y,), variables, w, facts = run_layer(Linear(4, bias=False), [x])
    assert list(facts.keys()) == ["weight"] and list(variables.keys()) == ["weight"]
    np.testing.assert_allclose(y, x @ w["weight"], rtol=1e-5, atol=1e-6)


def test_linear_float16_follows_the_input_dtype(seeded):
    x = np.random.rand(2, 8).astype(np.float16)
    (y,), _, w, facts = run_layer(Linear(3), [x])
    assert y.dtype == np.float16 and w["weight"].dtype == np.float16
    assert factory_specs(facts)[0] == ("weight", (8, 3), popxl.float16)
    ref = x.astype(np.float32) @ w["weight"].astype(np.float32)
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=1e-2, atol=1e-3)


def test_linear_tensor_parallel_grouping_draws_one_weight_per_group(seeded):
    replicas = 4
    x = np.random.rand(replicas, 2, 3).astype(np.float32)

    def layer(ir):  # groups {0, 1} and {2, 3}
        return Linear(5, replica_grouping=ir.replica_grouping(stride=1, group_size=2))

    (y,), variables, w, _ = run_layer(layer, [x], replication=replicas)
    assert w["weight"].shape == (2, 3, 5) and w["bias"].shape == (2, 5)
    assert not np.allclose(w["weight"][0], w["weight"][1])
    for r in range(replicas):
        g = r // 2
        np.testing.assert_allclose(y[r], x[r] @ w["weight"][g] + w["bias"][g], rtol=1e-5, atol=1e-6)


def test_linear_gradients_through_autodiff_match_numpy(seeded):
    x_data = np.random.rand(3, 4).astype(np.float32)
    dy_data = np.random.rand(3, 5).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream(x_data.shape, popxl.float32, "x")
        dy_stream = popxl.h2d_stream(dy_data.shape, popxl.float32, "dy")
        x = ops.host_load(x_stream, "x")
        facts, fwd = Linear(5).create_graph(x)
        bwd = addons.autodiff(fwd)
        variables = facts.init()
        fwd_info = fwd.bind(variables).call_with_info(x)
        dy = ops.host_load(dy_stream, "dy")
        bwd_info = bwd.call_with_info(dy, args=bwd.grad_graph_info.inputs_dict(fwd_info))
        grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(fwd_info, bwd_info)
        wanted = {"x": x, "weight": variables.weight, "bias": variables.bias}
        out_streams = {}
        for name, t in wanted.items():
            out_streams[name] = popxl.d2h_stream(t.shape, t.dtype, f"d{name}")
            ops.host_store(out_streams[name], grads[t])
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run({x_stream: x_data, dy_stream: dy_data})
    w = session.get_tensor_data(variables.weight)
    np.testing.assert_allclose(out[out_streams["x"]], dy_data @ w.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[out_streams["weight"]], x_data.T @ dy_data, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[out_streams["bias"]], dy_data.sum(0), rtol=1e-5, atol=1e-6)


def torch_parameter(array):
    """A torch parameter (it requires grad) holding ``array``, as torch_mapping gets them."""
    torch = pytest.importorskip("torch")
    return torch.nn.Parameter(torch.from_numpy(np.array(array)))


def test_linear_torch_mapping_transposes_and_checks_shapes(seeded):
    x = np.random.rand(2, 3).astype(np.float32)
    torch_w = np.random.rand(4, 3)  # torch layout (out, in), float64 on purpose
    torch_b = np.random.rand(4)
    layer = SimpleNamespace(weight=torch_parameter(torch_w), bias=torch_parameter(torch_b))

    def mapping(variables):
        weights = Linear.torch_mapping(variables, layer)
        assert isinstance(weights, addons.WeightsDict)
        assert weights[variables.weight].dtype == np.float32
        return weights

    (y,), _, w, _ = run_layer(Linear(4), [x], weights=mapping)
    np.testing.assert_allclose(w["weight"], torch_w.T.astype(np.float32))
    np.testing.assert_allclose(y, x @ torch_w.T + torch_b, rtol=1e-5, atol=1e-6)

    wrong = SimpleNamespace(weight=np.zeros((3, 4)), bias=None)
    with pytest.raises(ValueError, match="shape"):
        run_layer(Linear(4), [x], weights=lambda v: Linear.torch_mapping(v, wrong))


# LayerNorm -------------------------------------------------------------------------------


def np_layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def test_layer_norm_matches_numpy(seeded):
    x = (np.random.rand(4, 6) * 3).astype(np.float32)
    w_data = np.random.rand(6).astype(np.float32)
    b_data = np.random.rand(6).astype(np.float32)
    torch_like = SimpleNamespace(weight=w_data.reshape(1, 6), bias=torch_parameter(b_data))
    (y,), variables, w, facts = run_layer(
        LayerNorm(), [x], eps=1e-3, weights=lambda v: LayerNorm.torch_mapping(v, torch_like)
    )
    assert factory_specs(facts) == [("weight", (6,), popxl.float32), ("bias", (6,), popxl.float32)]
    np.testing.assert_array_equal(w["weight"], w_data)
    np.testing.assert_allclose(y, np_layer_norm(x, w_data, b_data, 1e-3), rtol=1e-5, atol=1e-5)


def test_layer_norm_initialises_ones_and_zeros(seeded):
    x = np.random.rand(2, 5).astype(np.float32)
    (y,), _, w, _ = run_layer(LayerNorm(), [x])
    np.testing.assert_array_equal(w["weight"], np.ones(5, np.float32))
    np.testing.assert_array_equal(w["bias"], np.zeros(5, np.float32))
    np.testing.assert_allclose(y, np_layer_norm(x, 1.0, 0.0, 1e-5), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 3, 4), (8,)])
def test_layer_norm_requires_rank_two(shape):
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match="rank-2"):
        LayerNorm().create_graph(popxl.TensorSpec(shape, popxl.float32))


# GroupNorm -------------------------------------------------------------------------------


def np_group_norm(x, w, b, groups, eps):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    y = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    return y.reshape(x.shape) * w.reshape(bshape) + b.reshape(bshape)


def test_group_norm_matches_numpy(seeded):
    x = np.random.rand(2, 6, 3, 4).astype(np.float32)
    w_data = np.random.rand(6).astype(np.float32)
    b_data = np.random.rand(6).astype(np.float32)
    torch_like = SimpleNamespace(weight=w_data, bias=b_data)
    (y,), _, w, facts = run_layer(
        GroupNorm(3, eps=1e-4), [x], weights=lambda v: GroupNorm.torch_mapping(v, torch_like)
    )
    assert factory_specs(facts) == [("weight", (6,), popxl.float32), ("bias", (6,), popxl.float32)]
    np.testing.assert_allclose(y, np_group_norm(x, w_data, b_data, 3, 1e-4), rtol=1e-4, atol=1e-5)


def test_group_norm_defaults_and_cache(seeded):
    x = np.random.rand(3, 4, 5).astype(np.float32)
    (y,), _, w, _ = run_layer(GroupNorm(2), [x])
    np.testing.assert_array_equal(w["weight"], np.ones(4, np.float32))
    np.testing.assert_allclose(
        y, np_group_norm(x, np.ones(4), np.zeros(4), 2, 1e-5), rtol=1e-4, atol=1e-4
    )

    ir = popxl.Ir()
    with ir.main_graph:
        layer = GroupNorm(2, cache=True)
        _, g1 = layer.create_graph(popxl.TensorSpec((3, 4, 5), popxl.float32))
        _, g2 = layer.create_graph(popxl.TensorSpec((3, 4, 5), popxl.float32))
        _, g3 = layer.create_graph(popxl.TensorSpec((3, 4, 6), popxl.float32))
    assert g1.graph is g2.graph and g3.graph is not g1.graph


# Embedding -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "vocab, shards, size",
    [
        (100, 1, 112),
        (112, 1, 112),
        (113, 1, 128),
        (1, 1, 16),
        (100, 4, 32),
        (1000, 3, 336),
        (64, 4, 16),
    ],
)
def test_embedding_vocab_shard_size_is_a_multiple_of_16(vocab, shards, size):
    assert Embedding.get_vocab_shard_size(vocab, shards) == size
    np.testing.assert_array_equal(Embedding.get_offsets(vocab, shards), np.arange(shards) * size)


def test_embedding_unsharded_is_a_padded_table_lookup(seeded):
    indices = np.array([[0, 5, 99], [3, 3, 42]], np.int32)
    layer = Embedding(popxl.float32, vocab_size=100, hidden_size=8)
    (y,), variables, w, facts = run_layer(layer, [indices])
    assert factory_specs(facts) == [("weight", (112, 8), popxl.float32)]
    assert layer.n_shards == 1 and layer.vocab_shard_size == 112
    assert layer.weight.shape == (112, 8)  # kept for tied output layers
    assert np.abs(w["weight"]).max() <= 0.04
    np.testing.assert_array_equal(y, w["weight"][indices])


def test_embedding_float16_and_torch_mapping_pads_rows(seeded):
    indices = np.array([1, 9, 0], np.int32)
    table = np.random.rand(10, 4)
    layer = Embedding(popxl.float16, vocab_size=10, hidden_size=4)
    torch_like = SimpleNamespace(weight=torch_parameter(table))
    (y,), _, w, _ = run_layer(
        layer, [indices], weights=lambda v: Embedding.torch_mapping(v, torch_like, popxl.float16)
    )
    assert w["weight"].shape == (16, 4) and w["weight"].dtype == np.float16
    np.testing.assert_array_equal(w["weight"][10:], 0)
    np.testing.assert_array_equal(y, table.astype(np.float16)[indices])


def test_embedding_sharded_over_replica_groups_gives_zeros_out_of_range(seeded):
    replicas, vocab, hidden = 4, 40, 3
    built = []

    def layer(ir):  # replica r is in group r % 2
        built.append(
            Embedding(popxl.float32, vocab, hidden, replica_grouping=ir.replica_grouping(2, 2))
        )
        return built[0]

    offsets = Embedding.get_offsets(vocab, 2)
    global_ids = np.array([0, 31, 32, 39, 5], np.int32)
    groups = np.arange(replicas) % 2
    local = np.stack([global_ids - offsets[g] for g in groups]).astype(np.int32)
    (y,), _, w, facts = run_layer(layer, [local], replication=replicas)
    assert built[0].n_shards == 2 and built[0].vocab_shard_size == 32
    assert facts.weight.shape == (32, hidden)
    assert w["weight"].shape == (2, 32, hidden)
    full = np.concatenate([w["weight"][0], w["weight"][1]])
    for r in range(replicas):
        owned = (local[r] >= 0) & (local[r] < 32)
        expected = np.where(owned[:, None], full[global_ids], 0.0)
        np.testing.assert_array_equal(y[r], expected)
    np.testing.assert_array_equal(y[0] + y[1], full[global_ids])


def test_embedding_torch_mapping_splits_shards():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        grouping = ir.replica_grouping(stride=1, group_size=1)
        facts, _ = Embedding(popxl.float32, 20, 2, replica_grouping=grouping).create_graph(
            popxl.TensorSpec((3,), popxl.int32)
        )
        variables = facts.init()
    table = np.arange(40, dtype=np.float32).reshape(20, 2)
    weights = Embedding.torch_mapping(variables, SimpleNamespace(weight=table))
    host = weights[variables.weight]
    assert host.shape == (2, 16, 2)
    np.testing.assert_array_equal(host[0], table[:16])
    np.testing.assert_array_equal(host[1, :4], table[16:])
    np.testing.assert_array_equal(host[1, 4:], 0)
    with pytest.raises(ValueError, match="vocab_size"):
        Embedding.torch_mapping(variables, SimpleNamespace(weight=np.zeros((33, 2))))


# Conv2D ----------------------------------------------------------------------------------


def same_pads(size, kernel, stride, dilation, lower):
    """(begin, end) padding of an ONNX SAME_UPPER / SAME_LOWER convolution axis."""
    total = max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    small, large = total // 2, total - total // 2
    return (large, small) if lower else (small, large)


def np_conv2d(x, w, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """Direct NCHW convolution with (top, left, bottom, right) padding."""
    top, left, bottom, right = pads
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    oh = (h - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (wd - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    out = np.zeros((n, m, oh, ow), np.float64)
    per_group = m // groups
    for o in range(m):
        g = o // per_group
        xs = x[:, g * cg : (g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilation[0], j * dilation[1]
                patch = xs[
                    :,
                    :,
                    r0 : r0 + (oh - 1) * stride[0] + 1 : stride[0],
                    c0 : c0 + (ow - 1) * stride[1] + 1 : stride[1],
                ]
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
    return out


def test_conv2d_int_kernel_declares_weight_then_bias(seeded):
    x = np.random.rand(2, 3, 6, 5).astype(np.float32)
    layer = Conv2D(4, 3)
    (y,), _, w, facts = run_layer(layer, [x])
    assert factory_specs(facts) == [
        ("weight", (4, 3, 3, 3), popxl.float32),
        ("bias", (1, 4, 1, 1), popxl.float32),
    ]
    assert np.abs(w["weight"]).max() <= 0.04
    np.testing.assert_allclose(y, np_conv2d(x, w["weight"]), rtol=1e-4, atol=1e-5)
    # the bias flag survives build, so the instance can build again (the original broke here)
    assert layer.bias is True
    ir = popxl.Ir()
    with ir.main_graph:
        facts, _ = layer.create_graph(popxl.TensorSpec((1, 3, 4, 4), popxl.float32))
    assert list(facts.keys()) == ["weight", "bias"]


CONV_CASES = {
    "explicit": dict(kernel_size=(2, 3), paddings=(1, 2, 0, 1)),
    "strided_dilated": dict(
        kernel_size=(3, 2), strides=(2, 1), dilations=(1, 2), paddings=(1, 0, 1, 0)
    ),
    "same_upper": dict(kernel_size=(2, 4), strides=(2, 2), paddings="same_upper"),
    "same_lower": dict(kernel_size=(2, 4), strides=(2, 2), paddings="same_lower"),
    "valid": dict(kernel_size=3, paddings="valid"),
    "grouped": dict(kernel_size=1, groups=2),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_padding_modes_match_numpy(seeded, case):
    options = CONV_CASES[case]
    x = np.random.rand(2, 4, 7, 6).astype(np.float32)
    bias = np.random.rand(1, 6, 1, 1).astype(np.float32)
    (y,), _, w, _ = run_layer(Conv2D(6, **options), [x], weights=lambda v: {v.bias: bias})
    kh, kw = w["weight"].shape[2:]
    stride = options.get("strides", (1, 1))
    dilation = options.get("dilations", (1, 1))
    pads = options.get("paddings", (0, 0, 0, 0))
    if pads in ("same_upper", "same_lower"):
        lower = pads == "same_lower"
        (top, bottom), (left, right) = (
            same_pads(7, kh, stride[0], dilation[0], lower),
            same_pads(6, kw, stride[1], dilation[1], lower),
        )
        pads = (top, left, bottom, right)
        assert y.shape[2:] == (math.ceil(7 / stride[0]), math.ceil(6 / stride[1]))
    elif pads == "valid":
        pads = (0, 0, 0, 0)
    expected = np_conv2d(x, w["weight"], stride, pads, dilation, options.get("groups", 1)) + bias
    assert w["weight"].shape[1] == 4 // options.get("groups", 1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_conv2d_without_bias_and_torch_mapping(seeded):
    x = np.random.rand(1, 2, 4, 4).astype(np.float32)
    (y,), variables, w, facts = run_layer(Conv2D(3, 2, bias=False), [x])
    assert list(facts.keys()) == ["weight"]
    np.testing.assert_allclose(y, np_conv2d(x, w["weight"]), rtol=1e-4, atol=1e-5)

    torch_like = SimpleNamespace(
        weight=torch_parameter(np.random.rand(3, 2, 2, 2)), bias=torch_parameter(np.arange(3.0))
    )
    (y,), _, w, _ = run_layer(
        Conv2D(3, (2, 2)), [x], weights=lambda v: Conv2D.torch_mapping(v, torch_like)
    )
    np.testing.assert_array_equal(w["bias"], np.arange(3.0, dtype=np.float32).reshape(1, 3, 1, 1))
    expected = np_conv2d(x, torch_like.weight.detach().numpy()) + np.arange(3.0).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("paddings", ["same", (1, 1)])
def test_conv2d_rejects_bad_paddings(paddings):
    with pytest.raises(ValueError, match="paddings"):
        Conv2D(2, 3, paddings=paddings)


class Block(addons.Module):
    def __init__(self):
        super().__init__()
        self.fc = Linear(6)
        self.norm = LayerNorm()

    def build(self, x):
        return self.norm(self.fc(x))


def test_layers_inline_as_submodules_under_their_attribute_names(seeded):
    x = np.random.rand(3, 4).astype(np.float32)
    (y,), variables, w, facts = run_layer(Block(), [x])
    assert list(facts.to_dict()) == ["fc.weight", "fc.bias", "norm.weight", "norm.bias"]
    assert variables.fc.weight.name == "fc.weight"
    expected = np_layer_norm(
        x @ w["fc.weight"] + w["fc.bias"], w["norm.weight"], w["norm.bias"], 1e-5
    )
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = Block().create_graph(popxl.TensorSpec((3, 4), popxl.float32))
    assert [t.name for t in graph.graph.inputs] == [
        "x",
        "fc/weight",
        "fc/bias",
        "norm/weight",
        "norm/bias",
    ]


def test_layers_are_not_loaded_by_import_popxl_addons():
    import subprocess
    import sys

    code = "import sys, popxl_addons; print('popxl_addons.layers' in sys.modules, 'popxl_addons.optimizers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
