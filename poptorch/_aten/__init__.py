"""The ATen op table: how each core ATen op of a captured model becomes popxl ops.

One record per op (``@lowering(aten.op.overload)``), grouped in files by family as
``popxl.ops`` is. ``TABLE`` maps each ATen overload to its record; ``PRESERVED`` holds the
ops the capture keeps whole instead of decomposing (their records lower them directly).
"""

from __future__ import annotations

from . import activation as activation
from . import conv as conv
from . import creation as creation
from . import elementwise as elementwise
from . import index as index
from . import linalg as linalg
from . import loss as loss
from . import matmul as matmul
from . import norm as norm
from . import pool as pool
from . import poptorch_ops as poptorch_ops
from . import random as random
from . import reduce as reduce
from . import rnn as rnn
from . import shape as shape
from ._registry import PRESERVED as PRESERVED
from ._registry import TABLE as TABLE
from ._registry import NodeContext as NodeContext
from ._registry import lowering as lowering

__all__ = ["PRESERVED", "TABLE", "NodeContext", "lowering"]
