"""Graph transforms: ``autodiff`` and the exchange/sum helpers."""

from .autodiff import autodiff as autodiff
from .exchange import decompose_sum as decompose_sum
from .exchange import io_tile_exchange as io_tile_exchange
from .exchange import merge_exchange as merge_exchange
from .grad_graph_info import ExpectedConnection as ExpectedConnection
from .grad_graph_info import ExpectedConnectionType as ExpectedConnectionType
from .grad_graph_info import GradGraphInfo as GradGraphInfo

__all__ = [
    "ExpectedConnectionType",
    "ExpectedConnection",
    "GradGraphInfo",
    "autodiff",
    "merge_exchange",
    "io_tile_exchange",
    "decompose_sum",
]
