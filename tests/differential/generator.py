"""Random valid PopXL programs, feature by feature.

The generator keeps, for every value, a bound on its magnitude and whether it is *exact*
(a multiple of ``2**-bits`` small enough that float arithmetic on it has no rounding). Ops
whose result jumps (floor, comparisons, casts to int) and ops whose gradient jumps (relu,
abs, maximum) are applied only to exact values, so rounding differences between the
session and the reference cannot change a program's result. Large values are tamed with
``tanh`` before they could overflow.

Features (each a flag the campaign selects):
    core: elementwise, reductions, matmul, casts, concat
    views: reshape/transpose/slice and their in-place (aliasing) forms
    inplace: in-place elementwise ops and var_updates
    call: subgraph calls, by-value and by-reference inputs, inputs_dict, graphs called twice
    repeat: ops.repeat with loop-carried, constant and by-reference inputs
    cond: ops.conditional
    autodiff: transforms.autodiff of subgraphs, gradients checked with jax.vjp
    replication: replicated programs, per-replica inputs, grouped variables and collectives
    remote, rts, addons, placement, pipeline, batchser: see ``generator_extras``
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .generator_extras import ExtraFeatures
from .program import FLOATS, Block, Ids, Leaf, Node, Program, Spec

FEATURES = ("core", "views", "inplace", "call", "repeat", "cond", "autodiff", "replication",
            "remote", "rts", "addons", "placement", "pipeline", "batchser")  # fmt: skip
MANTISSA = {"float32": 22, "float16": 9, "int32": 30, "bool": 1}
TAME = {"float32": 64.0, "float16": 8.0}


@dataclass
class Store:
    """What is known about one storage (shared by a value and its views)."""

    bound: float
    bits: int | None  # values are multiples of 2**-bits; None: inexact


@dataclass
class Scope:
    """A block being generated."""

    pool: list[int]
    nodes: list[Node] = field(default_factory=list)
    in_grad: bool = False
    collectives: bool = True
    depth: int = 0


class Generator(ExtraFeatures):
    def __init__(self, seed: int, features: tuple[str, ...], replicas: int | None = None) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.features = set(features) | {"core"}
        self.ids = Ids()
        self.specs: dict[int, Spec] = {}
        self.root: dict[int, int] = {}
        self.store: dict[int, Store] = {}
        self.modifiable: dict[int, bool] = {}
        self.leaves: list[Leaf] = []
        self.bodies: list[Block] = []
        self.body_flags: dict[int, tuple[bool, bool]] = {}
        if replicas is None:
            replicated = self.features & {"replication", "rts"}
            replicas = int(self.rng.choice([2, 4])) if replicated else 1
        self.replicas = replicas
        # Placed programs compile several times slower; a mixed set places 15% of them.
        alone = self.features <= {"core", "placement"}
        placed = "placement" in self.features and (alone or self.rng.random() < 0.15)
        self.ipus = 2 if placed else 1
        self.requested = tuple(sorted(self.features))
        self.steps = 1
        alone = self.features <= {"core", "pipeline"}
        if "pipeline" in self.features and (alone or self.rng.random() < 0.15):
            # A pipelined program uses the core ops and out-of-place views only.
            self.steps, self.replicas, self.ipus = int(self.rng.choice([4, 5, 6])), 1, 2
            self.features &= {"core", "views"}

    # Values -----------------------------------------------------------------------------------

    def value(self, spec: Spec, bound: float, bits: int | None, modifiable: bool = True,
              root: int | None = None) -> int:  # fmt: skip
        vid = self.ids()
        self.specs[vid] = spec
        if root is None:
            self.root[vid] = vid
            self.store[vid] = Store(float(bound), bits)
        else:
            self.root[vid] = self.root[root]
        self.modifiable[vid] = modifiable
        return vid

    def st(self, vid: int) -> Store:
        return self.store[self.root[vid]]

    def exact(self, vid: int) -> bool:
        s, dt = self.st(vid), self.specs[vid].dtype
        if dt == "bool":
            return True
        return s.bits is not None and s.bits + math.log2(s.bound + 1) <= MANTISSA[dt]

    def choice(self, seq: list) -> object:
        return seq[int(self.rng.integers(len(seq)))]

    def shape(self, max_rank: int = 3) -> tuple[int, ...]:
        rank = int(self.rng.integers(0, max_rank + 1))
        return tuple(int(d) for d in self.rng.integers(1, 5, rank))

    def data(self, spec: Spec) -> np.ndarray:
        if spec.dtype == "bool":
            return self.rng.random(spec.shape) < 0.5
        if spec.dtype == "int32":
            return self.rng.integers(-4, 5, spec.shape).astype(np.int32)
        return (self.rng.integers(-16, 17, spec.shape) / 8).astype(spec.dtype)

    def dtype(self) -> str:
        return str(self.choice(["float32"] * 6 + ["float16", "int32", "bool"]))

    def emit(self, scope: Scope, op: str, args: tuple, out_specs: list, bounds: list,
             bits: list, /, **attrs: object) -> tuple[int, ...]:  # fmt: skip
        outs = tuple(self.value(s, b, k) for s, b, k in zip(out_specs, bounds, bits))
        scope.nodes.append(Node(op, tuple(args), outs, attrs))
        scope.pool.extend(outs)
        return outs

    def const(self, scope: Scope, spec: Spec) -> int:
        data = self.data(spec)
        bound = 4 if spec.dtype == "int32" else 2
        (vid,) = self.emit(scope, "const", (), [spec], [bound], [3], data=data)
        return vid

    def pick(self, scope: Scope, pred) -> int | None:  # noqa: ANN001
        cands = [v for v in scope.pool if pred(v)]
        if not cands:
            return None
        recent = cands[-4:]
        return int(self.choice(recent if self.rng.random() < 0.6 else cands))

    def is_float(self, v: int) -> bool:
        return self.specs[v].dtype in FLOATS

    def tame(self, scope: Scope, v: int) -> int:
        """``v``, or ``tanh(v)`` when ``v`` could be large enough to overflow later."""
        dt = self.specs[v].dtype
        if dt in FLOATS and self.st(v).bound > TAME[dt]:
            (v,) = self.emit(scope, "tanh", (v,), [self.specs[v]], [1.0], [None])
        return v

    # Programs ---------------------------------------------------------------------------------

    def program(self, n_ops: int | None = None) -> Program:
        scope = Scope(pool=[])
        for _ in range(int(self.rng.integers(1, 4))):
            self.leaf(scope)
        n_ops = int(self.rng.integers(3, 10)) if n_ops is None else n_ops
        self.ops(scope, n_ops)
        n_out = min(len(scope.pool), int(self.rng.integers(1, 4)))
        outputs = [int(v) for v in self.rng.choice(scope.pool[-8:], n_out, replace=False)]
        outputs += self.watched(scope.nodes, outputs)
        main = Block([], scope.nodes, outputs, name="main")
        if self.steps > 1:
            self.stage(main)
        elif self.ipus > 1:
            self.place(main, self.ipus)
        return Program(self.specs, self.leaves, main, self.replicas, self.requested, self.seed,
                       self.ipus, self.steps)  # fmt: skip

    def leaf(self, scope: Scope) -> int:
        spec = Spec(self.shape(), self.dtype())
        r = self.replicas
        kind = "stream" if self.rng.random() < 0.4 else "var"
        grouping = None
        if kind == "stream":
            data = self.data(Spec((r, *spec.shape), spec.dtype)) if r > 1 else self.data(spec)
            if self.steps > 1:
                data = self.data(Spec((self.steps, *spec.shape), spec.dtype))
        else:
            grouping = self.grouping() if r > 1 and self.rng.random() < 0.5 else None
            groups = r // grouping[1] if grouping else 1
            data = (
                self.data(Spec((groups, *spec.shape), spec.dtype))
                if groups > 1
                else self.data(spec)
            )
        bound = 4 if spec.dtype == "int32" else 2
        vid = self.value(spec, bound, 3)
        self.leaves.append(Leaf(vid, kind, data, grouping))
        scope.pool.append(vid)
        return vid

    def grouping(self) -> tuple[int, int]:
        r = self.replicas
        options = [(s, g) for s in (1, 2, 4) for g in (1, 2, 4) if s * g <= r and r % (s * g) == 0]
        return tuple(self.choice(options))  # type: ignore[return-value]

    def ops(self, scope: Scope, n: int) -> None:
        makers = [(self.unary, 4), (self.binary, 4), (self.reduce, 2), (self.matmul, 1),
                  (self.cast, 1), (self.concat, 1), (self.const_op, 1)]  # fmt: skip
        if "views" in self.features:
            makers += [(self.view, 3)]
        if "inplace" in self.features:
            makers += [(self.inplace, 3)]
        if scope.depth < 2:
            if "call" in self.features:
                makers += [(self.call, 2)]
            if "repeat" in self.features:
                makers += [(self.repeat, 1)]
            if "cond" in self.features and not scope.in_grad:
                makers += [(self.cond, 1)]
            if "autodiff" in self.features and not scope.in_grad:
                makers += [(self.grad, 2)]
        if "replication" in self.features and scope.collectives and self.replicas > 1:
            makers += [(self.collective, 3)]
        if scope.depth == 0:
            if "remote" in self.features:
                makers += [(self.remote, 3)]
            if "rts" in self.features and self.replicas > 1:
                makers += [(self.rts, 3)]
            if "addons" in self.features:
                makers += [(self.addons_grad, 2)]
            if "batchser" in self.features:
                makers += [(self.batch_serial, 2)]
        weights = np.array([w for _, w in makers], float)
        done = 0
        while done < n:
            fn = makers[int(self.rng.choice(len(makers), p=weights / weights.sum()))][0]
            if fn(scope):
                done += 1

    # Op families ------------------------------------------------------------------------------

    def const_op(self, scope: Scope) -> bool:
        self.const(scope, Spec(self.shape(), str(self.choice(["float32", "float32", "int32"]))))
        return True

    def unary(self, scope: Scope) -> bool:
        x = self.pick(scope, lambda v: self.specs[v].dtype != "bool")
        if x is None:
            b = self.pick(scope, lambda v: self.specs[v].dtype == "bool")
            if b is None:
                return False
            self.emit(scope, "logical_not", (b,), [self.specs[b]], [1], [0])
            return True
        spec, s = self.specs[x], self.st(x)
        if spec.dtype == "int32":
            op = self.choice(["negate", "abs", "identity"])
            self.emit(scope, str(op), (x,), [spec], [s.bound], [0])
            return True
        x = self.tame(scope, x)
        s = self.st(x)
        exact = self.exact(x)
        ops_ = [
            "tanh",
            "sin",
            "cos",
            "sigmoid",
            "gelu",
            "swish",
            "negate",
            "identity",
            "sqrt",
            "log",
        ]
        if s.bound <= 4:
            ops_.append("exp")
        if exact or not scope.in_grad:
            ops_ += ["relu", "abs"]
        if exact:
            ops_ += ["floor", "ceil", "sign"]
        op = str(self.choice(ops_))
        if op in ("sqrt", "log"):
            (sq,) = self.emit(scope, "mul", (x, x), [spec], [s.bound**2], [None])
            half = self.emit(scope, "const", (), [Spec((), spec.dtype)], [0.5], [1],
                             data=np.asarray(0.5, spec.dtype))[0]  # fmt: skip
            (x,) = self.emit(scope, "add", (sq, half), [spec], [s.bound**2 + 0.5], [None])
            bound = math.sqrt(s.bound**2 + 0.5) if op == "sqrt" else math.log(s.bound**2 + 1) + 1
            self.emit(scope, op, (x,), [spec], [bound], [None])
            return True
        keeps = {"negate": s.bits, "identity": s.bits, "relu": s.bits, "abs": s.bits}
        bounds = {"exp": math.exp(s.bound), "floor": s.bound + 1, "ceil": s.bound + 1,
                  "sign": 1, "tanh": 1, "sin": 1, "cos": 1, "sigmoid": 1}  # fmt: skip
        bits = keeps.get(op, 0 if op in ("floor", "ceil", "sign") else None)
        self.emit(scope, op, (x,), [spec], [bounds.get(op, s.bound + 1)], [bits])
        return True

    def broadcast_partner(self, scope: Scope, a: int, same_shape: bool = False) -> int:
        """A value of ``a``'s dtype whose shape broadcasts to ``a``'s shape."""
        sa = self.specs[a]

        def fits(v: int) -> bool:
            sb = self.specs[v]
            if sb.dtype != sa.dtype:
                return False
            if same_shape:
                return sb.shape == sa.shape
            return len(sb.shape) <= len(sa.shape) and all(
                d in (1, e) for d, e in zip(sb.shape[::-1], sa.shape[::-1])
            )

        b = self.pick(scope, fits) if self.rng.random() < 0.7 else None
        if b is None:
            shape = sa.shape
            if not same_shape:
                k = int(self.rng.integers(0, len(shape) + 1))
                shape = tuple(d if self.rng.random() < 0.7 else 1 for d in shape[k:])
            b = self.const(scope, Spec(shape, sa.dtype))
        return b

    def binary(self, scope: Scope) -> bool:
        a = self.pick(scope, lambda v: True)
        if a is None:
            return False
        a = self.tame(scope, a)
        sa = self.specs[a]
        if sa.dtype == "bool":
            b = self.broadcast_partner(scope, a)
            op = str(self.choice(["logical_and", "logical_or"]))
            self.emit(scope, op, (a, b), [self.out_spec(a, b, "bool")], [1], [0])
            return True
        b = self.tame(scope, self.broadcast_partner(scope, a))
        ea, eb = self.st(a), self.st(b)
        both_exact = self.exact(a) and self.exact(b)
        ops_ = ["add", "sub", "mul", "div"]
        if both_exact or not scope.in_grad:
            ops_.append("maximum")
        if both_exact and not scope.in_grad:
            ops_ += ["greater", "equal"]
        op = str(self.choice(ops_))
        if sa.dtype == "int32" and max(ea.bound, eb.bound) > 2**12:
            return False
        if op in ("greater", "equal"):
            self.emit(scope, op, (a, b), [self.out_spec(a, b, "bool")], [1], [0])
            return True
        if op == "div":
            b = self.positive(scope, b)
            eb = self.st(b)
        k = [ea.bits, eb.bits]
        if op in ("add", "sub", "maximum"):
            bound, bits = ea.bound + eb.bound, None if None in k else max(k)
        elif op == "mul":
            bound, bits = ea.bound * eb.bound, None if None in k else sum(k)
        else:
            bound, bits = ea.bound * 2, (0 if sa.dtype == "int32" else None)
        self.emit(scope, op, (a, b), [self.out_spec(a, b, sa.dtype)], [bound], [bits])
        return True

    def positive(self, scope: Scope, b: int) -> int:
        """A denominator made from ``b``: ``abs(b) + 1`` (int) or ``b * b + 0.5`` (float)."""
        spec, s = self.specs[b], self.st(b)
        if spec.dtype == "int32":
            (ab,) = self.emit(scope, "abs", (b,), [spec], [s.bound], [0])
            one = self.emit(scope, "const", (), [Spec((), "int32")], [1], [0],
                            data=np.asarray(1, np.int32))[0]  # fmt: skip
            return self.emit(scope, "add", (ab, one), [spec], [s.bound + 1], [0])[0]
        (sq,) = self.emit(scope, "mul", (b, b), [spec], [s.bound**2], [None])
        half = self.emit(scope, "const", (), [Spec((), spec.dtype)], [0.5], [1],
                         data=np.asarray(0.5, spec.dtype))[0]  # fmt: skip
        return self.emit(scope, "add", (sq, half), [spec], [s.bound**2 + 0.5], [None])[0]

    def out_spec(self, a: int, b: int, dtype: str) -> Spec:
        shape = np.broadcast_shapes(self.specs[a].shape, self.specs[b].shape)
        return Spec(tuple(int(d) for d in shape), dtype)

    def reduce(self, scope: Scope) -> bool:
        x = self.pick(scope, lambda v: self.specs[v].dtype in ("float32", "float16", "int32")
                      and len(self.specs[v].shape) > 0)  # fmt: skip
        if x is None:
            return False
        x = self.tame(scope, x)
        spec, s = self.specs[x], self.st(x)
        rank = len(spec.shape)
        axes = tuple(
            sorted(
                int(i)
                for i in self.rng.choice(rank, int(self.rng.integers(1, rank + 1)), replace=False)
            )
        )
        keepdims = bool(self.rng.random() < 0.5)
        n = math.prod(spec.shape[i] for i in axes)
        if spec.dtype == "int32":
            op = str(self.choice(["sum", "max", "min"]))
        else:
            op = str(self.choice(["sum", "mean", "max", "min", "prod", "sumsquare", "logsumexp"]))
            if op == "prod" and s.bound**n > 1e3:
                op = "sum"
        if op in ("max", "min") and scope.in_grad and not self.exact(x):
            op = "sum"
        out_shape = tuple(
            1 if i in axes else d for i, d in enumerate(spec.shape) if keepdims or i not in axes
        )
        bound = {"sum": s.bound * n, "mean": s.bound, "max": s.bound, "min": s.bound,
                 "prod": s.bound**n, "sumsquare": s.bound**2 * n, "logsumexp": s.bound + math.log(n) + 1}[op]  # fmt: skip
        k = s.bits
        bits = {"sum": k, "max": k, "min": k, "prod": None if k is None else k * n,
                "sumsquare": None if k is None else 2 * k}.get(op)  # fmt: skip
        self.emit(
            scope,
            op,
            (x,),
            [Spec(out_shape, spec.dtype)],
            [bound],
            [bits],
            axis=axes,
            keepdims=keepdims,
        )
        return True

    def matmul(self, scope: Scope) -> bool:
        a = self.pick(scope, lambda v: self.is_float(v) and len(self.specs[v].shape) >= 2)
        if a is None:
            return False
        a = self.tame(scope, a)
        sa, ea = self.specs[a], self.st(a)
        k = sa.shape[-1]
        n = int(self.rng.integers(1, 5))
        bshape = (k, n) if self.rng.random() < 0.6 else (*sa.shape[:-2], k, n)
        b = self.pick(scope, lambda v: self.specs[v] == Spec(bshape, sa.dtype))
        b = self.tame(scope, b if b is not None else self.const(scope, Spec(bshape, sa.dtype)))
        eb = self.st(b)
        out = Spec((*sa.shape[:-1], n), sa.dtype)
        bits = None if None in (ea.bits, eb.bits) else ea.bits + eb.bits
        self.emit(scope, "matmul", (a, b), [out], [ea.bound * eb.bound * k], [bits])
        return True

    def cast(self, scope: Scope) -> bool:
        x = self.pick(scope, lambda v: True)
        if x is None:
            return False
        x = self.tame(scope, x)
        spec, s = self.specs[x], self.st(x)
        targets = {"float32": ["float16", "int32"], "float16": ["float32", "int32"],
                   "int32": ["float32"], "bool": ["float32", "int32"]}[spec.dtype]  # fmt: skip
        to = str(self.choice(targets))
        if to == "int32" and not self.exact(x):
            to = "float16" if spec.dtype == "float32" else "float32"
        if to == "float16" and scope.in_grad:
            # A float16 derivative that saturates (1 - tanh(x)**2 with tanh(x) rounded to 1)
            # is 0 where the float32 reference gives 2.5e-4: rounding, not a fault.
            return False
        if to == spec.dtype:
            return False
        exact = self.exact(x) and (
            to != "float16" or s.bits + math.log2(s.bound + 1) <= MANTISSA["float16"]
        )
        self.emit(scope, "cast", (x,), [Spec(spec.shape, to)], [s.bound + 1],
                  [s.bits if exact else None], dtype=to)  # fmt: skip
        return True

    def concat(self, scope: Scope) -> bool:
        a = self.pick(scope, lambda v: len(self.specs[v].shape) > 0)
        if a is None:
            return False
        sa = self.specs[a]
        axis = int(self.rng.integers(len(sa.shape)))

        def fits(v: int) -> bool:
            sb = self.specs[v]
            return (
                sb.dtype == sa.dtype
                and len(sb.shape) == len(sa.shape)
                and all(d == e for i, (d, e) in enumerate(zip(sb.shape, sa.shape)) if i != axis)
            )

        b = self.pick(scope, fits)
        if b is None:
            shape = list(sa.shape)
            shape[axis] = int(self.rng.integers(1, 4))
            b = self.const(scope, Spec(tuple(shape), sa.dtype))
        shape = list(sa.shape)
        shape[axis] += self.specs[b].shape[axis]
        ea, eb = self.st(a), self.st(b)
        bits = None if None in (ea.bits, eb.bits) else max(ea.bits, eb.bits)
        self.emit(scope, "concat", (a, b), [Spec(tuple(shape), sa.dtype)],
                  [max(ea.bound, eb.bound)], [bits], axis=axis)  # fmt: skip
        return True

    # Views and in-place ops ---------------------------------------------------------------------

    def new_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        n = math.prod(shape)
        dims = []
        while n > 1 and len(dims) < 3:
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            d = int(self.choice(divisors))
            dims.append(d)
            n //= d
        if n > 1:
            dims.append(n)
        return tuple(dims)

    def view(self, scope: Scope) -> bool:
        x = self.pick(scope, lambda v: True)
        if x is None:
            return False
        spec = self.specs[x]
        rank = len(spec.shape)
        kinds = ["reshape"] + (["transpose", "slice"] if rank else [])
        kind = str(self.choice(kinds))
        attrs: dict = {}
        if kind == "reshape":
            attrs["shape"] = shape = self.new_shape(spec.shape)
        elif kind == "transpose":
            attrs["perm"] = perm = tuple(int(i) for i in self.rng.permutation(rank))
            shape = tuple(spec.shape[i] for i in perm)
        else:
            bounds = []
            for d in spec.shape:
                start = int(self.rng.integers(0, d))
                stop = int(self.rng.integers(start + 1, d + 1))
                bounds.append((start, stop, 1))
            attrs["bounds"] = tuple(bounds)
            shape = tuple(b - a for a, b, _ in bounds)
        inplace = self.rng.random() < 0.5 and self.steps == 1
        out = Spec(tuple(shape), spec.dtype)
        if not inplace:
            s = self.st(x)
            self.emit(scope, kind, (x,), [out], [s.bound], [s.bits], **attrs)
            return True
        vid = self.value(out, 0, None, self.modifiable[x], root=x)
        scope.nodes.append(Node(kind + "_", (x,), (vid,), attrs))
        scope.pool.append(vid)
        return True

    def inplace(self, scope: Scope) -> bool:
        x = self.pick(scope, lambda v: self.modifiable[v] and self.is_float(v))
        if x is None:
            return False
        spec, s = self.specs[x], self.st(x)
        ops_ = ["add_", "relu_", "sigmoid_", "scaled_add_", "accumulate_"]
        if s.bound <= 4:
            ops_.append("exp_")
        op = str(self.choice(ops_))
        args: tuple = (x,)
        attrs: dict = {}
        bound, bits = s.bound, s.bits
        if op in ("add_", "scaled_add_", "accumulate_"):
            y = self.tame(scope, self.broadcast_partner(scope, x, same_shape=op != "add_"))
            sy = self.st(y)
            args = (x, y)
            bound += sy.bound
            bits = None if None in (bits, sy.bits) else max(bits, sy.bits)
            if op == "scaled_add_":
                attrs = {
                    "a": float(self.choice([0.5, 1.0, 2.0])),
                    "b": float(self.choice([-1.0, 0.5, 3.0])),
                }
                bound *= 3
                bits = None if bits is None else bits + 1
        elif op in ("exp_", "sigmoid_"):
            bound, bits = (math.exp(s.bound) if op == "exp_" else 1.0), None
        vid = self.value(spec, 0, None, True, root=x)
        store = self.st(x)
        store.bound = max(store.bound, bound)
        store.bits = None if None in (store.bits, bits) else max(store.bits, bits)
        scope.nodes.append(Node(op, args, (vid,), attrs))
        scope.pool.append(vid)
        return True

    # Subgraphs ----------------------------------------------------------------------------------

    def body(self, parent: Scope, args: list[int], by_ref: set[int], n_ops: int, *,
             in_grad: bool = False, collectives: bool = True, carried: int = 0,
             name: str = "g") -> tuple[Block, Scope]:  # fmt: skip
        """A block whose inputs mirror ``args`` (the first ``carried`` tamed to ``|x| <= 1``)."""
        inputs = []
        for pos, a in enumerate(args):
            s = self.st(a)
            bound, bits = (max(s.bound, 1.0), None) if pos < carried else (s.bound, s.bits)
            inputs.append(self.value(self.specs[a], bound, bits, modifiable=pos in by_ref))
        scope = Scope(pool=list(inputs), in_grad=in_grad or parent.in_grad,
                      collectives=collectives and parent.collectives, depth=parent.depth + 1)  # fmt: skip
        self.ops(scope, n_ops)
        return Block(inputs, scope.nodes, [], frozenset(by_ref), name), scope

    def outputs_for(self, scope: Scope, specs: list[Spec]) -> list[int]:
        """One value of each spec from ``scope`` (made from a constant when none fits)."""
        outs = []
        for spec in specs:
            v = self.pick(scope, lambda v, spec=spec: self.specs[v] == spec)
            outs.append(v if v is not None else self.const(scope, spec))
        return outs

    def args(self, scope: Scope, k: int, pred=lambda v: True) -> list[int]:  # noqa: ANN001
        cands = [v for v in scope.pool if pred(v)]
        if not cands:
            return []
        return [int(self.choice(cands)) for _ in range(k)]

    def call(self, scope: Scope) -> bool:
        # A body may be called again only where its own restrictions held (no in-place on
        # inputs under autodiff, no collectives where they are not allowed).
        reuse = [
            b
            for b in self.bodies
            if self.rng.random() < 0.3
            and (self.body_flags[id(b)][0] or not scope.in_grad)
            and (scope.collectives or not self.body_flags[id(b)][1])
        ]
        for block in reuse:
            args = []
            for pos, vid in enumerate(block.inputs):
                want = self.specs[vid]
                v = self.pick(scope, lambda v, want=want, pos=pos, block=block: self.specs[v] == want
                              and (pos not in block.by_ref or self.modifiable[v]))  # fmt: skip
                if v is None or (pos in block.by_ref and v in args):
                    break
                args.append(v)
            else:
                self.emit_call(scope, block, args)
                return True
        args = list(dict.fromkeys(self.args(scope, int(self.rng.integers(1, 4)))))
        if not args:
            return False
        by_ref = set()
        if not scope.in_grad and "inplace" in self.features:
            by_ref = {
                p for p, a in enumerate(args) if self.modifiable[a] and self.rng.random() < 0.5
            }
        block, inner = self.body(scope, args, by_ref, int(self.rng.integers(1, 6)))
        n_out = int(self.rng.integers(0 if by_ref else 1, 3))
        block.outputs = [
            int(v) for v in self.rng.choice(inner.pool, min(n_out, len(inner.pool)), replace=False)
        ]
        self.bodies.append(block)
        self.body_flags[id(block)] = (inner.in_grad, inner.collectives)
        self.emit_call(scope, block, args)
        return True

    def emit_call(self, scope: Scope, block: Block, args: list[int]) -> None:
        specs = [self.specs[v] for v in block.outputs]
        outs = tuple(
            self.value(s, self.st(v).bound, self.st(v).bits) for s, v in zip(specs, block.outputs)
        )
        for pos in block.by_ref:
            parent, inner = self.st(args[pos]), self.st(block.inputs[pos])
            parent.bound = max(parent.bound, inner.bound)
            parent.bits = (
                None if None in (parent.bits, inner.bits) else max(parent.bits, inner.bits)
            )
        by_dict = bool(self.rng.random() < 0.3)
        scope.nodes.append(Node("call", tuple(args), outs, {"body": block, "by_dict": by_dict}))
        scope.pool.extend(outs)

    def repeat(self, scope: Scope) -> bool:
        carried = list(dict.fromkeys(self.args(scope, int(self.rng.integers(1, 3)), self.is_float)))
        if not carried:
            return False
        extra = [
            v
            for v in dict.fromkeys(self.args(scope, int(self.rng.integers(0, 3))))
            if v not in carried
        ]
        args = carried + extra
        by_ref = set()
        if not scope.in_grad and "inplace" in self.features:
            by_ref = {len(carried) + p for p, a in enumerate(extra)
                      if self.modifiable[a] and self.is_float(a) and self.rng.random() < 0.5}  # fmt: skip
        block, inner = self.body(scope, args, by_ref, int(self.rng.integers(1, 5)),
                                 carried=len(carried), name="loop")  # fmt: skip
        outs = []
        for v in self.outputs_for(inner, [self.specs[c] for c in carried]):
            (t,) = self.emit(inner, "tanh", (v,), [self.specs[v]], [1.0], [None])
            outs.append(t)
        block.outputs = outs
        count = int(self.rng.integers(0, 4))
        for pos in by_ref:
            st = self.st(args[pos])
            st.bound, st.bits = max(st.bound, self.st(block.inputs[pos]).bound) * (count + 1), None
        specs = [self.specs[c] for c in carried]
        bounds = [max(1.0, self.st(c).bound) for c in carried]
        outs_ = tuple(self.value(s, b, None) for s, b in zip(specs, bounds))
        scope.nodes.append(Node("repeat", tuple(args), outs_, {"body": block, "count": count}))
        scope.pool.extend(outs_)
        return True

    def condition(self, scope: Scope) -> int | None:
        x = self.pick(scope, lambda v: self.exact(v) and self.specs[v].dtype != "bool")
        if x is None:
            return None
        spec = self.specs[x]
        s = x
        if spec.shape:
            axes = tuple(range(len(spec.shape)))
            (s,) = self.emit(scope, "sum", (x,), [Spec((), spec.dtype)],
                             [self.st(x).bound * math.prod(spec.shape)], [self.st(x).bits],
                             axis=axes, keepdims=False)  # fmt: skip
        zero = self.emit(scope, "const", (), [Spec((), spec.dtype)], [0], [0],
                         data=np.asarray(0, spec.dtype))[0]  # fmt: skip
        return self.emit(scope, "greater", (s, zero), [Spec((), "bool")], [1], [0])[0]

    def cond(self, scope: Scope) -> bool:
        flag = self.condition(scope)
        if flag is None:
            return False
        then_args = list(dict.fromkeys(self.args(scope, int(self.rng.integers(1, 3)))))
        else_args = list(dict.fromkeys(self.args(scope, int(self.rng.integers(0, 3)))))
        then_ref, else_ref = (
            self.branch_by_ref(scope, then_args),
            self.branch_by_ref(scope, else_args),
        )
        then, t_scope = self.body(scope, then_args, then_ref, int(self.rng.integers(1, 4)),
                                  collectives=False, name="then")  # fmt: skip
        then.outputs = [
            int(v) for v in self.rng.choice(t_scope.pool, min(2, len(t_scope.pool)), replace=False)
        ]
        other, e_scope = self.body(scope, else_args, else_ref, int(self.rng.integers(0, 4)),
                                   collectives=False, name="else")  # fmt: skip
        for block, args in ((then, then_args), (other, else_args)):
            for pos in block.by_ref:  # either branch may have written it
                parent, inner = self.st(args[pos]), self.st(block.inputs[pos])
                parent.bound, parent.bits = max(parent.bound, inner.bound), None
        other.outputs = self.outputs_for(e_scope, [self.specs[v] for v in then.outputs])
        outs = []
        for tv, ev in zip(then.outputs, other.outputs):
            st, se = self.st(tv), self.st(ev)
            bits = None if None in (st.bits, se.bits) else max(st.bits, se.bits)
            outs.append(self.value(self.specs[tv], max(st.bound, se.bound), bits))
        attrs = {"then": then, "else": other, "n_then": len(then_args)}
        scope.nodes.append(Node("cond", (flag, *then_args, *else_args), tuple(outs), attrs))
        scope.pool.extend(outs)
        return True

    def branch_by_ref(self, scope: Scope, args: list[int]) -> set[int]:
        """Inputs a conditional's branch takes by reference (ops.conditional writes them
        back from the branch that ran)."""
        if scope.in_grad or "inplace" not in self.features:
            return set()
        return {p for p, a in enumerate(args) if self.modifiable[a] and self.rng.random() < 0.4}

    def grad(self, scope: Scope) -> bool:
        made = self.grad_body(scope)
        if made is None:
            return False
        args, block, seeds = made
        k = int(self.rng.integers(1, len(args) + 1))
        wrt = tuple(sorted(int(p) for p in self.rng.choice(len(args), k, replace=False)))
        outs = tuple(self.value(self.specs[args[p]], 1e3, None) for p in wrt)
        scope.nodes.append(Node("grad", (*args, *seeds), outs, {"body": block, "wrt": wrt}))
        scope.pool.extend(outs)
        return True

    # Collectives ----------------------------------------------------------------------------------

    def collective(self, scope: Scope) -> bool:
        x = self.pick(scope, lambda v: self.is_float(v))
        if x is None:
            return False
        x = self.tame(scope, x)
        spec, s = self.specs[x], self.st(x)
        group = self.grouping() if self.rng.random() < 0.6 else None
        size = group[1] if group else self.replicas
        kind = str(
            self.choice(["all_reduce", "all_reduce", "all_gather", "reduce_scatter", "all_reduce_"])
        )
        if kind == "all_reduce_" and not self.modifiable[x]:
            kind = "all_reduce"
        op = str(self.choice(["add", "mean", "max", "min"]))
        if kind == "reduce_scatter":
            op = str(self.choice(["add", "mean"]))
        bound = s.bound * size if op == "add" else s.bound
        bits = s.bits if op in ("add", "max", "min") else None
        if kind == "all_gather":
            shape = spec.shape or (1,)
            out = Spec((shape[0] * size, *shape[1:]), spec.dtype)
        elif kind == "reduce_scatter":
            out = Spec((-(-math.prod(spec.shape) // size),), spec.dtype)
        else:
            out = spec
        attrs = {"group": group} if kind == "all_gather" else {"op": op, "group": group}
        if kind == "all_reduce_":
            vid = self.value(spec, 0, None, True, root=x)
            st = self.st(x)
            st.bound, st.bits = max(st.bound, bound), None if None in (st.bits, bits) else st.bits
            scope.nodes.append(Node(kind, (x,), (vid,), attrs))
            scope.pool.append(vid)
            return True
        self.emit(scope, kind, (x,), [out], [bound], [bits], **attrs)
        return True


def generate(seed: int, features: tuple[str, ...], n_ops: int | None = None) -> Program:
    """One random valid program using ``features``."""
    return Generator(seed, features).program(n_ops)
