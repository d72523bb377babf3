"""Work on read-only state taken out of the step and kept between runs.

An inference program reads its weights and never writes them, yet every run repeats what it
does to them before they meet the data: on the CPU each convolution's weight is transposed
from torch's ``(O, I, *kernel)`` to the channels-last kernel layout, a depthwise weight is
cut into per-tap slices, and an eval batch norm's scale is formed from its statistics
(EfficientNet-B0's inference step: 19 ms with that work, 13 ms without). ``split`` cuts the
step's jaxpr in two: ``prepare``, the equations that read only read-only state (layout and
elementwise arithmetic, nothing that grows an array), and ``main``, the rest, which takes
``prepare``'s results as extra arguments. ``Hoisted`` runs
``prepare`` again only when the read-only state it was given is not the same set of arrays
as last time (JAX arrays are immutable: a write of a weight, from the host or by another
program, makes a new array), so a run costs what its data needs.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from jax.extend import core as jcore

# Equations ``prepare`` may take: they neither branch, draw random numbers nor make an
# array larger than what they read (``pad`` excepted: a kernel padded by a few taps).
HOISTED = frozenset(
    {
        "transpose", "reshape", "squeeze", "expand_dims", "rev", "slice", "concatenate",
        "pad", "copy", "copy_p", "convert_element_type", "neg", "add", "sub", "mul", "div",
        "max", "min", "sqrt", "rsqrt", "integer_pow", "square",
    }
)  # fmt: skip
# Equations XLA does for free (a new view of the same buffer): hoisting only these saves nothing
FREE = frozenset({"reshape", "squeeze", "expand_dims", "convert_element_type"})

# the calls of the lowering rules (convolutions, pools) whose bodies the sinking inlines
CUSTOM_CALLS = frozenset({"custom_vjp_call", "custom_jvp_call"})
# ``prepare`` runs once per set of weights: compiled for compile time, not run time
# (EfficientNet-B0's, 1,212 equations: 2.1 s with XLA's defaults, 0.65 s so)
QUICK_TO_COMPILE = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_cpu_use_fusion_emitters": False,
}

# where ``prepare`` compiles while the session compiles ``main``
_COMPILER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hoisting")


class Split(NamedTuple):
    """``prepare(*read_only) -> prepared`` and ``main(*arguments, *prepared) -> outputs``."""

    prepare: jcore.ClosedJaxpr
    main: jcore.ClosedJaxpr


def split(closed: jcore.ClosedJaxpr, read_only: Sequence[int]) -> Split | None:
    """``closed`` cut into the work on its read-only arguments (positions ``read_only`` of
    its flat arguments) and the rest; None where nothing worth keeping reads them alone."""
    jaxpr = closed.jaxpr
    derived = {jaxpr.invars[i] for i in read_only}
    hoisted: list[Any] = []
    kept: list[Any] = []
    for eqn in jaxpr.eqns:
        reads = [v for v in eqn.invars if not isinstance(v, jcore.Literal)]
        if (
            eqn.primitive.name in HOISTED
            and reads
            and all(v in derived for v in reads)
            and not eqn.effects
        ):
            hoisted.append(eqn)
            derived.update(eqn.outvars)
        else:
            kept.append(eqn)
    if not any(eqn.primitive.name not in FREE and _worth(eqn.outvars) for eqn in hoisted):
        return None
    used = {v for eqn in kept for v in eqn.invars if not isinstance(v, jcore.Literal)}
    used.update(v for v in jaxpr.outvars if not isinstance(v, jcore.Literal))
    prepared = [v for eqn in hoisted for v in eqn.outvars if v in used]
    prepare = _jaxpr([], [jaxpr.invars[i] for i in read_only], prepared, hoisted, "prepare")
    main = _jaxpr(
        jaxpr.constvars, [*jaxpr.invars, *prepared], jaxpr.outvars, kept, "step", jaxpr.effects
    )
    return Split(jcore.ClosedJaxpr(prepare, []), jcore.ClosedJaxpr(main, closed.consts))


def _jaxpr(
    constvars: list, invars: list, outvars: list, eqns: list, name: str, effects: Any = None
) -> jcore.Jaxpr:
    info = jcore.DebugInfo(
        "jit", name, tuple(f"a{i}" for i in range(len(invars))), tuple("" for _ in outvars)
    )
    return jcore.Jaxpr(constvars, invars, outvars, eqns, effects or jcore.no_effects, info)


def worth_hoisting(closed: jcore.ClosedJaxpr, args: tuple, read_only: int) -> bool:
    """Whether ``closed``, traced for ``args``, may do work on ``args[read_only]`` alone
    that ``split`` would keep, before its calls are inlined (a call, such as a convolution's
    ``custom_vjp``, that reads read-only state may hold it; ``runtime.transpose_sinking``
    inlines them). A training step, which writes its weights, has no such work and keeps
    its plain compilation, as does one whose read-only state is only scalars (an
    optimizer's hyperparameters)."""
    read = _positions(args, read_only)
    fixed = {closed.jaxpr.invars[i] for i in read}
    calls = (e for e in closed.jaxpr.eqns if e.primitive.name in CUSTOM_CALLS)
    read_by_calls = [
        v for e in calls for v in e.invars if not isinstance(v, jcore.Literal) and v in fixed
    ]
    return _worth(read_by_calls) or split(closed, read) is not None


def _positions(args: tuple, read_only: int) -> range:
    """The positions of ``args[read_only]``'s leaves among the flat leaves of ``args``."""
    counts = [len(jax.tree_util.tree_leaves(a)) for a in args]
    start = sum(counts[:read_only])
    return range(start, start + counts[read_only])


def _worth(values: Sequence[Any]) -> bool:
    """Whether any of ``values`` is a matrix or larger: work on scalars and per-channel
    vectors (an optimizer's hyperparameters, a batch norm's factors alone) is not worth a
    program of its own."""
    return any(len(v.aval.shape) >= 2 for v in values if not isinstance(v, jcore.Literal))


class Hoisted:
    """A step ``fn(*args)`` run as ``main`` after ``prepare``, whose results are kept while
    the read-only arguments (``args[read_only]``, a pytree of arrays) stay the same arrays.

    ``jit(fun, donate_argnums)`` compiles ``main`` (flat arguments, those of ``args[0]``
    donated as ``args[0]`` was)."""

    def __init__(
        self,
        closed: jcore.ClosedJaxpr,
        out_tree: Any,
        args: tuple,
        read_only: int,
        jit: Callable[..., Any],
    ) -> None:
        read = _positions(args, read_only)
        self._fixed = slice(read.start, read.stop)
        self._out_tree = out_tree
        parts = split(closed, read) or Split(
            jcore.ClosedJaxpr(_jaxpr([], [closed.jaxpr.invars[i] for i in read], [], [], ""), []),
            closed,
        )
        self._prepare = jax.jit(
            jcore.jaxpr_as_fun(parts.prepare), compiler_options=QUICK_TO_COMPILE
        )
        donated = tuple(range(len(jax.tree_util.tree_leaves(args[0]))))
        self._main = jit(jcore.jaxpr_as_fun(parts.main), donate_argnums=donated)
        self._compiling: concurrent.futures.Future | None = None
        self._kept_for: tuple = ()
        self._kept: Sequence[Any] = ()

    def prepared(self, flat: Sequence[Any]) -> Sequence[Any]:
        """``prepare``'s results for these arguments' read-only arrays (made again only where
        they are not the arrays of the previous call)."""
        fixed = tuple(flat[self._fixed])
        same = len(fixed) == len(self._kept_for) and all(
            a is b for a, b in zip(fixed, self._kept_for)
        )
        if not same:
            if self._compiling is not None:
                compiling, self._compiling = self._compiling, None
                compiling.result()
            self._kept = self._prepare(*fixed)
            self._kept_for = fixed
        return self._kept

    def __call__(self, *args: Any) -> Any:
        return self.call_compiled(self._main, *args)

    def call_compiled(self, main: Any, *args: Any) -> Any:
        """``main`` (this step's, or its executable compiled from ``lower``, as the
        executable cache loads it) run for ``args``."""
        flat = jax.tree_util.tree_leaves(args)
        outs = main(*flat, *self.prepared(flat))
        return jax.tree_util.tree_unflatten(self._out_tree, outs)

    def lower(self, *args: Any) -> Any:
        """``main`` lowered for abstract or concrete ``args`` (``prepare``'s results as
        abstract values: ``prepare`` is compiled with them)."""
        flat = jax.tree_util.tree_leaves(args)
        fixed = flat[self._fixed]
        # compiled beside ``main`` (XLA releases the interpreter while it compiles)
        self._compiling = _COMPILER.submit(lambda: self._prepare.lower(*fixed).compile())
        # placed where the run's will be (the device of the state), or the run compiles again
        where = getattr(fixed[0], "sharding", None) if fixed else None
        kept = [
            jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=where)
            for k in jax.eval_shape(self._prepare, *fixed)
        ]
        return self._main.lower(*flat, *kept)

    def trace(self, *args: Any) -> Any:
        """``main`` traced (``jax.stages.Traced``) for ``args``."""
        flat = jax.tree_util.tree_leaves(args)
        return self._main.trace(*flat, *jax.eval_shape(self._prepare, *flat[self._fixed]))
