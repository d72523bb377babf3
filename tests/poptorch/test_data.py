"""poptorch.DataLoader and AsynchronousDataAccessor with NumPy / plain Python datasets (the
popxl_addons front end): batches stay NumPy arrays. Torch datasets: test_torch_data.py."""

import numpy as np
import pytest
import torch

import poptorch

# Torch's DataLoader workers are forked; JAX (if another test started it in this process)
# warns about any fork.
fork_ok = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")


class Pairs:
    """A map-style dataset of (x, y) samples, as in the seeds' ExampleDataset."""

    def __init__(self, length, shape=(1,)):
        self.length, self.shape = length, shape

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return np.full(self.shape, i, np.float32), np.int32(i % 10)


class Stream:
    """An iterable of the samples 0 .. n-1 that is not a torch dataset (one pass each epoch)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return (np.float32(i) for i in range(self.n))


class FailingStream:
    def __iter__(self):
        yield np.zeros(2, np.float32)
        raise OSError("disk on fire")


class Empty:
    def __iter__(self):
        return iter(())


def test_is_a_torch_dataloader_with_combined_batches_of_numpy_arrays():
    """Efficient data batching: batch 10 x deviceIterations 10 -> 100 samples per call."""
    opts = poptorch.Options().deviceIterations(10)
    loader = poptorch.DataLoader(opts, Pairs(20000), batch_size=10, shuffle=True)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert loader.combinedBatchSize == 100 and len(loader) == 200 and loader.options is opts
    x, y = next(iter(loader))
    assert isinstance(x, np.ndarray) and x.shape == (100, 1) and x.dtype == np.float32
    assert isinstance(y, np.ndarray) and y.shape == (100,) and y.dtype == np.int32


def test_combined_batch_includes_replicas_and_accumulation():
    opts = poptorch.Options().deviceIterations(2).replicationFactor(4)
    opts.Training.gradientAccumulation(3)
    assert poptorch.DataLoader(opts.clone(), Pairs(10), batch_size=5).combinedBatchSize == 120
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Orthogonal)
    assert poptorch.DataLoader(opts, Pairs(10), batch_size=5).combinedBatchSize == 60


def test_options_are_frozen():
    opts = poptorch.Options()
    poptorch.DataLoader(opts, Pairs(4))
    with pytest.raises(AttributeError, match="frozen Options"):
        opts.deviceIterations(2)


def test_drop_last_and_the_remainder_warning(caplog):
    opts = poptorch.Options().deviceIterations(2)
    kept = poptorch.DataLoader(opts, np.arange(25, dtype=np.float32), batch_size=4, drop_last=False)
    assert "not divisible by the number of elements processed per step (8)" in caplog.text
    dropped = poptorch.DataLoader(opts, np.arange(25, dtype=np.float32), batch_size=4)
    assert [b.shape[0] for b in kept] == [8, 8, 8, 1] and len(kept) == 4
    assert [b.shape[0] for b in dropped] == [8, 8, 8] and len(dropped) == 3
    np.testing.assert_array_equal(list(dropped)[1], np.arange(8, 16))


def test_too_small_dataset_with_drop_last_warns_and_yields_nothing(caplog):
    opts = poptorch.Options().deviceIterations(10)
    loader = poptorch.DataLoader(opts, Pairs(50), batch_size=10)
    assert "fewer than one combined batch of 100" in caplog.text
    assert list(loader) == [] and len(loader) == 0


def test_shuffle_is_seeded_by_options_and_changes_per_epoch():
    opts = poptorch.Options().deviceIterations(2).randomSeed(42)
    a = poptorch.DataLoader(opts, np.arange(40), batch_size=5, shuffle=True)
    b = poptorch.DataLoader(opts.clone(), np.arange(40), batch_size=5, shuffle=True)
    torch.manual_seed(123)  # the loaders' order does not depend on torch's global generator
    epoch_a, epoch_b = np.concatenate(list(a)), np.concatenate(list(b))
    np.testing.assert_array_equal(epoch_a, epoch_b)
    assert sorted(epoch_a) == list(range(40)) and list(epoch_a) != list(range(40))
    assert list(np.concatenate(list(a))) != list(epoch_a)


def test_processes_get_disjoint_contiguous_shares():
    seen = []
    for pid in range(2):
        opts = poptorch.Options()
        opts.Distributed.configureProcessId(pid, 2)
        loader = poptorch.DataLoader(opts, np.arange(23), batch_size=5)
        assert len(loader) == 2
        seen.append(np.concatenate(list(loader)))
    np.testing.assert_array_equal(seen[0], np.arange(10))
    np.testing.assert_array_equal(seen[1], np.arange(10, 20))
    no_split = poptorch.Options()
    no_split.Distributed.configureProcessId(1, 2)
    loader = poptorch.DataLoader(no_split, np.arange(20), 5, auto_distributed_partitioning=False)
    assert len(loader) == 4


def test_processes_shuffle_one_permutation_and_need_a_seed():
    seen = []
    for pid in range(2):
        opts = poptorch.Options().randomSeed(1)
        opts.Distributed.configureProcessId(pid, 2)
        loader = poptorch.DataLoader(opts, np.arange(20), batch_size=5, shuffle=True)
        seen.append(np.concatenate(list(loader)))
    assert not set(seen[0]) & set(seen[1]) and len(seen[0]) == len(seen[1]) == 10
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(0, 2)
    with pytest.raises(poptorch.Error, match="you must set poptorch.Options.randomSeed"):
        poptorch.DataLoader(opts, np.arange(20), batch_size=5, shuffle=True)


def test_plain_iterables_and_python_sequences():
    opts = poptorch.Options().deviceIterations(2)
    stream = (np.float32(i) for i in range(9))
    batches = list(poptorch.DataLoader(opts, stream, batch_size=2, drop_last=False))
    assert [len(b) for b in batches] == [4, 4, 1]
    with pytest.raises(TypeError):
        len(poptorch.DataLoader(opts, Stream(3)))
    listed = poptorch.DataLoader(opts, [(i, 2 * i) for i in range(8)], batch_size=2)
    x, y = next(iter(listed))
    np.testing.assert_array_equal(y, 2 * x)


def test_plain_iterables_are_split_between_processes():
    got = []
    for pid in range(2):
        opts = poptorch.Options()
        opts.Distributed.configureProcessId(pid, 2)
        got.append(np.concatenate(list(poptorch.DataLoader(opts, Stream(10), batch_size=2))))
    np.testing.assert_array_equal(got[0], [0, 2, 4, 6])
    np.testing.assert_array_equal(got[1], [1, 3, 5, 7])


@fork_ok
def test_worker_processes_keep_the_order():
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, Pairs(64), batch_size=4, num_workers=2)
    firsts = [int(x[0, 0]) for x, _ in loader]
    assert firsts == list(range(0, 64, 8))


@fork_ok
def test_plain_iterable_is_dealt_to_the_workers():
    """103 samples dealt to 2 workers (52, 51), combined batch 2 x 5 = 10: each worker drops
    its own remainder (Sync, Async); AsyncRebatched joins the workers' batches."""
    opts = poptorch.Options().deviceIterations(5)
    kw = {"batch_size": 2, "num_workers": 2}
    sync = list(poptorch.DataLoader(opts, Stream(103), **kw))
    assert len(sync) == 10
    np.testing.assert_array_equal(sync[0], np.arange(0, 20, 2))
    np.testing.assert_array_equal(sync[1], np.arange(1, 21, 2))
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
    assert len(a) == 10 and len(r) == 10 and all(b.shape == (10,) for b in a + r)
    for x, y in zip(sync, a):
        np.testing.assert_array_equal(x, y)
    # Worker batches of 3: w0 [0 2 4], w1 [1 3 5], w0 [6 8 10], w1 [7 9 11]...
    np.testing.assert_array_equal(r[0], [0, 2, 4, 1, 3, 5, 6, 8, 10, 7])
    assert len(set(np.concatenate(r).tolist())) == 100


