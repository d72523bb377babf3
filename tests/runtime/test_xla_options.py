"""The options programs compile with (``runtime/xla_options``): on a CPU with more than one
core a program's convolutions go to XLA's multi-threaded Eigen kernel rather than YNNPACK's
single-threaded one, its dots stay with YNNPACK unless they are mostly of many rows (then
Eigen's too), the values are the convolution's and the products'; a
convolution program's training step that neither loops nor branches updates its weights in
place, without copying them first; one core (for YNNPACK), a user's own ``XLA_FLAGS``
choice or another backend leave XLA's defaults."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import popxl
import popxl.ops as ops
from runtime.backend import xla_options

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's options")


@pytest.fixture
def fresh(monkeypatch):
    """``compiler_options`` worked out again under the test's patches, and afterwards."""
    xla_options.compiler_options.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    xla_options.compiler_options.cache_clear()


def _conv_program(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, str]:
    """``ops.conv`` (padding 1) then a matmul, run by a session: the result and the HLO
    XLA compiled."""
    ir = popxl.Ir()
    with ir.main_graph:
        xt = popxl.variable(x, name="x")
        wt = popxl.variable(w, name="w")
        y = ops.conv(xt, wt, padding=(1, 1, 1, 1))
        y = ops.matmul(y, popxl.variable(np.eye(x.shape[-1], dtype=np.float32), name="eye"))
        out = popxl.d2h_stream(y.shape, y.dtype, name="y")
        ops.host_store(out, y)
    with popxl.Session(ir, "ipu_model") as session:
        value = session.run()[out]
        return value, session._lowered().compile().as_text()


def _ynn_ops(hlo: str) -> list[str]:
    """The op names (from metadata) of the YNNPACK fusions in compiled HLO."""
    return [
        line.split('op_name="')[1].split('"')[0].rsplit("/", 1)[-1]
        for line in hlo.splitlines()
        if " fusion(" in line and "__ynn_fusion" in line and 'op_name="' in line
    ]


def test_convolutions_leave_ynnpack_on_several_cores_and_keep_their_values(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 2)
    options = xla_options.compiler_options()
    if not options:
        pytest.skip("this jaxlib does not know the YNNPACK option")
    assert options[xla_options.YNN_OPTION] == xla_options.YNN_WITHOUT_CONVOLUTIONS
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32, 12, 12)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    got, hlo = _conv_program(x, w)
    assert "convolution(" in hlo  # XLA's own kernel (a roomy 32-channel map)
    assert not any("conv" in name for name in _ynn_ops(hlo))
    assert any("dot" in name for name in _ynn_ops(hlo))  # dots stay with YNNPACK
    want = lax.conv_general_dilated(
        x.astype(np.float64), w.astype(np.float64), (1, 1), ((1, 1), (1, 1))
    )
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-4)


def _conv_sgd_step(loop: bool) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
    """``sum(conv(tanh(conv(x, w1)), w2))`` (padding 1), two SGD steps (lr 0.01) in one
    session, written out or as a ``repeat`` of two: ``w2`` is read by the input gradient as
    well as by its update. The compiled HLO, the initial weights and the weights after."""
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((2, 16, 10, 10)).astype(np.float32)
    w0 = [rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1 for _ in range(2)]
    ir = popxl.Ir()
    pad = (1, 1, 1, 1)
    with ir.main_graph:
        x = popxl.variable(x0, name="x")
        w1, w2 = (popxl.variable(w, name=f"w{i}") for i, w in enumerate(w0, 1))

        def net(a, b, c):
            return ops.sum(ops.conv(ops.tanh(ops.conv(a, b, padding=pad)), c, padding=pad))

        graph = ir.create_graph(net, x, w1, w2)
        info = popxl.transforms.autodiff(graph, grads_required=graph.inputs[1:])

        def sgd_step(a: popxl.Tensor, b: popxl.TensorByRef, c: popxl.TensorByRef) -> None:
            fwd = ops.call_with_info(graph, a, b, c)
            seed = popxl.constant(np.float32(1.0))
            bwd = ops.call_with_info(info.graph, seed, inputs_dict=info.inputs_dict(fwd))
            grads = info.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
            ops.scaled_add_(b, grads[b], b=-0.01)
            ops.scaled_add_(c, grads[c], b=-0.01)

        if loop:
            ops.repeat(ir.create_graph(sgd_step, x, w1, w2), 2, x, w1, w2)
        else:
            sgd_step(x, w1, w2)
    with popxl.Session(ir, "ipu_model") as session:
        for _ in range(1 if loop else 2):
            session.run()
        hlo = session._lowered().compile().as_text()
        return hlo, w0, [session.get_tensor_data(w1), session.get_tensor_data(w2)]


def _jax_steps(w0: list[np.ndarray]) -> list[np.ndarray]:
    """The same two steps in float64 with ``jax.grad`` and ``lax`` convolutions."""
    x = np.random.default_rng(1).standard_normal((2, 16, 10, 10))
    conv = lambda a, b: lax.conv_general_dilated(a, b, (1, 1), ((1, 1), (1, 1)))  # noqa: E731
    loss = lambda w1, w2: jax.numpy.sum(conv(jax.numpy.tanh(conv(x, w1)), w2))  # noqa: E731
    with jax.enable_x64(True):
        ws = [w.astype(np.float64) for w in w0]
        for _ in range(2):
            grads = jax.grad(loss, (0, 1))(*ws)
            ws = [w - 0.01 * g for w, g in zip(ws, grads)]
        return [np.asarray(w) for w in ws]


def _copies(hlo: str) -> int:
    return hlo[hlo.index("ENTRY") :].count(" copy(%")


