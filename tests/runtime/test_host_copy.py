"""``stream_io.host_copy``: step outputs → fresh writable host arrays, one copy."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from runtime.session import stream_io


def _mesh(n: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:n]), ("r",))


@pytest.mark.parametrize("nht", [1, 3])
def test_replica_sharded_output_is_assembled_from_its_shards(nht: int) -> None:
    value = np.arange(nht * 4 * 5 * 2, dtype=np.float32).reshape(nht, 4, 5, 2)
    buffer = jax.device_put(value, NamedSharding(_mesh(4), P(None, "r")))
    assert stream_io._spread(buffer)
    host = stream_io.host_copy(buffer, nht)
    np.testing.assert_array_equal(host, value if nht > 1 else value[0])
    assert host.flags.writeable
    host[...] = -1  # the caller's array: writing it leaves the device value alone
    np.testing.assert_array_equal(np.asarray(buffer), value)


@pytest.mark.parametrize(
    "place",
    [
        lambda v: jax.device_put(v),  # one device
        lambda v: jax.device_put(v, NamedSharding(_mesh(4), P())),  # replicated
        lambda v: v,  # already on the host
    ],
    ids=["one_device", "replicated", "numpy"],
)
def test_other_outputs_are_copied(place: object) -> None:
    value = np.arange(2 * 3 * 4, dtype=np.int32).reshape(1, 2, 3, 4)
    buffer = place(value)  # type: ignore[operator]
    assert not stream_io._spread(buffer)
    host = stream_io.host_copy(buffer, 1)
    np.testing.assert_array_equal(host, value[0])
    assert host.flags.writeable
    host[...] = 7
    np.testing.assert_array_equal(np.asarray(buffer), value)


def test_a_large_output_on_the_cpu_is_taken_over_not_copied() -> None:
    import gc

    value = np.arange(3 * 70_000, dtype=np.float32).reshape(1, 3, 70_000)  # 840 KB
    buffer = jax.device_put(value)
    pointer = buffer.unsafe_buffer_pointer()
    host = stream_io.host_copy(buffer, 1)
    assert host.__array_interface__["data"][0] == pointer  # the buffer's own memory
    assert host.flags.writeable and host.shape == (3, 70_000)
    del buffer
    gc.collect()  # the array keeps the memory alive
    np.testing.assert_array_equal(host, value[0])
    host[...] = 0  # and is the caller's to write


def test_a_large_output_on_several_devices_is_copied() -> None:
    value = np.ones((1, 4, 70_000), np.float32)
    buffer = jax.device_put(value, NamedSharding(_mesh(4), P()))  # replicated on four
    host = stream_io.host_copy(buffer, 1)
    assert host.flags.owndata and host.flags.writeable
    np.testing.assert_array_equal(host, value[0])
