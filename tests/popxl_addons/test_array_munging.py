"""``popxl_addons.array_munging``: host-side layout helpers checked against NumPy."""

import numpy as np
import pytest

import popxl_addons as addons
from popxl_addons import array_munging as am


def test_all_names_are_exported_at_top_level():
    for name in am.__all__:
        assert getattr(addons, name) is getattr(am, name)
    assert "tensor_parallel_output" not in am.__all__
    assert addons.repeat is am.repeat


def test_shard_reference_examples():
    data = np.arange(8).reshape(4, 2)
    np.testing.assert_array_equal(
        shard0 := am.shard(data, 2, 0), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    )
    assert shard0.shape == (2, 2, 2)
    on_1 = am.shard(data, 2, 1)
    assert on_1.shape == (2, 4, 1)
    np.testing.assert_array_equal(on_1[..., 0], [[0, 2, 4, 6], [1, 3, 5, 7]])
    np.testing.assert_array_equal(am.shard(data, 2, -1), on_1)


def test_shard_indivisible_raises():
    with pytest.raises(ValueError):
        am.shard(np.arange(5), 2, 0)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_unshard_inverts_shard(rng, axis):
    data = rng.normal(size=(4, 6, 8))
    sharded = am.shard(data, 2, axis)
    np.testing.assert_array_equal(am.unshard(sharded, axis), data)


def test_unshard_reference_example(rng):
    data = rng.random((10, 3, 4))
    s2 = am.shard(data, 2, 2)
    assert s2.shape == (2, 10, 3, 2)
    np.testing.assert_array_equal(am.unshard(s2, 2), data)


