"""popxl-addons' custom ops on one replica: values against NumPy, gradients against JAX.

One table entry per op: how to record it, NumPy inputs, the NumPy reference of its output
and a JAX function whose ``jax.grad`` is the reference for the gradient that
``popxl.transforms.autodiff`` builds. The replicated ops are checked in
``test_custom_ops_replicated.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.sparse import csr_matrix

import popxl
import popxl.ops as ops
import popxl_addons.ops.cross_entropy_sharded_loss
import popxl_addons.ops.layer_norm_distributed
import popxl_addons.ops.replicated_all_reduce_TP
import popxl_addons.ops.replicated_strided_collectives  # noqa: F401  (registers their ops)
from popxl._op import REGISTRY
from popxl.errors import PopXLException
from popxl.fp8_utils import host_fp8_mse_scale
from popxl_addons.ops.cross_entropy_sharded_wr_loss import cross_entropy_sharded_wr_loss
from popxl_addons.ops.fp8_amax_scale import fp8_amax_scale
from popxl_addons.ops.fp8_mse_scale import fp8_mse_scale
from popxl_addons.ops.grad_reduce_square_add import grad_reduce_square_add
from popxl_addons.ops.group_quantize_decompress import (
    group_quantize_compress_numpy,
    group_quantize_decompress,
    group_quantize_decompress_numpy,
)
from popxl_addons.ops.linear_layout import linear_layout
from popxl_addons.ops.rotary_pos_embed import rotary_pos_embed, trig_tables
from popxl_addons.ops.static_sparse_ops import dense_const_sparse_matmul, random_sparse

# Keys of the registry entries that popxl_addons.ops adds (all must have a case here or in
# the replicated tests).
CUSTOM_KEYS = {
    "replicated_all_reduce_TP",
    "replicated_all_reduce_strided",
    "replicated_all_gather_strided",
    "replicated_reduce_scatter_strided",
    "cross_entropy_sharded",
    "cross_entropy_sharded_wr",
    "grad_reduce_square_add",
    "layer_norm_distributed",
    "rotary_pos_embed",
    "group_quantize_decompress",
    "fp8_mse_scale",
    "linear_layout",
    "dense_sparse_matmul",
}
REPLICATED_CASES = {
    "replicated_all_reduce_TP",
    "replicated_all_reduce_strided",
    "replicated_all_gather_strided",
    "replicated_reduce_scatter_strided",
    "cross_entropy_sharded",
    "layer_norm_distributed",
}


@dataclass
class Case:
    key: str
    build: Callable[..., popxl.Tensor]  # build(*tensors) -> output (inside a graph)
    inputs: list[np.ndarray]
    reference: Callable[..., np.ndarray]
    jax_fn: Callable[..., Any] | None = None  # differentiable JAX version, for gradients
    diff: tuple[int, ...] = (0,)  # inputs to differentiate
    rtol: float = 1e-5
    atol: float = 1e-5
    type_name: str = ""
    extra: dict = field(default_factory=dict)


def _rope_ref(x: Any, sin: Any, cos: Any, rotary_dim: int, xp: Any = np) -> Any:
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    real, imag = rot[..., ::2], rot[..., 1::2]
    s, c = sin[None, :, None, :], cos[None, :, None, :]
    turned = xp.stack([real * c - imag * s, imag * c + real * s], axis=-1)
    return xp.concatenate([turned.reshape(rot.shape), rest], axis=-1)


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _rope_case() -> Case:
    x = _rng().standard_normal((2, 5, 3, 8)).astype(np.float32)
    sin, cos = trig_tables(5, 6)
    return Case(
        "rotary_pos_embed",
        lambda t, s, c: rotary_pos_embed(t, s, c, 6),
        [x, sin.astype(np.float32), cos.astype(np.float32)],
        lambda t, s, c: _rope_ref(t, s, c, 6),
        lambda t, s, c: _rope_ref(t, s, c, 6, jnp),
        type_name="RotaryPosEmbed",
    )


def _square_add_case() -> Case:
    x = _rng().standard_normal((3, 4)).astype(np.float32)
    return Case(
        "grad_reduce_square_add",
        lambda t: grad_reduce_square_add(t, loss_scaling=8),
        [x],
        lambda t: np.sum(t.astype(np.float64) ** 2) / 64,
        lambda t: jnp.sum(t**2) / 64,
        type_name="GradReduceSquareAdd",
    )


def _gq_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    weights = _rng().standard_normal((6, 32)).astype(np.float16)
    return group_quantize_compress_numpy(weights, group_size=8)


def _gq_case() -> Case:
    packed, scale, bias = _gq_data()

    def jax_fn(p: Any, s: Any, b: Any) -> Any:
        shifts = jnp.asarray([12, 8, 4, 0], jnp.uint16)
        ids = (p[..., None] >> shifts) & 15
        ids = ids.reshape(*p.shape[:-1], -1).astype(s.dtype)
        return (ids * s + b).reshape(p.shape[0], -1)

    return Case(
        "group_quantize_decompress",
        lambda p, s, b: group_quantize_decompress(p, s, b),
        [packed, scale, bias],
        lambda p, s, b: group_quantize_decompress_numpy(p, s, b),
        jax_fn,
        diff=(1, 2),
        rtol=2e-3,
        atol=2e-3,  # float16 sums
        type_name="GroupQuantizeDecompress",
    )


def _layout_case() -> Case:
    x = _rng().standard_normal((4, 6)).astype(np.float32)
    return Case(
        "linear_layout",
        lambda t: linear_layout(t, 2),
        [x],
        lambda t: t,
        lambda t: t,
        type_name="LinearLayout",
    )


def _sparse_case() -> Case:
    np.random.seed(3)
    dense = random_sparse(_rng().standard_normal((5, 7)).astype(np.float32), density=0.4)
    x = _rng().standard_normal((2, 3, 5)).astype(np.float32)
    csr = csr_matrix(dense)
    return Case(
        "dense_sparse_matmul",
        lambda t: dense_const_sparse_matmul(t, csr, 7),
        [x],
        lambda t: t @ dense,
        lambda t: t @ dense,
        type_name="SparseMatmul",
    )


def _ce_wr_case() -> Case:
    rng = _rng()
    sizes = (3, 4, 2)
    logits = [rng.standard_normal((5, n)).astype(np.float32) for n in sizes]
    labels = rng.integers(0, sum(sizes), 5).astype(np.uint32)

    def reference(*xs: np.ndarray) -> np.ndarray:
        full = np.concatenate(xs[:3], axis=1).astype(np.float64)
        lse = np.log(np.exp(full).sum(1))
        return lse - full[np.arange(5), xs[3].astype(np.int64)]

    def jax_fn(*xs: Any) -> Any:
        full = jnp.concatenate(xs[:3], axis=1)
        return -jnp.take_along_axis(
            jax.nn.log_softmax(full, axis=1), xs[3][:, None].astype(int), 1
        )[:, 0]

    return Case(
        "cross_entropy_sharded_wr",
        lambda a, b, c, i0, i1, i2: cross_entropy_sharded_wr_loss(
            [a, b, c], [i0, i1, i2], ipus=[0, 0, 0]
        ),
        [*logits, labels, labels, labels],
        lambda a, b, c, i0, i1, i2: reference(a, b, c, i0),
        lambda a, b, c, i0, i1, i2: jax_fn(a, b, c, i0),
        diff=(0, 1, 2),
        type_name="CrossEntropyShardedWR",
    )


def _mse_case() -> Case:
    x = (_rng().standard_normal(200) * 3).astype(np.float32)
    return Case(
        "fp8_mse_scale",
        lambda t: fp8_mse_scale(t, popxl.float8_152),
        [x],
        lambda t: np.int32(host_fp8_mse_scale(t, popxl.float8_152)[1]),
        type_name="Fp8Scale",
    )


CASES = [
    _rope_case,
    _square_add_case,
    _gq_case,
    _layout_case,
    _sparse_case,
    _ce_wr_case,
    _mse_case,
]


def _run(case: Case, with_grad: bool) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, str]:
    """(forward output, gradients of ``case.diff``, the cotangent used, printed schedule)."""
    ir = popxl.Ir()
    with ir.main_graph:
        tensors = [popxl.variable(x, name=f"in{i}") for i, x in enumerate(case.inputs)]
        graph = ir.create_graph(case.build, *tensors)
        out_spec = graph.outputs[0]
        cot = _rng().standard_normal(out_spec.shape).astype(out_spec.dtype.as_numpy())
        info = ops.call_with_info(graph, *tensors)
        y = info.outputs[0]
        streams = [popxl.d2h_stream(y.shape, y.dtype, "y")]
        ops.host_store(streams[0], y)
        if with_grad:
            wanted = [graph.inputs[k] for k in case.diff]
            grad_info = popxl.transforms.autodiff(graph, grads_required=wanted)
            grads = ops.call(
                grad_info.graph, popxl.constant(cot), inputs_dict=grad_info.inputs_dict(info)
            )
            for k, g in enumerate(grads):
                streams.append(popxl.d2h_stream(g.shape, g.dtype, f"g{k}"))
                ops.host_store(streams[-1], g)
    schedule = graph.print_schedule()
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    return out[streams[0]], [out[s] for s in streams[1:]], cot, schedule


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__.strip("_").removesuffix("_case"))
def test_custom_op_forward_and_gradient(make: Callable[[], Case]) -> None:
    case = make()
    with_grad = case.jax_fn is not None
    y, grads, cot, schedule = _run(case, with_grad)
    np.testing.assert_allclose(y, case.reference(*case.inputs), rtol=case.rtol, atol=1e-6)
    assert f"{case.type_name}." in schedule
    if not with_grad:
        return
    _, pullback = jax.vjp(
        lambda *d: case.jax_fn(*_with(case.inputs, case.diff, d)),
        *[jnp.asarray(case.inputs[k]) for k in case.diff],
    )
    expected = pullback(jnp.asarray(cot).astype(y.dtype))
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, np.asarray(want), rtol=case.rtol, atol=case.atol)


def _with(inputs: list, positions: tuple[int, ...], values: tuple) -> list:
    out = [jnp.asarray(x) for x in inputs]
    for k, v in zip(positions, values):
        out[k] = v
    return out


def test_every_custom_op_has_a_case() -> None:
    keys = {make().key for make in CASES} | REPLICATED_CASES
    registered = {
        k
        for k, d in REGISTRY.items()
        if d.lower is not None and d.lower.__module__.startswith("popxl_addons.ops")
    }
    assert registered == CUSTOM_KEYS
    assert CUSTOM_KEYS <= keys


# Finite differences for one op whose gradient is written by hand (custom_vjp) ------------


def test_rotary_gradient_matches_finite_differences() -> None:
    case = _rope_case()
    y, (grad,), cot, _ = _run(case, with_grad=True)
    x = case.inputs[0].astype(np.float64)
    sin, cos = (a.astype(np.float64) for a in case.inputs[1:])
    eps, index = 1e-6, (1, 2, 0, 3)
    up, down = x.copy(), x.copy()
    up[index] += eps
    down[index] -= eps
    fd = ((_rope_ref(up, sin, cos, 6) - _rope_ref(down, sin, cos, 6)) * cot).sum() / (2 * eps)
    np.testing.assert_allclose(grad[index], fd, rtol=1e-4)


# Ops without gradients, errors ----------------------------------------------------------


@pytest.mark.parametrize("fmt", [popxl.float8_143, popxl.float8_152])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("magnitude", [20.0, 0.01])  # float16 max / 0.01 would overflow
def test_fp8_scales_match_host_references(fmt: popxl.dtype, dtype: type, magnitude: float) -> None:
    x = (_rng().standard_normal(300) * magnitude).astype(dtype)
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(x)
        outs = [fp8_amax_scale(t, fmt), fp8_mse_scale(t, fmt)]
        streams = [popxl.d2h_stream((), popxl.int32, f"s{i}") for i in range(2)]
        for s, o in zip(streams, outs):
            ops.host_store(s, o)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    largest = 240.0 if fmt == popxl.float8_143 else 57344.0
    amax = int(np.clip(np.floor(np.log2(largest / np.abs(x.astype(np.float64)).max())), -31, 31))
    assert out[streams[0]] == amax
    assert out[streams[1]] == host_fp8_mse_scale(x, fmt)[1]


def test_mse_scale_picks_the_middle_of_equal_candidates() -> None:
    # All values in [32, 64): every bias that keeps that binade in range costs the same;
    # float8_143 spans 18 binades, so 18 candidates tie and the middle one is chosen.
    x = np.random.default_rng(0).uniform(32, 64, 10).astype(np.float32)
    assert host_fp8_mse_scale(x, popxl.float8_143)[1] == -7
    assert host_fp8_mse_scale(x, popxl.float8_152)[1] == -6


def test_custom_op_errors() -> None:
    ir = popxl.Ir()
    with ir.main_graph:
        x4 = popxl.variable(np.zeros((1, 2, 1, 4), np.float32))
        sin = popxl.constant(np.zeros((2, 2), np.float32))
        with pytest.raises(PopXLException, match="rotary_dim must be a multiple of 2"):
            rotary_pos_embed(x4, sin, sin, 3)
        with pytest.raises(PopXLException, match="x should have rank 4"):
            rotary_pos_embed(popxl.variable(np.zeros((2, 4), np.float32)), sin, sin)
        i32 = popxl.variable(np.zeros(3, np.int32))
        with pytest.raises(RuntimeError, match="not currently supported"):
            fp8_amax_scale(i32)
        with pytest.raises(RuntimeError, match="not currently supported"):
            dense_const_sparse_matmul(i32, csr_matrix(np.eye(3, dtype=np.float32)), 3)
        with pytest.raises(NotImplementedError, match="rank 3"):
            group_quantize_decompress(
                popxl.variable(np.zeros((2, 2), np.uint16), popxl.uint16), sin, sin
            )
        with pytest.raises(ValueError, match="bs must be a positive int"):
            linear_layout(x4, 0)
        f = popxl.variable(np.zeros((2, 3), np.float32))
        idx = popxl.variable(np.zeros(2, np.uint32), popxl.uint32)
        with pytest.raises(ValueError, match="same number of logits and indices"):
            cross_entropy_sharded_wr_loss([f, f], [idx], ipus=[0, 0])


def test_group_quantize_numpy_round_trip_along_dim0() -> None:
    w = np.random.default_rng(1).standard_normal((16, 3)).astype(np.float16)
    packed, scale, bias = group_quantize_compress_numpy(w, group_size=8, dim=0)
    assert packed.shape == (3, 2, 2) and scale.shape == (3, 2, 1)
    back = group_quantize_decompress_numpy(packed, scale, bias, dim=0)
    assert back.shape == w.shape
    step = np.abs(scale).max()
    assert np.abs(back.astype(np.float32) - w).max() <= step / 2 + 1e-3
    with pytest.raises(ValueError, match="non-finite"):
        group_quantize_compress_numpy(np.full((2, 8), np.nan, np.float16), 8)


def test_dense_sparse_matmul_float16_with_a_float16_csr():
    """Graphcore's fp16 test built ``csr_matrix`` of a float16 array: SciPy 1.10 (its pin)
    up to 1.12 kept float16, SciPy >= 1.13 refuses it (scipy/scipy#20200, #20207) before
    any popxl code runs. The op takes any object with ``data``/``indices``/``indptr``, so a
    float16 CSR stand-in runs the same computation."""
    rng = _rng()
    lhs = rng.standard_normal((2, 3)).astype(np.float16)
    rhs = random_sparse(rng.standard_normal((3, 4)).astype(np.float16), density=0.5)
    f32_csr = csr_matrix(rhs.astype(np.float32))
    csr16 = SimpleNamespace(
        data=f32_csr.data.astype(np.float16), indices=f32_csr.indices, indptr=f32_csr.indptr
    )
    ir = popxl.Ir()
    with ir.main_graph:
        stream = popxl.h2d_stream(lhs.shape, popxl.float16, "lhs")
        out = dense_const_sparse_matmul(ops.host_load(stream), csr16, 4)
        out_stream = popxl.d2h_stream(out.shape, out.dtype, "out")
        ops.host_store(out_stream, out)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run({stream: lhs})[out_stream]
    assert got.dtype == np.float16
    expected = lhs.astype(np.float32) @ rhs.astype(np.float32)
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=2e-3, atol=2e-3)


def test_group_quantize_decompress_rounds_the_product_then_the_sum_on_every_cpu():
    """Every id (0-15) under scales and biases whose sums cancel: bit for bit NumPy's float16
    ``ids * scale + bias`` (the product rounded, then the sum). XLA:CPU contracts a float16
    multiply-add into one rounding on AVX-512 FP16 CPUs: 20 of 192 elements of the case above
    were 1-4 units off there."""
    rng = _rng()
    ids = np.arange(16, dtype=np.uint16)
    packed = ((ids[0::4] << 12) | (ids[1::4] << 8) | (ids[2::4] << 4) | ids[3::4]).astype(np.uint16)
    rows, groups = 64, 3
    packed = np.broadcast_to(packed, (rows, groups, 4)).copy()
    scale = rng.uniform(0.001, 0.5, (rows, groups, 1)).astype(np.float16)
    bias = (-scale.astype(np.float32) * rng.integers(1, 15, (rows, groups, 1))).astype(np.float16)
    bias = (bias + rng.uniform(-0.01, 0.01, bias.shape)).astype(np.float16)
    ir = popxl.Ir()
    with ir.main_graph:
        args = [popxl.variable(a) for a in (packed, scale, bias)]
        y = group_quantize_decompress(*args)
        stream = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(stream, y)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run()[stream]
    np.testing.assert_array_equal(got, group_quantize_decompress_numpy(packed, scale, bias))
