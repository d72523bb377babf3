"""Helpers for tests: run a ``Module`` on host data in one call, count ops of a type."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

import popxl
from popxl.tensor import Variable

from .module import Module
from .named_tensors import NamedTensors
from .ops.streams import host_store

Weights = Mapping[Variable, np.ndarray] | Callable[[NamedTensors], Mapping[Variable, np.ndarray]]


def _op_type_name(op: Any) -> str:
    opdef = getattr(op, "opdef", None)
    return opdef.type if opdef is not None else str(op.opType())


def ops_of_type(ops: Iterable[Any], op_type: str) -> int:
    """How many of ``ops`` have the PopXL type name ``op_type`` (``"Mul"``, ``"MatMul"``...).

    ``ops`` may be a graph's op records (``graph._ops``) or PopART-style views
    (``graph._pb_graph.getOps()``). The original compared C++ op classes, which do not exist
    here; pass the type name printed in schedules instead.
    """
    if not isinstance(op_type, str):
        raise TypeError(
            f"op_type must be an op type name such as 'MatMul' (as print_schedule shows), "
            f"got {op_type!r}."
        )
    return sum(1 for op in ops if _op_type_name(op) == op_type)


class TensorInput:
    """Host data meant to become a tensor input of a module in ``run_module``.

    Args:
        data: the value (NumPy array or anything ``np.asarray`` takes).
        dtype: the tensor's dtype; default: inferred from ``data`` (64-bit data is
            downcast to 32-bit, as ``popxl.variable`` does).
    """

    def __init__(self, data: Any, dtype: popxl.dtype | None = None) -> None:
        self.data = data
        self.dtype = dtype


def _as_variable(arg: Any) -> Any:
    if isinstance(arg, TensorInput):
        return popxl.variable(arg.data, dtype=arg.dtype)
    return arg


def run_module(
    module: Module, *args: Any, weights: Weights | None = None, **kwargs: Any
) -> list[np.ndarray]:
    """Build ``module`` in a new IR, run it once and return its outputs as NumPy arrays.

    Each ``TensorInput`` among ``args``/``kwargs`` becomes a variable of the main graph; the
    module's graph is built from all arguments, called with the tensor ones, and every
    output is streamed to the host.

    Args:
        module: the module to run.
        *args, **kwargs: the module's ``build`` arguments (``TensorInput`` for tensors).
        weights: values for the module's variables, ``{variable: array}``, or a callable
            that receives the variables (``NamedTensors``) and returns that mapping.

    Returns:
        The outputs, in the order ``build`` returns them.

    >>> import numpy as np
    >>> from popxl_addons.layers import Linear
    >>> (y,) = run_module(Linear(2), TensorInput(np.ones((1, 3)), popxl.float32),
    ...     weights=lambda v: {v.weight: np.ones((3, 2), np.float32), v.bias: np.zeros(2, np.float32)})
    >>> y.tolist()
    [[3.0, 3.0]]
    """
    ir = popxl.Ir()
    with ir.main_graph:
        new_args = [_as_variable(a) for a in args]
        new_kwargs = {k: _as_variable(v) for k, v in kwargs.items()}
        facts, graph = module.create_graph(*new_args, **new_kwargs)
        variables = facts.init()
        tensor_args = [a for a in new_args if isinstance(a, popxl.Tensor)]
        tensor_kwargs = [v for v in new_kwargs.values() if isinstance(v, popxl.Tensor)]
        # The graph's inputs are the tensor arguments in build's order; keyword tensors follow.
        outputs = graph.bind(variables).call(*tensor_args, *tensor_kwargs)
        streams = [host_store(o) for o in outputs]
    with popxl.Session(ir, "ipu_hw") as session:
        if weights is not None:
            values = weights(variables) if callable(weights) else weights
            session.write_variables_data(dict(values))
        results = session.run()
    return [results[s] for s in streams]


__all__ = ["TensorInput", "run_module", "ops_of_type"]
