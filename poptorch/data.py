"""``DataLoader`` and ``AsynchronousDataAccessor``: combined batches for one model call.

One model call consumes ``batch_size * deviceIterations * replicationFactor /
inputReplicaGrouping size * gradientAccumulation`` samples (the *combined batch size*);
``DataLoader`` yields batches of exactly that many samples, stacked field by field, so
each batch can be passed straight to the executor.

Datasets: anything with ``__len__`` and ``__getitem__`` (map-style: NumPy arrays, lists,
``torch.utils.data.Dataset``) or anything iterable (iterable-style). A sample is an array
or a tuple/list of arrays; a batch is an array or a tuple of arrays.

Shuffling uses a permutation drawn from ``numpy.random.default_rng(seed + epoch)`` with
``seed`` from ``Options.randomSeed`` (0 when unset), so every process of a multi-process
run draws the same permutation; process ``p`` of ``n`` then takes every ``n``-th sample
from ``p`` (``Options.Distributed``).

>>> from poptorch import Options
>>> opts = Options().deviceIterations(10)
>>> loader = DataLoader(opts, np.arange(2000, dtype=np.float32), batch_size=10)
>>> loader.combinedBatchSize, len(loader), next(iter(loader)).shape
(100, 20, (100,))
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .enums import DataLoaderMode, SharingStrategy
from .options import Options

BATCH_SAMPLER_MSG = (
    "batch_sampler is mutually exclusive with batch_size, shuffle and drop_last (as in "
    "torch.utils.data.DataLoader)."
)
REBATCHED_MSG = (
    "rebatched_worker_size ({size}) must be at most the combined batch size ({combined})."
)
TERMINATED_MSG = "The AsynchronousDataAccessor was terminated; create a new one to load again."
EMPTY_MSG = (
    "The dataset has {n} samples for this process, fewer than one combined batch of {c} "
    "(batch_size {b} x deviceIterations x replicas x gradientAccumulation); with "
    "drop_last=True no batch is produced. Use a smaller batch or drop_last=False."
)


def combined_batch_size(options: Options, batch_size: int) -> int:
    """Samples one model call consumes: ``batch_size * DI * (R / input group) * GA``."""
    o = options
    replicas = o.replication_factor // o.input_group_size
    return batch_size * o.device_iterations * replicas * o.training.gradient_accumulation


def collate(samples: list[Any]) -> Any:
    """Stack samples field by field: arrays -> one array, tuples -> a tuple of arrays."""
    first = samples[0]
    if isinstance(first, (tuple, list)):
        return tuple(collate([s[i] for s in samples]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: collate([s[k] for s in samples]) for k in first}
    return np.stack([_numpy(s) for s in samples])


def _numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _is_map_style(dataset: Any) -> bool:
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


class DataLoader:
    """Batches of ``combinedBatchSize`` samples for a model built with ``options``.

    Args:
        options: the model's options (device iterations, replicas, accumulation, seed,
            process layout).
        dataset: map-style or iterable dataset.
        batch_size: the micro-batch size (samples per replica per micro-batch).
        shuffle: shuffle map-style datasets each epoch (seeded; identical on every process).
        num_workers: threads that load samples in parallel (0: load in the caller).
        drop_last: drop the last incomplete combined batch (else yield it short).
        auto_distributed_partitioning: give each process its share of the samples.
        mode: ``DataLoaderMode.Sync``, or ``Async``/``AsyncRebatched`` to prefetch in a
            background ``AsynchronousDataAccessor``.
        async_options: keyword arguments for the ``AsynchronousDataAccessor``.
        rebatched_worker_size: ``AsyncRebatched``: samples per worker batch (at most the
            combined batch size).
        batch_sampler: iterable of index lists; replaces batch_size/shuffle/drop_last.
        collate_fn: builds a batch from a list of samples (default ``collate``).

    Raises:
        ValueError: bad argument combinations (see the messages).
    """

    def __init__(
        self,
        options: Options,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool | None = None,
        num_workers: int = 0,
        drop_last: bool = True,
        persistent_workers: bool | None = None,
        auto_distributed_partitioning: bool = True,
        mode: DataLoaderMode = DataLoaderMode.Sync,
        async_options: dict[str, Any] | None = None,
        rebatched_worker_size: int | None = None,
        batch_sampler: Iterable[list[int]] | None = None,
        collate_fn: Any = None,
    ) -> None:
        if batch_sampler is not None and (batch_size != 1 or shuffle or not drop_last):
            raise ValueError(BATCH_SAMPLER_MSG)
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")
        options._freeze()  # as in PopTorch: the options a loader uses cannot change
        self._options = options
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.mode = DataLoaderMode(mode)
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn or collate
        self._combined = combined_batch_size(options, batch_size)
        if rebatched_worker_size is not None and rebatched_worker_size > self._combined:
            raise ValueError(
                REBATCHED_MSG.format(size=rebatched_worker_size, combined=self._combined)
            )
        if rebatched_worker_size is not None and rebatched_worker_size < 1:
            raise ValueError(
                f"rebatched_worker_size must be a positive integer, got {rebatched_worker_size}."
            )
        self._rebatched = self.mode == DataLoaderMode.AsyncRebatched and batch_sampler is None
        # Samples per batch a worker loads: the accessor rebatches them to ``_combined``.
        self._worker_batch = (rebatched_worker_size or self._combined) if self._rebatched else 0
        if auto_distributed_partitioning:
            self.process_id = options.distributed.process_id
            self.num_processes = options.distributed.num_processes
        else:
            self.process_id, self.num_processes = 0, 1
        self._epoch = 0
        self._accessor: AsynchronousDataAccessor | None = None
        if self.mode != DataLoaderMode.Sync:
            kwargs = dict(async_options or {})
            kwargs.setdefault("load_indefinitely", False)
            if self._rebatched:
                kwargs["rebatched_size"] = self._combined
            source = _WorkerBatches(self) if self._rebatched else _SyncBatches(self)
            self._accessor = AsynchronousDataAccessor(source, **kwargs)

    @property
    def combinedBatchSize(self) -> int:  # noqa: N802
        """Samples consumed by one model call."""
        return self._combined

    @property
    def options(self) -> Options:
        return self._options

    # ---- indices ------------------------------------------------------------------------

    def _indices(self) -> np.ndarray:
        n = len(self.dataset)
        if self.shuffle:
            seed = (self._options.random_seed or 0) + self._epoch
            order = np.random.default_rng(seed).permutation(n)
        else:
            order = np.arange(n)
        if self.num_processes > 1:
            usable = n - n % self.num_processes
            order = order[:usable][self.process_id :: self.num_processes]
        return order

    def _index_batches(self, worker_batches: bool = False) -> list[np.ndarray]:
        """Index batches of the combined size, or (``worker_batches``) the same indices cut
        into worker batches for the accessor to rebatch."""
        if self.batch_sampler is not None:
            return [np.asarray(b) for b in self.batch_sampler]
        order = self._indices()
        c = self._combined
        count = len(order) // c if self.drop_last else -(-len(order) // c)
        if worker_batches:
            order, c = order[: count * c], self._worker_batch
            count = -(-len(order) // c)
        return [order[i * c : (i + 1) * c] for i in range(count)]

    def __len__(self) -> int:
        if not _is_map_style(self.dataset):
            raise TypeError("An iterable-style dataset has no length.")
        if self.batch_sampler is not None:
            return len(self.batch_sampler)  # type: ignore[arg-type]
        n = len(self.dataset) // self.num_processes
        return n // self._combined if self.drop_last else -(-n // self._combined)

    # ---- loading ------------------------------------------------------------------------

    def _fetch(self, indices: np.ndarray) -> Any:
        if isinstance(self.dataset, np.ndarray):
            return self.dataset[indices]
        return self.collate_fn([self.dataset[int(i)] for i in indices])

    def _sync_iter(self, worker_batches: bool = False) -> Iterator[Any]:
        """This epoch's batches: combined batches, or (``worker_batches``) the workers'
        batches of ``rebatched_worker_size`` samples."""
        if not _is_map_style(self.dataset):
            yield from self._iterable_batches(worker_batches)
            return
        batches = self._index_batches(worker_batches)
        self._epoch += 1
        if not batches and len(self.dataset):
            raise ValueError(
                EMPTY_MSG.format(n=len(self._indices()), c=self._combined, b=self.batch_size)
            )
        if self.num_workers > 0:
            with ThreadPoolExecutor(self.num_workers) as pool:
                yield from pool.map(self._fetch, batches)
        else:
            for b in batches:
                yield self._fetch(b)

    def _iterable_batches(self, worker_batches: bool = False) -> Iterator[Any]:
        """Deal this process's samples to the workers; each batches its own share.

        Worker batches (``AsyncRebatched``) keep every sample: the accessor drops the
        remainder. Otherwise each worker drops its own short last batch if ``drop_last``.
        """
        size = self._worker_batch if worker_batches else self._combined
        drop = self.drop_last and not worker_batches
        workers: list[list[Any]] = [[] for _ in range(max(1, self.num_workers))]
        mine = 0
        for i, sample in enumerate(self.dataset):
            if self.num_processes > 1 and i % self.num_processes != self.process_id:
                continue
            worker = mine % len(workers)
            mine += 1
            workers[worker].append(sample)
            if len(workers[worker]) == size:
                yield self.collate_fn(workers[worker])
                workers[worker] = []
        for buffer in workers:
            if buffer and not drop:
                yield self.collate_fn(buffer)

    def __iter__(self) -> Iterator[Any]:
        if self._accessor is not None:
            return iter(self._accessor)
        return self._sync_iter()

    def terminate(self) -> None:
        """Stop the background worker (``Async`` modes); no effect in ``Sync`` mode."""
        if self._accessor is not None:
            self._accessor.terminate()


class _SyncBatches:
    """A DataLoader's synchronous batches, as an iterable for the accessor."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return self.loader._sync_iter()

    def __len__(self) -> int:
        return len(self.loader)


