"""Several instances (processes) running one replicated program: JAX's distributed runtime.

An instance started by ``poprun`` reads its place in the run from ``environment``. With more than
one instance, the session connects the processes with ``jax.distributed`` (the coordinator is
instance 0, at the address ``poprun`` chose; collectives go over gloo on CPUs), once per
process. Every process contributes one JAX device per local replica; the replica axis is a
mesh over all processes' devices in global replica order, so the compiled step is one SPMD
program and collectives between replicas cross process boundaries where the groups do.

Host data keeps the single-process layout: variables and remote buffers are global
(``(replication_factor, ...)`` where they are per replica), so ``get_tensor_data`` returns the
same arrays on every instance as one process running all replicas would. Streams are local:
``session.run`` takes and returns ``[num_host_transfers][instance_replication_factor]...``,
this instance's replicas only.

Faults are bounded: connecting gives up after ``POPDIST_TIMEOUT`` seconds (default 60), a
dead instance is noticed by the others' heartbeats, and instances whose programs differ
refuse to run (each compares its program's structural key with every other instance's).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from popxl.errors import InternalError
from popxl.ir import Ir

from . import environment

DEFAULT_TIMEOUT_S = 60
HEARTBEAT_TIMEOUT_S = 10
NO_COORDINATOR_MSG = (
    "Instance {index} of {n} found no coordinator address: ${var} is not set. Start the "
    "instances with `poprun --num-instances {n} ...`, which sets it."
)
CONNECT_MSG = (
    "Instance {index} of {n} could not join the distributed run through the coordinator at "
    "{address} within {timeout} s: {err}. Check that every instance was started (poprun "
    "starts them all), that the address is reachable from this host (poprun "
    "--coordinator-address HOST:PORT for multi-host runs), and that the port is free."
)
LATE_INIT_MSG = (
    "JAX was already in use in this process before the distributed run was set up, so "
    "instance {index} cannot join it. Call `popdist.init()` (or create the popxl.Session) "
    "before any other JAX computation."
)
DEVICES_MSG = (
    "Instance {index} runs {local} replica(s) but JAX sees {have} local device(s) of the "
    "kind {platform}. Each replica needs its own device: start the instances with poprun "
    "(it sets XLA_FLAGS=--xla_force_host_platform_device_count for CPUs), or launch fewer "
    "replicas per instance."
)
MISMATCH_MSG = (
    "The instances are not running the same program: instance {index} built program {mine} "
    "but instance {other} built {theirs}. Every instance must build the same Ir (same ops, "
    "shapes and replication); check code that depends on the instance index."
)
PEER_MSG = (
    "Instance {index} gave up waiting for instance {other} ({err}); it may have failed or be stuck."
)

_initialized = False
_checks = 0


def instances(ir: Ir) -> int:
    """How many processes run ``ir``'s replicas (1 unless it is a popdist Ir)."""
    return environment.num_instances() if ir._use_popdist else 1


def is_multi_process(ir: Ir) -> bool:
    return instances(ir) > 1


def timeout_s() -> int:
    return int(os.environ.get(environment.TIMEOUT, DEFAULT_TIMEOUT_S))


def initialize() -> None:
    """Join the distributed run (once per process; a no-op with one instance)."""
    global _initialized
    n = environment.num_instances()
    if _initialized or n == 1:
        return
    index = environment.instance_index()
    address = environment.coordinator_address()
    if not address:
        raise RuntimeError(
            NO_COORDINATOR_MSG.format(index=index, n=n, var=environment.COORDINATOR_ADDRESS)
        )
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError(LATE_INIT_MSG.format(index=index))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = timeout_s()
    if index > 0:
        # JAX's client aborts the process when it cannot reach the coordinator; find out
        # first, so the error says what to do.
        _wait_reachable(address, timeout, index, n)
    try:
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=n,
            process_id=index,
            initialization_timeout=timeout,
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
            shutdown_timeout_seconds=timeout,
        )
    except Exception as err:  # JAX raises XlaRuntimeError/RuntimeError subclasses
        raise RuntimeError(
            CONNECT_MSG.format(index=index, n=n, address=address, timeout=timeout, err=err)
        ) from err
    _initialized = True


def _wait_reachable(address: str, timeout: int, index: int, n: int) -> None:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    CONNECT_MSG.format(index=index, n=n, address=address, timeout=timeout, err=err)
                ) from None
        time.sleep(0.2)


