"""The ATen op table: how each core ATen op of a captured model becomes popxl ops.

One record per op (``@lowering(aten.op.overload)``), grouped in files by family as
``popxl.ops`` is. ``TABLE`` maps each ATen overload to its record; ``PRESERVED`` holds the
ops the capture keeps whole instead of decomposing (their records lower them directly).
PopTorch's own ops (``torch.ops.poptorch.*``) add their records from ``poptorch.ops.lowerings``.
The table imports nothing of the capture: ``registry.Translator`` says what a record may ask of
it.
"""

from __future__ import annotations

# Each family's records register themselves in TABLE when it is imported.
from . import (  # noqa: F401
    activation,
    conv,
    creation,
    elementwise,
    index,
    linalg,
    loss,
    matmul,
    norm,
    pool,
    random,
    reduce,
    rnn,
    shape,
)
from .registry import PRESERVED as PRESERVED
from .registry import TABLE as TABLE
from .registry import NodeContext as NodeContext
from .registry import lowering as lowering

__all__ = ["PRESERVED", "TABLE", "NodeContext", "lowering"]
