"""``LinearLayout``: a copy of a tensor, mapped linearly over the IPU's tiles.

Off the IPU there are no tiles: the op is a copy (identity in value and gradient) that
keeps its type name and its ``bs`` attribute in the IR.
"""

from __future__ import annotations

from typing import Any

import popxl

from .._native import define, record, same_spec


def _lower(x: Any, *, bs: int) -> Any:
    return x


LINEAR_LAYOUT = define("linear_layout", "LinearLayout", same_spec, _lower, grad_needs="none")


def linear_layout(t: popxl.Tensor, bs: int = 1) -> popxl.Tensor:
    """A copy of ``t`` laid out linearly, ``bs`` elements per grain (the grain size has no
    effect off the IPU).

    Raises:
        ValueError: ``bs`` is not a positive int.
    """
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        raise ValueError(f"linear_layout: bs must be a positive int, got {bs!r}.")
    return record(LINEAR_LAYOUT, {"t": t}, {"bs": bs}, ["linear_layout"])[0]


__all__ = ["linear_layout"]
