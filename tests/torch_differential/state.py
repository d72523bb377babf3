"""The generator's working state: the values a ``forward`` has made so far, evaluated eagerly.

Every statement the generator proposes runs at once on example tensors (one micro-batch),
so shapes, dtypes and validity come from torch itself: a statement torch rejects, or whose
result is empty, huge or not finite, is dropped and another is tried. Values carry two
facts torch does not: ``exact`` (the value has the same bits under every correct
implementation, so comparisons, rounding and casts to integers may read it) and
``trained`` (it depends on a parameter, so a loss made from it trains something).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from .program import DTYPES, NAMESPACE, Input, Spec, Stmt

MAX_ELEMENTS = 2048
MAX_MAGNITUDE = 1e3


@dataclass
class Value:
    name: str
    tensor: torch.Tensor
    exact: bool
    trained: bool

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def dtype(self) -> str:
        return str(self.tensor.dtype).removeprefix("torch.")

    @property
    def is_float(self) -> bool:
        return self.tensor.dtype.is_floating_point


@dataclass
class State:
    rng: random.Random
    features: tuple[str, ...]
    training: bool
    replicated: bool = False
    values: list[Value] = field(default_factory=list)
    init: list[str] = field(default_factory=list)
    stmts: list[Stmt] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    holder: torch.nn.Module = field(default_factory=torch.nn.Module)
    counter: int = 0
    loss_reduction: str = "mean"

    # -- choosing --------------------------------------------------------------------
    def pick(self, ok=lambda v: True) -> Value | None:  # noqa: ANN001
        """A value satisfying ``ok``, preferring recent ones (programs stay connected)."""
        found = [v for v in self.values if ok(v)]
        if not found:
            return None
        recent = found[-4:]
        return self.rng.choice(recent if self.rng.random() < 0.7 else found)

    def floats(self, min_rank: int = 0, max_rank: int = 9) -> Value | None:
        return self.pick(lambda v: v.is_float and min_rank <= v.tensor.dim() <= max_rank)

    def choice(self, options):  # noqa: ANN001, ANN201
        return self.rng.choice(list(options))

    # -- adding ----------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def add_input(self, spec: Input, tensor: torch.Tensor) -> None:
        self.values.append(Value(spec.name, tensor, exact=True, trained=False))

    def attribute(self, prefix: str, ctor: str, trained: bool = True) -> str | None:
        """Add ``self.<name> = <ctor>`` to ``__init__``; the attribute's name."""
        name = self.fresh(prefix)
        try:
            obj = eval(ctor, dict(NAMESPACE))  # noqa: S307 (our own source)
        except Exception:  # noqa: BLE001 (an invalid constructor: try something else)
            return None
        if isinstance(obj, torch.nn.Module):
            obj.train(self.training)
        setattr(self.holder, name, obj)
        self.init.append(f"self.{name} = {ctor}")
        return name

    def buffer(self, prefix: str, ctor: str) -> str:
        name = self.fresh(prefix)
        self.holder.register_buffer(name, eval(ctor, dict(NAMESPACE)))  # noqa: S307
        self.init.append(f'self.register_buffer("{name}", {ctor})')
        return name

    def emit(
        self,
        template: str,
        args: list[Value] | tuple[Value, ...],
        family: str,
        exact: bool = False,
        effect: bool = False,
        trained: bool = False,
    ) -> Value | None:
        """Run ``template`` on ``args`` eagerly; if torch accepts it and the result is
        small and finite, record the statement and return its value."""
        names = tuple(a.name for a in args)
        scope = {**NAMESPACE, "self": self.holder, **{v.name: v.tensor for v in self.values}}
        try:
            with torch.no_grad():
                result = eval(template.format(*names), scope)  # noqa: S307
        except Exception:  # noqa: BLE001 (torch refused it: not a valid program)
            return None
        if effect:
            self.stmts.append(Stmt("", template, names, family, None, effect=True))
            return None
        if not _acceptable(result):
            return None
        out = self.fresh("v")
        spec = Spec(tuple(result.shape), str(result.dtype).removeprefix("torch."))
        self.stmts.append(Stmt(out, template, names, family, spec))
        value = Value(
            out,
            result,
            exact=exact and all(a.exact for a in args),
            trained=trained or any(a.trained for a in args),
        )
        self.values.append(value)
        return value


def _acceptable(result: object) -> bool:
    if not isinstance(result, torch.Tensor) or result.numel() == 0:
        return False
    if result.numel() > MAX_ELEMENTS or result.dtype not in DTYPES.values():
        return False
    if result.dtype.is_floating_point:
        r = result.float()
        return bool(torch.isfinite(r).all()) and float(r.abs().max()) < MAX_MAGNITUDE
    if result.dtype == torch.bool:
        return True
    return int(result.abs().max()) < 2**20
