"""Checking and arranging the host arrays of a run.

The host layout of a stream is ``[num_host_transfers if > 1][replication_factor if > 1]
[*stream_shape]``. Inputs are converted (64-bit data downcast to 32-bit), checked against
that layout with PopXL's rules, and rearranged into the step's ``[slots, (replicas,)
*shape]`` form. Nothing here touches the device, so a rejected run changes no state.

Float8 streams take PopXL's structured arrays (``np_dtype_float8_*``) or ml_dtypes float8
arrays, and give back the structured form; the step sees ml_dtypes views of the same bytes.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from popxl import _float8_host
from popxl.streams import DeviceToHostStream, HostToDeviceStream, Stream
from popxl.utils import downcast_np_dtypes, to_numpy

SET_MISMATCH_MSG = "Unexpected/Missing {word}.\n  Unexpected: {unexpected}\n  Missing: {missing}"
TOO_SHORT_MSG = (
    "Dimension 0 ({n}) for the array provided for {kind} stream {sid} is not large enough.\n"
    "It should be at least of size num_host_transfers = {nht}"
)
WRONG_REPLICAS_MSG = (
    "Dimension {dim} ({n}) for the array provided for {kind} stream {sid} is the wrong size.\n"
    "It should be of size replication_factor = {rf}"
)
SHAPE_MSG = (
    "Shape mismatch for {kind} stream {sid}:\nStream shape = {shape}, therefore expected full "
    "global batch shape {full}. Got array shape = {got}"
)
DTYPE_MSG = (
    "The array for {kind} stream {sid} has dtype {got}, but the stream carries {want}. "
    "Convert it first, e.g. array.astype(np.{want})."
)
DTYPE_MSG_FLOAT8 = (
    "The array for {kind} stream {sid} has dtype {got}, but the stream carries {want}: pass "
    "float8 data, an array of dtype popxl.dtypes.np_dtype_{want} (convert float data with "
    "popxl.fp8_utils.host_pow2scale_cast_to_fp8) or of the matching ml_dtypes type."
)


def _extra_dims(nht: int, replicas: int) -> tuple[int, ...]:
    return ((nht,) if nht > 1 else ()) + ((replicas,) if replicas > 1 else ())


def check_stream_set(provided: Collection[Stream], expected: Sequence[Stream], kind: str) -> None:
    given = set(provided)
    wanted = set(expected)
    if given != wanted:
        # PopXL names the kind only when something was provided ("Unexpected/Missing ." else).
        word = kind if provided else ""
        unexpected = {str(s) for s in given - wanted}
        missing = {str(s) for s in wanted - given}
        raise ValueError(SET_MISMATCH_MSG.format(word=word, unexpected=unexpected, missing=missing))


def check_shape(arr: np.ndarray, stream: Stream, nht: int, replicas: int, kind: str) -> None:
    """PopXL's layout rules, in PopXL's order.

    PopXL's escape hatch accepts an array whose dims after the leading ones squeeze away
    (a 0-d array for a ``(1,)`` stream, ``(nht,)`` for ``(1,)``...). It applies here only
    to one-element streams: for larger streams PopXL read past the data, so we raise.
    """
    sid = stream.tensor_id
    if nht > 1 and (arr.ndim == 0 or arr.shape[0] < nht):
        n = arr.shape[0] if arr.ndim else 0
        raise ValueError(TOO_SHORT_MSG.format(n=n, kind=kind, sid=sid, nht=nht))
    dim = 1 if nht > 1 else 0
    if replicas > 1 and (arr.ndim <= dim or arr.shape[dim] != replicas):
        n = arr.shape[dim] if arr.ndim > dim else 0
        raise ValueError(WRONG_REPLICAS_MSG.format(dim=dim, n=n, kind=kind, sid=sid, rf=replicas))
    d = len(_extra_dims(nht, replicas))
    if arr.shape[d:] == stream.shape:
        return
    if math.prod(stream.shape) == 1 and arr.squeeze().shape[d:] == ():
        return
    full = _extra_dims(nht, replicas) + stream.shape
    raise ValueError(
        SHAPE_MSG.format(kind=kind, sid=sid, shape=stream.shape, full=full, got=arr.shape)
    )


def _float8_array(value: Any, stream: Stream) -> np.ndarray:
    """Float8 input in either form, as an ml_dtypes view for the step."""
    arr = value if isinstance(value, np.ndarray) else to_numpy(value, copy=False)
    want = stream.dtype
    if not _float8_host.is_float8(arr.dtype):
        raise TypeError(
            DTYPE_MSG_FLOAT8.format(
                kind="input", sid=stream.tensor_id, got=arr.dtype, want=want.name
            )
        )
    return _float8_host.to_ml(_float8_host.checked_structured(arr, want))


def _convert(value: Any, stream: Stream, downcast: bool) -> np.ndarray:
    if stream.dtype.name.startswith("float8"):
        return _float8_array(value, stream)
    want = stream.dtype.as_numpy()
    if isinstance(value, np.ndarray):  # the common case, without to_numpy's overhead
        arr = value
        if arr.dtype != want and downcast and arr.dtype in downcast_np_dtypes:
            arr = arr.astype(downcast_np_dtypes[arr.dtype])
    elif isinstance(value, (bool, int, float, list, tuple)):
        return np.asarray(value, dtype=want)
    else:
        arr = to_numpy(value, downcast=downcast, copy=False)
    if arr.dtype != want:
        raise TypeError(
            DTYPE_MSG.format(kind="input", sid=stream.tensor_id, got=arr.dtype, want=want)
        )
    return arr


def arrange_input(arr: np.ndarray, stream: Stream, nht: int, replicas: int) -> np.ndarray:
    """The step's ``[slots, (replicas,) *shape]`` layout of a checked input array."""
    lead: tuple[int, ...] = (arr.shape[0],) if nht > 1 else (1,)
    lead += (replicas,) if replicas > 1 else ()
    return arr.reshape(lead + stream.shape)