def test_batch_sampler_batches_are_combined():
    opts = poptorch.Options().deviceIterations(2)
    sampler = [[3, 1], [0, 9], [4, 4], [7, 2], [5, 6]]
    loader = poptorch.DataLoader(opts, np.arange(10), batch_sampler=sampler, drop_last=False)
    assert [list(b) for b in loader] == [[3, 1, 0, 9], [4, 4, 7, 2], [5, 6]]
    assert len(loader) == 3
    with pytest.raises(poptorch.Error, match="mutually exclusive with batch_size, shuffle"):
        poptorch.DataLoader(opts, np.arange(10), batch_size=2, batch_sampler=[[0]])


@pytest.mark.parametrize(
    "mode", [poptorch.DataLoaderMode.Async, poptorch.DataLoaderMode.AsyncRebatched]
)
def test_async_modes_yield_the_sync_batches(mode):
    opts = poptorch.Options().deviceIterations(2)
    sync = poptorch.DataLoader(opts, Pairs(40), batch_size=4)
    loader = poptorch.DataLoader(opts, Pairs(40), batch_size=4, mode=mode)
    got = list(loader)
    assert len(got) == len(loader) == 5
    for (xa, ya), (xs, ys) in zip(got, sync):
        assert isinstance(xa, np.ndarray) and xa.dtype == np.float32
        np.testing.assert_array_equal(xa, xs)
        np.testing.assert_array_equal(ya, ys)
    assert len(list(loader)) == 5  # a second epoch
    loader.terminate()


