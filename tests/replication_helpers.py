"""Helpers for tests of replicated programs: both replica mappings, groups, host runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import dtypes

MODES = ("vmap", "shard_map")
MAX_REPLICAS = 8  # the most replicas a test uses; conftest forces 8 CPU devices


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    """Run the test with replicas mapped by ``jax.vmap`` and by ``jax.shard_map``."""
    import jax

    if request.param == "shard_map" and len(jax.devices()) < MAX_REPLICAS:
        pytest.skip(f"shard_map tests need {MAX_REPLICAS} devices, JAX has {len(jax.devices())}")
    monkeypatch.setenv("POPXL_REPLICATION", request.param)
    return request.param


def members(assignment: Sequence[int]) -> list[list[int]]:
    """Each group's replicas in increasing order (their rank order)."""
    groups: dict[int, list[int]] = {}
    for replica, g in enumerate(assignment):
        groups.setdefault(g, []).append(replica)
    return [groups[g] for g in sorted(groups)]


def group_of(assignment: Sequence[int], replica: int) -> tuple[list[int], int]:
    """(the members of ``replica``'s group, its rank in that group)."""
    ms = next(m for m in members(assignment) if replica in m)
    return ms, ms.index(replica)


def run_replicated(
    replicas: int,
    build: Callable[..., Any],
    inputs: Sequence[np.ndarray],
    device: str = "ipu_model",
) -> list[np.ndarray]:
    """Host-load one ``(replicas, *shape)`` array per input, build, host-store the outputs.

    ``build(ir, *tensors)`` returns a tensor or a sequence of tensors. Returns the outputs
    in host layout (``(replicas, *shape)``).
    """
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        streams = [
            popxl.h2d_stream(x.shape[1:], dtypes.dtype.as_dtype(x.dtype), f"in{i}")
            for i, x in enumerate(inputs)
        ]
        tensors = [ops.host_load(s, f"x{i}") for i, s in enumerate(streams)]
        result = build(ir, *tensors)
        outs = [result] if isinstance(result, popxl.Tensor) else list(result)
        out_streams = []
        for i, o in enumerate(outs):
            stream = popxl.d2h_stream(o.shape, o.dtype, f"out{i}")
            ops.host_store(stream, o)
            out_streams.append(stream)
    with popxl.Session(ir, device) as session:
        values = session.run(dict(zip(streams, inputs)))
    return [values[s] for s in out_streams]
