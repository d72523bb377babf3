"""Program structure: reused submodules and parameters, buffers updated in ``forward``,
in-place writes to slices, trace-time Python control flow, ``poptorch.for_loop``/``cond``
and ``BeginBlock``."""

from __future__ import annotations

import torch

from .state import State, Value


def reuse(s: State) -> Value | None:
    """Call a submodule (or read a parameter) made earlier again, on another value."""
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.LayerNorm, torch.nn.PReLU)
    mods = [
        n for n, m in s.holder.named_children() if isinstance(m, kinds) and not n.startswith("blk")
    ]
    params = [n for n, _ in s.holder.named_parameters(recurse=False)]
    if not mods and not params:
        return None
    x = s.floats(min_rank=1)
    if x is None:
        return None
    if mods and (not params or s.rng.random() < 0.6):
        return s.emit(f"self.{s.choice(mods)}({{0}})", [x], "structure", trained=True)
    return s.emit(f"{{0}} @ self.{s.choice(params)}", [x], "structure", trained=True)


def frozen(s: State) -> Value | None:
    """Parameters the optimiser must leave alone: one frozen (``requires_grad=False``), one
    of a layer ``forward`` never calls (torch's optimisers skip a parameter without a
    gradient, weight decay and momentum included)."""
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() >= 1)
    if x is None:
        return None
    n = x.shape[-1]
    name = s.attribute("frz", f"torch.nn.Linear({n}, 2)")
    if name is None:
        return None
    s.init.append(f"self.{name}.weight.requires_grad_(False)")
    s.attribute("unused", f"torch.nn.Linear({n}, 3)")
    return s.emit(f"self.{name}({{0}})", [x], "structure", trained=True)


def buffer_slice(s: State) -> Value | None:
    """In-place ops on a slice of a buffer, then a read of the whole buffer."""
    if s.replicated:
        return None
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() >= 2)
    if x is None:
        return None
    shape = list(x.shape[1:])
    name = s.buffer("acc", f"torch.ones({shape})")
    k = s.rng.randint(1, shape[0])
    update = s.choice(
        [
            f"self.{name}[:{k}].mul_(0.5)",
            f"self.{name}[{k - 1}].add_({{0}}.detach().mean(0)[{k - 1}])",
            f"self.{name}[:{k}] += {{0}}.detach()[0, :{k}]",
        ]
    )
    s.emit(update, [x], "structure", effect=True)
    return s.emit(f"{{0}} * self.{name}", [x], "structure")


def input_inplace(s: State) -> Value | None:
    """An in-place op on (a slice of) a model input, which is read again afterwards. Not on
    a stride-0 input (eager torch would write every element sharing the memory, while an
    input reaching the device is a value), nor on one already read (autograd may have
    saved it)."""
    read = {a for stmt in s.stmts for a in stmt.args}
    x = s.pick(
        lambda v: (
            v.is_float
            and v.name.startswith("x")
            and v.tensor.dim() >= 2
            and 0 not in v.tensor.stride()
            and v.name not in read
        )
    )
    if x is None:
        return None
    write = s.choice(["{0}.mul_(2)", "{0}[:, :1].add_(1)", "{0}.transpose(0, 1)[0].zero_()"])
    s.emit(write, [x], "structure", effect=True)
    return s.emit("{0} + 0", [x], "structure")


def twice(s: State) -> Value | None:
    """A square layer applied twice in one expression (its weights read twice)."""
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() >= 1)
    if x is None:
        return None
    n = x.shape[-1]
    name = s.attribute("sq", f"torch.nn.Linear({n}, {n})")
    return s.emit(f"self.{name}(torch.tanh(self.{name}({{0}})))", [x], "structure", trained=True)


def buffer_update(s: State) -> Value | None:
    """A buffer updated in place in ``forward`` (a running statistic), then read."""
    if s.replicated:
        return None
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() >= 1)
    if x is None:
        return None
    n = x.shape[-1]
    name = s.buffer("buf", f"torch.zeros({n})")
    red = "" if x.tensor.dim() == 1 else f".mean(dim={tuple(range(x.tensor.dim() - 1))})"
    update = s.choice(
        [
            f"self.{name}.mul_(0.5).add_({{0}}.detach(){red})",
            f"self.{name}.copy_({{0}}.detach(){red} * 0.25)",
            f"self.{name}[0] += 1",
        ]
    )
    s.emit(update, [x], "structure", effect=True)
    return s.emit(f"{{0}} + self.{name}", [x], "structure")


