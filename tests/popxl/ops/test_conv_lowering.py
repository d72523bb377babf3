"""How convolutions lower on XLA:CPU: every form (matmul, per-tap, XLA's own) computes the
convolution, its input gradient and its weight gradient that ``lax.conv_general_dilated``
and ``jax.vjp`` of it give, across 1-3 spatial axes, strides, paddings (negative ones too),
dilations and groups; the chosen ``custom_vjp`` does too, in float32, float16 and bfloat16,
and so does the transposed convolution."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from runtime.backend.conv_forms import FORMS, Geometry, choose, conv, conv_transpose
from runtime.backend.forms import forms_of

# (name, input shape, weight shape, geometry)
CASES = [
    ("2d", (2, 3, 7, 6), (4, 3, 3, 3), Geometry((1, 1), ((0, 0), (0, 0)), (1, 1), 1)),
    ("2d_pad", (2, 5, 6, 6), (8, 5, 3, 3), Geometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1)),
    ("2d_stride", (2, 4, 9, 8), (6, 4, 3, 2), Geometry((2, 3), ((1, 0), (2, 1)), (1, 1), 1)),
    ("2d_dilation", (1, 3, 9, 9), (5, 3, 3, 3), Geometry((1, 2), ((2, 1), (0, 2)), (2, 1), 1)),
    (
        "2d_negative_pad",
        (2, 3, 8, 8),
        (4, 3, 3, 3),
        Geometry((2, 2), ((0, -1), (1, -1)), (1, 1), 1),
    ),
    (
        "2d_kernel_wider_than_map",
        (2, 8, 2, 2),
        (8, 8, 3, 3),
        Geometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    ),
    ("2d_1x1_stride", (2, 6, 7, 7), (5, 6, 1, 1), Geometry((2, 2), ((0, 0), (0, 0)), (1, 1), 1)),
    ("2d_1x1", (3, 40, 6, 5), (36, 40, 1, 1), Geometry((1, 1), ((0, 0), (0, 0)), (1, 1), 1)),
    (  # popxl's exact geometry: the last row and column, which the stride skips, trimmed
        "2d_1x1_stride_trimmed",
        (2, 6, 8, 8),
        (5, 6, 1, 1),
        Geometry((2, 2), ((0, -1), (0, -1)), (1, 1), 1),
    ),
    (
        "2d_1x1_uneven_stride_trimmed",
        (2, 5, 8, 7),
        (4, 5, 1, 1),
        Geometry((3, 2), ((0, -1), (0, 0)), (1, 1), 1),
    ),
    (
        "2d_1x1_uneven_stride",
        (2, 5, 8, 7),
        (4, 5, 1, 1),
        Geometry((3, 2), ((0, 0), (0, 0)), (2, 1), 1),
    ),
    ("1d_1x1_stride", (2, 3, 10), (4, 3, 1), Geometry((3,), ((0, 0),), (1,), 1)),
    ("3d_1x1", (2, 4, 3, 5, 5), (6, 4, 1, 1, 1), Geometry((1, 2, 1), ((0, 0),) * 3, (1,) * 3, 1)),
    ("2d_groups", (2, 6, 7, 7), (9, 2, 3, 3), Geometry((1, 1), ((1, 1), (1, 1)), (1, 1), 3)),
    ("2d_depthwise", (2, 6, 8, 8), (6, 1, 3, 3), Geometry((1, 1), ((1, 1), (1, 1)), (1, 1), 6)),
    (
        "2d_depthwise_stride_mult",
        (2, 4, 9, 9),
        (8, 1, 5, 5),
        Geometry((2, 2), ((2, 2), (2, 2)), (1, 1), 4),
    ),
    (
        "2d_depthwise_dilation",
        (1, 3, 9, 9),
        (3, 1, 3, 3),
        Geometry((1, 1), ((2, 2), (2, 2)), (2, 2), 3),
    ),
    ("1d", (2, 3, 11), (4, 3, 3), Geometry((2,), ((1, 2),), (1,), 1)),
    ("1d_depthwise", (2, 4, 10), (4, 1, 3), Geometry((1,), ((1, 1),), (2,), 4)),
    (
        "3d",
        (1, 2, 5, 6, 4),
        (3, 2, 2, 3, 2),
        Geometry((1, 1, 2), ((0, 1), (1, 0), (1, 1)), (1, 1, 1), 1),
    ),
    (
        "3d_frames_stride_dilation",  # roomy: 2-D convolutions of its frames
        (2, 3, 10, 8, 8),
        (4, 3, 3, 3, 3),
        Geometry((2, 1, 2), ((2, 1), (1, 1), (0, 1)), (2, 1, 1), 1),
    ),
    (
        "3d_frames_tap_in_padding",  # the first kernel frame reads only padding
        (2, 3, 1, 6, 6),
        (4, 3, 2, 3, 3),
        Geometry((2, 1, 1), ((1, 1), (1, 1), (0, 0)), (1, 1, 1), 1),
    ),
    (
        "3d_frames_all_padding",  # every output frame reads padding only
        (1, 2, 1, 6, 7),
        (3, 2, 2, 3, 3),
        Geometry((4, 1, 2), ((2, 2), (0, 1), (1, 1)), (1, 1, 1), 1),
    ),
    (
        "2d_map_inside_the_padding",  # a 1x1 map under a 3x3 kernel: only its centre reads it
        (2, 8, 1, 1),
        (6, 8, 3, 3),
        Geometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    ),
    (
        "2d_dead_taps_stride_dilation",  # the dilated taps past the first read padding only
        (1, 3, 3, 9),
        (4, 3, 3, 3),
        Geometry((2, 1), ((0, 4), (1, 1)), (3, 1), 1),
    ),
    (
        "3d_single_frame",  # one frame under a 3-frame kernel: only its middle frame reads it
        (2, 4, 1, 3, 3),
        (5, 4, 3, 3, 3),
        Geometry((1, 1, 1), ((1, 1),) * 3, (1, 1, 1), 1),
    ),
    (
        "3d_small_frames",  # 3x3 frames under a 3x3 kernel: the 3-D matmul form
        (2, 4, 5, 3, 3),
        (6, 4, 3, 3, 3),
        Geometry((1, 1, 1), ((1, 1),) * 3, (1, 1, 1), 1),
    ),
    (
        "3d_stride_groups",
        (1, 4, 6, 6, 6),
        (4, 2, 3, 3, 3),
        Geometry((2, 2, 2), ((1, 1),) * 3, (1, 1, 1), 2),
    ),
    (
        "3d_depthwise_mult",
        (2, 3, 4, 2, 2),
        (9, 1, 2, 2, 2),
        Geometry((1, 1, 1), ((0, 0),) * 3, (1, 1, 1), 3),
    ),
]
IDS = [c[0] for c in CASES]


@pytest.fixture(autouse=True)
def _cpu_forms():
    """These tests are about the CPU's forms: traced as on the CPU on any backend."""
    with forms_of("cpu"):
        yield


