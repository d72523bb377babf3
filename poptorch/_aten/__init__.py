"""The ATen op table: how each core ATen op of a captured model becomes popxl ops.

One record per op (``@lowering(aten.op.overload)``), grouped in files by family as
``popxl.ops`` is. ``TABLE`` maps each ATen overload to its record.
"""

from __future__ import annotations

from . import elementwise as elementwise
from . import matmul as matmul
from . import shape as shape
from . import reduce as reduce
from ._registry import TABLE as TABLE
from ._registry import NodeContext as NodeContext
from ._registry import lowering as lowering

__all__ = ["TABLE", "NodeContext", "lowering"]
