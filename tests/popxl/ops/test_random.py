"""Random ops: distributions, dropout scaling and masks, determinism per seed, seed checks."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl._op import REGISTRY
from popxl.errors import PopXLException


def _run(build, seed=(1, 2), runs=1):
    """Build ``build(seed_tensor)`` (returns tensors) and run it; one result list per run."""
    ir = popxl.Ir()
    with ir.main_graph:
        stream = popxl.h2d_stream((2,), popxl.uint32, "seed")
        outs = build(ops.host_load(stream, "seed"))
        out_streams = []
        for i, t in enumerate(outs):
            s = popxl.d2h_stream(t.shape, t.dtype, f"out{i}")
            ops.host_store(s, t)
            out_streams.append(s)
    results = []
    with popxl.Session(ir, "ipu_model") as session:
        for _ in range(runs):
            values = session.run({stream: np.array(seed, np.uint32)})
            results.append([values[s] for s in out_streams])
    return results


def test_uniform_statistics():
    ((u,),) = _run(lambda s: [ops.random_uniform(s, (100, 100), low=-2.0, high=4.0)])
    assert u.dtype == np.float32 and u.shape == (100, 100)
    assert u.min() >= -2.0 and u.max() < 4.0
    assert abs(u.mean() - 1.0) < 0.05
    assert abs(u.std() - 6 / np.sqrt(12)) < 0.05


def test_normal_statistics():
    ((n,),) = _run(lambda s: [ops.random_normal(s, (100, 100), mean=3.0, std=0.5)])
    assert abs(n.mean() - 3.0) < 0.02
    assert abs(n.std() - 0.5) < 0.02


def test_float16_samples():
    ((u, n),) = _run(
        lambda s: [
            ops.random_uniform(s, (1000,), dtype=popxl.float16),
            ops.random_normal(s, (1000,), dtype=popxl.float16),
        ]
    )
    assert u.dtype == n.dtype == np.float16
    assert 0.0 <= u.min() and u.max() <= 1.0
    assert abs(float(n.astype(np.float32).mean())) < 0.15


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_drops_fraction_p_and_scales_the_rest(p):
    x = np.random.default_rng(0).uniform(0.5, 2.0, (100, 100)).astype(np.float32)

    def build(seed):
        return [ops.dropout(popxl.constant(x), seed, p)]

    ((out,),) = _run(build)
    kept = out != 0
    assert abs(1 - kept.mean() - p) < 0.03
    np.testing.assert_allclose(out[kept], x[kept] / (1 - p), rtol=1e-6)


def test_shaped_dropout_masks_whole_rows():
    x = np.ones((200, 8), np.float32)
    ((out,),) = _run(lambda s: [ops.shaped_dropout(popxl.constant(x), s, (200, 1), 0.5)])
    assert set(np.unique(out)) <= {0.0, 2.0}
    assert (out == out[:, :1]).all()
    assert 0.35 < (out[:, 0] == 0).mean() < 0.65


def test_same_seed_same_numbers_across_runs_and_sessions():
    def build(seed):
        return [
            ops.random_uniform(seed, (16,)),
            ops.dropout(popxl.constant(np.ones(16, np.float32)), seed, 0.5),
        ]

    first = _run(build, runs=2)
    again = _run(build)
    for a, b in zip(first[0], first[1]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(first[0], again[0]):
        np.testing.assert_array_equal(a, b)


def test_different_seeds_differ():
    def build(seed):
        return [ops.random_uniform(seed, (16,))]

    ((a,),) = _run(build, seed=(1, 2))
    ((b,),) = _run(build, seed=(1, 3))
    ((c,),) = _run(build, seed=(2, 2))
    assert not np.any(a == b) and not np.any(a == c)


def test_split_random_seed_gives_distinct_seeds():
    def build(seed):
        return list(ops.split_random_seed(seed, 4))

    (seeds,) = _run(build)
    assert all(s.dtype == np.uint32 and s.shape == (2,) for s in seeds)
    distinct = {tuple(s) for s in seeds} | {(1, 2)}
    assert len(distinct) == 5


def test_split_random_seed_names_and_types():
    ir = popxl.Ir()
    with ir.main_graph:
        seed = popxl.variable(np.array([1, 2], np.uint32), name="seed")
        seeds = ops.split_random_seed(seed, 3)
    assert len(seeds) == 3
    assert all(s.name.startswith("modified_seed") for s in seeds)
    assert {s._producer.type for s in seeds} == {"ModifyRandomSeed"}
    assert [int(s._producer.inputs[1]._data) for s in seeds] == [0, 1, 2]


def test_dropout_gradient_reuses_the_forward_mask():
    import jax
    import jax.numpy as jnp

    lower = REGISTRY["dropout"].lower
    x = jnp.asarray(np.random.default_rng(1).uniform(0.5, 2.0, (50,)).astype(np.float32))
    seed = jnp.asarray([3, 4], jnp.uint32)
    out, vjp = jax.vjp(lambda v: lower(v, seed, ratio=0.4), x)
    (dx,) = vjp(jnp.ones_like(x))
    np.testing.assert_allclose(
        np.asarray(dx), np.where(np.asarray(out) != 0, 1 / 0.6, 0.0), rtol=1e-6
    )


def test_output_names():
    ir = popxl.Ir()
    with ir.main_graph:
        seed = popxl.variable(np.array([1, 2], np.uint32))
        x = popxl.variable(np.ones((2, 2), np.float32))
        names = [
            ops.random_uniform(seed, (2,)).name,
            ops.random_normal(seed, (2,)).name,
            ops.dropout(x, seed, 0.1).name,
            ops.shaped_dropout(x, seed, (2, 1), 0.1).name,
        ]
    assert names == ["random_uniform_out", "random_normal_out", "dropout_out", "shapeddropout_out"]


# Errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, dtype",
    [
        (np.array([1, 2], np.int32), popxl.int32),
        (np.array([1, 2, 3], np.uint32), popxl.uint32),
        (np.array([[1, 2]], np.uint32), popxl.uint32),
    ],
)
def test_bad_seed_raises(value, dtype):
    ir = popxl.Ir()
    with ir.main_graph:
        seed = popxl.variable(value, dtype)
        x = popxl.variable(np.ones(3, np.float32))
        for make in (
            lambda: ops.random_uniform(seed, (2,)),
            lambda: ops.random_normal(seed, (2,)),
            lambda: ops.dropout(x, seed, 0.5),
            lambda: ops.shaped_dropout(x, seed, (3,), 0.5),
            lambda: ops.split_random_seed(seed),
        ):
            with pytest.raises(ValueError, match=r"uint32 tensor of shape \(2,\)"):
                make()


def test_bad_arguments_raise():
    ir = popxl.Ir()
    with ir.main_graph:
        seed = popxl.variable(np.array([1, 2], np.uint32))
        x = popxl.variable(np.ones((3, 4), np.float32))
        with pytest.raises(ValueError, match="float16 or float32"):
            ops.random_uniform(seed, (2,), dtype=popxl.int32)
        with pytest.raises(PopXLException, match=r"interval \[0, 1\)"):
            ops.dropout(x, seed, 1.0)
        with pytest.raises(PopXLException, match=r"interval \[0, 1\)"):
            ops.shaped_dropout(x, seed, (3, 1), -0.1)
        with pytest.raises(PopXLException, match="does not broadcast"):
            ops.shaped_dropout(x, seed, (2, 1), 0.5)
        with pytest.raises(PopXLException, match="uint32 scalar"):
            ops.random_seed.create_random_seed(seed, popxl.constant(1, popxl.int32))
        with pytest.raises(TypeError, match="not a Tensor"):
            ops.dropout(np.ones(3), seed, 0.5)