def prepare_inputs(
    inputs: Mapping[HostToDeviceStream, Any] | None,
    streams: list[HostToDeviceStream],
    nht: int,
    replicas: int,
    downcast: bool,
) -> tuple[np.ndarray, ...]:
    provided = dict(inputs or {})
    check_stream_set(provided, streams, "input")
    arrays = []
    for stream in streams:
        arr = _convert(provided[stream], stream, downcast)
        check_shape(arr, stream, nht, replicas, "input")
        arrays.append(arrange_input(arr, stream, nht, replicas))
    return tuple(arrays)


def output_shape(stream: DeviceToHostStream, nht: int, replicas: int) -> tuple[int, ...]:
    return _extra_dims(nht, replicas) + stream.shape


def check_outputs(
    outputs: Mapping[DeviceToHostStream, np.ndarray],
    streams: list[DeviceToHostStream],
    nht: int,
    replicas: int,
) -> None:
    check_stream_set(outputs, streams, "output")
    for stream in streams:
        arr = outputs[stream]
        if not isinstance(arr, np.ndarray):
            raise TypeError(
                f"The output array for {stream} must be a NumPy array, got {type(arr).__name__}. "
                "Use session.create_host_outputs() to make them."
            )
        if stream.dtype.name.startswith("float8"):
            _float8_output(arr, stream)
        elif arr.dtype != stream.dtype.as_numpy():
            raise TypeError(
                DTYPE_MSG.format(
                    kind="output", sid=stream.tensor_id, got=arr.dtype, want=stream.dtype.as_numpy()
                )
            )
        check_shape(arr, stream, nht, replicas, "output")
        if not arr.flags.writeable:
            raise ValueError(f"The output array for {stream} is read-only; pass a writeable array.")


def _float8_output(arr: np.ndarray, stream: Stream) -> None:
    """A float8 output array may be of either float8 form, but of the stream's format."""
    if not _float8_host.is_float8(arr.dtype):
        raise TypeError(
            DTYPE_MSG_FLOAT8.format(
                kind="output", sid=stream.tensor_id, got=arr.dtype, want=stream.dtype.name
            )
        )
    _float8_host.checked_structured(arr, stream.dtype)