class _WorkerBatches(_SyncBatches):
    """``AsyncRebatched``: the workers' batches, which the accessor rebatches."""

    def __iter__(self) -> Iterator[Any]:
        return self.loader._sync_iter(worker_batches=True)

    @property
    def drop_last(self) -> bool:
        return self.loader.drop_last


_END = object()


class _WorkerError:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class AsynchronousDataAccessor:
    """Prefetch batches from ``dataset`` in a background thread into a bounded queue.

    Args:
        dataset: any iterable (a ``DataLoader``, a list of batches...).
        buffer_size: batches held ready at most (the ring buffer's size).
        miss_sleep_time_in_ms: how long the worker waits before retrying a full buffer.
        load_indefinitely: restart ``dataset`` when it ends (iteration never stops).
        early_preload: start loading at construction instead of at the first ``iter``.
        sharing_strategy: accepted for compatibility; the worker is a thread, so data is
            shared in memory whatever the strategy.
        rebatched_size: return batches of exactly this many samples. The dataset's items are
            single samples (stacked), or, when the dataset is a ``DataLoader``'s worker
            batches (``AsyncRebatched``), batches that are concatenated and split at batch
            boundaries. A short last batch is dropped unless the ``DataLoader`` says
            ``drop_last=False``.

    An exception in the worker is re-raised in the caller by the next ``next()``.
    ``terminate()`` stops the worker and joins it.
    """

    def __init__(
        self,
        dataset: Any,
        buffer_size: int = 3,
        miss_sleep_time_in_ms: float = 0.1,
        load_indefinitely: bool = True,
        early_preload: bool = False,
        sharing_strategy: SharingStrategy = SharingStrategy.ForkServer,
        rebatched_size: int | None = None,
    ) -> None:
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be at least 1, got {buffer_size}.")
        self.dataset = dataset
        self.buffer_size = buffer_size
        self._sleep = miss_sleep_time_in_ms / 1000.0
        self.load_indefinitely = load_indefinitely
        self.rebatched_size = rebatched_size
        self._queue: queue.Queue[Any] = queue.Queue(buffer_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._terminated = False
        if early_preload:
            self._start()

    def __len__(self) -> int:
        return len(self.dataset)

    def _pieces(self) -> Iterator[Any]:
        """The dataset's items as batches (single samples become batches of one)."""
        if isinstance(self.dataset, _WorkerBatches):
            return iter(self.dataset)
        return (collate([s]) for s in self.dataset)

    def _drop_last(self) -> bool:
        return getattr(self.dataset, "drop_last", True)

    def _source(self) -> Iterator[Any]:
        while True:
            if self.rebatched_size:
                yield from _rebatch(self._pieces(), self.rebatched_size, self._drop_last())
            else:
                yield from self.dataset
            if not self.load_indefinitely:
                return

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=max(self._sleep, 1e-3))
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            for batch in self._source():
                if not self._put(batch):
                    return
        except BaseException as error:  # noqa: BLE001 (handed to the caller)
            self._put(_WorkerError(error))
            return
        self._put(_END)

    def _start(self) -> None:
        if self._terminated:
            raise RuntimeError(TERMINATED_MSG)
        if self._thread is None or not self._thread.is_alive():
            self._queue = queue.Queue(self.buffer_size)
            self._thread = threading.Thread(target=self._work, daemon=True)
            self._thread.start()

    def __iter__(self) -> Iterator[Any]:
        self._start()
        return self._drain()

    def _drain(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is _END:
                self._thread = None
                return
            if isinstance(item, _WorkerError):
                self._thread = None
                raise item.error
            yield item

    def terminate(self) -> None:
        """Stop and join the worker; the accessor cannot load again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._thread = None
        self._terminated = True

    def __del__(self) -> None:
        self._stop.set()


def _rows(batch: Any) -> int:
    if isinstance(batch, (tuple, list)):
        return _rows(batch[0])
    if isinstance(batch, dict):
        return _rows(next(iter(batch.values())))
    return len(batch)


def _cut(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, (tuple, list)):
        return tuple(_cut(b, start, stop) for b in batch)
    if isinstance(batch, dict):
        return {k: _cut(v, start, stop) for k, v in batch.items()}
    return batch[start:stop]


def _concat(batches: list[Any]) -> Any:
    first = batches[0]
    if isinstance(first, (tuple, list)):
        return tuple(_concat([b[i] for b in batches]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concat([b[k] for b in batches]) for k in first}
    return np.concatenate([_numpy(b) for b in batches])


def _rebatch(pieces: Iterator[Any], size: int, drop_last: bool) -> Iterator[Any]:
    """Batches of exactly ``size`` rows from ``pieces`` (batches of any size), splitting a
    piece across two batches where needed; the short remainder is yielded unless
    ``drop_last``."""
    held: list[Any] = []
    count = 0
    for piece in pieces:
        start, rows = 0, _rows(piece)
        while start < rows:
            take = min(size - count, rows - start)
            held.append(_cut(piece, start, start + take))
            count, start = count + take, start + take
            if count == size:
                yield _concat(held)
                held, count = [], 0
    if held and not drop_last:
        yield _concat(held)
