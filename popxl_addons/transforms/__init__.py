"""Graph transforms on GraphWithNamedArgs."""

from .autodiff import autodiff as autodiff
from .autodiff import autodiff_with_accumulation as autodiff_with_accumulation
from .pipelining import pipelined_execution as pipelined_execution
from .recomputation import add_recompute_inputs as add_recompute_inputs
from .recomputation import recompute_graph as recompute_graph

__all__ = [
    "autodiff",
    "autodiff_with_accumulation",
    "recompute_graph",
    "add_recompute_inputs",
    "pipelined_execution",
]
