"""Op-table cases: pow2scale_cast_to_fp8 / pow2scale_cast_from_fp8 and matmul_pow2scaled.

Float8 inputs are built on the host with ``popxl.fp8_utils`` (PopXL's structured float8
arrays) and fed through float8 streams; the casts are checked against the host conversions
they must match bit for bit, with ``np.testing.assert_equal`` (``EDGES`` holds NaNs, which
compare equal byte by byte).
"""

import numpy as np

import popxl
import popxl.ops as ops
from popxl.fp8_utils import host_pow2scale_cast_from_fp8, host_pow2scale_cast_to_fp8

from .harness import OpCase, f32

F8 = {"143": popxl.float8_143, "152": popxl.float8_152}
# In range, tiny (subnormal/underflow), exactly at the limit, just past it, and NaN.
EDGES = np.array(
    [0.0, -0.0, 1e-3, -2.5e-3, 1e-6, 3.3, -17.0, 240.0, -241.0, 250.0, 6e4, np.nan], np.float32
)
X = np.concatenate([f32(12, seed=20, low=-30.0, high=30.0), EDGES]).reshape(4, 6)


def scale(s):
    return np.array(s, np.int32)


def fp8(x, fmt, log2_scale=0):
    return host_pow2scale_cast_to_fp8(np.asarray(x, np.float32), F8[fmt], log2_scale)


def _to_fp8_case(fmt, log2_scale, x=X):
    def ref(a, s):
        return host_pow2scale_cast_to_fp8(a, F8[fmt], int(s), nan_on_overflow=True)

    return OpCase(
        f"pow2scale_cast_to_fp8_{fmt}_{x.dtype.name}_scale{log2_scale}",
        lambda t, s: ops.pow2scale_cast_to_fp8(t, s, F8[fmt]),
        [x, scale(log2_scale)],
        ref,
        rtol=0,
        atol=0,
        grad=False,
    )


def _from_fp8_case(fmt, log2_scale, target):
    data = fp8(f32(3, 5, seed=21, low=-8.0, high=8.0), fmt, 2)

    def ref(a, s):
        return host_pow2scale_cast_from_fp8(a, target, int(s))

    return OpCase(
        f"pow2scale_cast_from_fp8_{fmt}_to_{target.name}_scale{log2_scale}",
        lambda t, s: ops.pow2scale_cast_from_fp8(t, s, target),
        [data, scale(log2_scale)],
        ref,
        rtol=0,
        atol=0,
        grad=False,
    )


def _matmul_ref(a, b, s):
    a, b = (host_pow2scale_cast_from_fp8(x, popxl.float64) for x in (a, b))
    product = np.matmul(a, b) * 2.0 ** int(s)
    return product.astype(np.float32).astype(np.float16)


def _matmul_case(name, lhs, rhs, log2_scale):
    return OpCase(
        f"matmul_pow2scaled_{name}",
        ops.matmul_pow2scaled,
        [lhs, rhs, scale(log2_scale)],
        _matmul_ref,
        rtol=1e-3,
        atol=1e-3,
        grad=False,
    )


A = fp8(f32(3, 4, seed=22, low=-4.0, high=4.0), "143")
B = fp8(f32(4, 2, seed=23, low=-4.0, high=4.0), "143")
B152 = fp8(f32(4, 2, seed=24, low=-100.0, high=100.0), "152")
BATCH = fp8(f32(2, 3, 4, seed=25), "143")
VEC = fp8(f32(4, seed=26), "152")


def _round_trip(t, s):
    # Casting to float8 and back with the opposite scale restores representable values.
    f8 = ops.pow2scale_cast_to_fp8(t, s, popxl.float8_152)
    return ops.pow2scale_cast_from_fp8(f8, -s, popxl.float32)


CASES = [
    _to_fp8_case("143", 0),
    _to_fp8_case("143", 3),
    _to_fp8_case("143", -2),
    _to_fp8_case("152", 0),
    _to_fp8_case("152", 10),
    _to_fp8_case("152", -5),
    _to_fp8_case("143", 1, X.astype(np.float16)),
    _to_fp8_case("152", 0, X.astype(np.float16)),
    _from_fp8_case("143", 0, popxl.float32),
    _from_fp8_case("143", -3, popxl.float16),
    _from_fp8_case("152", 4, popxl.float32),
    _from_fp8_case("152", -2, popxl.float16),
    OpCase(
        "pow2scale_cast_fp8_round_trip",
        _round_trip,
        [np.array([0.5, -3.0, 24.0, 0.125], np.float32), scale(-4)],
        lambda x, s: x.copy(),
        rtol=0,
        atol=0,
        grad=False,
    ),
    _matmul_case("143", A, B, 0),
    _matmul_case("143_scale_down", A, B, -3),
    _matmul_case("mixed_formats_scale_up", A, B152, 2),
    _matmul_case("batched_times_vector", BATCH, VEC, -1),
]
