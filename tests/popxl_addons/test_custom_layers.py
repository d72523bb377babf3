"""Layers built on the custom ops: LinearGQ, LinearFP8, LayerNormDistributed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.layers.layer_norm_distributed import LayerNormDistributed
from popxl_addons.layers.linear_fp8 import LinearFP8
from popxl_addons.layers.linear_gq import LinearGQ
from popxl_addons.ops.group_quantize_decompress import (
    group_quantize_compress_numpy,
    group_quantize_decompress_numpy,
)


def _run_layer(
    layer: addons.Module, x: np.ndarray, values: dict[str, np.ndarray], dy: np.ndarray | None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Output, and with ``dy`` the gradients of the input and of every float variable."""
    ir = popxl.Ir()
    with ir.main_graph:
        xt = popxl.variable(x, name="x")
        facts, graph = layer.create_graph(xt)
        variables = facts.init()
        call = graph.bind(variables).call_with_info(xt)
        streams = {"y": addons.ops.host_store(call.outputs[0])}
        if dy is not None:
            floats = [t for t in graph.graph.inputs if t.dtype.is_floating_point]
            dgraph = graph.autodiff(grads_required=floats)  # build_grad where defined
            grads = dgraph.call(popxl.constant(dy), args=dgraph.grad_graph_info.inputs_dict(call))
            names = {t: n for n, t in graph.args.to_dict().items()}
            for t, g in zip(floats, grads):
                streams[names.get(t, "x")] = addons.ops.host_store(g)
    with popxl.Session(ir, "ipu_model") as session:
        session.write_variables_data({variables.to_dict()[k]: v for k, v in values.items()})
        out = session.run()
    return out[streams.pop("y")], {k: out[s] for k, s in streams.items()}


@pytest.mark.parametrize("dim", [0, -1])
def test_linear_gq_uses_the_decompressed_weight(dim: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)).astype(np.float16)
    w = rng.standard_normal((16, 24)).astype(np.float16)
    b = rng.standard_normal(24).astype(np.float16)
    packed, scale, offset = group_quantize_compress_numpy(w, 8, dim=dim)
    values = {
        "weight_compressed": packed,
        "weight_decompression_scale": scale,
        "weight_decompression_bias": offset,
        "bias": b,
    }
    y, _ = _run_layer(LinearGQ(24, group_size=8, dim=dim), x, values, None)
    w_q = group_quantize_decompress_numpy(packed, scale, offset, dim=dim)
    assert w_q.shape == w.shape
    want = x.astype(np.float32) @ w_q.astype(np.float32) + b
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=2e-2, atol=2e-2)


def test_linear_gq_rejects_bad_group_sizes() -> None:
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match="not a multiple of group_size=6"):
        LinearGQ(24, group_size=6).create_graph(popxl.variable(np.zeros((2, 8), np.float16)))


@pytest.mark.parametrize("metric", ["amax", "mse", "manual_scale"])
def test_linear_fp8_is_close_to_the_float_layer(metric: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (8, 16)).astype(np.float16)
    w = (rng.standard_normal((16, 12)) * 0.2).astype(np.float16)
    b = (rng.standard_normal(12) * 0.1).astype(np.float16)
    dy = (rng.standard_normal((8, 12)) * 0.1).astype(np.float16)
    layer = LinearFP8(12, scale_metric=metric, scale=3)
    y, grads = _run_layer(layer, x, {"weight": w, "bias": b}, dy)
    f = [a.astype(np.float32) for a in (x, w, b, dy)]
    want = {"x": f[3] @ f[1].T, "weight": f[0].T @ f[3], "bias": f[3].sum(0)}
    # float8_143 keeps 3 mantissa bits (relative error 2**-4 per value), float8_152 two.
    np.testing.assert_allclose(y, f[0] @ f[1] + f[2], rtol=0.15, atol=0.08)
    for name, ref in want.items():
        np.testing.assert_allclose(grads[name].astype(np.float32), ref, rtol=0.25, atol=0.08)
    assert not np.allclose(grads["x"].astype(np.float32), want["x"], rtol=1e-4, atol=0)


def test_linear_fp8_torch_mapping_is_the_linear_one() -> None:
    torch = pytest.importorskip("torch")
    nn_layer = torch.nn.Linear(6, 4, dtype=torch.float64)
    ir = popxl.Ir()
    with ir.main_graph:
        facts, _ = LinearFP8(4).create_graph(popxl.variable(np.zeros((2, 6), np.float16)))
        variables = facts.init()
    weights = LinearFP8.torch_mapping(variables, nn_layer, popxl.float16)
    assert isinstance(weights, addons.WeightsDict)
    want_w = nn_layer.weight.detach().numpy().T.astype(np.float16)
    np.testing.assert_array_equal(weights[variables.weight], want_w)
    want_b = nn_layer.bias.detach().numpy().astype(np.float16)
    np.testing.assert_array_equal(weights[variables.bias], want_b)


def test_linear_fp8_rejects_unknown_metrics() -> None:
    with pytest.raises(ValueError, match="scale_metric option max is not available"):
        LinearFP8(4, scale_metric="max")


def test_layer_norm_distributed_layer_needs_a_grouping() -> None:
    ir = popxl.Ir(replication=2)
    with ir.main_graph, pytest.raises(ValueError, match="needs the replica grouping"):
        LayerNormDistributed().create_graph(popxl.variable(np.zeros((2, 4), np.float32)))


def test_layer_norm_distributed_layer_variables_are_per_shard() -> None:
    ir = popxl.Ir(replication=4)
    group = ir.replica_grouping(group_size=2)
    with ir.main_graph:
        x = popxl.variable(np.zeros((3, 4), np.float32))
        facts, graph = LayerNormDistributed(group).create_graph(x)
        variables: Any = facts.init()
    assert variables.weight.replica_grouping == group.transpose()
    assert "LayerNormDistributed." in graph.print_schedule()
    _ = ops  # the schedule above is the layer's single op
