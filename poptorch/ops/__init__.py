"""PopTorch's own ops, in one place.

* ``functions``: what a model's ``forward`` calls (``poptorch.ipu_print_tensor``,
  ``for_loop``, ``cond``, ``MultiConv``, ``custom_op``, ``CPU`` ...);
* ``torch_ops``: each of them as a torch operator (``torch.ops.poptorch.*``), run eagerly on
  the CPU so the model still runs in plain PyTorch, and seen whole by the capture;
* ``lowerings``: their records in the ATen table (how each becomes popxl ops).
"""

from __future__ import annotations

from .functions import CPU as CPU
from .functions import MultiConv as MultiConv
from .functions import cond as cond
from .functions import ctc_beam_search_decoder as ctc_beam_search_decoder
from .functions import custom_op as custom_op
from .functions import dynamic_slice as dynamic_slice
from .functions import dynamic_update as dynamic_update
from .functions import for_loop as for_loop
from .functions import ipu_print_tensor as ipu_print_tensor
from .functions import lower_torch_op as lower_torch_op
from .functions import nop as nop
from .functions import recomputationCheckpoint as recomputationCheckpoint
from .functions import serializedMatMul as serializedMatMul
from .functions import set_available_memory as set_available_memory
from .functions import set_overlap_for_input as set_overlap_for_input
from .functions import set_overlap_for_output as set_overlap_for_output

__all__ = [
    "CPU",
    "MultiConv",
    "cond",
    "ctc_beam_search_decoder",
    "custom_op",
    "dynamic_slice",
    "dynamic_update",
    "for_loop",
    "ipu_print_tensor",
    "lower_torch_op",
    "nop",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
]
