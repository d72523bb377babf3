"""popxl-addons on JAX: modules, named tensors, variable factories and transforms.

Importing is cheap: nothing is compiled and no JAX code runs at import time.
"""

from . import ops as ops
from . import transforms as transforms
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
from .streams import InputStreams as InputStreams
from .streams import OutputStreams as OutputStreams
from .transforms import autodiff as autodiff
from .transforms import autodiff_with_accumulation as autodiff_with_accumulation
from .transforms import recompute_graph as recompute_graph
from .utils import OrderedDict as OrderedDict
from .utils import WeightsDict as WeightsDict
from .utils import timer as timer
from .variable_factory import NamedVariableFactories as NamedVariableFactories
from .variable_factory import VariableFactory as VariableFactory
from .variable_factory import add_replica_sharded_variable_input as add_replica_sharded_variable_input
from .variable_factory import add_variable_input as add_variable_input

__all__ = [
    "ops", "transforms", "DotTree", "BoundGraph", "GraphWithNamedArgs", "GraphCache", "function",
    "Module", "NameScopeMeta", "NamedReplicaGrouping", "NamedTensorData", "NamedTensors",
    "InputStreams", "OutputStreams", "autodiff", "autodiff_with_accumulation", "recompute_graph",
    "OrderedDict", "WeightsDict", "timer", "NamedVariableFactories", "VariableFactory",
    "add_replica_sharded_variable_input", "add_variable_input",
]  # fmt: skip