def replica_devices(replicas: int, local_replicas: int) -> list[jax.Device]:
    """One device per global replica, in replica order (process-major)."""
    local = jax.local_devices()
    if len(local) < local_replicas:
        raise RuntimeError(
            DEVICES_MSG.format(
                index=jax.process_index(),
                local=local_replicas,
                have=len(local),
                platform=local[0].platform,
            )
        )
    by_process: dict[int, list[jax.Device]] = {}
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    devices = [d for p in sorted(by_process) for d in by_process[p][:local_replicas]]
    if len(devices) != replicas:
        raise InternalError(f"picked {len(devices)} devices for {replicas} replicas")
    return devices


def check_same_program(key: str) -> None:
    """Every instance compares its program's key with every other instance's, through the
    coordinator's key-value store (bounded by ``POPDIST_TIMEOUT``)."""
    global _checks
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        return
    _checks += 1
    index, n = jax.process_index(), jax.process_count()
    prefix = f"popxl/program/{_checks}"
    client.key_value_set(f"{prefix}/{index}", key)
    for other in range(n):
        try:
            theirs = client.blocking_key_value_get(f"{prefix}/{other}", timeout_s() * 1000)
        except Exception as err:
            raise RuntimeError(PEER_MSG.format(index=index, other=other, err=err)) from err
        if theirs != key:
            raise RuntimeError(
                MISMATCH_MSG.format(index=index, mine=key[:12], other=other, theirs=theirs[:12])
            )


class Placement:
    """Moves host arrays to and from the replica mesh of a multi-process program."""

    def __init__(self, mesh: Mesh, local_replicas: int) -> None:
        self.mesh = mesh
        self.local_replicas = local_replicas
        # This instance's replicas are the global replicas from here (instances in order).
        self.first_replica = jax.process_index() * local_replicas
        self.state = NamedSharding(mesh, P("replica"))
        self.streams = NamedSharding(mesh, P(None, "replica"))

    def put(self, hosts: Sequence[Any]) -> list[Any]:
        """Global host arrays (leading replica axis) → global device arrays."""
        return [_from_global(np.asarray(h), self.state) for h in hosts]

    def get(self, values: Sequence[Any]) -> list[np.ndarray]:
        """Global device arrays → the full global arrays, on every instance (a collective)."""
        return [np.asarray(v) for v in multihost_utils.process_allgather(list(values), tiled=True)]

    def inputs(self, arrays: Sequence[np.ndarray]) -> tuple:
        """This instance's stream inputs ``[slots, local replicas, *shape]`` → global arrays."""
        return tuple(
            multihost_utils.host_local_array_to_global_array(
                np.asarray(a), self.mesh, P(None, "replica")
            )
            for a in arrays
        )

    def local(self, value: Any, axis: int) -> np.ndarray:
        """This instance's replicas of a global array sharded on ``axis``."""
        shards = sorted(value.addressable_shards, key=lambda s: s.index[axis].start or 0)
        return np.concatenate([np.asarray(s.data) for s in shards], axis=axis)


def _from_global(host: np.ndarray, sharding: NamedSharding) -> Any:
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


FIRST_FAILED_MSG = "Instance 0 failed to {what}: {err}"
_first_calls = 0


def on_first_instance(ir: Ir, fn: Callable[[], Any], what: str) -> None:
    """Run ``fn`` on instance 0 only; every instance returns once it is done, or raises
    when it failed (a clear error on every instance, bounded by ``POPDIST_TIMEOUT``)."""
    global _first_calls
    if not is_multi_process(ir):
        fn()
        return
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        raise InternalError(f"{what}: the session joins the distributed run before this")
    _first_calls += 1
    key = f"popxl/first/{_first_calls}"
    if jax.process_index() == 0:
        try:
            fn()
        except BaseException as err:
            client.key_value_set(key, f"{type(err).__name__}: {err}")
            raise
        client.key_value_set(key, "")
        return
    try:
        status = client.blocking_key_value_get(key, timeout_s() * 1000)
    except Exception as err:
        raise RuntimeError(PEER_MSG.format(index=jax.process_index(), other=0, err=err)) from err
    if status:
        raise RuntimeError(FIRST_FAILED_MSG.format(what=what, err=status))
