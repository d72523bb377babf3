"""The core op families: one small emitter per kind of statement, tables for regular ops.

An emitter picks operands from the state, writes a statement template (``{0}``, ``{1}``
stand for the operands) and lets ``State.emit`` check it against eager torch. Emitters may
fail (return ``None``); the generator then tries another.
"""

from __future__ import annotations

from .state import State, Value

# Unary elementwise ops, safe on any finite input: (template, exact-preserving).
UNARY = [
    ("torch.neg({0})", True),
    ("torch.abs({0})", True),
    ("torch.tanh({0})", False),
    ("torch.sigmoid({0})", False),
    ("torch.sin({0})", False),
    ("torch.cos({0})", False),
    ("torch.exp(torch.tanh({0}))", False),
    ("torch.log({0}.abs() + 1)", False),
    ("torch.sqrt({0}.abs() + 0.5)", False),
    ("torch.rsqrt({0}.abs() + 0.5)", False),
    ("torch.reciprocal({0}.abs() + 1)", False),
    ("{0} * {0}", False),
    ("torch.clamp({0}, -0.5, 0.75)", True),
    ("torch.erf({0})", False),
    ("torch.atan({0})", False),
    ("torch.square({0})", False),
    ("{0} * 0.5 + 0.25", False),
    ("{0} ** 3", False),
]
# Ops whose result jumps: only on exact operands.
DISCONTINUOUS = [
    "torch.floor({0} * 2)",
    "torch.round({0} * 2)",
    "torch.sign({0})",
    "({0} > 0)",
    "({0} <= 0.25)",
    "torch.trunc({0} * 3)",
    "{0}.to(torch.int32)",
    "({0} * 4).to(torch.int64)",
]
BINARY = [
    "{0} + {1}",
    "{0} - {1}",
    "{0} * {1}",
    "{0} / ({1}.abs() + 1)",
    "torch.maximum({0}, {1})",
    "torch.minimum({0}, {1})",
    "torch.atan2({0}, {1})",
    "torch.hypot({0}, {1})",
    "torch.lerp({0}, {1}, 0.25)",
]
INT_OPS = [
    "{0} + {1}",
    "{0} * {1}",
    "{0} - {1}",
    "torch.remainder({0}, 3)",
    "torch.div({0}, 2, rounding_mode='floor')",
    "{0} // 2",
    "torch.bitwise_and({0}, {1})",
    "{0} == {1}",
]
BOOL_OPS = ["{0} & {1}", "{0} | {1}", "{0} ^ {1}", "~{0}", "torch.logical_not({0})"]
ACTIVATIONS = [
    "F.relu({0})",
    "F.gelu({0})",
    "F.gelu({0}, approximate='tanh')",
    "F.silu({0})",
    "F.elu({0})",
    "F.leaky_relu({0}, 0.1)",
    "F.softplus({0})",
    "F.hardswish({0})",
    "F.hardsigmoid({0})",
    "F.mish({0})",
    "F.relu6({0} * 4)",
    "F.celu({0})",
    "F.selu({0})",
    "F.hardtanh({0})",
    "F.softsign({0})",
    "F.logsigmoid({0})",
    "F.tanhshrink({0})",
]
REDUCTIONS = [
    "{0}.sum(dim={d}, keepdim={k})",
    "{0}.mean(dim={d}, keepdim={k})",
    "{0}.amax(dim={d}, keepdim={k})",
    "{0}.amin(dim={d}, keepdim={k})",
    "torch.logsumexp({0}, dim={d}, keepdim={k})",
    "{0}.var(dim={d}, keepdim={k})",
    "{0}.std(dim={d}, keepdim={k}, correction=0)",
    "torch.linalg.vector_norm({0}, dim={d}, keepdim={k})",
    "{0}.max(dim={d1}, keepdim={k}).values",
    "{0}.prod(dim={d1}, keepdim={k})",
    "torch.cumsum({0}, dim={d1})",
]
EXACT_REDUCTIONS = [
    "{0}.argmax(dim={d1}, keepdim={k})",
    "{0}.argmin(dim={d1})",
    "torch.sort({0}, dim={d1}).values",
    "torch.topk({0}, 2, dim={d1}).values",  # its indices are unspecified on ties
    "{0}.any(dim={d1})",
]


