"""Views, slicing, indexing (gather/scatter/index_put/masks) and creation ops."""

from __future__ import annotations

import math

from .state import State, Value


def _dim(s: State, x: Value) -> int:
    return s.rng.randrange(x.tensor.dim())


def _factor(s: State, shape: tuple[int, ...]) -> list[int]:
    """A random shape with the same number of elements."""
    n = math.prod(shape)
    dims = []
    while n > 1 and len(dims) < 3:
        divisors = [d for d in range(2, n + 1) if n % d == 0]
        d = s.choice(divisors)
        dims.append(d)
        n //= d
    if n > 1 or not dims:
        dims.append(n)
    s.rng.shuffle(dims)
    return dims


def as_strided_views(shape: tuple[int, ...]) -> list[str]:
    """``as_strided`` templates for a value of ``shape`` (4 elements or more). Its
    ``storage_offset`` counts from the start of the storage, not of the tensor, and in eager
    torch a micro-batch is a view into the whole batch's storage (replica 1's starts past
    replica 0's elements), so each reads from a fresh contiguous copy."""
    fresh = "{0}.clone(memory_format=torch.contiguous_format)"
    row = math.prod(shape[1:])
    return [
        f"{fresh}.as_strided((2, 2), (1, 2))",
        f"{fresh}.as_strided(({shape[0]}, 2), ({row}, 1), 1)",
    ]


def view(s: State) -> Value | None:
    x = s.pick(lambda v: v.tensor.dim() >= 1)
    if x is None:
        return None
    rank = x.tensor.dim()
    a, b = _dim(s, x), _dim(s, x)
    perm = list(range(rank))
    s.rng.shuffle(perm)
    new = _factor(s, x.shape)
    ones = [i for i, n in enumerate(x.shape) if n == 1]
    options = [
        f"{{0}}.reshape({new})",
        f"{{0}}.reshape(-1, {x.shape[-1]})",
        f"{{0}}.transpose({a}, {b})",
        f"{{0}}.permute({perm})",
        f"{{0}}.flatten({min(a, b)}, {max(a, b)})",
        f"{{0}}.unsqueeze({a})",
        f"{{0}}.contiguous().view({new})",
        f"{{0}}.transpose({a}, {b}).contiguous().view(-1)",
        f"{{0}}.flip({a})",
        f"{{0}}.roll(1, {a})",
        f"{{0}}.repeat({[s.rng.randint(1, 2) for _ in range(rank)]})",
        f"{{0}}.movedim({a}, {b})",
    ]
    if ones:
        shape = list(x.shape)
        shape[ones[0]] = 3
        options += [f"{{0}}.expand({shape})", f"{{0}}.squeeze({ones[0]})"]
    if x.shape[a] >= 2:
        size = s.rng.randint(1, x.shape[a])
        options.append(f"{{0}}.unfold({a}, {size}, {s.rng.randint(1, 2)})")
    if rank == 2:
        options.append("{0}.t()")
    if x.tensor.numel() >= 4:
        options += as_strided_views(x.shape)
    return s.emit(s.choice(options), [x], "view", exact=True)


def slicing(s: State) -> Value | None:
    x = s.pick(lambda v: v.tensor.dim() >= 1)
    if x is None:
        return None
    d = _dim(s, x)
    n = x.shape[d]
    start = s.rng.randint(0, n - 1)
    stop = s.rng.randint(start + 1, n)
    step = s.rng.randint(1, 2)
    lead = ":, " * d
    options = [
        f"{{0}}[{lead}{start}:{stop}:{step}]",
        f"{{0}}[{lead}{start - n}]" if d < 2 else f"{{0}}[..., {start}]",
        f"{{0}}.narrow({d}, {start}, {stop - start})",
        f"{{0}}.select({d}, {start})",
        f"{{0}}.chunk(2, {d})[{s.rng.randint(0, 1) if n > 1 else 0}]",
        f"{{0}}.split(1, {d})[-1]",
        f"{{0}}[{lead}None]",
    ]
    return s.emit(s.choice(options), [x], "view", exact=True)


