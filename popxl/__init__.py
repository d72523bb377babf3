"""PopXL on JAX: build explicit programs as an IR of graphs, then run them with a Session.

``import popxl`` is light: JAX is imported when a program is lowered or run.
"""

from typing import Any

from . import context as context
from . import custom_ops as custom_ops
from . import dtypes as dtypes
from . import errors as errors
from . import fp8_utils as fp8_utils
from . import graph as graph
from . import ir as ir
from . import module as module
from . import ops as ops
from . import random_seed as random_seed
from . import replica_grouping as replica_grouping
from . import session as session
from . import streams as streams
from . import tensor as tensor
from . import tensorlocation as tensorlocation
from . import testing as testing
from . import transforms as transforms
from . import typing_ as typing_
from . import utils as utils
from .context import gcg as gcg
from .context import get_current_graph as get_current_graph
from .context import get_ir as get_ir
from .context import get_main_graph as get_main_graph
from .context import gir as gir
from .context import gmg as gmg
from .context import in_sequence as in_sequence
from .context import io_tiles as io_tiles
from .context import ipu as ipu
from .context import name_scope as name_scope
from .dtypes import bool as bool  # noqa: A004 (public API name)
from .dtypes import complex64 as complex64
from .dtypes import complex128 as complex128
from .dtypes import double as double
from .dtypes import dtype as dtype
from .dtypes import float as float  # noqa: A004 (public API name)
from .dtypes import float8_143 as float8_143
from .dtypes import float8_152 as float8_152
from .dtypes import float16 as float16
from .dtypes import float32 as float32
from .dtypes import float64 as float64
from .dtypes import half as half
from .dtypes import int8 as int8
from .dtypes import int16 as int16
from .dtypes import int32 as int32
from .dtypes import int64 as int64
from .dtypes import uint8 as uint8
from .dtypes import uint16 as uint16
from .dtypes import uint32 as uint32
from .dtypes import uint64 as uint64
from .graph import Graph as Graph
from .ir import Ir as Ir
from .module import Module as Module
from .random_seed import create_seeds as create_seeds
from .remote_buffer import RemoteBuffer as RemoteBuffer
from .remote_buffer import remote_buffer as remote_buffer
from .remote_buffer import remote_replica_sharded_variable as remote_replica_sharded_variable
from .remote_buffer import remote_variable as remote_variable
from .remote_buffer import replica_sharded_buffer as replica_sharded_buffer
from .remote_buffer import replica_sharded_variable as replica_sharded_variable
from .replica_grouping import ReplicaGrouping as ReplicaGrouping
from .streams import DeviceToHostStream as DeviceToHostStream
from .streams import HostToDeviceStream as HostToDeviceStream
from .streams import d2h_stream as d2h_stream
from .streams import h2d_stream as h2d_stream
from .tensor import Constant as Constant
from .tensor import Tensor as Tensor
from .tensor import TensorByRef as TensorByRef
from .tensor import Variable as Variable
from .tensor import constant as constant
from .tensor import graph_input as graph_input
from .tensor import graph_output as graph_output
from .tensor import variable as variable
from .tensor_spec import TensorSpec as TensorSpec
from .tensorlocation import ExecutionContext as ExecutionContext
from .tensorlocation import ReplicatedTensorSharding as ReplicatedTensorSharding
from .tensorlocation import TensorLocation as TensorLocation
from .tensorlocation import TensorStorage as TensorStorage
from .tensorlocation import TileSet as TileSet

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Session":
        from runtime.session.session import Session  # noqa: PLC0415  (lazy: keeps `import popxl` light)

        return Session
    raise AttributeError(f"module 'popxl' has no attribute {name!r}")


__all__ = [
    "get_current_graph", "get_main_graph", "get_ir", "gcg", "gmg", "gir", "in_sequence",
    "name_scope", "ipu", "io_tiles",
    "dtype", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "half", "float8_143", "float8_152", "float16", "float", "float32", "double", "float64",
    "complex64", "complex128",
    "Graph", "Ir", "Module", "create_seeds", "ReplicaGrouping", "RemoteBuffer", "remote_buffer",
    "remote_variable", "remote_replica_sharded_variable", "replica_sharded_variable",
    "HostToDeviceStream", "DeviceToHostStream", "h2d_stream", "d2h_stream",
    "Tensor", "variable", "constant", "graph_input", "graph_output", "TensorByRef", "TensorSpec",
    "TensorStorage", "TensorLocation", "ReplicatedTensorSharding", "TileSet", "ExecutionContext",
    "Session",
]  # fmt: skip
