"""Graph transforms on GraphWithNamedArgs."""

from .autodiff import autodiff as autodiff
from .autodiff import autodiff_with_accumulation as autodiff_with_accumulation
from .batch_serialisation import RemoteHandle as RemoteHandle
from .batch_serialisation import batch_serial_buffer as batch_serial_buffer
from .batch_serialisation import batch_serialise as batch_serialise
from .batch_serialisation import batch_serialise_fwd_and_grad as batch_serialise_fwd_and_grad
from .pipelining import pipelined_execution as pipelined_execution
from .recomputation import add_recompute_inputs as add_recompute_inputs
from .recomputation import recompute_graph as recompute_graph

__all__ = [
    "autodiff",
    "autodiff_with_accumulation",
    "recompute_graph",
    "add_recompute_inputs",
    "pipelined_execution",
    "batch_serialise",
    "batch_serialise_fwd_and_grad",
    "batch_serial_buffer",
    "RemoteHandle",
]
