"""The torch programs the generator writes: plain data that prints as Python source.

A program is a ``torch.nn.Module`` (its ``__init__`` lines, ``forward`` statements and
outputs), the inputs of one micro-batch, and how poptorch runs it (a ``Mode``). The
module's source is what runs: ``module_class`` executes the printed text, so a failing
case shows exactly the code that failed.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import torch

import poptorch

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
FLOATS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Spec:
    """Shape and dtype of a value (the shape of one micro-batch for inputs)."""

    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class Input:
    """A model input. ``layout``: ``contiguous``; ``transposed`` (the last two dims of a
    contiguous tensor swapped); ``expanded`` (dim 1 broadcast with stride 0)."""

    name: str
    spec: Spec
    layout: str = "contiguous"
    low: int = 0  # value range of integer inputs (indices), [low, high)
    high: int = 4


@dataclass
class Stmt:
    """``out = template.format(*args)`` in ``forward`` (no ``out``: a statement run for its
    effect, such as an in-place update of a buffer)."""

    out: str
    template: str
    args: tuple[str, ...]
    family: str
    spec: Spec | None = None
    effect: bool = False

    def line(self) -> str:
        code = self.template.format(*self.args)
        return f"{self.out} = {code}" if self.out else code


@dataclass
class Mode:
    """How poptorch runs the model: ``inference`` or ``training`` (with ``optimizer``, the
    source of a constructor over ``params``), for ``calls`` calls of ``device_iterations``
    x ``accumulation`` x ``replicas`` micro-batches each."""

    kind: str = "inference"
    optimizer: str = ""
    device_iterations: int = 1
    accumulation: int = 1
    replicas: int = 1
    output_mode: str = "Default"
    output_period: int = 1
    calls: int = 1
    set_optimizer: str = ""  # a second optimizer given by setOptimizer after the first call
    reduction: str = "Mean"  # accumulationAndReplicationReductionType

    def micro_batches(self) -> int:
        return self.device_iterations * self.accumulation * self.replicas

    def options_source(self) -> str:
        parts = ["poptorch.Options()"]
        if self.device_iterations > 1:
            parts.append(f".deviceIterations({self.device_iterations})")
        if self.replicas > 1:
            parts.append(f".replicationFactor({self.replicas})")
        if self.output_mode != "Default":
            period = f", {self.output_period}" if self.output_mode == "EveryN" else ""
            parts.append(f".outputMode(poptorch.OutputMode.{self.output_mode}{period})")
        return "".join(parts)


@dataclass
class Program:
    seed: int
    features: tuple[str, ...]
    inputs: list[Input]
    init: list[str]  # lines of ``__init__`` after ``super().__init__()``
    stmts: list[Stmt]
    outputs: list[str]
    out_kind: str = "tuple"  # tuple, list, dict or single
    loss: str = ""  # the value trained on (training only)
    loss_reduction: str = "mean"  # of ``poptorch.identity_loss``
    methods: list[str] = field(default_factory=list)  # extra methods, full source
    mode: Mode = field(default_factory=Mode)
    raw: str = ""  # the module's source as written (a kept case), instead of the parts
    families: tuple[str, ...] = ()  # the op families of a ``raw`` source

    def forward_lines(self) -> list[str]:
        lines = [s.line() for s in self.stmts]
        if self.mode.kind == "training":
            lines.append(
                f'loss = poptorch.identity_loss({self.loss}, reduction="{self.loss_reduction}")'
            )
        return lines

    def returned(self) -> str:
        names = list(self.outputs)
        if self.mode.kind == "training":
            names.append("loss")
        if self.out_kind == "single" and len(names) == 1:
            return names[0]
        if self.out_kind == "list":
            return "[" + ", ".join(names) + "]"
        if self.out_kind == "dict":
            return "{" + ", ".join(f'"{n}": {n}' for n in names) + "}"
        return "(" + ", ".join(names) + ",)"

    def source(self) -> str:
        """The module's Python source (class ``Model``)."""
        if self.raw:
            return textwrap.dedent(self.raw).strip()
        args = ", ".join(["self", *(i.name for i in self.inputs)])
        body = ["super().__init__()", *self.init]
        lines = ["class Model(torch.nn.Module):", "    def __init__(self):"]
        lines += [f"        {b}" for b in body]
        lines += [f"    def forward({args}):"]
        lines += [f"        {b}" for b in self.forward_lines()]
        lines += [f"        return {self.returned()}"]
        for method in self.methods:
            lines += ["", *(f"    {m}" for m in method.splitlines())]
        return "\n".join(lines)


NAMESPACE = {"torch": torch, "F": torch.nn.functional, "poptorch": poptorch}


def module_class(source: str, namespace: dict | None = None) -> type[torch.nn.Module]:
    """Execute a program's source and return its ``Model`` class (``namespace`` replaces
    names the source uses, such as ``poptorch``)."""
    scope = {**NAMESPACE, **(namespace or {})}
    exec(compile(source, "<generated model>", "exec"), scope)  # noqa: S102 (our own source)
    return scope["Model"]


def input_tensor(spec: Input, batch: int, generator: torch.Generator) -> torch.Tensor:
    """``batch`` micro-batches of input ``spec``, concatenated along dim 0, laid out as asked."""
    shape = (spec.spec.shape[0] * batch, *spec.spec.shape[1:])
    dtype = DTYPES[spec.spec.dtype]
    if spec.layout == "transposed" and len(shape) >= 3:
        stored = (*shape[:-2], shape[-1], shape[-2])
        return _values(stored, dtype, spec, generator).transpose(-1, -2)
    if spec.layout == "expanded" and len(shape) >= 2:
        one = _values((shape[0], 1, *shape[2:]), dtype, spec, generator)
        return one.expand(shape)
    return _values(shape, dtype, spec, generator)


def _values(shape: tuple, dtype: torch.dtype, spec: Input, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(spec.low, spec.high, shape, generator=gen, dtype=dtype)
    return torch.randn(shape, generator=gen).to(dtype)


def make_inputs(program: Program, call: int = 0) -> list[torch.Tensor]:
    """The inputs of one model call (all its micro-batches), from the program's seed."""
    gen = torch.Generator().manual_seed(program.seed * 7919 + call)
    return [input_tensor(i, program.mode.micro_batches(), gen) for i in program.inputs]


def make_model(program: Program, namespace: dict | None = None) -> torch.nn.Module:
    """A fresh instance of the program's model, its parameters drawn from the program's seed."""
    cls = module_class(program.source(), namespace)
    torch.manual_seed(program.seed)
    model = cls()
    return model.train() if program.mode.kind == "training" else model.eval()
