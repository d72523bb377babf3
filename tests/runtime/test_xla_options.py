"""The options programs compile with (``runtime/xla_options``): on a CPU with more than one
core a program's convolutions go to XLA's multi-threaded Eigen kernel rather than YNNPACK's
single-threaded one, its dots stay with YNNPACK, the values are the convolution's; one
core, a user's own ``XLA_FLAGS`` choice or another backend leave XLA's defaults."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import popxl
import popxl.ops as ops
from runtime import xla_options

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
    assert options == {xla_options.YNN_OPTION: xla_options.YNN_WITHOUT_CONVOLUTIONS}
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


def test_one_core_keeps_xlas_defaults(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 1)
    assert xla_options.compiler_options() == {}


def test_a_users_xla_flags_choice_wins(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 2)
    fresh.setenv("XLA_FLAGS", f"--{xla_options.YNN_OPTION}=")
    assert xla_options.compiler_options() == {}


def test_a_jaxlib_without_the_option_compiles_with_its_defaults(fresh):
    fresh.setattr(xla_options, "_cores", lambda: 2)
    fresh.setattr(xla_options, "YNN_WITHOUT_CONVOLUTIONS", "LIBRARY_FUSION_TYPE_NO_SUCH_THING")
    assert xla_options.compiler_options() == {}
    assert float(xla_options.jit(lambda a: a * 2)(np.float32(3))) == 6