def join(s: State) -> Value | None:
    a = s.pick(lambda v: v.tensor.dim() >= 1)
    b = s.pick(lambda v: v.dtype == a.dtype and v.tensor.dim() == a.tensor.dim()) if a else None
    if a is None or b is None:
        return None
    d = _dim(s, a)
    template = s.choice(
        [f"torch.cat([{{0}}, {{1}}], dim={d})", f"torch.stack([{{0}}, {{1}}], dim={d})"]
    )
    return s.emit(template, [a, b], "view", exact=True)


def _index_list(s: State, n: int, count: int) -> list[int]:
    return [s.rng.randrange(-n if s.rng.random() < 0.2 else 0, n) for _ in range(count)]


def index(s: State) -> Value | None:
    x = s.pick(lambda v: v.tensor.dim() >= 1)
    if x is None:
        return None
    d = _dim(s, x)
    n = x.shape[d]
    idx = [s.rng.randrange(n) for _ in range(s.rng.randint(1, 4))]
    lead = ":, " * d
    options = [
        f"{{0}}.index_select({d}, torch.tensor({idx}))",
        f"{{0}}[{lead}torch.tensor({_index_list(s, n, 3)})]",
        f"{{0}}[{lead}{idx}]",
        f"torch.take_along_dim({{0}}, torch.tensor({idx}).reshape({[len(idx) if i == d else 1 for i in range(x.tensor.dim())]}), dim={d})",
    ]
    if x.tensor.dim() >= 2 and d == 0:
        m = x.shape[1]
        options.append(
            f"{{0}}[torch.tensor({idx}), torch.tensor({[s.rng.randrange(m) for _ in idx]})]"
        )
    return s.emit(s.choice(options), [x], "index", exact=True)


def gather(s: State) -> Value | None:
    x = s.pick(lambda v: v.tensor.dim() >= 1)
    i = (
        s.pick(lambda v: v.dtype == "int64" and v.tensor.dim() == x.tensor.dim() and v.exact)
        if x
        else None
    )
    if x is None or i is None:
        return None
    d = _dim(s, x)
    n = x.shape[d]
    limits = [min(a, b) for a, b in zip(i.shape, x.shape)]
    sl = ", ".join(f":{m}" for m in limits)
    return s.emit(f"torch.gather({{0}}, {d}, {{1}}[{sl}].abs() % {n})", [x, i], "index", exact=True)


def scatter(s: State) -> Value | None:
    x = s.pick(lambda v: v.is_float and v.tensor.dim() >= 1)
    if x is None:
        return None
    d = _dim(s, x)
    n = x.shape[d]
    shape = list(x.shape)
    shape[d] = s.rng.randint(1, n)
    rows = _unique_rows(s, shape, d, n)
    src = s.pick(lambda v: v.dtype == x.dtype and tuple(v.shape) == tuple(shape))
    src_text = "{1}" if src else f"torch.full({shape}, 0.5, dtype={{0}}.dtype)"
    kind = s.choice(
        [
            "scatter",
            "scatter_add",
            "scatter_reduce_sum",
            "scatter_reduce_amax",
            "index_add",
            "index_copy",
        ]
    )
    if (
        kind in ("scatter_add", "scatter_reduce_sum", "scatter_reduce_amax")
        and s.rng.random() < 0.5
    ):
        rows = _any_rows(s, shape, n)  # duplicates: their sum and max are defined
    idx = f"torch.tensor({rows})"
    if kind == "scatter":
        template = f"{{0}}.scatter({d}, {idx}, {src_text})"
    elif kind == "scatter_add":
        template = f"{{0}}.scatter_add({d}, {idx}, {src_text})"
    elif kind.startswith("scatter_reduce"):
        red = kind.rsplit("_", 1)[1]
        template = f"{{0}}.scatter_reduce({d}, {idx}, {src_text}, '{red}', include_self={s.rng.random() < 0.5})"
    else:
        picks = s.rng.sample(range(n), shape[d])
        if kind == "index_add" and s.rng.random() < 0.5:
            picks = [s.rng.randrange(n) for _ in range(shape[d])]
        template = f"{{0}}.{kind}({d}, torch.tensor({picks}), {src_text})"
    args = [x, src] if src else [x]
    return s.emit(template, args, "index", exact=kind in ("scatter", "index_copy"))


def _any_rows(s: State, shape: list[int], n: int) -> list:
    """An index tensor (nested lists) of ``shape`` with entries in [0, n), repeats allowed."""
    import torch  # noqa: PLC0415

    gen = torch.Generator().manual_seed(s.rng.randrange(2**31))
    return torch.randint(0, n, shape, generator=gen).tolist()