def _reference(x, w, geo):
    return lax.conv_general_dilated(
        x,
        w,
        geo.stride,
        list(geo.pads),
        rhs_dilation=geo.dilation,
        feature_group_count=geo.groups,
        precision=lax.Precision.HIGHEST,
    )


def _data(rng, x_shape, w_shape, dtype=np.float32):
    x = jnp.asarray(rng.standard_normal(x_shape), dtype)
    w = jnp.asarray(rng.standard_normal(w_shape), dtype)
    return x, w


def _close(a, b, tol=1e-4):
    np.testing.assert_allclose(
        np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol
    )


def _fits(form: str, w_shape: tuple, geo: Geometry) -> bool:
    """The per-tap form is for depthwise convolutions (one input channel per group), the
    pointwise form for 1x1 kernels of one group without padding (an end pad may trim)."""
    if form == "taps":
        return w_shape[1] == 1 and geo.groups > 1
    if form == "pointwise":
        untouched = all(lo == 0 and hi <= 0 for lo, hi in geo.pads)
        return geo.groups == 1 and set(w_shape[2:]) == {1} and untouched
    return True


FORM_CASES = [
    pytest.param(form, *case[1:], id=f"{form}-{case[0]}")
    for case in CASES
    for form in sorted(FORMS)
    if _fits(form, case[2], case[3])
]