def unary(s: State) -> Value | None:
    x = s.pick(lambda v: v.is_float)
    if x is None:
        return None
    template, exact = s.choice(UNARY)
    return s.emit(template, [x], "elementwise", exact=exact)


def discontinuous(s: State) -> Value | None:
    x = s.pick(lambda v: v.is_float and v.exact)
    return None if x is None else s.emit(s.choice(DISCONTINUOUS), [x], "elementwise", exact=True)


def binary(s: State) -> Value | None:
    a = s.pick(lambda v: v.dtype != "bool")
    b = s.pick(lambda v: v.dtype != "bool" and _broadcasts(v.shape, a.shape)) if a else None
    if a is None or b is None or not (a.is_float or b.is_float):
        return None
    exact = s.rng.random() < 0.2
    template = s.choice(BINARY[:3] if exact else BINARY)
    return s.emit(template, [a, b], "elementwise", exact=template in BINARY[:2] and exact)


def scalar_op(s: State) -> Value | None:
    x = s.pick(lambda v: v.dtype != "bool")
    if x is None:
        return None
    c = s.choice(["2", "0.5", "-1.5", "3"])
    template = s.choice([f"{{0}} * {c}", f"{{0}} + {c}", f"{c} - {{0}}", f"{{0}} / {c}"])
    return s.emit(template, [x], "elementwise", exact=c in ("2", "0.5"))


def integer(s: State) -> Value | None:
    a = s.pick(lambda v: v.dtype in ("int32", "int64"))
    b = (
        s.pick(lambda v: v.dtype in ("int32", "int64") and _broadcasts(v.shape, a.shape))
        if a
        else None
    )
    if a is None or b is None:
        return None
    return s.emit(s.choice(INT_OPS), [a, b], "dtype", exact=True)


def boolean(s: State) -> Value | None:
    a = s.pick(lambda v: v.dtype == "bool")
    b = s.pick(lambda v: v.dtype == "bool" and _broadcasts(v.shape, a.shape)) if a else None
    if a is None or b is None:
        return None
    return s.emit(s.choice(BOOL_OPS), [a, b], "dtype", exact=True)


def where(s: State) -> Value | None:
    c = s.pick(lambda v: v.dtype == "bool")
    a = s.pick(lambda v: v.is_float)
    b = s.pick(lambda v: v.is_float)
    if c is None or a is None or b is None:
        return None
    return s.emit("torch.where({0}, {1}, {2})", [c, a, b], "elementwise", exact=True)


def promote(s: State) -> Value | None:
    """A mixed-dtype expression: int or bool with float, or two float widths."""
    a = s.pick(lambda v: not v.is_float)
    b = s.pick(lambda v: v.is_float)
    if a is None or b is None:
        return None
    template = s.choice(
        [
            "{0} + {1}",
            "{1} * {0}",
            "torch.where({0} > 1, {1}, 0.5)" if a.dtype != "bool" else "{1} * {0}",
        ]
    )
    return s.emit(template, [a, b], "dtype", exact=True)


def cast(s: State) -> Value | None:
    x = s.pick(lambda v: v.is_float or v.dtype == "bool")
    if x is None:
        return None
    to = s.choice(["torch.float32", "torch.float16", "torch.bfloat16"])
    if "lowp" not in s.features and to != "torch.float32":
        to = "torch.float32"
    elif to == "torch.bfloat16" and s.rng.random() < 0.75:
        # PopTorch refuses a bfloat16 cast (the IPU has none), and with it the whole
        # program: a few programs check the refusal, the others cast to float16.
        to = "torch.float16"
    return s.emit(f"{{0}}.to({to})", [x], "dtype", exact=True)


