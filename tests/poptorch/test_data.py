"""poptorch.DataLoader and AsynchronousDataAccessor."""

import threading

import numpy as np
import pytest

import poptorch


class Pairs:
    """A map-style dataset of (x, y) samples, as in the seeds' ExampleDataset."""

    def __init__(self, length, shape=(1,)):
        self.length, self.shape = length, shape

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return np.full(self.shape, i, np.float32), np.int32(i % 10)


def test_combined_batch_size_and_shapes():
    """Efficient data batching: batch 10 x deviceIterations 10 -> 100 samples per call."""
    opts = poptorch.Options().deviceIterations(10)
    loader = poptorch.DataLoader(opts, Pairs(20000), batch_size=10, shuffle=True, drop_last=True)
    assert loader.combinedBatchSize == 100 and len(loader) == 200
    x, y = next(iter(loader))
    assert x.shape == (100, 1) and y.shape == (100,) and x.dtype == np.float32


def test_combined_batch_includes_replicas_and_accumulation():
    opts = poptorch.Options().deviceIterations(2).replicationFactor(4)
    opts.Training.gradientAccumulation(3)
    assert poptorch.DataLoader(opts.clone(), Pairs(10), batch_size=5).combinedBatchSize == 120
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Orthogonal)
    assert poptorch.DataLoader(opts, Pairs(10), batch_size=5).combinedBatchSize == 60


def test_drop_last():
    opts = poptorch.Options().deviceIterations(2)
    kept = poptorch.DataLoader(opts, np.arange(25, dtype=np.float32), batch_size=4, drop_last=False)
    dropped = poptorch.DataLoader(opts, np.arange(25, dtype=np.float32), batch_size=4)
    assert [b.shape[0] for b in kept] == [8, 8, 8, 1] and len(kept) == 4
    assert [b.shape[0] for b in dropped] == [8, 8, 8] and len(dropped) == 3
    np.testing.assert_array_equal(list(dropped)[1], np.arange(8, 16))


def test_too_small_dataset_with_drop_last_explains():
    opts = poptorch.Options().deviceIterations(10)
    loader = poptorch.DataLoader(opts, Pairs(50), batch_size=10)
    with pytest.raises(ValueError, match="fewer than one combined batch of 100"):
        list(loader)


def test_shuffle_is_seeded_identical_across_instances_and_changes_per_epoch():
    opts = poptorch.Options().deviceIterations(2).randomSeed(42)
    a = poptorch.DataLoader(opts, np.arange(40), batch_size=5, shuffle=True)
    b = poptorch.DataLoader(opts.clone(), np.arange(40), batch_size=5, shuffle=True)
    epoch_a, epoch_b = np.concatenate(list(a)), np.concatenate(list(b))
    np.testing.assert_array_equal(epoch_a, epoch_b)
    assert sorted(epoch_a) == list(range(40)) and list(epoch_a) != list(range(40))
    assert list(np.concatenate(list(a))) != list(epoch_a)


def test_processes_get_disjoint_shares_of_one_permutation():
    seen = []
    for pid in range(2):
        opts = poptorch.Options().randomSeed(1)
        opts.Distributed.configureProcessId(pid, 2)
        loader = poptorch.DataLoader(opts, np.arange(20), batch_size=5, shuffle=True)
        assert len(loader) == 2
        seen.append(np.concatenate(list(loader)))
    assert not set(seen[0]) & set(seen[1]) and len(seen[0]) == len(seen[1]) == 10
    no_split = poptorch.Options()
    no_split.Distributed.configureProcessId(1, 2)
    loader = poptorch.DataLoader(no_split, np.arange(20), 5, auto_distributed_partitioning=False)
    assert len(loader) == 4


