"""Graph transforms on GraphWithNamedArgs."""

from .autodiff import autodiff as autodiff
from .autodiff import autodiff_with_accumulation as autodiff_with_accumulation
from .available_memory_proportion import (
    set_available_memory_proportion_by_ipu as set_available_memory_proportion_by_ipu,
)
from .available_memory_proportion import (
    set_graph_available_memory_proportion_by_ipu as set_graph_available_memory_proportion_by_ipu,
)
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
]
