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
from tests.case_groups import each_alone_if_failing


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
    _compare_outputs(case, got, expected, dtype)
    pm.destroy()


def _compare_outputs(case: Case, got: list, expected: list, dtype: torch.dtype) -> None:
    assert len(got) == len(expected), case.name
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

    def loss(self, *xs: Any) -> Any:
        xs = list(xs)
        for p, i in zip(self.offsets, self.which):
            xs[i] = xs[i] + p
        outs = _flat(self.fn(*xs))
        return sum((o * w).sum() for o, w in zip(outs, self.weights) if w is not None)

    def forward(self, *xs: Any) -> Any:
        return poptorch.identity_loss(self.loss(*xs), reduction="sum")


def _offset_models(case: Case) -> tuple[tuple, _WithOffsets, list[torch.Tensor]]:
    """The case's inputs, its model with offsets, and torch's gradients of them."""
    torch.manual_seed(0)
    inputs = case.inputs()
    which = case.grad_inputs
    if which is None:
        which = [
            i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()
        ]
    model = _WithOffsets(case.fn, inputs, which)
    reference = _WithOffsets(case.fn, inputs, which)
    reference.load_state_dict(model.state_dict())
    loss = reference(*[x.clone() for x in inputs])
    return inputs, model, list(torch.autograd.grad(loss, list(reference.offsets)))


def _compare_step(case: Case, model: _WithOffsets, grads: list[torch.Tensor]) -> None:
    """After one SGD step of lr 1 from zero, each offset is minus its gradient."""
    tol = {"atol": max(case.atol, 1e-4), "rtol": max(case.rtol, 1e-3)}
    for p, g in zip(model.offsets, grads):
        torch.testing.assert_close(-p.detach(), g, equal_nan=True, **tol)  # NaN where torch's is


def check_gradients(case: Case) -> None:
    inputs, model, grads = _offset_models(case)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    pm = poptorch.trainingModel(model, _options(case), optimizer)
    pm(*inputs)
    pm.copyWeightsToHost()
    _compare_step(case, model, grads)
    pm.destroy()


# ---- several cases in one model ------------------------------------------------------------
#
# A capture costs about half a second whatever its size (most of it torch.export's
# decomposition pass), so the table checks its cases several to a model: each case is a
# submodule with its own inputs and outputs (or, for gradients, its own offsets and loss
# term, whose gradients do not depend on the other terms). A group that fails is checked
# again case by case, so the failure names its case; a group that fails although each of
# its cases passes alone fails as it is (the cases interfered).


def groupable(case: Case) -> bool:
    """Whether ``case`` can share a model: default options and tensor inputs only."""
    return case.options is None and all(isinstance(x, torch.Tensor) for x in case.inputs())


def groups(cases: Sequence[Case], size: int) -> list[tuple[Case, ...]]:
    """``cases`` in consecutive groups of at most ``size``; a case that cannot share a
    model is a group of its own."""
    out: list[tuple[Case, ...]] = []
    pending: list[Case] = []
    for case in cases:
        if not groupable(case):
            out.append((case,))
            continue
        pending.append(case)
        if len(pending) == size:
            out.append(tuple(pending))
            pending = []
    if pending:
        out.append(tuple(pending))
    return out


class _Together(torch.nn.Module):
    """Each part called on its own slice of the inputs; returns the parts' results."""

    def __init__(self, parts: Sequence[torch.nn.Module], arity: Sequence[int], method: str) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(parts)
        self.arity, self.method = list(arity), method

    def forward(self, *xs: Any) -> Any:
        outs, start = [], 0
        for part, n in zip(self.parts, self.arity):
            # Called as a module for the forward pass, so its ops carry its path.
            call = part if self.method == "forward" else getattr(part, self.method)
            outs.append(call(*xs[start : start + n]))
            start += n
        if self.method == "loss":
            return poptorch.identity_loss(sum(outs), reduction="sum")
        return tuple(outs)


def _ops_by_part(executor: Any, parts: int) -> list[set[Any]]:
    """The ATen overloads each part's ops use (by the module path ``parts.<i>`` the capture
    records on each node)."""
    found: list[set[Any]] = [set() for _ in range(parts)]

    def visit(cap: Any) -> None:
        for node in cap.program.graph.nodes:
            if node.op != "call_function":
                continue
            for path, _ in (node.meta.get("nn_module_stack") or {}).values():
                head = path.split(".")
                if len(head) >= 2 and head[0] == "parts" and head[1].isdigit():
                    found[int(head[1])].add(node.target)
                    break
        for inner in cap.block_captures.values():
            visit(inner)

    visit(executor._captured.capture)
    return found


def _forward_together(cases: Sequence[Case], dtype: torch.dtype) -> None:
    inputs, expected = [], []
    for case in cases:
        torch.manual_seed(0)
        xs = tuple(_as_dtype(x, dtype) for x in case.inputs())
        expected.append(_flat(_Fn(case.fn)(*[x.clone() for x in xs])))
        inputs.append(xs)
    model = _Together([_Fn(c.fn) for c in cases], [len(xs) for xs in inputs], "forward")
    pm = poptorch.inferenceModel(model, poptorch.Options())
    got = pm(*[x for xs in inputs for x in xs])
    used = _ops_by_part(pm, len(cases))
    for case, ops, out, want in zip(cases, used, got, expected):
        missing = set(case.ops) - ops
        assert not missing, f"{case.name}: the captured graph does not use {missing}"
        _compare_outputs(case, _flat(out), want, dtype)
    pm.destroy()


def _gradients_together(cases: Sequence[Case]) -> None:
    prepared = [_offset_models(case) for case in cases]
    model = _Together([m for _, m, _ in prepared], [len(xs) for xs, _, _ in prepared], "loss")
    pm = poptorch.trainingModel(
        model, poptorch.Options(), torch.optim.SGD(model.parameters(), lr=1.0)
    )
    pm(*[x for xs, _, _ in prepared for x in xs])
    pm.copyWeightsToHost()
    for case, (_, part, grads) in zip(cases, prepared):
        _compare_step(case, part, grads)
    pm.destroy()


def check_forward_group(cases: Sequence[Case], dtype: torch.dtype = torch.float32) -> None:
    """``check_forward`` of every case in ``cases``, with one model for them all."""
    each_alone_if_failing(
        lambda: _forward_together(cases, dtype), lambda c: check_forward(c, dtype), cases
    )


def check_gradients_group(cases: Sequence[Case]) -> None:
    """``check_gradients`` of every case in ``cases``, with one model for them all."""
    each_alone_if_failing(lambda: _gradients_together(cases), check_gradients, cases)