def test_rebatched_keeps_the_short_batch_without_drop_last():
    opts = poptorch.Options().deviceIterations(5)
    loader = poptorch.DataLoader(
        opts,
        Stream(23),
        batch_size=2,
        drop_last=False,
        mode=poptorch.DataLoaderMode.AsyncRebatched,
        rebatched_worker_size=4,
    )
    batches = list(loader)
    loader.terminate()
    assert [len(b) for b in batches] == [10, 10, 3]
    assert sorted(np.concatenate(batches).tolist()) == list(range(23))


def test_rebatched_map_style_splits_worker_batches_into_the_sync_batches():
    """Map-style: torch loads 3 samples at a time, the accessor rebuilds batches of 8 (a
    worker batch is split across two combined batches) equal to the Sync batches."""
    opts = poptorch.Options().deviceIterations(2).randomSeed(5)
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


def test_rebatched_worker_size_is_checked():
    opts = poptorch.Options().deviceIterations(2)
    with pytest.raises(poptorch.Error, match="rebatched_worker_size \\(9\\) must be <="):
        poptorch.DataLoader(
            opts, Pairs(40), 4, mode=poptorch.DataLoaderMode.AsyncRebatched, rebatched_worker_size=9
        )


def test_accessor_over_a_numpy_stream_keeps_numpy_and_numbers():
    samples = [(np.full(2, i, np.float32), i, np.int64(2 * i)) for i in range(3)]
    accessor = poptorch.AsynchronousDataAccessor(samples, load_indefinitely=False)
    got = list(accessor)
    x, n, m = got[2]
    np.testing.assert_array_equal(x, [2, 2])
    assert isinstance(x, np.ndarray) and n == 2 and isinstance(n, int) and m == 4
    assert len(list(accessor)) == 3
    accessor.terminate()


def test_accessor_rebatches_samples_and_loads_indefinitely():
    accessor = poptorch.AsynchronousDataAccessor(
        [np.full(1, i, np.float32) for i in range(3)], rebatched_size=2
    )
    it = iter(accessor)
    assert [b.tolist() for b in it] == [[0, 1]]  # the remainder is dropped
    assert [b.tolist() for b in accessor] == [[0, 1]]  # the next epoch, already loaded
    accessor.terminate()
    with pytest.raises(poptorch.Error, match="was terminated"):
        iter(accessor)


def test_accessor_errors():
    accessor = poptorch.AsynchronousDataAccessor(FailingStream(), load_indefinitely=False)
    it = iter(accessor)
    next(it)
    with pytest.raises(poptorch.Error, match="data fetcher: OSError: disk on fire"):
        next(it)
    accessor.terminate()
    with pytest.raises(poptorch.Error, match="failed to start.*The Dataset is empty"):
        poptorch.AsynchronousDataAccessor(Empty())
    with pytest.raises(poptorch.Error, match="rebatched_size must be None or greater than 1"):
        poptorch.AsynchronousDataAccessor(Stream(3), rebatched_size=1)