def host_layout(buffer: np.ndarray, nht: int) -> np.ndarray:
    """Step output ``[nht, (replicas,) *shape]`` → host layout (drop the nht axis if 1).

    The buffer is fetched before the axis is dropped: indexing a device array dispatches
    an XLA computation, which was most of ``session.run``'s own time for small steps
    (77 -> 25 us of CPU per run of a 4-element step; a bare ``jax.jit`` call takes 10-11).
    """
    host = np.asarray(buffer)
    return host if nht > 1 else host[0]


def host_copy(buffer: Any, nht: int, may_spread: bool = True) -> np.ndarray:
    """Step output ``[nht, (replicas,) *shape]`` → a fresh, writable host array in host
    layout (see ``host_layout``), copied once, or for a large one on the CPU not at all
    (``taken_over``).

    An array spread over several devices (replicas under ``shard_map``) is assembled
    straight from its shards: ``np.asarray`` would assemble a read-only array that then
    needed a second copy, which cost about a fifth of a 4-device tensor-parallel step
    (``bench/tp_block.py`` under ``shard_map``: 1.57-1.79x the hand-written step with its
    outputs left on the devices, 1.03-1.14x copied once; 2026-11-22).
    ``may_spread`` False (a program on one device) skips asking.
    """
    if not (may_spread and _spread(buffer)):
        if _may_take_over(buffer):
            host = taken_over(buffer)
            return host if nht > 1 else host[0]
        return np.array(host_layout(buffer, nht))
    host = np.empty(buffer.shape, buffer.dtype)
    for shard in buffer.addressable_shards:
        host[shard.index] = np.asarray(shard.data)
    return host if nht > 1 else host[0]


# Taking a buffer over costs about 6 us whatever its size; a copy costs 3 us at 4 KiB, 11 at
# 256 KiB, 60 at 1 MiB and 420 at 4 MiB (2026-11-29, the 2-core host): smaller ones are copied.
TAKEN_OVER_BYTES = 512 * 1024


def _may_take_over(buffer: Any) -> bool:
    """Whether ``buffer`` is a large JAX array in the host's memory, on one device."""
    sharding = getattr(buffer, "sharding", None)
    if sharding is None or buffer.nbytes < TAKEN_OVER_BYTES or len(sharding.device_set) != 1:
        return False
    return next(iter(sharding.device_set)).platform == "cpu"


def taken_over(buffer: Any) -> np.ndarray:
    """A step's output buffer on the CPU as a writable NumPy array over its own memory,
    which the array keeps alive: no copy.

    Only for a step's output that nothing else holds: every result of an XLA step has a
    buffer of its own, never the state's nor another result's (a donated input forwarded
    to a result gives that result its memory), so the caller's writes reach nothing the
    session reads. A language model's logits are the case: a 50,257-word GPT-2's for
    8 x 64 tokens are 103 MB a call.
    """
    buffer.block_until_ready()
    memory = (ctypes.c_char * buffer.nbytes).from_address(buffer.unsafe_buffer_pointer())
    memory._owner = buffer  # the array keeps the buffer, so its memory lives as long
    return np.frombuffer(memory, buffer.dtype).reshape(buffer.shape)


def _spread(buffer: Any) -> bool:
    """Whether ``buffer`` is a JAX array split over several of this process's devices."""
    # The sharding's device set, not ``addressable_shards``: that builds a shard object per
    # device, a tenth of a millisecond per output of every step.
    sharding = getattr(buffer, "sharding", None)
    return (
        sharding is not None
        and len(sharding.device_set) > 1
        and bool(buffer.is_fully_addressable)
        and not sharding.is_fully_replicated
    )


def fill_output(target: np.ndarray, buffer: np.ndarray, count: int, nht: int) -> None:
    """Copy the slots a run wrote (``count`` stores, wrapping) into a user's output array."""
    written = min(int(count), nht)
    if written == 0:
        return
    target = _float8_host.to_ml(target)  # a view: float8 bytes land in the user's array
    buffer = np.asarray(buffer)  # one fetch, then host slicing (see ``host_layout``)
    if nht > 1:
        region = target[:written]
        region[...] = buffer[:written].reshape(region.shape)
    else:
        target[...] = buffer[0].reshape(target.shape)
