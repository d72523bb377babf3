"""The ``AsynchronousDataAccessor``'s worker process and the ring buffer it fills.

The worker iterates the dataset in its own process and copies every batch into a ring of
``buffer_size`` slots of shared memory, allocated once from the first batch's shapes (fewer
slots where that many would take more than half the memory available: ``ring_slots``). Each
slot has a state (0: free for the worker, 1: ready for the host), a kind (a batch, or the
end of an epoch) and, per field, how many rows are valid (a short last batch). The host
copies a ready slot out and frees it, so the batches it returns never alias the ring.

Control goes through a command pipe (host -> worker: start, reset, shutdown); the worker
answers a reset through a shared counter, and reports its set-up (the batch structure and
the shared tensors) or an error on a data pipe (worker -> host).

With ``rebatched_size`` the worker concatenates the rows of the batches it reads (and
splits them where needed) so that every slot holds exactly ``rebatched_size`` rows; the
rows left at the end of an epoch form a short batch unless the dataset says
``rebatched_drop_last`` (a ``poptorch.DataLoader`` built with ``drop_last=True``).
"""

from __future__ import annotations

import io
import math
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing as multiprocessing

from .._log import logger
from ..enums import SharingStrategy
from ..errors import Error
from . import utils as du

FREE, READY = 0, 1
DATA, END = 0, 1
START, RESET, SHUTDOWN, WAKE = "start", "reset", "shutdown", "wake"
# A worker waiting for a free slot sleeps at most this long between checks (the host wakes
# it as soon as it frees a slot).
MAX_SLEEP_S = 0.05
WAITING, PENDING, ACK = 0, 1, 2  # the ring's control words
# The most of the system's available memory the ring's slots may take (``ring_slots``).
RING_MEMORY_SHARE = 0.5

START_FAILED_MSG = (
    "AsynchronousDataAccessor worker thread failed to start (Check above for details)"
)
FETCH_FAILED_MSG = "An error occurred in the data fetcher"
EMPTY_MSG = "The Dataset is empty"
SHAPE_MSG = (
    "The AsynchronousDataAccessor's batches must all have the shapes of the first one "
    "(or fewer rows): field {i} has shape {got}, the first batch had {first}."
)
REBATCH_SHAPE_MSG = (
    "rebatched_size needs every field to have a batch dimension and the same sample shape in "
    "every batch: field {i} has shape {got}, expected (N, {rest})."
)
REBATCH_ROWS_MSG = "rebatched_size needs every field of a batch to have the same number of rows"