def test_iterable_dataset_and_python_sequences():
    opts = poptorch.Options().deviceIterations(2)
    stream = (np.float32(i) for i in range(9))
    batches = list(poptorch.DataLoader(opts, stream, batch_size=2, drop_last=False))
    assert [len(b) for b in batches] == [4, 4, 1]
    listed = poptorch.DataLoader(opts, [(i, 2 * i) for i in range(8)], batch_size=2)
    x, y = next(iter(listed))
    np.testing.assert_array_equal(y, 2 * x)


def test_worker_threads_keep_the_order():
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, Pairs(64), batch_size=4, num_workers=2)
    firsts = [int(x[0, 0]) for x, _ in loader]
    assert firsts == list(range(0, 64, 8))


def test_batch_sampler_replaces_batch_size():
    opts = poptorch.Options()
    loader = poptorch.DataLoader(opts, np.arange(10), batch_sampler=[[3, 1], [0, 9]])
    assert [list(b) for b in loader] == [[3, 1], [0, 9]]
    with pytest.raises(ValueError, match="mutually exclusive"):
        poptorch.DataLoader(opts, np.arange(10), batch_size=2, batch_sampler=[[0]])


@pytest.mark.parametrize(
    "mode", [poptorch.DataLoaderMode.Async, poptorch.DataLoaderMode.AsyncRebatched]
)
def test_async_modes_yield_the_sync_batches(mode):
    opts = poptorch.Options().deviceIterations(2)
    sync = poptorch.DataLoader(opts, Pairs(40), batch_size=4)
    loader = poptorch.DataLoader(opts, Pairs(40), batch_size=4, mode=mode)
    for (xa, ya), (xs, ys) in zip(loader, sync):
        np.testing.assert_array_equal(xa, xs)
        np.testing.assert_array_equal(ya, ys)
    assert len(list(loader)) == 5  # a second epoch
    loader.terminate()


def test_rebatched_worker_size_is_checked():
    opts = poptorch.Options().deviceIterations(2)
    with pytest.raises(ValueError, match="rebatched_worker_size \\(9\\) must be at most"):
        poptorch.DataLoader(
            opts, Pairs(40), 4, mode=poptorch.DataLoaderMode.AsyncRebatched, rebatched_worker_size=9
        )


def test_accessor_prefetches_into_a_bounded_buffer():
    produced = []
    release = threading.Event()

    def batches():
        for i in range(10):
            produced.append(i)
            yield i
        release.set()

    class Source:
        def __iter__(self):
            return batches()

        def __len__(self):
            return 10

    accessor = poptorch.AsynchronousDataAccessor(
        Source(), buffer_size=2, load_indefinitely=False, early_preload=True
    )
    for _ in range(200):
        if len(produced) >= 3:
            break
        threading.Event().wait(0.01)
    # Two batches wait in the buffer and the worker holds the third.
    assert len(produced) == 3
    assert list(accessor) == list(range(10))
    accessor.terminate()
    with pytest.raises(RuntimeError, match="was terminated"):
        iter(accessor)


def test_accessor_loads_indefinitely_and_rebatches():
    accessor = poptorch.AsynchronousDataAccessor(
        [np.float32(i) for i in range(3)], rebatched_size=2, load_indefinitely=True
    )
    it = iter(accessor)
    got = [next(it) for _ in range(3)]
    accessor.terminate()
    assert [list(b) for b in got] == [[0, 1], [0, 1], [0, 1]]


def test_worker_errors_are_raised_in_the_caller():
    def broken():
        yield np.zeros(2)
        raise OSError("disk on fire")

    class Source:
        def __iter__(self):
            return broken()

    accessor = poptorch.AsynchronousDataAccessor(Source(), load_indefinitely=False)
    it = iter(accessor)
    next(it)
    with pytest.raises(OSError, match="disk on fire"):
        next(it)
    accessor.terminate()


