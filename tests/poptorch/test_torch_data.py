"""poptorch.DataLoader / AsynchronousDataAccessor with torch datasets, as in PopTorch:
torch's collation, workers, samplers, combined batches, processes, Async modes, and
batches fed to torch models through inferenceModel / trainingModel."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import poptorch
from poptorch.data import worker as data_worker
from poptorch.data.worker import ring_slots

Mode = poptorch.DataLoaderMode
# Torch's DataLoader workers are forked; JAX (if a model already ran in this process) warns
# about any fork.
fork_ok = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")


class Increment(torch.utils.data.Dataset):
    """Sample i is a (2, 3) tensor full of i."""

    def __init__(self, length: int, dtype: torch.dtype = torch.float32) -> None:
        self.length, self.dtype = length, dtype

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= self.length:
            raise IndexError(index)
        return torch.full((2, 3), index, dtype=self.dtype)


class Labelled(Increment):
    def __getitem__(self, index: int):
        return {"data": super().__getitem__(index), "label": torch.tensor([index])}


class Stream(torch.utils.data.IterableDataset):
    """Samples start .. start + length - 1; a worker_init_fn may narrow the range."""

    def __init__(self, length: int, start: int = 0) -> None:
        self.length, self.start = length, start

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return (torch.full((2, 3), self.start + i) for i in range(self.length))


class Broken(Increment):
    def __getitem__(self, index: int) -> torch.Tensor:
        raise ValueError(f"sample {index} is corrupt")


class Pair:
    """A user type carried through batches with poptorch.registerCustomArgParser."""

    def __init__(self, data: torch.Tensor, label: torch.Tensor) -> None:
        self.data, self.label = data, label


class PairParser(poptorch.ICustomArgParser):
    def yieldTensors(self, struct):  # noqa: N802
        yield struct.data
        yield struct.label

    def reconstruct(self, original_structure, tensor_iterator):
        return Pair(*tensor_iterator)


poptorch.registerCustomArgParser(Pair, PairParser())


def collate_pairs(samples):
    return Pair(torch.stack(samples), torch.arange(len(samples)))


def split_range(worker_id: int) -> None:
    """Each worker takes its own contiguous range of the Stream."""
    info = torch.utils.data.get_worker_info()
    dataset = info.dataset
    per_worker = math.ceil(dataset.length / info.num_workers)
    dataset.start = per_worker * worker_id
    dataset.length = min(per_worker, dataset.length - dataset.start)


def firsts(batch: torch.Tensor) -> list[int]:
    return [int(v) for v in batch[:, 0, 0]]


# ---- DataLoader basics ------------------------------------------------------------------


def test_a_torch_dataloader_of_combined_torch_batches():
    opts = poptorch.Options().deviceIterations(3).replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    loader = poptorch.DataLoader(opts, Increment(100), batch_size=2)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert loader.combinedBatchSize == 24 and len(loader) == 4
    batches = list(loader)
    assert all(isinstance(b, torch.Tensor) and b.shape == (24, 2, 3) for b in batches)
    assert firsts(batches[1]) == list(range(24, 48))


def test_torch_collation_of_tuples_and_dicts():
    loader = poptorch.DataLoader(poptorch.Options().deviceIterations(2), Labelled(10), batch_size=2)
    batch = next(iter(loader))
    assert set(batch) == {"data", "label"} and batch["label"].shape == (4, 1)
    assert batch["label"].dtype == torch.int64  # torch's collate, not narrowed


def test_a_plain_list_of_torch_samples_collates_as_torch_does():
    """A Python list of (tensor, label) pairs, as torch's DataLoader takes it: the labels
    become a torch tensor too, which a torch model accepts (NumPy samples stay NumPy)."""
    samples = [(torch.full((3,), float(i)), i % 4) for i in range(8)]
    x, y = next(iter(poptorch.DataLoader(poptorch.Options(), samples, batch_size=4)))
    assert torch.equal(y, torch.tensor([0, 1, 2, 3])) and x.shape == (4, 3)
    numpy_samples = [(np.zeros(3, np.float32), i) for i in range(8)]
    x, y = next(iter(poptorch.DataLoader(poptorch.Options(), numpy_samples, batch_size=4)))
    assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)


def test_drop_last_false_warns_and_keeps_the_short_batch(caplog):
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, Increment(21), batch_size=4, drop_last=False)
    assert "The last tensor will have a batch size of 5" in caplog.text
    assert [b.shape[0] for b in loader] == [8, 8, 5] and len(loader) == 3


def test_batch_size_none_yields_samples():
    loader = poptorch.DataLoader(poptorch.Options(), Increment(3), batch_size=None)
    assert loader.combinedBatchSize is None
    assert [b.shape for b in loader] == [torch.Size([2, 3])] * 3


def test_shuffle_follows_options_random_seed():
    def epoch(loader):
        return [v for b in loader for v in firsts(b)]

    opts = poptorch.Options().randomSeed(7)
    a = poptorch.DataLoader(opts, Increment(30), batch_size=5, shuffle=True)
    b = poptorch.DataLoader(opts.clone(), Increment(30), batch_size=5, shuffle=True)
    first = epoch(a)
    assert first == epoch(b) and sorted(first) == list(range(30)) and first != list(range(30))
    assert epoch(a) != first


@fork_ok
def test_workers_and_worker_init_fn_split_an_iterable_dataset():
    loader = poptorch.DataLoader(
        poptorch.Options(), Stream(20), batch_size=3, num_workers=2, worker_init_fn=split_range
    )
    values = [v for b in loader for v in firsts(b)]
    # Each worker drops its own remainder: 10 samples each -> 3 batches each.
    assert len(values) == 18 and len(set(values)) == 18 and len(loader) == 6


@fork_ok
def test_iterable_dataset_without_worker_init_fn_warns(caplog):
    loader = poptorch.DataLoader(poptorch.Options(), Stream(4), num_workers=2)
    assert "no worker_init_fn specified" in caplog.text
    assert len(list(loader)) == 8  # every worker returns every sample, as in torch


def test_iterable_dataset_and_processes():
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(0, 2)
    with pytest.raises(poptorch.Error, match="not supported for IterableDataset"):
        poptorch.DataLoader(opts, Stream(4))
    manual = poptorch.DataLoader(opts, Stream(4), auto_distributed_partitioning=False)
    assert len(list(manual)) == 4


def test_batch_sampler_micro_batches_are_combined():
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.SequentialSampler(range(23)), batch_size=3, drop_last=False
    )
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, Increment(23), batch_sampler=sampler, drop_last=False)
    assert loader.combinedBatchSize == 6
    batches = list(loader)
    assert [b.shape[0] for b in batches] == [6, 6, 6, 5] and len(loader) == 4
    assert firsts(batches[1]) == list(range(6, 12))
    # drop_last drops an incomplete group of micro-batches (here the sampler's 8 batches
    # make 4 complete groups, the last one with a short micro-batch).
    dropped = poptorch.DataLoader(opts, Increment(23), batch_sampler=sampler)
    assert [b.shape[0] for b in dropped] == [6, 6, 6, 5] and len(dropped) == 4
    odd = torch.utils.data.BatchSampler(range(21), batch_size=3, drop_last=False)
    dropped = poptorch.DataLoader(opts, Increment(21), batch_sampler=odd)
    assert [b.shape[0] for b in dropped] == [6, 6, 6] and len(dropped) == 3
    with pytest.raises(poptorch.Error, match="mutually exclusive with batch_size, shuffle"):
        poptorch.DataLoader(opts, Increment(23), batch_sampler=sampler, shuffle=True)


class GrowingBatches(torch.utils.data.Sampler):
    """Batches of 1, 2, 3 ... samples; written for torch 2.0, whose ``Sampler.__init__``
    took the data source, as PopTorch's users wrote them."""

    def __init__(self, sampler: torch.utils.data.Sampler) -> None:
        super().__init__(None)
        self.sampler = sampler

    def __iter__(self):
        indices = list(self.sampler)
        start, size = 0, 1
        while start < len(indices):
            yield indices[start : start + size]
            start, size = start + size, size + 1


