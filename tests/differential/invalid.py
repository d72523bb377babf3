"""Invalid programs: the generator's valid programs with one bad op slipped in.

``InvalidBuilder`` builds a random program and, after random nodes, tries one mutation (an
op with wrong shapes or dtypes, a tensor of another graph, bad call inputs, an in-place op
on a constant, a bad replica grouping ...). Each refusal must be a typed, teaching error
raised while the op is created, and must leave the IR exactly as it was.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.errors import InternalError
from popxl.ops import collectives

from .build import Builder
from .program import Node

TYPED = (ValueError, TypeError, IndexError, KeyError, NotImplementedError, RuntimeError)


def snapshot(ir: popxl.Ir) -> tuple:
    """Everything a half-applied op would change."""
    graphs = []
    for g in ir._graphs.values():
        consumers = sum(len(t._consumers) for t in g._tensors.values())
        graphs.append(
            (g.id, len(g._ops), len(g._tensors), len(g._inputs), len(g._outputs), consumers)
        )
    return (tuple(graphs), len(ir._variables), len(ir._streams), len(ir._remote_buffers))


def judge(error: BaseException | None, what: str) -> str | None:
    """Why the refusal (or its absence) is wrong, or None when it is a good refusal."""
    if error is None:
        return f"{what}: accepted (no error)"
    if isinstance(error, (AssertionError, InternalError)) or not isinstance(error, TYPED):
        return f"{what}: untyped refusal {type(error).__name__}: {error}"
    last = traceback.extract_tb(error.__traceback__)[-1].filename
    if "site-packages" in last:
        return f"{what}: raw library error from {last}: {type(error).__name__}: {error}"
    if len(str(error)) < 25:
        return f"{what}: terse message {str(error)!r}"
    return None


def _float(env: list, rng: np.random.Generator, rank: int = 0) -> Any:
    cands = [t for t in env if t.dtype == popxl.float32 and t.rank >= rank]
    return cands[int(rng.integers(len(cands)))] if cands else None


def _const(shape: tuple, dtype: Any = popxl.float32) -> Any:
    return popxl.constant(np.ones(shape, dtype.as_numpy()), dtype)


class Mutations:
    """Each method returns (name, the bad op as a thunk) or None when it does not apply here.

    Setup (constants, helper graphs) happens before the snapshot; only the thunk is judged.
    """

    def __init__(self, ir: popxl.Ir, rng: np.random.Generator, main_env: list) -> None:
        self.ir, self.rng, self.main_env = ir, rng, main_env

    def binary_shape(self, env: list) -> Any:
        a = _float([t for t in env if t.shape and t.shape[-1] > 1], self.rng, 1)
        if a is None:
            return None
        b = _const((a.shape[-1] + 1,))
        op = [ops.add, ops.sub, ops.mul, ops.div, ops.maximum][int(self.rng.integers(5))]
        return f"{op.__name__} of shapes {a.shape} and {b.shape}", lambda: op(a, b)

    def binary_dtype(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None
        b = _const(a.shape, popxl.int32)
        return "add of float32 and int32", lambda: ops.add(a, b)

    def matmul_shape(self, env: list) -> Any:
        a = _float(env, self.rng, 2)
        if a is None:
            return None
        b = _const((a.shape[-1] + 1, 2))
        return f"matmul {a.shape} @ {b.shape}", lambda: ops.matmul(a, b)

    def reshape_count(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None
        op = ops.reshape_ if self.rng.random() < 0.5 else ops.reshape
        return f"{op.__name__} of {a.shape} to ({a.nelms + 1},)", lambda: op(a, (a.nelms + 1,))

    def transpose_perm(self, env: list) -> Any:
        a = _float(env, self.rng, 2)
        if a is None:
            return None
        perm = [0] * a.rank
        return f"transpose of rank {a.rank} by {perm}", lambda: ops.transpose(a, perm)

    def reduce_axis(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None
        return f"sum over axis {a.rank + 1} of rank {a.rank}", lambda: ops.sum(a, a.rank + 1)

    def concat_shape(self, env: list) -> Any:
        a = _float(env, self.rng, 2)
        if a is None:
            return None
        b = _const((a.shape[0], a.shape[1] + 1, *a.shape[2:]))
        return f"concat of {a.shape} and {b.shape} on axis 0", lambda: ops.concat([a, b], 0)

    def not_a_tensor(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None
        return "add of a tensor and a string", lambda: ops.add(a, "two")

    def cast_fp8(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None
        return "cast to float8", lambda: ops.cast(a, popxl.float8_143)

    def other_graph(self, env: list) -> Any:
        current = popxl.gcg()
        foreign = [t for t in self.main_env if t._graph is not current]
        if current is self.ir.main_graph or not foreign:
            return None
        t = foreign[int(self.rng.integers(len(foreign)))]
        return "a main-graph tensor used in a subgraph", lambda: ops.negate(t)

    def _graph(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None, None
        return a, self.ir.create_graph(lambda x: ops.tanh(x), a.spec)

    def call_too_many(self, env: list) -> Any:
        a, g = self._graph(env)
        if g is None:
            return None
        return "call with too many inputs", lambda: ops.call(g, a, a)

    def call_missing(self, env: list) -> Any:
        a, g = self._graph(env)
        if g is None:
            return None
        return "call with a missing input", lambda: ops.call(g)

    def call_wrong_shape(self, env: list) -> Any:
        a, g = self._graph(env)
        if g is None:
            return None
        b = _const((*a.shape, 2))
        return f"call with shape {b.shape} for {a.shape}", lambda: ops.call(g, b)

    def call_bad_key(self, env: list) -> Any:
        a, g = self._graph(env)
        if g is None:
            return None
        return "call with an inputs_dict key of the parent", lambda: ops.call(g, inputs_dict={a: a})

    def call_main(self, env: list) -> Any:
        return "call of the main graph", lambda: ops.call(self.ir.main_graph)

    def repeat_negative(self, env: list) -> Any:
        a, g = self._graph(env)
        if g is None:
            return None
        return "repeat -1 times", lambda: ops.repeat(g, -1, a)

    def cond_not_bool(self, env: list) -> Any:
        a, g = self._graph(env)
        if g is None:
            return None
        return "conditional on a float", lambda: ops.conditional(a, g, g, [a], [a])

    def cond_branch_outputs(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None
        flag = popxl.constant(True)
        same = self.ir.create_graph(lambda t: t * 2.0, a)
        other = self.ir.create_graph(lambda t: t.reshape((1, *t.shape)), a)
        return "conditional branches with different outputs", lambda: ops.conditional(
            flag, same, other, [a], [a]
        )

    def bad_grouping(self, env: list) -> Any:
        r = self.ir.replication_factor
        a = _float(env, self.rng)
        if a is None:
            return None

        def bad() -> Any:
            group = self.ir.replica_grouping(r + 1, 2)
            return collectives.replicated_all_reduce(a, "add", group)

        return f"replica grouping stride {r + 1} for {r} replicas", bad

    def collective_op(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None
        return "all_reduce with op 'median'", lambda: collectives.replicated_all_reduce(a, "median")

    def variable_in_subgraph(self, env: list) -> Any:
        if popxl.gcg() is self.ir.main_graph:
            return None
        return "a variable created in a subgraph", lambda: popxl.variable(np.ones(2, np.float32))

    def autodiff_modifying(self, env: list) -> Any:
        a = _float(env, self.rng)
        if a is None:
            return None
        g = self.ir.create_empty_graph("modifies")
        with g:
            x = popxl.graph_input(a.shape, a.dtype, "x", by_ref=True)
            popxl.graph_output(ops.add_(x, x))
        return "autodiff of a graph that modifies its input", lambda: transforms.autodiff(g)

    @classmethod
    def names(cls) -> list[str]:
        return [n for n in vars(cls) if not n.startswith("_") and n != "names"]


class InvalidBuilder(Builder):
    """Builds a random program, trying a mutation after some nodes."""

    def __init__(self, ir: popxl.Ir, rng: np.random.Generator, rate: float = 0.3) -> None:
        super().__init__(ir)
        self.rng, self.rate = rng, rate
        self.main_env: list = []
        self.findings: list[str] = []
        self.tried: dict[str, int] = {}
        self.mutations = Mutations(ir, rng, self.main_env)

    def nodes(self, nodes: list[Node], env: dict[int, Any]) -> None:
        for node in nodes:
            outs = self.node(node, [env[v] for v in node.args])
            for vid, t in zip(node.outs, outs):
                env[vid] = t
            tensors = [t for t in env.values() if isinstance(t, popxl.Tensor)]
            if popxl.gcg() is self.ir.main_graph:
                self.main_env[:] = tensors
            if self.rng.random() < self.rate:
                self.mutate(tensors)

    def mutate(self, env: list) -> None:
        names = Mutations.names()
        name = names[int(self.rng.integers(len(names)))]
        made: Callable | None = getattr(self.mutations, name)(env)
        if made is None:
            return
        what, bad = made
        self.tried[name] = self.tried.get(name, 0) + 1
        before = snapshot(self.ir)
        error = None
        try:
            bad()
        except Exception as e:  # noqa: BLE001 (judged below)
            error = e
        problem = judge(error, f"{name} ({what})")
        if problem is None and snapshot(self.ir) != before:
            problem = f"{name} ({what}): refused but half-applied"
        if problem is not None:
            self.findings.append(problem)