def test_torch_datasets_are_accepted():
    torch = pytest.importorskip("torch")

    class TorchPairs(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return torch.full((2,), float(i)), torch.tensor(i)

    opts = poptorch.Options().deviceIterations(3)
    x, y = next(iter(poptorch.DataLoader(opts, TorchPairs(), batch_size=2)))
    assert isinstance(x, np.ndarray) and x.shape == (6, 2)
    np.testing.assert_array_equal(y, np.arange(6))


class Stream:
    """An iterable-style dataset of the samples 0 .. n-1 (one pass each epoch)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return (np.float32(i) for i in range(self.n))


def test_iterable_workers_each_drop_their_remainder_unless_rebatched():
    """103 samples dealt to 4 workers (26, 26, 26, 25), combined batch 2 x 5 = 10.

    Async: each worker drops its own 6 or 5 leftover samples -> 4 x 2 = 8 batches (80 samples).
    AsyncRebatched with workers loading 3 samples at a time: the accessor joins and splits
    the worker batches -> 10 batches (100 samples), only the last 3 dropped."""
    opts = poptorch.Options().deviceIterations(5)
    kw = {"batch_size": 2, "num_workers": 4}
    sync = list(poptorch.DataLoader(opts, Stream(103), **kw))
    plain = poptorch.DataLoader(opts, Stream(103), mode=poptorch.DataLoaderMode.Async, **kw)
    rebatched = poptorch.DataLoader(
        opts,
        Stream(103),
        mode=poptorch.DataLoaderMode.AsyncRebatched,
        rebatched_worker_size=3,
        **kw,
    )
    a, r = list(plain), list(rebatched)
    plain.terminate()
    rebatched.terminate()
    assert len(sync) == len(a) == 8 and len(r) == 10
    assert all(b.shape == (10,) for b in a + r)
    # Worker 0 holds samples 0, 4, 8, ...: its first batch, then worker 1's.
    np.testing.assert_array_equal(a[0], np.arange(0, 40, 4))
    np.testing.assert_array_equal(a[1], np.arange(1, 41, 4))
    for x, y in zip(sync, a):
        np.testing.assert_array_equal(x, y)
    # Worker batches of 3: w0 [0 4 8], w1 [1 5 9], w2 [2 6 10], w3 [3 7 11], w0 [12 16 20]...
    np.testing.assert_array_equal(r[0], [0, 4, 8, 1, 5, 9, 2, 6, 10, 3])
    np.testing.assert_array_equal(r[1][:2], [7, 11])
    seen = np.concatenate(r)
    assert len(set(seen.tolist())) == 100 and set(seen.tolist()) <= set(range(103))


def test_rebatched_keeps_the_short_batch_without_drop_last():
    opts = poptorch.Options().deviceIterations(5)
    loader = poptorch.DataLoader(
        opts,
        Stream(23),
        batch_size=2,
        num_workers=2,
        drop_last=False,
        mode=poptorch.DataLoaderMode.AsyncRebatched,
        rebatched_worker_size=4,
    )
    batches = list(loader)
    loader.terminate()
    assert [len(b) for b in batches] == [10, 10, 3]
    assert sorted(np.concatenate(batches).tolist()) == list(range(23))


def test_rebatched_map_style_splits_worker_batches_into_the_sync_batches():
    """Map-style: workers load 3 samples at a time, the accessor rebuilds batches of 8
    (a worker batch is split across two combined batches) equal to the Sync batches."""
    opts = poptorch.Options().deviceIterations(2)
    sync = list(poptorch.DataLoader(opts, Pairs(30), batch_size=4, shuffle=True))
    loader = poptorch.DataLoader(
        opts,
        Pairs(30),
        batch_size=4,
        shuffle=True,
        mode=poptorch.DataLoaderMode.AsyncRebatched,
        rebatched_worker_size=3,
    )
    got = list(loader)
    loader.terminate()
    assert len(got) == len(sync) == 3
    for (xa, ya), (xs, ys) in zip(got, sync):
        assert xa.shape == (8, 1) and ya.shape == (8,)
        np.testing.assert_array_equal(xa, xs)
        np.testing.assert_array_equal(ya, ys)