def test_batch_sampler_written_for_torch_2_0_works():
    sampler = GrowingBatches(torch.utils.data.SequentialSampler(range(10)))
    loader = poptorch.DataLoader(poptorch.Options(), Increment(10), batch_sampler=sampler)
    assert [firsts(b) for b in loader] == [[0], [1, 2], [3, 4, 5], [6, 7, 8, 9]]


def test_custom_batch_types_are_combined_and_transferred():
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.SequentialSampler(range(12)), batch_size=2, drop_last=True
    )
    opts = poptorch.Options().deviceIterations(3)
    for mode in (Mode.Sync, Mode.Async):
        loader = poptorch.DataLoader(
            opts, Increment(12), batch_sampler=sampler, collate_fn=collate_pairs, mode=mode
        )
        batches = list(loader)
        loader.terminate()
        assert len(batches) == 2 and all(isinstance(b, Pair) for b in batches)
        assert batches[1].data.shape == (6, 2, 3) and batches[1].label.tolist() == [0, 1] * 3


# ---- processes (Options.Distributed) ----------------------------------------------------


def test_each_process_reads_one_contiguous_block():
    seen = []
    for pid in range(3):
        opts = poptorch.Options()
        opts.Distributed.configureProcessId(pid, 3)
        loader = poptorch.DataLoader(opts, Increment(100), batch_size=4)
        assert len(loader) == 8
        seen.append([v for b in loader for v in firsts(b)])
    assert seen == [list(range(p * 32, p * 32 + 32)) for p in range(3)]