def test_unshard_arrays_concatenates_after_the_leading_axis():
    xs = [np.full((1, 2, 3), i) for i in range(3)]
    out = am.unshard_arrays(xs, 1)
    assert out.shape == (2, 9)
    np.testing.assert_array_equal(out[0], [0, 0, 0, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(am.unshard_arrays(xs, -1), out)


def test_unshard_arrays_rank_mismatch_raises():
    with pytest.raises(ValueError, match="same rank"):
        am.unshard_arrays([np.zeros((1, 2)), np.zeros((1, 2, 1))], 0)


def test_repeat_adds_an_axis():
    data = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(am.repeat(data, 2, 0), [data, data])
    np.testing.assert_array_equal(am.repeat(data, 2, 1), [[[0, 1, 2]] * 2, [[3, 4, 5]] * 2])
    assert am.repeat(data, 3, -1).shape == (2, 3, 3)


def test_repeat_axis_tiles():
    data = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(
        am.repeat_axis(data, 2, 0), [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]]
    )
    np.testing.assert_array_equal(
        am.repeat_axis(data, 2, 1), [[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5]]
    )


def test_split2D_blocks():
    data = np.arange(16).reshape(4, 4)
    blocks = am.split2D(data, 2, 2, 0, 1)
    assert len(blocks) == 2 and all(len(row) == 2 for row in blocks)
    np.testing.assert_array_equal(blocks[0][1], [[2, 3], [6, 7]])
    np.testing.assert_array_equal(blocks[1][0], [[8, 9], [12, 13]])


def test_shard2D_reference_examples():
    data = np.arange(8).reshape(4, 2)
    a = am.shard2D(data, 2, 2, 0, 1)
    assert a.shape == (4, 2, 1)
    np.testing.assert_array_equal(a[..., 0], [[0, 2], [1, 3], [4, 6], [5, 7]])
    b = am.shard2D(data, 2, 2, 1, 0)
    np.testing.assert_array_equal(b[..., 0], [[0, 2], [4, 6], [1, 3], [5, 7]])


@pytest.mark.parametrize("n1,n2,a1,a2", [(2, 4, 0, 2), (5, 2, 0, 2), (5, 3, 0, 1), (2, 2, 2, 0)])
def test_unshard2D_inverts_shard2D(rng, n1, n2, a1, a2):
    data = rng.random((10, 3, 4))
    s = am.shard2D(data, n1, n2, a1, a2)
    assert s.shape[0] == n1 * n2
    np.testing.assert_array_equal(am.unshard2D(s, n1, n2, a1, a2), data)


def test_unshard2D_wrong_block_count_raises():
    with pytest.raises(ValueError, match="n1\\*n2"):
        am.unshard2D(np.zeros((3, 2, 2)), 2, 2, 0, 1)


def test_repeat_shard_orders():
    data = np.arange(4)
    np.testing.assert_array_equal(am.repeat_shard(data, 2, 2, 0), [[0, 1], [2, 3], [0, 1], [2, 3]])
    np.testing.assert_array_equal(
        am.repeat_shard(data, 2, 2, 0, sharded_tensor="strided"), [[0, 1], [0, 1], [2, 3], [2, 3]]
    )
    np.testing.assert_array_equal(
        am.repeat_shard(np.arange(6), 2, 3, 0, "strided"),
        [[0, 1], [0, 1], [2, 3], [2, 3], [4, 5], [4, 5]],
    )


def test_repeat_shard_bad_mode_raises():
    with pytest.raises(ValueError, match="contiguous' or 'strided"):
        am.repeat_shard(np.arange(4), 2, 2, 0, sharded_tensor="blocked")


@pytest.mark.parametrize(
    "tp,rf,expected",
    [
        (1, 2, [[0, 1], [2, 3]]),
        (2, 2, [[0, 0], [1, 1], [2, 2], [3, 3]]),
        (2, 4, [[0, 0, 1, 1], [2, 2, 3, 3]]),
        (1, 4, [0, 1, 2, 3]),
    ],
)
def test_tensor_parallel_input_reference_examples(tp, rf, expected):
    np.testing.assert_array_equal(am.tensor_parallel_input(np.arange(4), tp, rf), expected)


def test_tensor_parallel_input_repeat_fn_and_sample_shape():
    data = np.arange(8).reshape(4, 2)
    out = am.tensor_parallel_input(data, 2, 4, repeat_fn=lambda x, i: x + 100 * i)
    assert out.shape == (2, 4, 2)
    np.testing.assert_array_equal(out[0, :, 0], [0, 100, 2, 102])
    np.testing.assert_array_equal(data, np.arange(8).reshape(4, 2))


@pytest.mark.parametrize("tp,rf", [(3, 2), (3, 4), (0, 4)])
def test_tensor_parallel_input_bad_sizes_raise(tp, rf):
    with pytest.raises(ValueError, match="must divide"):
        am.tensor_parallel_input(np.arange(4), tp, rf)


def test_tensor_parallel_output_inverts_input(rng):
    samples = rng.normal(size=(8, 3))
    tp, rf = 2, 4
    host = am.tensor_parallel_input(samples, tp, rf)
    nht = host.shape[0]
    out = am.tensor_parallel_output(host, nht, tp, rf, (3,))
    np.testing.assert_array_equal(out, samples)
    everything = am.tensor_parallel_output(host, nht, tp, rf, (3,), tp_identical=False)
    assert everything.shape == (8, 2, 3)
    np.testing.assert_array_equal(everything[:, 1], samples)
    np.testing.assert_array_equal(
        am.tensor_parallel_output(host, nht, tp, rf, (3,), true_num_host_transfers=2), samples[:4]
    )


def test_pad_axis():
    data = np.arange(6).reshape(3, 2)
    np.testing.assert_array_equal(
        am.pad_axis(data, 5, 1), [[0, 1, 0, 0, 0], [2, 3, 0, 0, 0], [4, 5, 0, 0, 0]]
    )
    np.testing.assert_array_equal(am.pad_axis(np.arange(2), 3, 0, value=-1), [0, 1, -1])
    with pytest.raises(ValueError, match="longer"):
        am.pad_axis(data, 2, 0)


def test_squeeze_safe():
    x = np.zeros((1, 2, 1, 3))
    assert am.squeeze_safe(x).shape == (2, 3)
    assert am.squeeze_safe(x, 1).shape == (1, 2, 1, 3)
    assert am.squeeze_safe(x, [0, 1, 2]).shape == (2, 3)
    assert am.squeeze_safe(x, [-2, 2, 0]).shape == (2, 3)
    assert am.squeeze_safe(x, 0).shape == (2, 1, 3)
    with pytest.raises(IndexError):
        am.squeeze_safe(x, 4)


def test_handle_negative_axis():
    x = np.zeros((2, 3, 4))
    assert [am.handle_negative_axis(x, a) for a in (0, 2, -1, -3)] == [0, 2, 2, 0]
    for bad in (3, -4):
        with pytest.raises(IndexError, match="out of range"):
            am.handle_negative_axis(x, bad)
    with pytest.raises(IndexError, match="0-dimensional"):
        am.handle_negative_axis(np.array(1.0), 0)
