"""Tensor-parallel all-reduce pairs (``ReplicatedAllReduceTP``)."""

from .replicated_all_reduce_TP import replicated_all_reduce as replicated_all_reduce
from .replicated_all_reduce_TP import (
    replicated_all_reduce_identical_grad_inputs as replicated_all_reduce_identical_grad_inputs,
)
from .replicated_all_reduce_TP import (
    replicated_all_reduce_identical_inputs as replicated_all_reduce_identical_inputs,
)

__all__ = [
    "replicated_all_reduce",
    "replicated_all_reduce_identical_grad_inputs",
    "replicated_all_reduce_identical_inputs",
]