@pytest.mark.parametrize("form,x_shape,w_shape,geo", FORM_CASES)
def test_every_form_matches_lax_in_every_direction(rng, form, x_shape, w_shape, geo):
    x, w = _data(rng, x_shape, w_shape)
    y_shape = jax.eval_shape(lambda a, b: _reference(a, b, geo), x, w).shape
    gy = jnp.asarray(rng.standard_normal(y_shape), jnp.float32)
    f = FORMS[form]

    # The form and the reference in one program, traced under jit as programs use the
    # forms (op by op, every small op of the per-tap forms compiled on its own, took several
    # times longer; a compilation per direction, twice as long as one for all).
    @jax.jit
    def both(x, w, gy):
        y, pullback = jax.vjp(lambda a, b: _reference(a, b, geo), x, w)
        got = (f.forward(x, w, geo), f.input_grad(w, geo, x.shape, gy))
        return (*got, f.weight_grad(x, geo, w.shape, gy)), (y, *pullback(gy))

    for got, want in zip(*both(x, w, gy)):
        _close(got, want)


def _with_gradients(f, *args):
    """``f(*args)`` and the gradients of ``sum(tanh(f(*args)))`` with respect to ``args``."""
    y, pullback = jax.vjp(f, *args)
    return (y, *pullback(1 - jnp.tanh(y) ** 2))


@pytest.mark.parametrize("name,x_shape,w_shape,geo", CASES, ids=IDS)
def test_the_chosen_forms_differentiate_like_lax(rng, name, x_shape, w_shape, geo):
    x, w = _data(rng, x_shape, w_shape)

    @jax.jit
    def both(x, w):
        got = _with_gradients(lambda a, b: conv(a, b, geo), x, w)
        return got, _with_gradients(lambda a, b: _reference(a, b, geo), x, w)

    for got, want in zip(*both(x, w)):
        _close(got, want)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("name", ["2d_pad", "2d_depthwise", "3d"])
def test_half_precision_accumulates_in_float32(rng, dtype, name):
    _, x_shape, w_shape, geo = CASES[IDS.index(name)]
    x, w = _data(rng, x_shape, w_shape, dtype)
    want = _reference(x.astype(jnp.float32), w.astype(jnp.float32), geo).astype(dtype)
    got = conv(x, w, geo)
    assert got.dtype == dtype
    tol = 1e-2 if dtype == jnp.float16 else 4e-2
    _close(got, want, tol)
    grads = jax.grad(lambda a, b: jnp.sum(conv(a, b, geo).astype(jnp.float32)), (0, 1))(x, w)
    assert [g.dtype for g in grads] == [dtype, dtype]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("name", ["2d_pad", "3d"])
def test_half_precision_widens_into_buffers_with_the_plain_conversions_values(rng, dtype, name):
    # The input and the output's cotangent are widened to float32 into buffers of their own
    # (runtime.backend.xla_workarounds.computed_once), not inside the layout transposes: the values
    # and gradients are those of converting around the float32 convolution.
    _, x_shape, w_shape, geo = CASES[IDS.index(name)]
    x, w = _data(rng, x_shape, w_shape, dtype)
    y_shape = _reference(x.astype(jnp.float32), w.astype(jnp.float32), geo).shape
    t = jnp.asarray(rng.standard_normal(y_shape), dtype)

    def plain(a, b):
        return conv(a.astype(jnp.float32), b, geo).astype(a.dtype)

    got_y, got_pull = jax.vjp(lambda a, b: conv(a, b, geo), x, w)
    want_y, want_pull = jax.vjp(plain, x, w)
    np.testing.assert_array_equal(np.asarray(got_y, np.float32), np.asarray(want_y, np.float32))
    for got, want in zip(got_pull(t), want_pull(t)):
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))

    def guards(a, b):
        def count(jaxpr) -> int:
            n = 0
            for e in jaxpr.eqns:
                n += e.primitive.name == "reduce" and bool(e.params["jaxpr"])
                n += sum(count(sub) for sub in jax.extend.core.jaxprs_in_params(e.params))
            return n

        grad = jax.grad(lambda a, b: jnp.sum(conv(a, b, geo).astype(jnp.float32)), (0, 1))
        return count(jax.make_jaxpr(grad)(a, b).jaxpr)

    wide = (x.astype(jnp.float32), w.astype(jnp.float32))
    assert guards(x, w) == guards(*wide) + 2  # the input, then the output's cotangent


@pytest.mark.parametrize("name,x_shape,w_shape,geo", CASES, ids=IDS)
def test_transposed_convolution_is_the_input_gradient(rng, name, x_shape, w_shape, geo):
    x, w = _data(rng, x_shape, w_shape)
    y_shape = jax.eval_shape(lambda a, b: _reference(a, b, geo), x, w).shape
    t = jnp.asarray(rng.standard_normal(y_shape), jnp.float32)
    want_fn = lambda t, w: jax.vjp(lambda a: _reference(a, w, geo), x)[1](t)[0]  # noqa: E731
    got_fn = lambda t, w: conv_transpose(t, w, geo, x_shape[2:])  # noqa: E731

    @jax.jit
    def both(t, w):
        return _with_gradients(got_fn, t, w), _with_gradients(want_fn, t, w)

    for got, want in zip(*both(t, w)):
        _close(got, want)