def slice_write(s: State) -> Value | None:
    """In-place ops on a slice (a view) of a fresh copy."""
    x = s.pick(lambda v: v.is_float and v.tensor.dim() >= 2 and v.shape[1] >= 2)
    if x is None:
        return None
    y = s.emit("{0}.clone()", [x], "structure")
    if y is None:
        return None
    k = s.rng.randint(1, y.shape[1] - 1)
    write = s.choice(
        [
            f"{{0}}[:, :{k}].mul_(2)",
            f"{{0}}[:, {k}:] = 0.5",
            f"{{0}}[:, {k}].add_({{0}}[:, 0].clone())",
            f"{{0}}.narrow(1, 0, {k}).tanh_()",
            "{0}[:, ::2].relu_()",
        ]
    )
    s.emit(write, [y], "structure", effect=True)
    return s.emit("{0} * 1", [y], "structure")


def control(s: State) -> Value | None:
    """Python control flow resolved while tracing (shape tests, unrolled loops)."""
    x = s.pick(lambda v: v.is_float and v.tensor.dim() >= 1)
    if x is None:
        return None
    n = x.shape[-1]
    options = [
        f"{{0}} * 2 if {{0}}.shape[-1] > {n // 2 + s.rng.randint(-1, 1)} else {{0}} + 1",
        "sum(torch.tanh({0} * k) for k in range(1, 4))",
        "[{0} * k for k in range(3)][-1] - {0}",
        f"{{0}}.sum(dim=-1, keepdim=True) if {{0}}.dim() > {s.rng.randint(1, 3)} else {{0}}.neg()",
    ]
    return s.emit(s.choice(options), [x], "structure")


def loop(s: State) -> Value | None:
    """``poptorch.for_loop`` with a body method (inference only)."""
    if s.training:
        return None
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() >= 1)
    if x is None:
        return None
    name = s.fresh("_body")
    body = s.choice(
        ["torch.tanh(x * 0.9 + 0.1)", "x * 0.5 + torch.sin(x)", "torch.roll(x, 1, -1) * 0.75"]
    )
    _method(s, name, f"def {name}(self, x):\n    return [{body}]")
    return s.emit(
        f"poptorch.for_loop({s.rng.randint(1, 4)}, self.{name}, [{{0}}])[0]", [x], "structure"
    )


def branch(s: State) -> Value | None:
    """``poptorch.cond`` on a value's sign (inference only)."""
    if s.training:
        return None
    x = s.pick(lambda v: v.dtype == "float32" and v.exact)
    if x is None:
        return None
    then, other = s.fresh("_then"), s.fresh("_else")
    _method(s, then, f"def {then}(self, x):\n    return [x * 2]")
    _method(s, other, f"def {other}(self, x):\n    return [torch.tanh(x)]")
    return s.emit(
        f"poptorch.cond({{0}}.flatten()[0] > 0, self.{then}, [{{0}}], self.{other}, [{{0}}])[0]",
        [x],
        "structure",
    )


def block(s: State) -> Value | None:
    """A submodule wrapped in ``poptorch.BeginBlock`` on IPU 1: from its call on, the model
    runs as a second pipeline stage (one per program; the mode is made pipelinable)."""
    if any("BeginBlock" in line for line in s.init):
        return None
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() >= 1)
    if x is None:
        return None
    n = x.shape[-1]
    name = s.attribute(
        "blk", f"poptorch.BeginBlock(torch.nn.Linear({n}, {s.rng.randint(1, 4)}), ipu_id=1)"
    )
    return s.emit(f"self.{name}({{0}})", [x], "structure", trained=True) if name else None


def _method(s: State, name: str, source: str) -> None:
    scope: dict = {"torch": torch}
    exec(source, scope)  # noqa: S102 (our own source)
    setattr(s.holder, name, scope[name].__get__(s.holder))
    s.methods.append(source)


STRUCTURE = {
    "structure": [
        reuse,
        twice,
        buffer_update,
        slice_write,
        control,
        block,
        frozen,
        buffer_slice,
        input_inplace,
    ],
    "control": [loop, branch],
}
