"""popxl-addons on JAX: modules, named tensors, variable factories and transforms.

Importing is cheap: nothing is compiled and no JAX code runs at import time. ``TaskSession``
and ``write_variables_pb`` (which need the runtime) are loaded on first access, and
``GIT_COMMIT`` asks git on first access.

As in the original, ``layers``, ``optimizers``, ``patterns``, ``testing_utils`` and the
custom-op packages under ``ops`` need an explicit import (``from popxl_addons.layers import
Linear``); ``addons.transforms.autodiff`` and ``addons.seed_variable`` are the functions.
"""

import importlib
from typing import Any

from popxl import Ir as Ir
from popxl import ReplicaGrouping as ReplicaGrouping
from popxl import Tensor as Tensor
from popxl import dtypes as dtypes
from popxl.tensor import HostTensor as HostTensor
from popxl.transforms import ExpectedConnection as ExpectedConnection
from popxl.transforms import ExpectedConnectionType as ExpectedConnectionType
from popxl.transforms import GradGraphInfo as GradGraphInfo

from . import array_munging as array_munging
from . import debugging as debugging
from . import ops as ops
from . import performance_utils as performance_utils
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
from .debugging import print_tensor as print_tensor
from .debugging import print_text as print_text
from .dot_tree import DotTree as DotTree
from .graph import BoundGraph as BoundGraph
from .graph import GraphWithNamedArgs as GraphWithNamedArgs
from .graph_cache import GraphCache as GraphCache
from .graph_cache import argument_hash as argument_hash
from .graph_cache import bound_arguments as bound_arguments
from .graph_cache import function as function
from .graph_cache import get_function_hash as get_function_hash
from .graph_cache import tensor_hash as tensor_hash
from .graph_common import CalledGraphsGradInfo as CalledGraphsGradInfo
from .graph_common import CalledGraphsGradInfoLike as CalledGraphsGradInfoLike
from .graph_common import GradGraphInfoLike as GradGraphInfoLike
from .graph_common import GraphLike as GraphLike
from .module import Module as Module
from .module import NameScopeMeta as NameScopeMeta
from .module import create_grad_graph_info as create_grad_graph_info
from .named_replica_grouping import NamedReplicaGrouping as NamedReplicaGrouping
from .named_tensors import NamedTensorData as NamedTensorData
from .named_tensors import NamedTensors as NamedTensors
from .ops import cross_entropy as cross_entropy
from .ops import cross_entropy_with_grad as cross_entropy_with_grad
from .ops import fp8_amax_scale as fp8_amax_scale
from .ops import host_load as host_load
from .ops import host_store as host_store
from .performance_utils import evaluate_FLOPs as evaluate_FLOPs
from .performance_utils import evaluate_ir_FLOPs as evaluate_ir_FLOPs
from .performance_utils import format_flops_scientific as format_flops_scientific
from .performance_utils import print_FLOPs as print_FLOPs
from .performance_utils import total_FLOPs as total_FLOPs
from .remote import create_remote_buffer as create_remote_buffer
from .remote import load_remote_graph as load_remote_graph
from .remote import named_buffers as named_buffers
from .remote import named_variable_buffers as named_variable_buffers
from .remote import store_remote_graph as store_remote_graph
from .route_tensor import is_subgraph as is_subgraph
from .route_tensor import route_tensor_into_graph as route_tensor_into_graph
from .seed_variable import seed_variable as seed_variable
from .streams import InputStreams as InputStreams
from .streams import OutputStreams as OutputStreams
from .transforms import RemoteHandle as RemoteHandle
from .transforms import add_recompute_inputs as add_recompute_inputs
from .transforms import autodiff as autodiff
from .transforms import autodiff_with_accumulation as autodiff_with_accumulation
from .transforms import batch_serial_buffer as batch_serial_buffer
from .transforms import batch_serialise as batch_serialise
from .transforms import batch_serialise_fwd_and_grad as batch_serialise_fwd_and_grad
from .transforms import disable_fc_pass as disable_fc_pass
from .transforms import enable_fc_pass as enable_fc_pass
from .transforms import pipelined_execution as pipelined_execution
from .transforms import recompute_graph as recompute_graph
from .transforms import (
    set_available_memory_proportion_by_ipu as set_available_memory_proportion_by_ipu,
)
from .transforms import (
    set_graph_available_memory_proportion_by_ipu as set_graph_available_memory_proportion_by_ipu,
)
from .utils import OrderedDict as OrderedDict
from .utils import WeightsDict as WeightsDict
from .utils import duplicate_items as duplicate_items
from .utils import overrides as overrides
from .utils import suffix_graph_name as suffix_graph_name
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
    if name == "GIT_COMMIT":
        from ._git import git_commit  # noqa: PLC0415

        return git_commit()
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
    "cross_entropy", "cross_entropy_with_grad", "fp8_amax_scale", "host_load", "host_store",
    "seed_variable",
    "set_available_memory_proportion_by_ipu", "set_graph_available_memory_proportion_by_ipu",
    "disable_fc_pass", "enable_fc_pass", "add_recompute_inputs", "debugging", "print_tensor",
    "print_text", "performance_utils", "total_FLOPs", "evaluate_ir_FLOPs", "evaluate_FLOPs",
    "print_FLOPs", "format_flops_scientific", "create_grad_graph_info", "bound_arguments",
    "tensor_hash", "argument_hash", "get_function_hash", "GraphLike", "GradGraphInfoLike",
    "CalledGraphsGradInfo", "CalledGraphsGradInfoLike", "overrides", "duplicate_items",
    "suffix_graph_name", "ExpectedConnection", "ExpectedConnectionType", "GradGraphInfo",
    "HostTensor", "Tensor", "Ir", "ReplicaGrouping", "dtypes", "GIT_COMMIT",
]  # fmt: skip