def test_shuffled_processes_cover_the_dataset_over_two_epochs():
    total: set[int] = set()
    for pid in range(3):
        opts = poptorch.Options().randomSeed(42)
        opts.Distributed.configureProcessId(pid, 3)
        loader = poptorch.DataLoader(opts, Increment(100), batch_size=4, shuffle=True)
        first = [v for b in loader for v in firsts(b)]
        assert len(set(first)) == 32
        total |= set(first) | {v for b in loader for v in firsts(b)}
    assert total == set(range(100))


# ---- Async modes ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [Mode.Async, Mode.AsyncRebatched])
def test_async_modes_match_sync_and_restart_after_a_break(mode):
    opts = poptorch.Options().deviceIterations(2)
    expected = [firsts(b) for b in poptorch.DataLoader(opts, Increment(20), batch_size=2)]
    loader = poptorch.DataLoader(opts, Increment(20), batch_size=2, mode=mode)
    assert len(loader) == 5 and [firsts(b) for b in loader] == expected
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert [firsts(b) for b in loader] == expected  # a new iterator starts from the start
    loader.terminate()
    with pytest.raises(poptorch.Error, match="terminated"):
        iter(loader)


@fork_ok
def test_async_rebatched_loses_at_most_one_batch_of_an_iterable_dataset():
    """101 samples split between 2 workers (51, 50), batch 4: each worker of a Sync
    loader drops its own remainder (3, 2), AsyncRebatched only the last sample."""
    kw = {"batch_size": 4, "num_workers": 2, "worker_init_fn": split_range}
    sync = poptorch.DataLoader(poptorch.Options(), Stream(101), **kw)
    rebatched = poptorch.DataLoader(
        poptorch.Options(), Stream(101), mode=Mode.AsyncRebatched, rebatched_worker_size=2, **kw
    )
    assert sum(b.shape[0] for b in sync) == 96
    values = [v for b in rebatched for v in firsts(b)]
    rebatched.terminate()
    assert len(values) == 100 and len(set(values)) == 100 and len(rebatched) == 25


def test_async_with_drop_last_false_rebatches_the_left_over():
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(
        opts, Increment(21), batch_size=4, drop_last=False, mode=Mode.Async
    )
    assert len(loader) == 3 and [b.shape[0] for b in loader] == [8, 8, 5]
    loader.terminate()


def test_rebatched_worker_size_must_fit_the_combined_batch():
    with pytest.raises(poptorch.Error, match=r"rebatched_worker_size \(9\) must be <="):
        poptorch.DataLoader(
            poptorch.Options(),
            Increment(20),
            batch_size=4,
            mode=Mode.AsyncRebatched,
            rebatched_worker_size=9,
        )
    with pytest.raises(poptorch.Error, match="manually specify the rebatched_size"):
        poptorch.DataLoader(
            poptorch.Options(),
            Increment(20),
            mode=Mode.AsyncRebatched,
            async_options={"rebatched_size": 2},
        )


# ---- AsynchronousDataAccessor -----------------------------------------------------------


def test_accessor_over_a_dataset_and_over_a_sync_loader():
    accessor = poptorch.AsynchronousDataAccessor(Increment(5))
    assert len(accessor) == 5 and [b.shape for b in accessor] == [torch.Size([2, 3])] * 5
    assert len(list(accessor)) == 5  # loads indefinitely: the next epoch
    accessor.terminate()
    loader = poptorch.DataLoader(poptorch.Options(), Increment(12), batch_size=4)
    accessor = poptorch.AsynchronousDataAccessor(loader)
    assert len(accessor) == 3 and [firsts(b)[0] for b in accessor] == [0, 4, 8]
    accessor.terminate()


def test_accessor_rebatches_single_sample_batches():
    loader = poptorch.DataLoader(poptorch.Options(), Increment(7), batch_size=1)
    accessor = poptorch.AsynchronousDataAccessor(loader, rebatched_size=3)
    assert len(accessor) == 2 and [firsts(b) for b in accessor] == [[0, 1, 2], [3, 4, 5]]
    accessor.terminate()


def test_early_preload_fills_the_ring():
    def ready(loader):
        return int(sum(loader._accessor._worker._data_buffers.indices_mem))

    kw = {"batch_size": 1, "mode": Mode.Async}
    lazy = poptorch.DataLoader(
        poptorch.Options(), Increment(10), **kw, async_options={"buffer_size": 4}
    )
    eager = poptorch.DataLoader(
        poptorch.Options(),
        Increment(10),
        **kw,
        async_options={"buffer_size": 4, "early_preload": True},
    )
    deadline = time.time() + 30
    while ready(eager) < 4 and time.time() < deadline:
        time.sleep(0.05)
    assert ready(lazy) == 1 and ready(eager) == 4
    assert len(list(lazy)) == len(list(eager)) == 10
    lazy.terminate()
    eager.terminate()


