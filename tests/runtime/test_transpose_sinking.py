"""Transposes sunk through a traced step (``runtime/transpose_sinking``): every rule gives the
values the program gave, pending transposes that meet their inverse are gone, and between two
channels-last convolutions of a conv / BatchNorm / ReLU chain no transpose is left."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from runtime.backend.conv_forms import Geometry, conv
from runtime.backend.transpose_sinking import reshape_plan, sink_transposes
from runtime.backend.xla_workarounds import computed_once


def _transposes(fn, *args, least: int = 0) -> int:
    """The transposes of at least ``least`` elements left in ``fn``'s jaxpr, loop and
    branch bodies included."""

    def count(jaxpr) -> int:
        n = 0
        for eqn in jaxpr.eqns:
            n += eqn.primitive.name == "transpose" and eqn.invars[0].aval.size >= least
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                n += count(sub)
        return n

    return count(jax.make_jaxpr(fn)(*args).jaxpr)


def _agree(fn, *args) -> None:
    want = jax.jit(fn)(*args)
    got = jax.jit(sink_transposes(fn))(*args)
    for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


def _nchw(x):
    return jnp.transpose(x, (0, 3, 1, 2))


def _nhwc(x):
    return jnp.transpose(x, (0, 2, 3, 1))


RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((2, 5, 6, 3)), jnp.float32)  # NHWC
C = jnp.asarray(RNG.standard_normal((3,)), jnp.float32)


def _elementwise(x, c):
    y = _nchw(x)
    z = jnp.clip(y * c[:, None, None] + 1.0, 0.0, 6.0)
    z = jnp.where(y > 0, jnp.exp(z), -z).astype(jnp.float16).astype(jnp.float32)
    z, _ = lax.optimization_barrier((z, c))
    z = computed_once(z)  # bitcasts of one width, a pad and a reduction
    return _nhwc(jax.nn.relu(z) + y)


def _reductions(x, c):
    y = _nchw(x)
    mean = y.mean((0, 2, 3), keepdims=True)
    var = ((y - mean) ** 2).mean((0, 2, 3))
    normed = (y - mean) * lax.rsqrt(var + 1e-5)[None, :, None, None]
    return (
        _nhwc(normed),
        y.max(axis=2),
        jnp.argmax(y, axis=1),
        jnp.cumsum(y, axis=3),
        y.sum((1, 3)),
        lax.reduce([y, y * y], [0.0, 0.0], lambda a, b: [a[0] + b[0], a[1] + b[1]], (0, 2, 3)),
    )


def _structural(x, c):
    y = _nchw(x)
    widened = lax.bitcast_convert_type(y, jnp.int8)  # across widths: computed as it is
    padded = jnp.pad(y, ((0, 0), (0, 0), (1, 2), (2, 1)))
    cut = padded[:, 1:, 1::2, ::-1]
    joined = jnp.concatenate([cut, cut * 2.0], axis=1)
    stacked = jnp.stack([y, -y], axis=2).reshape(2, 3, 10, 6)  # interleaved rows
    return (
        _nhwc(joined),
        jnp.squeeze(y[:, :1], 1),
        y[:, None].reshape(2, 3, 30),
        _nhwc(stacked),
        y.reshape(2, 15, 6),
        widened,
    )


def _matmuls(x, c):
    y = _nchw(x)  # (N, C, H, W)
    w = jnp.ones((4, 3)) * c.sum()
    pointwise = jnp.einsum("mc,nchw->nmhw", w, y)
    gram = jnp.einsum("nchw,ndhw->ncd", y, y)
    return _nhwc(pointwise), gram


def _calls(x, c):
    @jax.custom_vjp
    def double(v):
        return 2.0 * v

    double.defvjp(lambda v: (double(v), None), lambda _, g: (2.0 * g,))
    y = double(jax.jit(_nchw)(x))
    body = lambda carry, row: (carry + (row.T * 2.0).T, carry.sum())  # noqa: E731
    scanned = lax.scan(body, x[0], x)
    branch = lax.cond(c[0] > 0, lambda v: _nhwc(v) * 2.0, lambda v: _nhwc(v), y)
    return branch, scanned


@pytest.mark.parametrize(
    "fn", [_elementwise, _reductions, _structural, _matmuls, _calls], ids=lambda f: f.__name__
)
def test_every_rule_gives_the_program_s_values(fn):
    _agree(fn, X, C)


def _literals(x, c):
    """Weakly typed literals (JAX reads them as Python scalars: no ``shape``, no ``ndim``)
    broadcast, and beside pending transposes, in scan, branch and custom-rule bodies."""

    def rows(carry, row):
        t = carry.T * 0.5 + lax.broadcast_in_dim(3.0, carry.T.shape, ())
        return t.T + lax.broadcast_in_dim(1.0, carry.shape, ()), (row.T * 2).T.sum() + 1

    @jax.custom_vjp
    def scaled(v):
        return v * lax.broadcast_in_dim(2.0, v.shape, ())

    scaled.defvjp(
        lambda v: (scaled(v), None), lambda _, g: (g * lax.broadcast_in_dim(2.0, g.shape, ()),)
    )
    y = scaled(_nchw(x)) + lax.broadcast_in_dim(1.0, (2, 3, 5, 6), ())
    branch = lax.cond(
        c[0] > 0,
        lambda v: _nhwc(v) + lax.broadcast_in_dim(2.0, X.shape, ()),
        lambda v: _nhwc(v * lax.broadcast_in_dim(0.5, v.shape, ())),
        y,
    )
    solved = lax.custom_linear_solve(  # all four bodies: a named tuple without gaps
        lambda v: v * 2.0, y.sum((0, 2, 3)), lambda _, v: v / 2.0, lambda _, v: v / 2.0
    )
    return branch, lax.scan(rows, x[0], x), solved


def _looped(x):
    def body(state):
        i, w = state
        y = _nchw(w)
        return i + 1, _nhwc(y * 2.0 + lax.broadcast_in_dim(1.0, y.shape, ()))

    return lax.while_loop(lambda s: s[0] < 2, body, (0, x))


def test_literals_in_nested_bodies_give_the_program_s_values():
    """Regression: ``broadcast_in_dim`` of a weakly typed literal inside a scan (CTC loss's
    recursion after a Conv1d) stopped the pass with ``'TypedInt' object has no attribute
    'ndim'``; a ``custom_linear_solve`` with all four bodies lost its named tuple. The
    loop body's transposes still cancel: the literal's broadcast (converted to the
    program's dtype) is broadcast again in the body's layout."""
    _agree(_literals, X, C)
    _agree(_looped, X)
    assert _transposes(_looped, X) == 2
    assert _transposes(sink_transposes(_looped), X) == 0

    def loss(x, c):
        return sum(v.sum() for v in jax.tree_util.tree_leaves(_literals(x, c)))

    _agree(jax.value_and_grad(loss, argnums=(0, 1)), X, C)


def test_a_transpose_and_its_inverse_around_per_channel_ops_cancel():
    big = X.size  # not the per-channel operands' own small transposes
    assert _transposes(_elementwise, X, C, least=big) == 2
    assert _transposes(sink_transposes(_elementwise), X, C, least=big) == 0
    assert _transposes(sink_transposes(lambda x, c: _reductions(x, c)[0]), X, C, least=big) == 0


def test_a_transpose_left_pending_is_computed_once_for_every_reader():
    def fn(x):
        y = _nchw(x)
        window = ((1, 1, 2, 2), (1, 1, 1, 1), "VALID")
        return lax.reduce_window(y, 0.0, lax.add, *window), lax.reduce_window(
            y, -1e9, lax.max, *window
        )

    assert _transposes(sink_transposes(fn), X) == 1
    _agree(fn, X)


def test_the_transposes_between_channels_last_convolutions_cancel():
    """conv -> BatchNorm -> ReLU -> conv in ``NCHW``: each ``lax`` form transposes its
    activations to channels-last and back; after sinking, only the program's edges do (and,
    in training, the weight gradients, which read the batch as the channels)."""
    x = jnp.asarray(RNG.standard_normal((8, 32, 8, 8)), jnp.float32)
    w1 = jnp.asarray(RNG.standard_normal((32, 32, 3, 3)) * 0.1, jnp.float32)
    w2 = jnp.asarray(RNG.standard_normal((32, 32, 3, 3)) * 0.1, jnp.float32)
    geo = Geometry((1, 1), ((1, 1), (1, 1)), (1, 1), 1)

    def net(x, w1, w2):
        y = conv(x, w1, geo)
        mean = y.mean((0, 2, 3), keepdims=True)
        y = jax.nn.relu((y - mean) * lax.rsqrt(y.var((0, 2, 3), keepdims=True) + 1e-5))
        return conv(y, w2, geo).sum()

    big = x.size  # larger than a kernel
    assert _transposes(net, x, w1, w2, least=big) == 4
    assert _transposes(sink_transposes(net), x, w1, w2, least=big) == 1  # the input's
    step = jax.value_and_grad(net, argnums=(0, 1, 2))
    before = _transposes(step, x, w1, w2, least=big)
    after = _transposes(sink_transposes(step), x, w1, w2, least=big)
    assert after <= before - 6, (before, after)
    want, got = jax.jit(step)(x, w1, w2), jax.jit(sink_transposes(step))(x, w1, w2)
    for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)


def test_a_concatenation_transposes_only_operands_pending_another_order():
    """DenseNet's features: most come channels-last from the convolutions' forms, one in
    another order; the join pends the majority's transpose, which the next channels-last
    reader cancels, and only the odd operands are transposed (where plain operands hold as
    many elements as the pending ones, the pending ones are computed, as before)."""
    wide = jnp.asarray(RNG.standard_normal((2, 5, 6, 8)), jnp.float32)  # NHWC
    odd = jnp.asarray(RNG.standard_normal((3, 2, 5, 6)), jnp.float32)  # CNHW
    plain = jnp.asarray(RNG.standard_normal((2, 9, 5, 6)), jnp.float32)  # NCHW

    def joined(wide, x, odd):
        parts = [_nchw(wide), _nchw(x) * 2.0, jnp.transpose(odd, (1, 0, 2, 3))]
        return _nhwc(jnp.concatenate(parts, axis=1))

    def mostly_plain(wide, plain):
        return jnp.concatenate([_nchw(wide), plain], axis=1).sum(2)

    def mostly_pending(wide, plain):  # the plain operand is the largest, not the most
        return _nhwc(jnp.concatenate([_nchw(wide), plain, _nchw(wide) + 1.0], axis=1))

    assert _transposes(joined, wide, X, odd) == 4
    assert _transposes(sink_transposes(joined), wide, X, odd) == 1
    assert _transposes(sink_transposes(mostly_plain), wide, plain) == 1
    assert _transposes(sink_transposes(mostly_pending), wide, plain) == 1  # the plain one
    _agree(joined, wide, X, odd)
    _agree(mostly_plain, wide, plain)
    _agree(mostly_pending, wide, plain)


def test_a_split_of_a_pending_value_splits_its_base():
    """The gradient of a concatenation splits the joined cotangent: each part pends the
    transpose the whole did, so channels-last parts stay channels-last."""

    def parts(x):
        a, b, c = lax.split(_nchw(x) * 3.0, (1, 0, 2), axis=1)
        return _nhwc(a), b, _nhwc(c) + 1.0

    assert _transposes(sink_transposes(parts), X, least=2) == 0
    _agree(parts, X)
    step = jax.grad(
        lambda wide, x: (_nhwc(jnp.concatenate([_nchw(wide), _nchw(x)], 1)) ** 2).sum(), (0, 1)
    )
    assert _transposes(sink_transposes(step), X, X) == 0
    _agree(step, X, X)


@pytest.mark.parametrize("base", [(2, 3, 4, 5), (6, 1, 4), (2, 1, 3, 1, 4), (12, 10)])
def test_a_reshape_plan_reshapes_the_base_to_the_same_values(base):
    """Every permutation of ``base`` under every reshape that merges or splits neighbours
    (and adds or drops unit axes): a plan, where one is given, gives the reshape's values."""
    rng = np.random.default_rng(1)
    b = rng.standard_normal(base)
    planned = 0
    for perm in itertools.permutations(range(len(base))):
        value = np.transpose(b, perm)
        for target in _targets(value.shape):
            plan = reshape_plan(base, perm, target)
            if plan is None:
                continue
            first, shape, perm2 = plan
            moved = b if first is None else np.transpose(b, first)
            planned += 1
            np.testing.assert_array_equal(
                np.transpose(moved.reshape(shape), perm2), value.reshape(target)
            )
    assert planned > len(base)  # the identity and unit-axis reshapes at least


