"""Collectives over strided replica groups (``ReplicaGrouping(stride, group_size)``)."""

from .replicated_all_gather_strided import (
    replicated_all_gather_strided as replicated_all_gather_strided,
)
from .replicated_all_reduce_strided import (
    replicated_all_reduce_strided as replicated_all_reduce_strided,
)
from .replicated_all_reduce_strided import (
    replicated_all_reduce_strided_graph as replicated_all_reduce_strided_graph,
)
from .replicated_all_reduce_strided import (
    replicated_all_reduce_strided_identical_grad_inputs as replicated_all_reduce_strided_identical_grad_inputs,
)
from .replicated_all_reduce_strided import (
    replicated_all_reduce_strided_identical_inputs as replicated_all_reduce_strided_identical_inputs,
)
from .replicated_reduce_scatter_strided import (
    replicated_reduce_scatter_strided as replicated_reduce_scatter_strided,
)

__all__ = [
    "replicated_all_gather_strided",
    "replicated_all_reduce_strided",
    "replicated_all_reduce_strided_graph",
    "replicated_all_reduce_strided_identical_grad_inputs",
    "replicated_all_reduce_strided_identical_inputs",
    "replicated_reduce_scatter_strided",
]