def test_accessor_errors_name_the_cause():
    loader = poptorch.DataLoader(poptorch.Options(), Broken(4))
    with pytest.raises(poptorch.Error, match="failed to start.*sample 0 is corrupt"):
        poptorch.AsynchronousDataAccessor(loader)
    async_loader = poptorch.DataLoader(poptorch.Options(), Increment(4), mode=Mode.Async)
    with pytest.raises(poptorch.Error, match="already uses an AsynchronousDataAccessor"):
        poptorch.AsynchronousDataAccessor(async_loader)
    async_loader.terminate()
    short = poptorch.DataLoader(poptorch.Options(), Increment(5), batch_size=2, drop_last=False)
    with pytest.raises(poptorch.Error, match="only works if 'rebatched_size' is specified"):
        poptorch.AsynchronousDataAccessor(short)


def test_the_ring_takes_at_most_half_the_available_memory():
    assert ring_slots(3, 100, 1000) == 3
    assert ring_slots(3, 100, 450) == 2
    assert ring_slots(3, 100, 250) == 1
    assert ring_slots(3, 100, 10) == 1  # always one slot
    assert ring_slots(3, 100, None) == 3  # unknown: as asked


def test_a_ring_cut_to_one_slot_delivers_every_batch(monkeypatch):
    """A combined batch too large for ``buffer_size`` slots in the memory available (the
    CNN application's 8,192 images at 380x380): the ring gets one slot, and the batches
    come in order all the same. (The accessor reads the memory available where it is
    made and tells its worker.)"""
    slot_bytes = 6 * 2 * 3 * 4  # a combined batch: 6 samples of (2, 3) float32
    monkeypatch.setattr(data_worker, "available_memory", lambda: 3 * slot_bytes)
    loader = poptorch.DataLoader(poptorch.Options(), Increment(14), batch_size=2)
    accessor = poptorch.AsynchronousDataAccessor(loader, buffer_size=4, rebatched_size=6)
    assert len(accessor._worker._data_buffers) == 1
    assert [firsts(b) for b in accessor] == [list(range(6)), list(range(6, 12))]
    assert [firsts(b) for b in accessor] == [list(range(6)), list(range(6, 12))]
    accessor.terminate()


@pytest.mark.parametrize(
    "strategy", [poptorch.SharingStrategy.FileSystem, poptorch.SharingStrategy.SharedMemory]
)
def test_sharing_strategies(strategy):
    opts = poptorch.Options().randomSeed(3)
    loader = poptorch.DataLoader(opts, Increment(8), batch_size=2, shuffle=True)
    accessor = poptorch.AsynchronousDataAccessor(loader, sharing_strategy=strategy)
    values = sorted(v for b in accessor for v in firsts(b))
    accessor.terminate()
    assert values == list(range(8))


# ---- feeding torch models ---------------------------------------------------------------


class Double(torch.nn.Module):
    def forward(self, data, label):
        return data * 2, label + 1


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x, y):
        out = self.fc(x)
        return out, torch.nn.functional.mse_loss(out, y)


class Line(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        x = torch.tensor([i / 64, (i % 8) / 8, 1.0])
        return x, x[:1] * 2 - x[1:2] + 0.5


@pytest.mark.parametrize("mode", [Mode.Sync, Mode.Async])
def test_inference_model_consumes_combined_batches(mode):
    opts = poptorch.Options().deviceIterations(4)
    dataset = Labelled(40)
    loader = poptorch.DataLoader(opts, dataset, batch_size=2, mode=mode)
    model = poptorch.inferenceModel(Double(), opts)
    for i, batch in enumerate(loader):
        data, label = model(batch["data"], batch["label"])
        assert data.shape == (8, 2, 3)
        torch.testing.assert_close(data, batch["data"] * 2)
        assert label[:, 0].tolist() == list(range(8 * i + 1, 8 * i + 9))
    assert i == 4
    loader.terminate()


def test_training_model_learns_from_the_loader():
    torch.manual_seed(0)
    opts = poptorch.Options().deviceIterations(2).randomSeed(0)
    loader = poptorch.DataLoader(opts, Line(), batch_size=4, shuffle=True, mode=Mode.Async)
    model = Regression()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    losses = []
    for _ in range(6):
        for x, y in loader:
            assert x.shape == (8, 3)
            _, loss = training(x, y)
            losses.append(float(loss))
    loader.terminate()
    assert losses[-1] < losses[0] / 10