def test_the_choice_avoids_xla_kernels_slow_cases():
    geo = Geometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    directions = ("forward", "input", "weight")
    # A 3x3 kernel over a 2x2 map (ResNet's last stage at 64x64): matmul in every direction.
    assert {choose((8, 512, 2, 2), (512, 512, 3, 3), geo, d) for d in directions} == {"matmul"}
    depthwise = geo._replace(groups=96)
    assert choose((8, 96, 16, 16), (96, 1, 3, 3), depthwise, "input") == "taps"
    # A roomy map: XLA's kernel in every direction.
    got = [choose((8, 64, 16, 16), (64, 64, 3, 3), geo, d) for d in directions]
    assert got == ["lax", "lax", "lax"]
    # A 1x1 kernel's weight gradient: a product over the positions of the channels-last
    # operands, or XLA's kernel where the cotangent is the wider one over many positions.
    pointwise = geo._replace(pads=((0, 0), (0, 0)))
    assert choose((8, 144, 16, 16), (24, 144, 1, 1), pointwise, "weight") == "pointwise"
    temporal = Geometry((1, 1, 1), ((0, 0),) * 3, (1, 1, 1), 1)  # S3D's frames, stacked
    assert choose((1, 192, 8, 56, 56), (576, 192, 1, 1, 1), temporal, "weight") == "lax"
    assert choose((8, 320, 2, 2), (1280, 320, 1, 1), pointwise, "weight") == "pointwise"
    assert choose((8, 64, 16, 16), (128, 64, 1, 1), geo, "weight") == "matmul"  # padded
    # A 1x1 kernel's forward is one product reading the weight as stored, strided or not.
    assert choose((8, 144, 16, 16), (24, 144, 1, 1), pointwise, "forward") == "pointwise"
    strided = pointwise._replace(stride=(2, 2))
    assert choose((8, 64, 16, 16), (128, 64, 1, 1), strided, "forward") == "pointwise"
    # ResNet's downsampling shortcut as popxl gives it: the skipped last row trimmed.
    trimmed = strided._replace(pads=((0, -1), (0, -1)))
    assert choose((8, 64, 16, 16), (128, 64, 1, 1), trimmed, "forward") == "pointwise"
    assert choose((8, 1024, 4, 4), (2048, 1024, 1, 1), trimmed, "weight") == "pointwise"
    assert choose((8, 64, 16, 16), (128, 64, 1, 1), geo, "forward") == "lax"  # padded
    assert choose((16, 16, 8, 8), (32, 16, 3, 3), geo, "weight") == "lax"
    geo3 = Geometry((1, 1, 1), ((1, 1),) * 3, (1, 1, 1), 1)
    assert choose((4, 64, 8, 16, 16), (64, 64, 3, 3, 3), geo3, "weight") == "lax"
    # At most 16 channels a side (XLA's slow path): the matmul forms, unless the forward's
    # patches have many rows.
    valid = geo._replace(pads=((0, 0), (0, 0)))
    got = [choose((12, 1, 128, 128), (5, 1, 3, 3), valid, d) for d in directions]
    assert got == ["matmul", "matmul", "lax"]
    got = [choose((12, 5, 63, 63), (12, 5, 5, 5), valid, d) for d in directions]
    assert got == ["lax", "matmul", "lax"]


@pytest.mark.parametrize(
    "name,kernel",
    [("2d_map_inside_the_padding", (1, 1)), ("2d_dead_taps_stride_dilation", (1, 3)),
     ("3d_single_frame", (1, 3, 3)), ("2d_pad", (3, 3))],
)  # fmt: skip
def test_taps_that_read_only_padding_are_left_out(rng, name, kernel):
    """The convolution multiplies by the taps that read the input, not by those that read
    only padding: the kernel the lowered program slices out of the weight has the extent
    given here (its full extent where every tap reads some input)."""
    _, x_shape, w_shape, geo = CASES[IDS.index(name)]
    x, w = _data(rng, x_shape, w_shape)
    eqns = jax.make_jaxpr(lambda a, b: conv(a, b, geo))(x, w).jaxpr.eqns
    sliced = [e.outvars[0].aval.shape for e in eqns if e.primitive.name == "slice"]
    if kernel == w_shape[2:]:
        assert not [s for s in sliced if s[:2] == w_shape[:2]]
    else:
        assert [s[2:] for s in sliced if s[:2] == w_shape[:2]] == [kernel]


