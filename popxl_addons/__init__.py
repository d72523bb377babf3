"""popxl-addons on JAX: modules, named tensors, variable factories and transforms.

Importing is cheap: nothing is compiled and no JAX code runs at import time. ``TaskSession``
and ``write_variables_pb`` (which need the runtime) are loaded on first access.
"""

import importlib
from typing import Any

from . import array_munging as array_munging
from . import ops as ops
from . import remote as remote
from . import rts as rts
from . import transforms as transforms
from .array_munging import handle_negative_axis as handle_negative_axis
from .array_munging import pad_axis as pad_axis
from .array_munging import repeat as repeat
from .array_munging import repeat_axis as repeat_axis
from .array_munging import repeat_shard as repeat_shard
from .array_munging import shard as shard
from .array_munging import shard2D as shard2D
from .array_munging import split2D as split2D
from .array_munging import squeeze_safe as squeeze_safe
from .array_munging import tensor_parallel_input as tensor_parallel_input
from .array_munging import unshard as unshard
from .array_munging import unshard2D as unshard2D
from .array_munging import unshard_arrays as unshard_arrays
from .dot_tree import DotTree as DotTree
from .graph import BoundGraph as BoundGraph
from .graph import GraphWithNamedArgs as GraphWithNamedArgs
from .graph_cache import GraphCache as GraphCache
from .graph_cache import function as function
from .module import Module as Module
from .module import NameScopeMeta as NameScopeMeta
from .named_replica_grouping import NamedReplicaGrouping as NamedReplicaGrouping
from .named_tensors import NamedTensorData as NamedTensorData
from .named_tensors import NamedTensors as NamedTensors
from .remote import create_remote_buffer as create_remote_buffer
from .remote import load_remote_graph as load_remote_graph
from .remote import named_buffers as named_buffers
from .remote import named_variable_buffers as named_variable_buffers
from .remote import store_remote_graph as store_remote_graph
from .route_tensor import is_subgraph as is_subgraph
from .route_tensor import route_tensor_into_graph as route_tensor_into_graph
from .streams import InputStreams as InputStreams
from .streams import OutputStreams as OutputStreams
from .transforms import RemoteHandle as RemoteHandle
from .transforms import autodiff as autodiff
from .transforms import autodiff_with_accumulation as autodiff_with_accumulation
from .transforms import batch_serial_buffer as batch_serial_buffer
from .transforms import batch_serialise as batch_serialise
from .transforms import batch_serialise_fwd_and_grad as batch_serialise_fwd_and_grad
from .transforms import pipelined_execution as pipelined_execution
from .transforms import recompute_graph as recompute_graph
from .utils import OrderedDict as OrderedDict
from .utils import WeightsDict as WeightsDict
from .utils import timer as timer
from .variable_factory import NamedVariableFactories as NamedVariableFactories
from .variable_factory import VariableFactory as VariableFactory
from .variable_factory import (
    add_replica_sharded_variable_input as add_replica_sharded_variable_input,
)
from .variable_factory import add_variable_input as add_variable_input

_LAZY = {"TaskSession", "write_variables_pb", "task_session"}


def __getattr__(name: str) -> Any:
    # TaskSession subclasses popxl.Session, so importing it imports the runtime and JAX.
    if name in _LAZY:
        task_session = importlib.import_module(f"{__name__}.task_session")
        return task_session if name == "task_session" else getattr(task_session, name)
    raise AttributeError(f"module 'popxl_addons' has no attribute '{name}'")


__all__ = [
    "ops", "transforms", "DotTree", "BoundGraph", "GraphWithNamedArgs", "GraphCache", "function",
    "Module", "NameScopeMeta", "NamedReplicaGrouping", "NamedTensorData", "NamedTensors",
    "InputStreams", "OutputStreams", "autodiff", "autodiff_with_accumulation", "recompute_graph",
    "pipelined_execution", "batch_serialise", "batch_serialise_fwd_and_grad",
    "batch_serial_buffer", "RemoteHandle",
    "OrderedDict", "WeightsDict", "timer", "NamedVariableFactories", "VariableFactory",
    "add_replica_sharded_variable_input", "add_variable_input",
    "array_munging", "shard", "unshard_arrays", "unshard", "repeat", "repeat_axis", "split2D",
    "shard2D", "unshard2D", "repeat_shard", "tensor_parallel_input", "pad_axis", "squeeze_safe",
    "handle_negative_axis", "route_tensor_into_graph", "is_subgraph", "TaskSession",
    "write_variables_pb", "remote", "rts", "create_remote_buffer", "load_remote_graph",
    "named_buffers", "named_variable_buffers", "store_remote_graph",
]  # fmt: skip