def test_a_reshape_transposes_the_base_only_where_it_merges_axes_apart_there():
    # (N, C, H, W) seen from an NHWC base: H and W are neighbours there, C and H are not.
    assert reshape_plan((2, 4, 5, 3), (0, 3, 1, 2), (2, 3, 20)) == (None, (2, 20, 3), (0, 2, 1))
    first, shape, perm = reshape_plan((2, 4, 5, 3), (0, 3, 1, 2), (2, 12, 5))
    assert first == (0, 2, 3, 1) and shape == (2, 5, 12) and perm == (0, 2, 1)
    # A split and merge in one run (6 x 4 -> 8 x 3) has no plan.
    assert reshape_plan((6, 4), (0, 1), (8, 3)) is None


def _targets(shape):
    """Reshapes of ``shape``: merges of neighbours, a split, unit axes added and dropped."""
    out = {shape, tuple(n for n in shape if n != 1), (*shape, 1), (1, *shape)}
    for i in range(len(shape) - 1):
        out.add((*shape[:i], shape[i] * shape[i + 1], *shape[i + 2 :]))
    for i, n in enumerate(shape):
        for f in range(2, n):
            if n % f == 0:
                out.add((*shape[:i], f, n // f, *shape[i + 1 :]))
    return sorted(out)


def _accumulated(w, xs):
    """A gradient-accumulation loop's pattern: a weight read channels-last in every step
    and an accumulator summing values made channels-last (``(C, H, W)`` in, HWC kernels)."""

    def step(acc, x):
        kernel = jnp.transpose(w, (1, 2, 0))  # the weight as the kernel reads it
        made = jnp.sort(kernel * x, axis=-1)  # (a kernel the sinking does not see into)
        grad = jnp.transpose(made, (2, 0, 1))  # made channels-last, named CHW
        return acc + grad, (grad * 2.0).max()  # (exact in any order)

    return lax.scan(step, jnp.zeros_like(w), xs)


def test_a_scan_keeps_its_invariant_operands_and_carries_in_their_body_s_layout():
    w = jnp.asarray(RNG.standard_normal((3, 4, 5)), jnp.float32)
    xs = jnp.asarray(RNG.standard_normal((6, 4, 5, 3)), jnp.float32)
    _agree(_accumulated, w, xs)
    assert _transposes(_accumulated, w, xs) == 2  # both in the body: every step

    def body(fn, *args):
        scan = next(e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "scan")
        return scan.params["jaxpr"].jaxpr

    def body_transposes(fn, *args) -> int:
        return sum(e.primitive.name == "transpose" for e in body(fn, *args).eqns)

    # the accumulator is carried channels-last, as the body makes it
    assert body(sink_transposes(_accumulated), w, xs).invars[1].aval.shape == (4, 5, 3)
    assert body(_accumulated, w, xs).invars[1].aval.shape == (3, 4, 5)

    def stored(w_hwc, xs):  # the weight kept as the kernel reads it, passed pending
        return _accumulated(jnp.transpose(w_hwc, (2, 0, 1)), xs)

    w_hwc = jnp.transpose(w, (1, 2, 0))
    _agree(stored, w_hwc, xs)
    # the weight kept as its kernel reads it enters as it is: nothing left in the body
    assert body_transposes(stored, w_hwc, xs) == 2
    assert body_transposes(sink_transposes(stored), w_hwc, xs) == 0
    assert _transposes(sink_transposes(stored), w_hwc, xs) == 1  # the accumulator's result
