"""Op-table cases: random sampling, dropout and seed splitting.

The streams are not reproducible in NumPy, so each case outputs a property the NumPy
reference can state exactly: samples lie in range, equal seeds give equal values, dropout
keeps ``x / (1 - p)`` or 0, a shaped mask is constant along its broadcast axes.
"""

import numpy as np

import popxl
import popxl.ops as ops

from .harness import OpCase, f32

SEED = np.array([7, 123456789], np.uint32)
X = f32(3, 4, seed=11, low=0.5, high=2.0)  # no zeros: a dropped element is exactly 0


def _const(value, dtype=popxl.float32):
    return popxl.constant(np.asarray(value), dtype)


def _uniform_in_range(seed):
    # floor((u - low) / (high - low)) is 0 exactly when low <= u < high.
    u = ops.random_uniform(seed, (4, 5), low=-1.0, high=3.0)
    return ops.floor((u + 1.0) / 4.0)


def _same_seed_same_samples(sample):
    def build(seed):
        return sample(seed) - sample(seed)

    return build


def _dropout_kept_or_zero(x, seed):
    out = ops.dropout(x, seed, 0.5)
    return ops.where(ops.equal(out, _const(0.0)), x * 2.0, out)


def _shaped_rows(x, seed):
    # A (3, 1) mask drops whole rows: out / (x / (1-p)) is 0 or 1, constant along axis 1.
    ratio = ops.shaped_dropout(x, seed, (3, 1), 0.25) / (x / 0.75)
    return ratio - ops.slice(ratio, start=0, stop=1, axis=1)


def _split_is_deterministic(seed):
    a0, a1 = ops.split_random_seed(seed)
    b0, b1 = ops.split_random_seed(seed)
    return ops.equal(a0, b0), ops.equal(a1, b1)


def _split_streams_differ(seed):
    s0, s1, s2 = ops.split_random_seed(seed, 3)
    u = [ops.random_uniform(s, (8,)) for s in (s0, s1, s2, seed)]
    return ops.equal(u[0], u[1]), ops.equal(u[1], u[2]), ops.equal(u[0], u[3])


def _create_random_seed(seed, modifier):
    new = ops.random_seed.create_random_seed(seed, modifier)
    return ops.equal(new, ops.random_seed.create_random_seed(seed, modifier))


CASES = [
    OpCase(
        "random_uniform_in_range",
        _uniform_in_range,
        [SEED],
        lambda s: np.zeros((4, 5), np.float32),
        grad=False,
    ),
    OpCase(
        "random_uniform_fp16",
        lambda s: ops.random_uniform(s, (2, 3), dtype=popxl.float16) * 0.0,
        [SEED],
        lambda s: np.zeros((2, 3), np.float16),
        grad=False,
    ),
    OpCase(
        "random_uniform_deterministic",
        _same_seed_same_samples(lambda s: ops.random_uniform(s, (6,))),
        [SEED],
        lambda s: np.zeros(6, np.float32),
        atol=0,
        grad=False,
    ),
    OpCase(
        "random_normal_deterministic",
        _same_seed_same_samples(lambda s: ops.random_normal(s, (2, 5), mean=1.0, std=3.0)),
        [SEED],
        lambda s: np.zeros((2, 5), np.float32),
        atol=0,
        grad=False,
    ),
    OpCase(
        "random_normal_fp16",
        lambda s: ops.random_normal(s, (3,), dtype=popxl.float16) * 0.0,
        [SEED],
        lambda s: np.zeros(3, np.float16),
        grad=False,
    ),
    OpCase(
        "dropout_p0_is_identity",
        lambda x, s: ops.dropout(x, s, 0.0),
        [X, SEED],
        lambda x, s: x,
        grad=[0],
    ),
    OpCase(
        "dropout_keeps_scaled_or_zero",
        _dropout_kept_or_zero,
        [X, SEED],
        lambda x, s: 2 * x,
        grad=False,
    ),
    OpCase(
        "dropout_deterministic",
        lambda x, s: ops.dropout(x, s, 0.3) - ops.dropout(x, s, 0.3),
        [X, SEED],
        lambda x, s: np.zeros_like(x),
        atol=0,
        grad=False,
    ),
    OpCase(
        "shaped_dropout_rows",
        _shaped_rows,
        [X, SEED],
        lambda x, s: np.zeros_like(x),
        atol=1e-6,
        grad=False,
    ),
    OpCase(
        "shaped_dropout_full_shape_p0",
        lambda x, s: ops.shaped_dropout(x, s, (3, 4), 0.0),
        [X, SEED],
        lambda x, s: x,
        grad=[0],
    ),
    OpCase(
        "split_random_seed_deterministic",
        _split_is_deterministic,
        [SEED],
        lambda s: (np.ones(2, bool), np.ones(2, bool)),
        grad=False,
    ),
    OpCase(
        "split_random_seed_streams_differ",
        _split_streams_differ,
        [SEED],
        lambda s: (np.zeros(8, bool),) * 3,
        grad=False,
    ),
    OpCase(
        "create_random_seed",
        _create_random_seed,
        [SEED, np.array(5, np.uint32)],
        lambda s, m: np.ones(2, bool),
        grad=False,
    ),
]