def _shared_zeros(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    numel = math.prod(shape)
    itemsize = dtype.itemsize
    storage = torch.UntypedStorage._new_shared(numel * itemsize)  # zero pages, not touched
    return torch.empty(0, dtype=dtype).set_(storage).view(tuple(shape))


def available_memory() -> int | None:
    """Bytes of memory the system has available for new allocations (Linux's
    ``MemAvailable``), or None where that is not known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def ring_slots(requested: int, slot_bytes: int, available: int | None) -> int:
    """How many slots the ring gets: ``requested`` (``buffer_size``), fewer where that many
    would take more than ``RING_MEMORY_SHARE`` of the ``available`` memory; at least one.
    Loading further ahead is worth less than the memory the program itself needs (a
    combined batch of 8,192 images at 380x380 in float16 is 7.1 GB a slot)."""
    if available is None or slot_bytes <= 0:
        return requested
    return max(1, min(requested, int(available * RING_MEMORY_SHARE) // slot_bytes))


class Ring:
    """The shared slots and their flags (the same memory on both sides).

    The flags live in one shared int64 tensor, read and written through NumPy views (a
    tensor element access costs microseconds, a NumPy one nanoseconds):
    ``state[slot]``, ``kind[slot]``, ``rows[slot, field]``, and three words: ``waiting``
    (the worker sleeps on a full ring), ``pending`` (the host sent a command) and ``ack``
    (the last reset the worker carried out).
    """

    def __init__(self, buffers: list[list[torch.Tensor]], flags: torch.Tensor) -> None:
        self.buffers, self.flags = buffers, flags
        size, fields = len(buffers), len(buffers[0])
        view = flags.numpy()
        self.state = view[:size]
        self.kind = view[size : 2 * size]
        self.rows = view[2 * size : 2 * size + size * fields].reshape(size, fields)
        self.words = view[2 * size + size * fields :]  # waiting, pending, ack

    @classmethod
    def allocate(cls, size: int, shapes: list[tuple[Any, torch.dtype]]) -> Ring:
        """``size`` slots of zeros in fresh shared memory (whose pages the system commits
        only as the worker first writes them)."""
        buffers = [[_shared_zeros(s, d) for s, d in shapes] for _ in range(size)]
        flags = torch.zeros(2 * size + size * len(shapes) + 3, dtype=torch.int64)
        return cls(buffers, flags.share_memory_())

    @property
    def indices_mem(self) -> torch.Tensor:
        """Per slot: 1 when it holds data the host has not read yet (PopTorch's name)."""
        return self.flags[: len(self.buffers)]

    def __len__(self) -> int:
        return len(self.buffers)

    def parts(self) -> tuple[Any, ...]:
        return self.buffers, self.flags

    def free(self, slot: int) -> bool:
        """Give ``slot`` back to the worker; True if the worker sleeps and needs waking."""
        self.state[slot] = FREE
        if self.words[WAITING]:
            self.words[WAITING] = 0
            return True
        return False


# ---- worker side ------------------------------------------------------------------------


class _Stop(Exception):
    """The host asked the worker to shut down (or went away)."""


class _Reset(Exception):
    def __init__(self, generation: int) -> None:
        super().__init__(generation)
        self.generation = generation


class _Producer:
    """The worker's loop: fill the ring from the dataset, obey the host's commands."""

    def __init__(self, dataset: Any, data_conn: Any, cmd_conn: Any, cfg: dict[str, Any]):
        self.dataset, self.data_conn, self.cmd_conn = dataset, data_conn, cmd_conn
        self.size = cfg["buffer_size"]
        self.sleep = cfg["miss_sleep_s"]
        self.indefinitely = cfg["load_indefinitely"]
        self.started = cfg["early_preload"]
        self.rebatch = cfg["rebatched_size"]
        self.available_memory = cfg.get("available_memory")
        self.drop_last = bool(getattr(dataset, "rebatched_drop_last", True))
        self.write = 0  # the slot being filled
        self.filled = 0  # rows already in it (rebatching)

    # -- set-up --

    def setup(self) -> Iterator[Any]:
        iterator = iter(self.dataset)
        try:
            first = next(iterator)
        except StopIteration:
            raise Error(EMPTY_MSG, "poptorch_py_error") from None
        leaves, self.spec = du.flatten(first)
        self.kinds = du.leaf_kinds(self.spec)
        self.consts = {i: v for i, (v, k) in enumerate(zip(leaves, self.kinds)) if k == du.CONST}
        tensors = self._tensors(leaves)
        if not tensors:
            raise Error("The dataset's items hold no tensor, array or number to transfer.")
        shapes = [self._slot_shape(i, t) for i, t in tensors]
        self._fit_ring(shapes)
        self.ring = Ring.allocate(self.size, shapes)
        self.data_conn.send(("ready", self.spec, self.consts, self.ring.parts()))
        self._put(tensors)
        return iterator

    def _fit_ring(self, shapes: list[tuple[Any, torch.dtype]]) -> None:
        """Fewer slots than ``buffer_size`` where they would not fit (``ring_slots``)."""
        slot_bytes = sum(math.prod(s) * d.itemsize for s, d in shapes)
        slots = ring_slots(self.size, slot_bytes, self.available_memory)
        if slots < self.size:
            logger.info(
                "AsynchronousDataAccessor: %d of buffer_size=%d slots of %.1f MB fit in half "
                "the memory available; loading %d batch(es) ahead.",
                slots,
                self.size,
                slot_bytes / 1e6,
                slots,
            )
            self.size = slots

    def _slot_shape(self, index: int, tensor: torch.Tensor) -> tuple[Any, torch.dtype]:
        if not self.rebatch:
            return tensor.shape, tensor.dtype
        if tensor.dim() == 0:
            raise Error(REBATCH_SHAPE_MSG.format(i=index, got=(), rest="..."))
        return (self.rebatch, *tensor.shape[1:]), tensor.dtype

    def _tensors(self, leaves: list[Any]) -> list[tuple[int, torch.Tensor]]:
        """The leaves that travel (as torch tensors), with their field index; constant
        fields must not change."""
        if len(leaves) != len(self.kinds):
            raise Error("Every batch must have the structure of the first one.")
        out: list[tuple[int, torch.Tensor]] = []
        for i, (leaf, kind) in enumerate(zip(leaves, self.kinds)):
            if kind == du.CONST:
                if leaf is not self.consts[i] and leaf != self.consts[i]:
                    raise Error(du.LEAF_MSG.format(t=type(leaf).__name__, a=self.consts[i], b=leaf))
                continue
            out.append((len(out), du.as_tensor(leaf, kind)))
        return out

    # -- the ring --

    def _wait_free(self) -> None:
        """Sleep until the host frees the slot to fill (it wakes us), checking again after
        ``miss_sleep_time_in_ms``, then twice as long each time up to ``MAX_SLEEP_S``."""
        delay, state, words = self.sleep, self.ring.state, self.ring.words
        while state[self.write] != FREE:
            words[WAITING] = 1
            if state[self.write] == FREE:
                break
            self._poll(delay)
            delay = min(delay * 2, MAX_SLEEP_S)
        words[WAITING] = 0

    def _publish(self, kind: int) -> None:
        self.ring.kind[self.write] = kind
        self.ring.state[self.write] = READY
        self.write = (self.write + 1) % self.size
        self.filled = 0

    def _put(self, tensors: list[tuple[int, torch.Tensor]]) -> None:
        if self.rebatch:
            self._put_rows(tensors)
            return
        self._wait_free()
        slot, rows = self.ring.buffers[self.write], self.ring.rows[self.write]
        for i, t in tensors:
            count = self._fit(i, t, slot[i])
            rows[i] = count
            (slot[i] if count < 0 else slot[i][:count]).copy_(t)
        self._publish(DATA)

    @staticmethod
    def _fit(index: int, tensor: torch.Tensor, buffer: torch.Tensor) -> int:
        """-1 if ``tensor`` fills ``buffer``, else its row count (a short batch)."""
        if tensor.shape == buffer.shape:
            return -1
        short = tensor.dim() >= 1 and tensor.shape[1:] == buffer.shape[1:]
        if short and tensor.shape[0] < buffer.shape[0]:
            return int(tensor.shape[0])
        raise Error(SHAPE_MSG.format(i=index, got=tuple(tensor.shape), first=tuple(buffer.shape)))

    def _put_rows(self, tensors: list[tuple[int, torch.Tensor]]) -> None:
        counts = {int(t.shape[0]) if t.dim() else -1 for _, t in tensors}
        for i, t in tensors:
            if t.dim() == 0 or t.shape[1:] != self.ring.buffers[0][i].shape[1:]:
                rest = tuple(self.ring.buffers[0][i].shape[1:])
                raise Error(REBATCH_SHAPE_MSG.format(i=i, got=tuple(t.shape), rest=rest))
        if len(counts) != 1:
            raise Error(REBATCH_ROWS_MSG)
        total, start = counts.pop(), 0
        while start < total:
            if self.filled == 0:
                self._wait_free()
            take = min(self.rebatch - self.filled, total - start)
            slot = self.ring.buffers[self.write]
            for i, t in tensors:
                slot[i][self.filled : self.filled + take].copy_(t[start : start + take])
            self.filled += take
            start += take
            if self.filled == self.rebatch:
                self.ring.rows[self.write] = -1
                self._publish(DATA)

    def _end_epoch(self) -> None:
        if self.filled and not self.drop_last:
            self.ring.rows[self.write] = self.filled
            self._publish(DATA)
        self.filled = 0
        self._wait_free()
        self._publish(END)

    # -- commands --

    def _poll(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (``None``: forever) for a command and obey it."""
        try:
            if timeout is not None and not self.cmd_conn.poll(timeout):
                return
            command = self.cmd_conn.recv()
        except (EOFError, OSError):
            raise _Stop() from None
        if command[0] == SHUTDOWN:
            raise _Stop()
        if command[0] == RESET:
            raise _Reset(command[1])
        if command[0] == START:
            self.started = True

    def _commands(self) -> None:
        """Obey the commands the host flagged as sent (no system call when there are
        none)."""
        words = self.ring.words
        if words[PENDING]:
            words[PENDING] = 0
            while self.cmd_conn.poll(0):
                self._poll(0)

    def _reset(self, generation: int) -> Iterator[Any]:
        logger.debug("AsynchronousDataAccessor worker: resetting the iterator")
        self.ring.state[:] = FREE
        self.write = self.filled = 0
        iterator = iter(self.dataset)
        self.ring.words[ACK] = generation
        self.started = True
        return iterator

    # -- main loop --

    def run(self) -> None:
        iterator = self.setup()
        while True:
            try:
                while not self.started:
                    self._poll(None)
                self._epoch(iterator)
                if not self.indefinitely:
                    logger.debug("AsynchronousDataAccessor worker: end of the dataset, waiting")
                    self.started = False
                    while not self.started:
                        self._poll(None)
                iterator = iter(self.dataset)
            except _Reset as reset:
                iterator = self._reset(reset.generation)

    def _epoch(self, iterator: Iterator[Any]) -> None:
        for item in iterator:
            leaves, _ = du.flatten(item)
            self._put(self._tensors(leaves))
            self._commands()
        self._end_epoch()


def _redirect_stdio() -> None:
    """Unbuffered output, so that a failing worker's traceback is seen before it exits."""
    sys.stdout = io.TextIOWrapper(open(sys.stdout.fileno(), "wb", 0), write_through=True)
    sys.stderr = io.TextIOWrapper(open(sys.stderr.fileno(), "wb", 0), write_through=True)


def worker_main(source: Any, data_conn: Any, cmd_conn: Any, cfg: dict[str, Any]) -> None:
    """Entry point of the worker process."""
    try:
        _redirect_stdio()
    except (OSError, ValueError, AttributeError):
        pass
    # The worker inherits its parent's start method (the fork server's, by default): the
    # DataLoader workers it starts should rather be forked from it (it runs no JAX threads),
    # which takes milliseconds instead of a fresh interpreter importing torch each.
    if "fork" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("fork", force=True)
    try:
        logger.debug("AsynchronousDataAccessor worker process: %d", os.getpid())
        if isinstance(source, str):
            with open(source, "rb") as f:
                source = pickle.load(f)
        elif isinstance(source, _Payload):
            source = source.dataset
        _Producer(source, data_conn, cmd_conn, cfg).run()
    except (_Stop, KeyboardInterrupt):
        return
    except BaseException as error:  # noqa: BLE001 (reported to the host, then exit 1)
        traceback.print_exc()
        try:
            data_conn.send(("error", f"{type(error).__name__}: {error}"))
        except (OSError, ValueError):
            pass
        sys.exit(1)


class _Pickler(ForkingPickler):
    """multiprocessing's pickler (tensors travel through shared memory), plus a reducer for
    ``torch.Generator`` (a DataLoader's sampler may hold one: multiprocessing cannot send
    one as is, its state tensor fails to map in the child)."""

    # A private attribute of ForkingPickler (typeshed leaves it out).
    _extra_reducers = dict(ForkingPickler._extra_reducers)  # type: ignore[attr-defined]


def _reduce_generator(generator: torch.Generator) -> tuple[Any, ...]:
    return _make_generator, (str(generator.device), bytes(generator.get_state().numpy()))


def _make_generator(device: str, state: bytes) -> torch.Generator:
    generator = torch.Generator(device)
    generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    return generator


_Pickler.register(torch.Generator, _reduce_generator)


class _Payload:
    """The dataset on its way to the worker: pickled with ``_Pickler`` while the process
    starts (so that shared-memory tensors can pass their file descriptors)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __reduce__(self) -> tuple[Any, ...]:
        return _Payload._load, (bytes(_Pickler.dumps(self.dataset)),)

    @staticmethod
    def _load(data: bytes) -> _Payload:
        return _Payload(pickle.loads(data))


# ---- host side --------------------------------------------------------------------------

_CONTEXTS = {
    SharingStrategy.Fork: "fork",
    SharingStrategy.ForkServer: "forkserver",
    SharingStrategy.SharedMemory: "spawn",
    SharingStrategy.FileSystem: "spawn",
}


def _context(strategy: SharingStrategy) -> Any:
    method = _CONTEXTS[SharingStrategy(strategy)]
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        _preload_forkserver(ctx)
    return ctx


def _preload_forkserver(ctx: Any) -> None:
    """Have the fork server import torch and poptorch once, so that each worker it forks
    starts in milliseconds instead of importing them again (only if the server is not
    running yet: its preload list is read when it starts)."""
    from multiprocessing import forkserver  # noqa: PLC0415

    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is None:
        modules = list(getattr(server, "_preload_modules", []))
        ctx.set_forkserver_preload(modules + [m for m in ("torch", "poptorch") if m not in modules])


class WorkerHandle:
    """The host's end: starts the worker, reads the ring, sends commands."""

    def __init__(self, dataset: Any, cfg: dict[str, Any], strategy: SharingStrategy) -> None:
        self.load_indefinitely = cfg["load_indefinitely"]
        self._needs_start = not cfg["early_preload"]
        self._read = 0
        self._consumed = False  # read data since the last epoch boundary
        self._at_end = False
        self._generation = 0
        self._process: Any = None
        self._cmd: Any = None
        self._start(dataset, cfg, strategy)

    # -- start-up --

    def _start(self, dataset: Any, cfg: dict[str, Any], strategy: SharingStrategy) -> None:
        strategy = SharingStrategy(strategy)
        if strategy == SharingStrategy.Fork:
            self._launch(dataset, cfg, strategy)  # inherited, not pickled
            return
        if strategy != SharingStrategy.FileSystem:
            self._launch(_Payload(dataset), cfg, strategy)
            return
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "dataset.pkl")
            logger.debug("Serialising dataset to file: %s", path)
            with open(path, "wb") as f:
                pickle.dump(dataset, f, protocol=4)
            self._launch(path, cfg, strategy)

    def _launch(self, source: Any, cfg: dict[str, Any], strategy: SharingStrategy) -> None:
        ctx = _context(strategy)
        data_read, data_write = ctx.Pipe(duplex=False)
        cmd_read, cmd_write = ctx.Pipe(duplex=False)
        logger.debug("AsynchronousDataAccessor parent process: %d", os.getpid())
        self._process = ctx.Process(target=worker_main, args=(source, data_write, cmd_read, cfg))
        self._process.start()
        data_write.close()
        cmd_read.close()
        self._data, self._cmd = data_read, cmd_write
        try:
            message = self._data.recv()
        except (EOFError, OSError):
            message = ("error", "the worker process exited")
        if message[0] != "ready":
            self.terminate()
            raise Error(f"{START_FAILED_MSG}: {message[1]}", "poptorch_py_error")
        _, self.spec, self.consts, parts = message
        self.kinds = [k for k in du.leaf_kinds(self.spec) if k != du.CONST]
        self._data_buffers = Ring(*parts)

    # -- commands --

    def _send(self, *command: Any) -> None:
        try:
            self._cmd.send(command)
            if getattr(self, "_data_buffers", None) is not None:
                self._data_buffers.words[PENDING] = 1
        except (BrokenPipeError, OSError):
            self._check_alive()

    def reset_iterator(self) -> None:
        """Called by ``iter()``: restart the epoch if it was partly read, or let a worker
        that waits at the end of an epoch (or before the first) start loading."""
        self._at_end = False
        if self._consumed:
            self._generation += 1
            self._send(RESET, self._generation)
            words = self._data_buffers.words
            self._wait(lambda: words[ACK] == self._generation)
            self._read = 0
            self._consumed = False
            self._needs_start = False
        elif self._needs_start:
            self._send(START)
            self._needs_start = False

    # -- reading --

    def _wait(self, ready: Any) -> None:
        delay = 1e-5
        while not ready():
            self._check_alive()
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def _check_alive(self) -> None:
        if self._process is None:
            raise Error("The AsynchronousDataAccessor was terminated.", "poptorch_py_error")
        code = self._process.exitcode
        if code is None:
            return
        reason = f"the worker process exited with code {code}"
        try:
            if self._data.poll():
                reason = self._data.recv()[1]
        except (EOFError, OSError):
            pass
        raise Error(f"{FETCH_FAILED_MSG}: {reason}", "poptorch_py_error")

    def next(self) -> Any:
        """The next batch (a copy), or ``StopIteration`` at the end of an epoch."""
        if self._at_end:
            raise StopIteration
        if self._needs_start:  # next() without iter(): let a waiting worker go on
            self._send(START)
            self._needs_start = False
        ring, slot = self._data_buffers, self._read
        self._wait(lambda: ring.state[slot] == READY)
        self._read = (slot + 1) % len(ring)
        if ring.kind[slot] == END:
            self._free(slot)
            self._at_end, self._consumed = True, False
            self._needs_start = not self.load_indefinitely
            raise StopIteration
        values = []
        for i, (buffer, kind) in enumerate(zip(ring.buffers[slot], self.kinds)):
            rows = int(ring.rows[slot, i])
            values.append(du.from_tensor(buffer if rows < 0 else buffer[:rows], kind))
        self._free(slot)
        self._consumed = True
        return du.unflatten(self.spec, self._with_consts(values))

    def _free(self, slot: int) -> None:
        if self._data_buffers.free(slot):
            self._send(WAKE)

    def _with_consts(self, values: list[Any]) -> list[Any]:
        if not self.consts:
            return values
        out, it = [], iter(values)
        for i in range(len(values) + len(self.consts)):
            out.append(self.consts[i] if i in self.consts else next(it))
        return out

    # -- shutdown --

    def terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.exitcode is None:
            try:
                self._cmd.send((SHUTDOWN,))
            except (BrokenPipeError, OSError):
                pass
            process.join(timeout=10)
            # A worker blocked inside the dataset cannot read the command: interrupt it.
            if process.exitcode is None:
                os.kill(process.pid, signal.SIGINT)
                process.join(timeout=10)
            if process.exitcode is None:
                process.terminate()
                process.join()
        for conn in (self._cmd, getattr(self, "_data", None)):
            if conn is not None:
                conn.close()
