"""Switch the IPU's fully-connected pass of matmuls off and on.

On the IPU, PopART planned a matmul's weights so that their transpose, used by the backward
pass, was ready in advance ("fully connected pass"); inference-only programs could turn
that off to save memory. Here the choice is recorded on every ``MatMul`` op
(``op.hints["use_fully_connected_pass"]``, and PopART's ``useFullyConnectedPass()`` through
``graph._pb_graph``); XLA lays out matmul operands itself and does not read it, so the
compiled program and its numbers are the same either way.
"""

from __future__ import annotations

import popxl
from popxl._op import FC_PASS_HINT, FC_PASS_OP_TYPES


def _set_fc_pass(ir: popxl.Ir, enabled: bool) -> None:
    for graph in ir._graphs.values():
        for op in graph._ops:
            if op.type in FC_PASS_OP_TYPES:
                op.hints[FC_PASS_HINT] = enabled


def disable_fc_pass(ir: popxl.Ir) -> None:
    """Record ``use_fully_connected_pass=False`` on every matmul of ``ir`` (inference).

    Args:
        ir: every graph of it is updated.
    """
    _set_fc_pass(ir, False)


def enable_fc_pass(ir: popxl.Ir) -> None:
    """Record ``use_fully_connected_pass=True`` on every matmul of ``ir``, undoing
    ``disable_fc_pass``.

    Args:
        ir: every graph of it is updated.
    """
    _set_fc_pass(ir, True)


__all__ = ["disable_fc_pass", "enable_fc_pass"]
