"""``popxl.create_seeds`` and the uint64 <-> two-uint32 helpers."""

import numpy as np
import pytest

import popxl
from popxl.random_seed import MAX_UINT64, two_uint32_to_uint64, uint64_to_two_uint32


@pytest.mark.parametrize(
    "kwargs,shape",
    [
        ({}, (2,)),
        ({"replicas": 4}, (4, 2)),
        ({"batches_per_step": 3, "gradient_accumulation_factor": 7, "replicas": 9}, (3, 7, 9, 2)),
        ({"batches_per_step": 3, "replicas": 2}, (3, 2, 2)),
    ],
)
def test_create_seeds_shapes(kwargs, shape):
    seeds = popxl.create_seeds(0, **kwargs)
    assert seeds.shape == shape and seeds.dtype == np.uint32


def test_create_seeds_is_deterministic_and_uses_offset():
    np.testing.assert_array_equal(popxl.create_seeds(42), popxl.create_seeds(42))
    np.testing.assert_array_equal(popxl.create_seeds(40, offset=2), popxl.create_seeds(42))
    assert not np.array_equal(popxl.create_seeds(1), popxl.create_seeds(2))
    assert len({tuple(s) for s in popxl.create_seeds(0, replicas=8)}) == 8


def test_create_seeds_are_uint64_draws_split_in_halves():
    value = np.random.default_rng(7).integers(0, MAX_UINT64, dtype=np.uint64, endpoint=True)
    hi, lo = uint64_to_two_uint32(int(value))
    np.testing.assert_array_equal(popxl.create_seeds(7), [hi, lo])


def test_uint64_round_trip():
    for num in (0, 1, 2**32, 2**40 + 5, MAX_UINT64):
        hi, lo = uint64_to_two_uint32(num)
        assert 0 <= hi < 2**32 and 0 <= lo < 2**32
        assert two_uint32_to_uint64(hi, lo) == num
    assert uint64_to_two_uint32(2**32 + 3) == (1, 3)


@pytest.mark.parametrize("num", [-1, MAX_UINT64 + 1])
def test_uint64_out_of_range(num):
    with pytest.raises(ValueError):
        uint64_to_two_uint32(num)


@pytest.mark.parametrize("a,b", [(-1, 0), (0, 2**32), (2**32, 0)])
def test_two_uint32_out_of_range(a, b):
    with pytest.raises(ValueError):
        two_uint32_to_uint64(a, b)
