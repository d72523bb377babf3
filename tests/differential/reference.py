"""The reference: the same programs evaluated directly in NumPy (forward) and plain JAX
(``jax.vjp`` for gradient nodes), never through ``runtime/``.

Storage is modelled explicitly: an in-place op writes its result into its first input's
storage, a view op (``reshape_``, ``transpose_``, ``slice_``) returns a handle whose writes
reach the base, and every handle on a storage sees each write. Replicas are evaluated in
lockstep (one environment each) so collectives can read every replica's value.
NumPy computes float32 in float64 and float16 in float32, rounding each op's result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .program import INPLACE, VIEWS, Block, Node, Program
from .reference_extras import ExtraRules, group_members, rts_leaf_finals, rts_leaf_values, vjp

NP_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "int32": np.int32,
    "bool": np.bool_,
}


class Env:
    """Values of one replica in one block, with the aliasing of views and in-place ops."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self.vals: dict[int, Any] = {}
        self.alias: dict[int, tuple[int, Callable, Callable]] = {}

    def define(self, vid: int, value: Any) -> None:
        self.vals[vid] = value

    def view(self, vid: int, parent: int, fwd: Callable, inv: Callable) -> None:
        self.alias[vid] = (parent, fwd, inv)
        self.vals[vid] = fwd(self.vals[parent])

    def write(self, vid: int, new: Any) -> None:
        new = new.astype(self.vals[vid].dtype)
        while vid in self.alias:
            parent, _, inv = self.alias[vid]
            new, vid = inv(self.vals[parent], new), parent
        self.vals[vid] = new
        for child, (parent, fwd, _) in self.alias.items():
            self.vals[child] = fwd(self.vals[parent])


def set_index(xp: Any, base: Any, index: tuple, new: Any) -> Any:
    if xp is np:
        out = base.copy()
        out[index] = new
        return out
    return base.at[index].set(new)


def _up(xp: Any, a: Any) -> Any:
    """The compute type: float16 in float32, and (NumPy only) float32 in float64."""
    if a.dtype == np.float16:
        return a.astype(np.float32)
    if xp is np and a.dtype == np.float32:
        return a.astype(np.float64)
    return a


def _sigmoid(xp: Any, x: Any) -> Any:
    return 1 / (1 + xp.exp(-x))