def activation(s: State) -> Value | None:
    x = s.pick(lambda v: v.is_float)
    if x is None:
        return None
    template = s.choice(ACTIVATIONS)
    if s.rng.random() < 0.2 and x.tensor.dim() >= 1:
        d = s.rng.randrange(-x.tensor.dim(), x.tensor.dim())
        template = s.choice([f"F.softmax({{0}}, dim={d})", f"F.log_softmax({{0}}, dim={d})"])
    return s.emit(template, [x], "activation", exact=template == "F.relu({0})")


def prelu(s: State) -> Value | None:
    x = s.floats(min_rank=2)
    if x is None:
        return None
    name = s.attribute("prelu", f"torch.nn.PReLU({x.shape[1]})")
    return s.emit(f"self.{name}({{0}})", [x], "activation", trained=True) if name else None


def reduction(s: State) -> Value | None:
    exact = s.rng.random() < 0.25
    x = s.pick(lambda v: v.is_float and v.tensor.dim() >= 1 and (v.exact or not exact))
    if x is None:
        return None
    rank = x.tensor.dim()
    dims = sorted(s.rng.sample(range(rank), s.rng.randint(1, min(2, rank))))
    d = dims[0] if len(dims) == 1 else tuple(dims)
    d1 = s.rng.randrange(-rank, rank)
    k = s.rng.random() < 0.5
    if exact:
        template = s.choice(EXACT_REDUCTIONS)
    else:
        template = s.choice(REDUCTIONS)
    template = template.replace("{d}", str(d)).replace("{d1}", str(d1)).replace("{k}", str(k))
    if s.rng.random() < 0.1 and not exact:
        template = s.choice(["{0}.sum()", "{0}.mean()", "{0}.amax()"])
    return s.emit(template, [x], "reduce", exact=exact)


def linear(s: State) -> Value | None:
    x = s.floats(min_rank=1)
    if x is None:
        return None
    n = s.rng.randint(1, 6)
    bias = s.rng.random() < 0.7
    dtype = "" if x.dtype == "float32" else f", dtype=torch.{x.dtype}"
    name = s.attribute("fc", f"torch.nn.Linear({x.shape[-1]}, {n}, bias={bias}{dtype})")
    return s.emit(f"self.{name}({{0}})", [x], "matmul", trained=True) if name else None


def matmul(s: State) -> Value | None:
    a = s.floats(min_rank=1)
    b = s.pick(lambda v: v.is_float and v.dtype == a.dtype and v.tensor.dim() >= 1) if a else None
    if a is None or b is None:
        return None
    template = s.choice(
        [
            "torch.matmul({0}, {1})",
            "{0} @ {1}.transpose(-1, -2)",
            "{0} @ {1}.t()" if b.tensor.dim() == 2 else "{0} @ {1}",
        ]
    )
    return s.emit(template, [a, b], "matmul")


def param_matmul(s: State) -> Value | None:
    """A product with a raw parameter (``torch.nn.Parameter``), maybe used again later."""
    x = s.floats(min_rank=1)
    if x is None or x.dtype != "float32":
        return None
    n = s.rng.randint(1, 5)
    name = s.attribute("w", f"torch.nn.Parameter(torch.randn({x.shape[-1]}, {n}) * 0.5)")
    return s.emit(f"{{0}} @ self.{name}", [x], "matmul", trained=True) if name else None


def einsum(s: State) -> Value | None:
    a = s.pick(lambda v: v.is_float and v.tensor.dim() == 3)
    b = s.pick(lambda v: v.is_float and v.tensor.dim() == 3 and v.dtype == a.dtype) if a else None
    if a is None or b is None:
        return None
    eq = s.choice(["bij,bkj->bik", "bij,bik->bjk", "bij,bij->bi"])
    return s.emit(f"torch.einsum('{eq}', {{0}}, {{1}})", [a, b], "matmul")


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    for x, y in zip(reversed(a), reversed(b)):
        if x != y and 1 not in (x, y):
            return False
    return True


CORE = {
    "elementwise": [unary, unary, binary, binary, scalar_op, discontinuous, where],
    "activation": [activation, activation, prelu],
    "reduce": [reduction, reduction],
    "matmul": [linear, linear, matmul, param_matmul, einsum],
    "dtype": [promote, cast, integer, boolean],
}
