"""Estimate the floating point operations (FLOPs) of an IR from its op records.

Counted ops: ``MatMul`` (2 per multiply-add), the elementwise ``Add``/``Sub``/``Mul``/
``Div`` (one per output element) and ``GroupNormalization``. Calls count their graph's
FLOPs at every call site and repeats multiply them by the trip count. Other ops count 0.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

import popxl
from popxl._op import Op
from popxl.utils import table_to_string

Breakdown = dict[str, Any]
Format = Literal["K", "M", "G", "T", "nearest3"]
FORMATS = ("K", "M", "G", "T", "nearest3")
EXPONENTS = {"K": 3, "M": 6, "G": 9, "T": 12}


def matmul_flops(op: Op) -> int:
    """``2 * k * prod(output shape)`` where ``k`` is the contracted dimension."""
    a, b = op.inputs[0].shape, op.inputs[1].shape
    k = a[-1]
    expected = b[-2] if len(b) > 1 else b[-1]
    if k != expected:
        raise ValueError(f"{op}: contracted dimensions differ ({a} @ {b}).")
    return 2 * k * int(np.prod(op.outputs[0].shape))


def elementwise_binary_flops(op: Op) -> int:
    """One FLOP per output element."""
    return int(np.prod(op.outputs[0].shape))


def group_norm_flops(op: Op) -> int:
    """Mean, variance (two passes), normalise (two), scale and bias per element."""
    x_shape, out_shape = op.inputs[0].shape, op.outputs[0].shape
    n_stats = op.outputs[1].shape[0]
    groups = n_stats // x_shape[0]
    per_group = x_shape[-1] * x_shape[-2] // groups
    mean = per_group
    variance = 2 * per_group + 2 * n_stats
    elements = int(np.prod(out_shape))
    return mean + variance + 4 * elements


FLOPS_FNS: dict[str, Callable[[Op], int]] = {
    "Add": elementwise_binary_flops,
    "Sub": elementwise_binary_flops,
    "Div": elementwise_binary_flops,
    "Mul": elementwise_binary_flops,
    "MatMul": matmul_flops,
    "GroupNormalization": group_norm_flops,
}


def _scaled(value: Any, factor: int) -> Any:
    if isinstance(value, dict):
        return {k: _scaled(v, factor) for k, v in value.items()}
    return value * factor


def _total(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_total(v) for v in value.values())
    return value


def _call_key(op: Op, graph: popxl.Graph) -> str:
    name = re.sub(r"_subgraph\(\d+\)", "", graph.id)
    return f"{op.type}_{op.id}({name})"


def _graph_flops(graph: popxl.Graph, memo: dict[popxl.Graph, Breakdown]) -> Breakdown:
    if graph in memo:
        return memo[graph]
    breakdown: defaultdict[str, Any] = defaultdict(dict)
    total = 0
    for op in graph._ops:
        for called in op.called_graphs:
            inner = _scaled(_graph_flops(called, memo), op.attrs.get("repeat_count", 1))
            total += inner["TOT"]
            for key, value in inner.items():
                breakdown[key][_call_key(op, called)] = value
        if op.type in FLOPS_FNS:
            flops = FLOPS_FNS[op.type](op)
            total += flops
            breakdown[op.type][op.id] = flops
    breakdown["TOT"] = total
    memo[graph] = dict(breakdown)
    return memo[graph]


def evaluate_FLOPs(graph: popxl.Graph) -> Breakdown:  # noqa: N802 (original name)
    """The FLOPs of ``graph`` by op type.

    Returns:
        ``{op type: {op id: FLOPs}}`` for the counted ops of ``graph`` itself; for an op
        that calls a graph, ``{op type: {"<CallType>_<id>(<graph>)": <that graph's entry>}}``
        nests the called graph's breakdown. ``"TOT"`` holds the total.

    >>> import numpy as np, popxl
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     y = popxl.constant(np.ones((2, 3), np.float32)) @ popxl.constant(np.ones((3, 4), np.float32))
    >>> evaluate_FLOPs(ir.main_graph)["TOT"]
    48
    """
    return _graph_flops(graph, {})


def evaluate_ir_FLOPs(ir: popxl.Ir) -> Breakdown:  # noqa: N802
    """``evaluate_FLOPs`` of the main graph, times the replication factor (all replicas)."""
    return _scaled(evaluate_FLOPs(ir.main_graph), ir.replication_factor)


def total_FLOPs(ir: popxl.Ir) -> int:  # noqa: N802
    """The estimated FLOPs of one run of ``ir`` over all replicas."""
    return evaluate_ir_FLOPs(ir)["TOT"]


def _flatten(tree: dict, prefix: str = "") -> dict[str, int]:
    flat: dict[str, int] = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            flat.update(_flatten(v, key))
        else:
            flat[key] = v
    return flat


def _type_rows(breakdown: Breakdown, fmt: Format) -> list[list[str]]:
    grouped = {k: _total(v) for k, v in breakdown.items()}
    total = grouped["TOT"] or 1
    rows = [["Op Type", "FLOPs", "%"]]
    for k, v in sorted(grouped.items(), key=lambda item: item[1], reverse=True):
        rows.append([k, format_flops_scientific(v, fmt), f"{100 * v / total:.1f}"])
    return rows


def _flat_rows(breakdown: Breakdown, fmt: Format) -> list[list[str]]:
    flat = _flatten(breakdown)
    rows = [["Op Type", "FLOPs", "Op Name"]]
    for k, v in sorted(flat.items(), key=lambda item: item[1], reverse=True):
        rows.append([k.split(".")[0], format_flops_scientific(v, fmt), k])
    rows.append(["TOT", format_flops_scientific(flat["TOT"], fmt), ""])
    return rows


def print_FLOPs(  # noqa: N802
    flops_breakdown: Breakdown,
    mode: Literal["type", "flat"] = "type",
    numerical_format: Literal["K", "M", "G", "T", "nearest3"] = "nearest3",
) -> None:
    """Print a breakdown from ``evaluate_FLOPs`` as a table, largest first.

    ``mode="type"`` sums each op type (with its percentage of the total); ``"flat"`` lists
    every op (dotted keys through call sites).

    Raises:
        ValueError: an unknown ``mode`` or ``numerical_format``.
    """
    if mode not in ("type", "flat"):
        raise ValueError(f"Unknown mode {mode!r}. Please use `type` or `flat`.")
    rows = (_type_rows if mode == "type" else _flat_rows)(flops_breakdown, numerical_format)
    print(table_to_string(rows))


def format_flops_scientific(
    val: float,
    format: Literal["K", "M", "G", "T", "nearest3"] = "nearest3",  # noqa: A002
) -> str:
    """``val`` as ``<mantissa with 3 decimals>E<signed 2-digit exponent>``.

    ``"K"``/``"M"``/``"G"``/``"T"`` fix the exponent at 3/6/9/12; ``"nearest3"`` picks the
    multiple of 3 nearest to ``val``'s order of magnitude.

    >>> format_flops_scientific(9072), format_flops_scientific(64), format_flops_scientific(2.5e6, "G")
    ('9.072E+03', '64.000E+00', '0.003E+09')

    Raises:
        ValueError: an unknown format.
    """
    if format not in FORMATS:
        raise ValueError(f"Unknown format {format!r}; use one of {list(FORMATS)}.")
    if format == "nearest3":
        power = math.floor(math.log10(abs(val))) if val > 0 else 0
        exponent = 3 * (power // 3 + int(power % 3 == 2))
    else:
        exponent = EXPONENTS[format]
    sign = "-" if exponent < 0 else "+"
    return f"{val * 10.0 ** (-exponent):.3f}E{sign}{abs(exponent):02d}"


__all__ = [
    "total_FLOPs",
    "evaluate_ir_FLOPs",
    "evaluate_FLOPs",
    "print_FLOPs",
    "format_flops_scientific",
]