def _gelu(xp: Any, x: Any) -> Any:
    return 0.5 * x * (1 + xp.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _div(xp: Any, a: Any, b: Any) -> Any:
    if np.issubdtype(a.dtype, np.integer):
        q = xp.abs(a) // xp.abs(b)
        return xp.where((a < 0) != (b < 0), -q, q)
    return a / b


def _logsumexp(xp: Any, x: Any, axis: tuple, keepdims: bool) -> Any:
    m = xp.max(x, axis=axis, keepdims=True)
    out = xp.log(xp.sum(xp.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else xp.squeeze(out, axis=axis)


def _slice_index(bounds: Sequence[tuple[int, int, int]]) -> tuple:
    return tuple(slice(a, b, s) for a, b, s in bounds)


UNARY: dict[str, Callable] = {
    "exp": lambda xp, x: xp.exp(x),
    "tanh": lambda xp, x: xp.tanh(x),
    "sin": lambda xp, x: xp.sin(x),
    "cos": lambda xp, x: xp.cos(x),
    "sigmoid": _sigmoid,
    "gelu": _gelu,
    "swish": lambda xp, x: x * _sigmoid(xp, x),
    "negate": lambda xp, x: -x,
    "abs": lambda xp, x: xp.abs(x),
    "relu": lambda xp, x: xp.where(x > 0, x, 0 * x),
    "floor": lambda xp, x: xp.floor(x),
    "ceil": lambda xp, x: xp.ceil(x),
    "sign": lambda xp, x: xp.sign(x),
    "sqrt": lambda xp, x: xp.sqrt(x),
    "log": lambda xp, x: xp.log(x),
    "logical_not": lambda xp, x: xp.logical_not(x),
    "identity": lambda xp, x: x,
    "relu_": lambda xp, x: xp.where(x > 0, x, 0 * x),
    "exp_": lambda xp, x: xp.exp(x),
    "sigmoid_": _sigmoid,
}
BINARY: dict[str, Callable] = {
    "add": lambda xp, a, b: a + b,
    "sub": lambda xp, a, b: a - b,
    "mul": lambda xp, a, b: a * b,
    "div": _div,
    "maximum": lambda xp, a, b: xp.maximum(a, b),
    "greater": lambda xp, a, b: a > b,
    "equal": lambda xp, a, b: a == b,
    "logical_and": lambda xp, a, b: xp.logical_and(a, b),
    "logical_or": lambda xp, a, b: xp.logical_or(a, b),
    "matmul": lambda xp, a, b: xp.matmul(a, b),
    "add_": lambda xp, a, b: a + b,
    "accumulate_": lambda xp, a, b: a + b,
}
REDUCE: dict[str, Callable] = {
    "sum": lambda xp, x, axis, keepdims: xp.sum(x, axis=axis, keepdims=keepdims),
    "mean": lambda xp, x, axis, keepdims: xp.mean(x, axis=axis, keepdims=keepdims),
    "max": lambda xp, x, axis, keepdims: xp.max(x, axis=axis, keepdims=keepdims),
    "min": lambda xp, x, axis, keepdims: xp.min(x, axis=axis, keepdims=keepdims),
    "prod": lambda xp, x, axis, keepdims: xp.prod(x, axis=axis, keepdims=keepdims),
    "sumsquare": lambda xp, x, axis, keepdims: xp.sum(x * x, axis=axis, keepdims=keepdims),
    "logsumexp": _logsumexp,
}


def _shape_op(xp: Any, node: Node, x: Any) -> Any:
    a = node.attrs
    if node.op in ("reshape", "reshape_"):
        return xp.reshape(x, a["shape"])
    if node.op in ("transpose", "transpose_"):
        return xp.transpose(x, a["perm"])
    return x[_slice_index(a["bounds"])]


def _view_inverse(xp: Any, node: Node) -> Callable:
    a = node.attrs
    if node.op == "reshape_":
        return lambda base, new: xp.reshape(new, base.shape)
    if node.op == "transpose_":
        inverse = tuple(int(i) for i in np.argsort(a["perm"]))
        return lambda base, new: xp.transpose(new, inverse)
    index = _slice_index(a["bounds"])
    return lambda base, new: set_index(xp, base, index, new)


def simple(xp: Any, node: Node, xs: list, out_dtype: Any) -> Any:
    """The value of a node without subgraphs or collectives (its single output)."""
    a = node.attrs
    op = node.op
    if op == "const":
        return xp.asarray(a["data"]).astype(out_dtype)
    if op in ("reshape", "reshape_", "transpose", "transpose_", "slice", "slice_"):
        return _shape_op(xp, node, xs[0])
    if op == "concat":
        return xp.concatenate(xs, axis=a["axis"])
    if op == "cast":
        x = xs[0]
        if np.dtype(out_dtype) == np.bool_:
            return x != 0
        if np.issubdtype(out_dtype, np.integer) and np.issubdtype(x.dtype, np.floating):
            x = xp.trunc(x)
        return x.astype(out_dtype)
    ys = [_up(xp, x) for x in xs]
    if op in UNARY:
        out = UNARY[op](xp, ys[0])
    elif op in BINARY:
        out = BINARY[op](xp, ys[0], ys[1])
        if op == "accumulate_" and xp is not np:
            # var_updates ops have no gradient (ARCHITECTURE.md §5): nothing flows through them
            import jax  # noqa: PLC0415

            out = jax.lax.stop_gradient(out)
    elif op in REDUCE:
        out = REDUCE[op](xp, ys[0], a["axis"], a["keepdims"])
    elif op == "clip":
        out = xp.clip(ys[0], a["min"], a["max"])
    elif op == "scaled_add_":
        out = a["a"] * ys[0] + a["b"] * ys[1]
    else:
        raise KeyError(f"the reference has no rule for op {op!r}")
    return xp.asarray(out).astype(out_dtype)


# Collectives ------------------------------------------------------------------------------


def _fold(values: list, op: str) -> Any:
    stacked = np.stack([_up(np, v) for v in values])
    if op == "add":
        return stacked.sum(0)
    if op == "mean":
        return stacked.mean(0)
    if op == "max":
        return stacked.max(0)
    if op == "min":
        return stacked.min(0)
    if op == "mul":
        return stacked.prod(0)
    raise KeyError(op)


def collective(node: Node, per_replica: list[list], replicas: int, out_dtype: Any) -> list:
    """Each replica's output of a collective node (NumPy)."""
    a = node.attrs
    members = group_members(replicas, a.get("group"))
    xs = [vals[0] for vals in per_replica]
    outs = []
    for r in range(replicas):
        group = [xs[m] for m in members[r]]
        if node.op in ("all_reduce", "all_reduce_"):
            out = _fold(group, a["op"])
        elif node.op == "all_gather":
            out = np.concatenate([np.reshape(g, (-1,) + g.shape[1:]) for g in group], axis=0)
        elif node.op == "reduce_scatter":
            n = len(group)
            flat = _fold([g.reshape(-1) for g in group], a["op"])
            chunk = -(-flat.size // n)
            flat = np.concatenate([flat, np.zeros(chunk * n - flat.size, flat.dtype)])
            rank = members[r].index(r)
            out = flat[rank * chunk : (rank + 1) * chunk]
        else:
            raise KeyError(node.op)
        outs.append(np.asarray(out).astype(out_dtype))
    return outs


# Evaluation -------------------------------------------------------------------------------


class Evaluator(ExtraRules):
    """Evaluates a program's blocks for every replica."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.replicas = program.replicas

    def dtype(self, vid: int) -> Any:
        return NP_DTYPES[self.program.specs[vid].dtype]

    def run_block(self, block: Block, envs: list[Env], args: list[list]) -> list[list]:
        """Outputs of ``block`` per replica, given each replica's input values.

        Inputs are passed by value: ``envs`` are the block's fresh environments.
        """
        for env, vals in zip(envs, args):
            for vid, v in zip(block.inputs, vals):
                env.define(vid, v)
        for node in block.nodes:
            self.node(node, envs)
        return [[env.vals[v] for v in block.outputs] for env in envs]

    def node(self, node: Node, envs: list[Env]) -> None:
        op = node.op
        if op in ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_"):
            per = [[env.vals[v] for v in node.args] for env in envs]
            outs = collective(node, per, len(envs), self.dtype(node.outs[0]))
            for env, out in zip(envs, outs):
                self._define_output(env, node, out)
            return
        handler = getattr(self, "_" + op, None)
        if handler is not None:
            handler(node, envs)
            return
        for env in envs:
            xs = [env.vals[v] for v in node.args]
            self._define_output(env, node, simple(env.xp, node, xs, self.dtype(node.outs[0])))

    def _define_output(self, env: Env, node: Node, out: Any) -> None:
        (vid,) = node.outs
        if node.op in INPLACE:
            env.write(node.args[0], out)
            env.view(vid, node.args[0], lambda b: b, lambda b, n: n)
        elif node.op in VIEWS:
            env.view(
                vid,
                node.args[0],
                lambda b, n=node: _shape_op(env.xp, n, b),
                _view_inverse(env.xp, node),
            )
        else:
            env.define(vid, out)

    def _enter(self, envs: list[Env], body: Block, args: Sequence[int]) -> list[list]:
        sub = [Env(env.xp) for env in envs]
        return self.run_block(body, sub, [[env.vals[v] for v in args] for env in envs]), sub

    def _write_back(self, envs: list, sub: list, body: Block, args: Sequence[int]) -> None:
        for pos in sorted(body.by_ref):
            for env, s in zip(envs, sub):
                env.write(args[pos], s.vals[body.inputs[pos]])

    def _call(self, node: Node, envs: list[Env]) -> None:
        body = node.attrs["body"]
        outs, sub = self._enter(envs, body, node.args)
        self._write_back(envs, sub, body, node.args)
        for env, vals in zip(envs, outs):
            for vid, v in zip(node.outs, vals):
                env.define(vid, v)

    def _repeat(self, node: Node, envs: list[Env]) -> None:
        body = node.attrs["body"]
        n_out = len(body.outputs)
        carried = [[env.vals[v] for v in node.args[:n_out]] for env in envs]
        for _ in range(node.attrs["count"]):
            sub = [Env(env.xp) for env in envs]
            args = [c + [env.vals[v] for v in node.args[n_out:]] for c, env in zip(carried, envs)]
            carried = self.run_block(body, sub, args)
            self._write_back(envs, sub, body, node.args)
        for env, vals in zip(envs, carried):
            for vid, v in zip(node.outs, vals):
                env.define(vid, v)

    def _cond(self, node: Node, envs: list[Env]) -> None:
        n_then = node.attrs["n_then"]
        for env in envs:
            flag = bool(np.asarray(env.vals[node.args[0]]).reshape(()))
            body = node.attrs["then" if flag else "else"]
            args = node.args[1 : 1 + n_then] if flag else node.args[1 + n_then :]
            (outs,), sub = self._enter([env], body, args)
            self._write_back([env], sub, body, args)
            for vid, v in zip(node.outs, outs):
                env.define(vid, v)

    def _grad(self, node: Node, envs: list[Env]) -> None:
        body = node.attrs["body"]
        n_in = len(body.inputs)
        for env in envs:
            vals = [env.vals[v] for v in node.args[:n_in]]
            seeds = [env.vals[v] for v in node.args[n_in:]]
            grads = vjp(self, body, vals, seeds, node.attrs["wrt"])
            for vid, g in zip(node.outs, grads):
                env.define(vid, g.astype(self.dtype(vid)))


def evaluate(program: Program) -> tuple[list[list], list[list]]:
    """(each replica's main outputs, each replica's final leaf values).

    A pipelined program is run once per micro-batch; its outputs are stacked.
    """
    if program.steps == 1:
        return evaluate_step(program)
    runs = [evaluate_step(program, m) for m in range(program.steps)]
    outs = [[np.stack(vals) for vals in zip(*(run[0][0] for run in runs))]]
    return outs, runs[-1][1]


def evaluate_step(program: Program, micro_batch: int | None = None) -> tuple[list, list]:
    ev = Evaluator(program)
    envs = [Env(np) for _ in range(program.replicas)]
    for leaf in program.leaves:
        values = [leaf_value(program, leaf, r) for r in range(program.replicas)]
        if micro_batch is not None and leaf.kind == "stream":
            values = [leaf.data[micro_batch]]
        if leaf.kind == "rts":
            values = rts_leaf_values(program, leaf, values)
        for env, value in zip(envs, values):
            env.define(leaf.vid, value)
    outs = ev.run_block(program.main, envs, [[] for _ in envs])
    finals = [[env.vals[leaf.vid] for leaf in program.leaves] for env in envs]
    for i, leaf in enumerate(program.leaves):
        if leaf.kind == "rts":
            full = rts_leaf_finals(program, leaf, [f[i] for f in finals])
            for f, value in zip(finals, full):
                f[i] = value
    return outs, finals


def leaf_value(program: Program, leaf: Any, replica: int) -> np.ndarray:
    """The value replica ``replica`` starts with for a leaf."""
    if leaf.kind == "stream" and program.replicas > 1:
        return leaf.data[replica]
    if leaf.grouping is not None:
        stride, size = leaf.grouping
        groups = sorted({tuple(m) for m in group_members(program.replicas, leaf.grouping)})
        index = next(i for i, g in enumerate(groups) if replica in g)
        return leaf.data[index] if len(groups) > 1 else leaf.data
    return leaf.data