@pytest.mark.parametrize("name", ["2d_groups", "3d_stride_groups"])
def test_patches_are_stacked_at_most_eight_taps_at_a_time(rng, name):
    """XLA:CPU copies each operand of a concatenate of more than eight into a buffer of its
    own before running it alone: the matmul form stacks a 3x3 (or 3x3x3) kernel's taps one
    kernel axis at a time, and its patches equal the taps stacked flat."""
    _, x_shape, w_shape, geo = CASES[IDS.index(name)]
    x, w = _data(rng, x_shape, w_shape)
    text = jax.jit(lambda a, b: FORMS["matmul"].forward(a, b, geo)).lower(x, w).as_text()
    concats = [line.split("=", 1)[1] for line in text.splitlines() if "concatenate" in line]
    widths = [line.split("dim")[0].count("%") for line in concats]
    assert widths and max(widths) <= 8
    y, pullback = jax.vjp(lambda a, b: _reference(a, b, geo), x, w)
    gy = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    _close(FORMS["matmul"].forward(x, w, geo), y)
    _close(FORMS["matmul"].weight_grad(x, geo, w.shape, gy), pullback(gy)[1])


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's compiled layouts")
def test_xla_kernel_takes_channels_last_operands_also_in_a_loop_body():
    # Inside a loop body XLA:CPU keeps the layouts it is given, and its kernel is 10-30x
    # slower on NCHW operands: every direction of the "lax" form hands it channels-last ones.
    geo = Geometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    x = jnp.ones((2, 8, 6, 6))
    ws = jnp.ones((3, 8, 8, 3, 3))

    def step(x: jax.Array, ws: jax.Array) -> jax.Array:
        def body(x: jax.Array, w: jax.Array) -> tuple:
            f = FORMS["lax"]
            y = f.forward(x, w, geo)
            return x + f.input_grad(w, geo, x.shape, y) + f.weight_grad(
                x, geo, w.shape, y
            ).sum(), None

        return lax.scan(body, x, ws)[0]

    hlo = jax.jit(step).lower(x, ws).compile().as_text()
    labels = [
        line.split("dim_labels=")[1].split(",")[0]
        for line in hlo.splitlines()
        if "convolution(" in line
    ]
    assert len(labels) == 3
    assert all(
        label.startswith("b01f_01io->b01f") or label.startswith("f01b_01io->f01b")
        for label in labels
    ), labels


@pytest.mark.parametrize("name", ["2d_pad", "2d_depthwise", "3d"])
def test_other_backends_keep_xla_convolution_in_every_direction(rng, name):
    _, x_shape, w_shape, geo = CASES[IDS.index(name)]
    x, w = _data(rng, x_shape, w_shape)
    loss = lambda a, b: jnp.sum(jnp.tanh(conv(a, b, geo)))  # noqa: E731
    with forms_of("gpu"):
        traced = jax.jit(jax.value_and_grad(loss, (0, 1))).lower(x, w)
        got = jax.value_and_grad(loss, (0, 1))(x, w)
    assert traced.as_text().count("stablehlo.convolution") == 3
    want = jax.value_and_grad(lambda a, b: jnp.sum(jnp.tanh(_reference(a, b, geo))), (0, 1))(x, w)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        _close(g, r)


@pytest.mark.parametrize("name", ["2d_stride", "3d_stride_groups"])
def test_other_backends_transposed_convolution_differentiates_like_the_cpu_forms(rng, name):
    # Strides that skip the input's last rows: the transposed convolution's output padding.
    _, x_shape, w_shape, geo = CASES[IDS.index(name)]
    x, w = _data(rng, x_shape, w_shape)
    t = jnp.asarray(rng.standard_normal(_reference(x, w, geo).shape), jnp.float32)
    u = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)

    def loss(a, b):
        return jnp.vdot(conv_transpose(a, b, geo, x_shape[2:]), u)

    want = jax.value_and_grad(loss, (0, 1))(t, w)
    with forms_of("gpu"):
        got = jax.value_and_grad(loss, (0, 1))(t, w)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        _close(g, r)
