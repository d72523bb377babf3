"""Table-driven tests of the ATen table: each case is a small torch function run through
``poptorch`` and compared with torch on the CPU.

A ``Case`` names the ATen ops it must exercise (checked against the captured graph), so
``test_table.py`` can require a case for every record. ``check_forward`` compares outputs
in float32 (and float16 where PopTorch supported it); ``check_gradients`` trains one SGD
step (lr 1) on a parameter added to each float input and compares the step with torch's
gradient (NaN where torch's is NaN), which checks the op's VJP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import poptorch


@dataclass
class Case:
    """One numeric check of some ATen records."""

    name: str
    fn: Callable[..., Any]
    inputs: Callable[[], tuple]
    ops: Sequence[Any]
    half: bool = True
    grad: bool = True
    atol: float = 1e-5
    rtol: float = 1e-4
    # Inputs are float tensors but the op is not differentiable in them (e.g. comparisons).
    grad_inputs: Sequence[int] | None = None
    options: Callable[[], Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return self.name


class _Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: Any) -> Any:
        return self.fn(*xs)


def captured_ops(executor: Any) -> set[Any]:
    """The ATen overloads in an executor's captured graph (block graphs included)."""
    found: set[Any] = set()

    def visit(cap: Any) -> None:
        for node in cap.program.graph.nodes:
            if node.op == "call_function":
                found.add(node.target)
        for inner in cap.block_captures.values():
            visit(inner)

    visit(executor._captured.capture)
    return found


def _as_dtype(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(dtype)
    return x


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    return []


def _options(case: Case) -> Any:
    return case.options() if case.options is not None else poptorch.Options()


def check_forward(case: Case, dtype: torch.dtype = torch.float32) -> None:
    torch.manual_seed(0)
    inputs = tuple(_as_dtype(x, dtype) for x in case.inputs())
    model = _Fn(case.fn)
    expected = _flat(model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]))
    pm = poptorch.inferenceModel(model, _options(case))
    got = _flat(pm(*inputs))
    missing = set(case.ops) - captured_ops(pm)
    assert not missing, f"{case.name}: the captured graph does not use {missing}"
    assert len(got) == len(expected)
    half = dtype == torch.float16
    for g, e in zip(got, expected):
        assert tuple(g.shape) == tuple(e.shape), (case.name, g.shape, e.shape)
        if e.dtype == torch.bool or not e.is_floating_point():
            torch.testing.assert_close(g.to(torch.int64), e.to(torch.int64), rtol=0, atol=0)
            continue
        atol = max(case.atol, 1e-2) if half else case.atol
        rtol = max(case.rtol, 1e-2) if half else case.rtol
        # NaN only where torch's is (torch.maximum's NaN operands).
        torch.testing.assert_close(g.float(), e.float(), atol=atol, rtol=rtol, equal_nan=True)


class _WithOffsets(torch.nn.Module):
    """``fn`` of each differentiable input plus a zero parameter of its shape, reduced to a
    scalar loss with fixed random weights."""

    def __init__(self, fn: Callable[..., Any], inputs: tuple, which: Sequence[int]) -> None:
        super().__init__()
        self.fn, self.which = fn, list(which)
        self.offsets = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros_like(inputs[i])) for i in self.which]
        )
        outs = _flat(fn(*inputs))
        gen = torch.Generator().manual_seed(1)
        self.weights = [
            torch.randn(o.shape, generator=gen) if o.is_floating_point() else None for o in outs
        ]

    def forward(self, *xs: Any) -> Any:
        xs = list(xs)
        for p, i in zip(self.offsets, self.which):
            xs[i] = xs[i] + p
        outs = _flat(self.fn(*xs))
        loss = sum(
            (o * w).sum() for o, w in zip(outs, self.weights) if w is not None
        )
        return poptorch.identity_loss(loss, reduction="sum")


def check_gradients(case: Case) -> None:
    torch.manual_seed(0)
    inputs = case.inputs()
    which = case.grad_inputs
    if which is None:
        which = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    model = _WithOffsets(case.fn, inputs, which)
    reference = _WithOffsets(case.fn, inputs, which)
    reference.load_state_dict(model.state_dict())
    loss = reference(*[x.clone() for x in inputs])
    grads = torch.autograd.grad(loss, list(reference.offsets))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    pm = poptorch.trainingModel(model, _options(case), optimizer)
    pm(*inputs)
    pm.copyWeightsToHost()
    for p, g in zip(model.offsets, grads):
        tol = {"atol": max(case.atol, 1e-4), "rtol": max(case.rtol, 1e-3)}
        torch.testing.assert_close(-p.detach(), g, equal_nan=True, **tol)  # NaN where torch's is
    pm.destroy()
