"""The host transfers of a PopTorch program's inputs and outputs.

Each model input is one host load per micro-batch and each output one host store (per
micro-batch, or once per run for the accumulated output modes). An input or output marked
with ``poptorch.set_overlap_for_input`` / ``set_overlap_for_output`` (``OverlapMode``)
transfers on the IO tiles, as PopTorch set it up for PopART: the load runs on the IO tiles
and an ``io_tile_copy`` brings the value to the compute tiles (the store the other way),
with PopART's exchange strategy recorded on the host op (``OverlapInnerLoop`` to overlap
the accumulation loop, ``OverlapLoops`` the device-iteration loop too). On the IPU that
let the transfers of the next iteration run beside this one's compute; the values are the
same, and this runtime sends a run's data to the device before the step starts anyway.
"""

from __future__ import annotations

from typing import Any

import popxl
from popxl import ops

from ..enums import OutputMode, OverlapMode
from ..errors import Error
from ..strategies import PipelinedExecution, ShardedExecution

PIPELINED_MSG = (
    "Overlapped IO is not supported with poptorch.PipelinedExecution. If you are using only "
    "one IPU, please switch to poptorch.ShardedExecution."
)
NO_IO_TILES_MSG = (
    "No IO tiles allocated. You must allocate at least 32 IO tiles using "
    "poptorch.Options().TensorLocations.numIOTiles."
)
OUTPUT_MODE_MSG = (
    "Unsupported output mode for overlapped IO. Please switch output mode to "
    "poptorch.OutputMode.All or poptorch.OutputMode.Sum."
)
# PopART's exchange strategy for each overlap mode.
EXCHANGE_STRATEGY = {
    OverlapMode.OverlapAccumulationLoop.value: "OverlapInnerLoop",
    OverlapMode.OverlapDeviceIterationLoop.value: "OverlapLoops",
}


def check_overlapped_io(overlaps: Any, options: Any, mode: OutputMode) -> None:
    """PopTorch's conditions for overlapped IO, checked when a program uses it.

    Raises:
        poptorch.Error: the model is pipelined, no IO tiles are reserved, or the output
            mode sends outputs other than every one or their sum.
    """
    if overlaps is None or not overlaps.used:
        return
    strategy = options.strategy
    if isinstance(strategy, PipelinedExecution) and not isinstance(strategy, ShardedExecution):
        raise Error(PIPELINED_MSG, "poptorch_cpp_error")
    if options.tensor_locations.num_io_tiles == 0:
        raise Error(NO_IO_TILES_MSG, "poptorch_cpp_error")
    if mode not in (OutputMode.All, OutputMode.Sum):
        raise Error(OUTPUT_MODE_MSG, "poptorch_cpp_error")


def _strategy(modes: dict[int, str] | None, index: int) -> str | None:
    return EXCHANGE_STRATEGY.get((modes or {}).get(index, ""))


def load(stream: popxl.HostToDeviceStream, index: int, overlaps: Any) -> popxl.Tensor:
    """The next micro-batch of model input ``index`` (on the IO tiles if it overlaps)."""
    strategy = _strategy(overlaps and overlaps.inputs, index)
    if strategy is None:
        return ops.host_load(stream, f"x{index}")
    graph = popxl.gcg()
    with popxl.io_tiles():
        value = ops.host_load(stream, f"x{index}")
    graph._ops[-1].attrs["exchange_strategy"] = strategy
    return ops.io_tile_copy(value)


def store(stream: popxl.DeviceToHostStream, index: int, value: popxl.Tensor, overlaps: Any) -> None:
    """Send ``value`` through model output ``index``'s stream (from the IO tiles if it
    overlaps)."""
    strategy = _strategy(overlaps and overlaps.outputs, index)
    if strategy is None:
        ops.host_store(stream, value)
        return
    graph = popxl.gcg()
    with popxl.io_tiles():
        ops.host_store(stream, ops.io_tile_copy(value))
    graph._ops[-1].attrs["exchange_strategy"] = strategy
