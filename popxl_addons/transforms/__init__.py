"""Graph transforms on GraphWithNamedArgs."""

from .autodiff import autodiff as autodiff
from .autodiff import autodiff_with_accumulation as autodiff_with_accumulation
from .available_memory_proportion import (
    set_available_memory_proportion_by_ipu as set_available_memory_proportion_by_ipu,
)
from .available_memory_proportion import (
    set_graph_available_memory_proportion_by_ipu as set_graph_available_memory_proportion_by_ipu,
)
from .batch_serialisation import RemoteHandle as RemoteHandle
from .batch_serialisation import batch_serial_buffer as batch_serial_buffer
from .batch_serialisation import batch_serialise as batch_serialise
from .batch_serialisation import batch_serialise_fwd_and_grad as batch_serialise_fwd_and_grad
from .pipelining import pipelined_execution as pipelined_execution
from .recomputation import add_recompute_inputs as add_recompute_inputs
from .recomputation import recompute_graph as recompute_graph
from .use_fc_pass import disable_fc_pass as disable_fc_pass
from .use_fc_pass import enable_fc_pass as enable_fc_pass

__all__ = [
    "autodiff",
    "autodiff_with_accumulation",
    "recompute_graph",
    "add_recompute_inputs",
    "set_available_memory_proportion_by_ipu",
    "set_graph_available_memory_proportion_by_ipu",
    "disable_fc_pass",
    "enable_fc_pass",
    "pipelined_execution",
    "batch_serialise",
    "batch_serialise_fwd_and_grad",
    "batch_serial_buffer",
    "RemoteHandle",
]