def test_a_convolution_step_updates_its_weights_in_place(fresh):
    if not xla_options.in_place_options():
        pytest.skip("this jaxlib does not know the copy insertion option")
    hlo, w0, got = _conv_sgd_step(loop=False)
    assert _copies(hlo) == 0, "a weight is copied before its update"
    for g, w in zip(got, _jax_steps(w0)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_looping_convolution_step_keeps_xlas_copies_and_its_values(fresh):
    """XLA's region analysis gets loops wrong, so a step that loops is not given it."""
    hlo, w0, got = _conv_sgd_step(loop=True)
    assert "while" in hlo
    for g, w in zip(got, _jax_steps(w0)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_xla_copies_weights_read_besides_their_update_by_default():
    """Why the option: a hand-written ``jax.jit`` SGD step copies the weights whose input
    gradient is computed, before updating them."""
    x = np.ones((16, 64), np.float32)
    w0 = [np.full((64, 64), 0.01, np.float32)] * 2

    def step(w1, w2):
        loss = lambda a, b: jax.numpy.sum(jax.numpy.tanh(x @ a) @ b)  # noqa: E731
        dw1, dw2 = jax.grad(loss, (0, 1))(w1, w2)
        return w1 - 0.1 * dw1, w2 - 0.1 * dw2

    default = jax.jit(step, donate_argnums=(0, 1)).lower(*w0).compile().as_text()
    assert _copies(default) > 0
    if xla_options.in_place_options():
        in_place = xla_options.jit(step, in_place=True, donate_argnums=(0, 1))
        assert _copies(in_place.lower(*w0).compile().as_text()) == 0


def test_one_core_keeps_xlas_convolution_choice(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 1)
    assert xla_options.YNN_OPTION not in xla_options.compiler_options()


def test_a_users_xla_flags_choice_wins(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 2)
    flags = f"--{xla_options.YNN_OPTION}= --{xla_options.COPY_OPTION}=false"
    fresh.setenv("XLA_FLAGS", flags)
    assert xla_options.compiler_options() == {}


def test_a_jaxlib_without_the_option_compiles_with_its_defaults(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 2)
    fresh.setattr(xla_options, "YNN_WITHOUT_CONVOLUTIONS", "LIBRARY_FUSION_TYPE_NO_SUCH_THING")
    assert xla_options.YNN_OPTION not in xla_options.compiler_options()
    assert float(xla_options.jit(lambda a: a * 2)(np.float32(3))) == 6


def _mlp_program(rows: int, features: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``tanh(x @ w1) @ w2`` for ``x`` of ``rows`` x ``features``, run by a session: the
    result, the same in float64 NumPy, and the HLO XLA compiled."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    w1, w2 = (rng.standard_normal((features, features)).astype(np.float32) / 8 for _ in range(2))
    ir = popxl.Ir()
    with ir.main_graph:
        h = ops.tanh(ops.matmul(popxl.variable(x, name="x"), popxl.variable(w1, name="w1")))
        y = ops.matmul(h, popxl.variable(w2, name="w2"))
        out = popxl.d2h_stream(y.shape, y.dtype, name="y")
        ops.host_store(out, y)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run()[out]
        hlo = session._lowered().compile().as_text()
    want = np.tanh(x.astype(np.float64) @ w1) @ w2
    return got, want, hlo


def test_products_of_many_rows_leave_ynnpack_and_keep_their_values(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 2)
    if not xla_options.compiler_options(large_products=True):
        pytest.skip("this jaxlib does not know the YNNPACK option")
    assert xla_options.compiler_options(large_products=True) == {
        xla_options.YNN_OPTION: xla_options.YNN_REDUCTIONS_ONLY
    }
    got, want, hlo = _mlp_program(xla_options.LARGE_PRODUCT_ROWS * 2, 64)
    assert hlo.count(" dot(") == 2  # Eigen's products, outside any YNNPACK fusion
    assert not any("dot" in name for name in _ynn_ops(hlo))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_products_of_few_rows_stay_with_ynnpack(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 2)
    if not xla_options.compiler_options():
        pytest.skip("this jaxlib does not know the YNNPACK option")
    got, want, hlo = _mlp_program(8, 256)
    assert any("dot" in name for name in _ynn_ops(hlo))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _matmul_ops(*pairs: tuple[tuple[int, ...], tuple[int, ...]]) -> list:
    """The ops of a main graph holding one ``ops.matmul`` per pair of operand shapes."""
    ir = popxl.Ir()
    with ir.main_graph:
        for k, (a, b) in enumerate(pairs):
            x = popxl.variable(np.zeros(a, np.float32), name=f"a{k}")
            ops.matmul(x, popxl.variable(np.zeros(b, np.float32), name=f"b{k}"))
    return list(ir.main_graph._ops)


def test_which_products_count_as_large():
    rows = xla_options.LARGE_PRODUCT_ROWS
    assert xla_options.large_products(_matmul_ops(((rows, 64), (64, 64))))
    assert not xla_options.large_products(_matmul_ops(((rows - 1, 64), (64, 64))))
    # a plain matrix on the right: every leading row of the left counts
    assert xla_options.large_products(_matmul_ops(((4, rows // 4, 64), (64, 64))))
    # batched products: each has only its own rows
    assert not xla_options.large_products(_matmul_ops(((8, 4, 64, 32), (8, 4, 32, 64))))
    # weighed by multiply-adds: a large product outweighs a smaller one of few rows, and
    # a product of few rows but many multiply-adds outweighs a large one
    assert xla_options.large_products(_matmul_ops(((8, 64), (64, 64)), ((512, 64), (64, 64))))
    assert not xla_options.large_products(
        _matmul_ops(((8, 4096), (4096, 4096)), ((rows, 64), (64, 64)))
    )
    assert not xla_options.large_products([])