def _unique_rows(s: State, shape: list[int], d: int, n: int) -> list:
    """An index tensor (nested lists) of ``shape`` with distinct entries along ``d`` (so
    ``scatter`` has no duplicate writes, whose winner is unspecified)."""
    import torch  # noqa: PLC0415

    perm = torch.stack(
        [
            torch.randperm(n, generator=torch.Generator().manual_seed(s.rng.randrange(2**31)))[
                : shape[d]
            ]
            for _ in range(math.prod(shape) // shape[d])
        ]
    )
    moved = [*shape[:d], *shape[d + 1 :], shape[d]]
    return perm.reshape(moved).movedim(-1, d).tolist()


def masked(s: State) -> Value | None:
    x = s.pick(lambda v: v.is_float)
    m = s.pick(lambda v: v.dtype == "bool") if x else None
    if x is None or m is None:
        return None
    options = [
        "{0}.masked_fill({1}, 0.25)",
        "torch.where({1}, {0}, torch.zeros_like({0}))",
        "{0} * {1}",
    ]
    return s.emit(s.choice(options), [x, m], "index", exact=True)


def index_put(s: State) -> Value | None:
    """In-place writes into a fresh copy: ``index_put_``, slice assignment, masked writes."""
    x = s.pick(lambda v: v.is_float and v.tensor.dim() >= 1)
    if x is None:
        return None
    n = x.shape[0]
    idx = sorted(set(s.rng.randrange(n) for _ in range(2)))
    options = [
        f"{{0}}.clone().index_put_((torch.tensor({idx}),), torch.tensor(0.5, dtype={{0}}.dtype))",
        f"{{0}}.clone().index_put_((torch.tensor({idx}),), torch.tensor(1.0, dtype={{0}}.dtype), accumulate=True)",
        f"{{0}}.index_put((torch.tensor({[idx[0], idx[0], n - 1]}),), {{0}}[:3] * 0.5, accumulate=True)",
        "torch.index_put({0}, (torch.tensor([0]),), {0}[-1:] * 2)",
    ]
    return s.emit(s.choice(options), [x], "index")


def creation(s: State) -> Value | None:
    x = s.pick(lambda v: v.tensor.dim() >= 1)
    if x is None:
        return None
    n = x.shape[-1]
    options = [
        "torch.zeros_like({0}) + 1",
        "torch.ones_like({0}) * 0.5 + {0}",
        f"{{0}} + torch.arange({n}, dtype={{0}}.dtype)"
        if x.dtype != "bool"
        else "torch.full_like({0}, True) & {0}",
        f"{{0}} * torch.linspace(0, 1, {n}, dtype={{0}}.dtype)"
        if x.is_float
        else f"{{0}} + torch.arange({n})",
        f"torch.eye({n}, dtype={{0}}.dtype) @ {{0}}.transpose(-1, -2)"
        if x.is_float and x.tensor.dim() >= 2
        else "{0}.new_zeros(3) + 2",
        f"{{0}} + torch.full(({n},), 2, dtype={{0}}.dtype)" if x.dtype != "bool" else "{0}",
        "torch.tril({0})" if x.tensor.dim() >= 2 else "torch.zeros(2)",
        "torch.triu({0}, diagonal=1)"
        if x.tensor.dim() >= 2
        else "torch.ones(3, dtype=torch.int64)",
        "torch.empty_like({0}).fill_(3)",
    ]
    return s.emit(s.choice(options), [x], "creation", exact=True)


def dynamic(s: State) -> Value | None:
    """Ops whose result shape depends on values (PopTorch must refuse them, naming the op)."""
    x = s.pick(lambda v: v.tensor.dim() >= 1 and v.exact)
    if x is None:
        return None
    options = [
        "torch.nonzero({0})",
        "{0}[{0} > 0]",
        "torch.masked_select({0}, {0} > 0)",
        "torch.unique({0})",
    ]
    return s.emit(s.choice(options), [x], "index", exact=True)


SHAPE = {
    "view": [view, view, slicing, join],
    "index": [index, gather, scatter, masked, index_put] * 2 + [dynamic],
    "creation": [creation],
}
