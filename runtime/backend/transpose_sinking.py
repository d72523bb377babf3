"""Transposes sunk through a traced step until they cancel: channels-last between convolutions.

On XLA:CPU every convolution form runs channels-last (``runtime/conv_forms``) on ``NC*``
operands, so each convolution transposes its input in and its output out, and its gradients
do the same. Between two convolutions sit only per-channel ops (BatchNorm, activations,
residual adds), which do not care about the layout, yet XLA keeps the ``NC*`` layout the
program names and pays both transposes (13% of MobileNetV2's training step, with as much
again in the copies around them).

``sink_transposes(fn)`` traces ``fn`` and evaluates its jaxpr again with every transpose
left pending: a value is then held as ``(base, perm)``, meaning ``lax.transpose(base,
perm)``, and ops that commute with a transpose (elementwise ops, reductions, pads, slices,
reshapes that only merge or split neighbouring axes, matmuls, concatenations, splits) are
applied to the base, their results pending the same or the mapped permutation. A pending
transpose of a pending transpose composes, and one that composes to the identity is gone.
Anything else reads the value transposed, once. The result is the same program, value for
value: only where the transposes run changes.

Calls (``jit``, ``custom_jvp_call``, ``custom_vjp_call``) are inlined, so a convolution's
form and the ops around it meet; loop and branch bodies are rewritten on their own, their
operands and results in the layout the program gives them.

Imported lazily by the runtime's program builder: this module imports JAX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax import lax
from jax.extend import core as jcore

ELEMENTWISE = frozenset(
    """
    neg sign floor ceil round is_finite exp exp2 log log1p expm1 tanh logistic sin cos tan
    asin acos atan sinh cosh asinh acosh atanh sqrt rsqrt cbrt abs not integer_pow square
    erf erfc erf_inv lgamma digamma real imag conj convert_element_type reduce_precision
    copy copy_p stop_gradient population_count clz add add_any sub mul div rem pow max min
    atan2 nextafter
    and or xor eq ne lt le gt ge shift_left shift_right_logical shift_right_arithmetic
    select_n clamp
    """.split()
)
REDUCTIONS = frozenset(
    "reduce reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor "
    "argmax argmin".split()
)
CUMULATIVE = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())
INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "custom_jvp_call": "call_jaxpr"}
INLINED_VJP = "custom_vjp_call"


class Pending(NamedTuple):
    """``lax.transpose(base, perm)``, not yet computed.

    A pad or slice of a pending value also keeps its op (``source``: the equation and its
    operands): where it must be computed, the op is applied to its computed operand, so the
    nine slices of one padded input (im2col's taps) share one transpose rather than each
    paying its own.
    """

    base: Any
    perm: tuple[int, ...]
    source: tuple | None = None


def sink_transposes(fn: Any, traced: dict | None = None) -> Any:
    """``fn`` with its transposes sunk through the ops that commute with them (a function
    of the same arguments and results, to be traced by ``jax.jit``).

    ``traced`` (optional) holds traces of ``fn`` made beforehand, by the abstract values of
    their arguments (``trace``): one found there is not traced again."""

    def sunk(*args: Any) -> Any:
        found = (traced or {}).pop(abstract_key(args), None)
        closed, out_shape = found or jax.make_jaxpr(fn, return_shape=True)(*args)
        flat = jax.tree_util.tree_leaves(args)
        outs = Sinker().run(closed.jaxpr, closed.consts, flat)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    return sunk


def trace(fn: Any, args: tuple, traced: dict) -> Any:
    """``fn``'s closed jaxpr for ``args``, kept in ``traced`` for ``sink_transposes``."""
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    traced[abstract_key(args)] = (closed, out_shape)
    return closed


def abstract_key(args: tuple) -> tuple:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple((tuple(a.shape), str(a.dtype)) for a in leaves)


LOOPS = frozenset({"while", "scan", "cond"})


def has_loops(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` (or any jaxpr inside it) loops or branches."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in LOOPS:
            return True
        for sub in jcore.jaxprs_in_params(eqn.params):
            if has_loops(sub):
                return True
    return False


def inverse(perm: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def is_identity(perm: Sequence[int]) -> bool:
    return all(i == p for i, p in enumerate(perm))


def pending_transpose(base: Any, perm: tuple[int, ...]) -> Any:
    return base if is_identity(perm) else Pending(base, perm)


def transpose_of(v: Any, perm: tuple[int, ...]) -> Any:
    """``lax.transpose(v, perm)`` of a value the evaluation holds, left pending (composed
    with the transpose ``v`` pends, if any; gone where the two cancel)."""
    if isinstance(v, Pending):
        return pending_transpose(v.base, tuple(v.perm[i] for i in perm))
    return pending_transpose(v, perm)


def _shape(v: Any) -> tuple[int, ...]:
    """The shape of a value the evaluation holds: a pending transpose, an array (or tracer),
    or a literal's value, which JAX gives as a Python scalar where the literal is weakly
    typed (``TypedInt``, ``TypedFloat``: no ``shape``, no ``ndim``)."""
    if isinstance(v, Pending):
        return tuple(v.base.shape[p] for p in v.perm)
    return tuple(np.shape(v))


def _ndim(v: Any) -> int:
    return len(_shape(v))


class Sinker:
    """One evaluation of a jaxpr with pending transposes (per loop body, a fresh one)."""

    def __init__(self, stored: Sequence[Any] = ()) -> None:
        self._computed: dict[int, Any] = {}  # id(Pending) -> its transposed array
        self._keep: list[Any] = [*stored]  # what the ids here name, kept alive
        self._broadcasts: dict[int, tuple] = {}  # id(array) -> (operand, broadcast dims)
        # arrays kept in a layout of their own (``runtime.backend.stored_layouts``): an
        # elementwise op meeting one of them pending keeps its layout
        self.stored = {id(a) for a in stored}
        # in a loop body: its loop-invariant arguments (id -> position), the transposes of
        # them made outside the loop ((position, perm) -> array), and those it asked for
        self.invariant: dict[int, int] = {}
        self.hoisted: dict[tuple[int, tuple[int, ...]], Any] = {}
        self.hoistable: set[tuple[int, tuple[int, ...]]] = set()

    def child(self, inner: Sequence[tuple[Any, Any]], stored: Sequence[Any]) -> Sinker:
        """The evaluation of a loop body: ``inner`` pairs each value this evaluation holds
        with the body's argument it becomes; ``stored``: the body's arguments that carry
        values in a layout of their own."""
        return Sinker(stored)

    def note_transpose(self, x: Any, perm: tuple[int, ...]) -> None:
        """Called for each transpose the program asks of ``x`` (a hook for probes)."""

    # Reading values ------------------------------------------------------------------------

    def value(self, v: Any) -> Any:
        """The array ``v`` stands for (a pending transpose is computed, once)."""
        if not isinstance(v, Pending):
            return v
        key = id(v)
        if key not in self._computed:
            where = self.invariant.get(id(v.base)) if v.source is None else None
            if where is not None and (where, v.perm) in self.hoisted:
                self._computed[key] = self.hoisted[(where, v.perm)]
            elif v.source is None:
                if where is not None:
                    self.hoistable.add((where, v.perm))
                self._computed[key] = lax.transpose(v.base, v.perm)
            else:
                eqn, ins = v.source
                self._computed[key] = self.bind_one(eqn, [self.value(x) for x in ins])
            self._keep.append(v)
        return self._computed[key]

    def transposed(self, x: Any, perm: tuple[int, ...]) -> Any:
        """``lax.transpose(x, perm)`` of an array; a broadcast is broadcast again instead."""
        made = self._broadcasts.get(id(x))
        if made is None:
            return lax.transpose(x, perm)
        operand, dims = made
        where = inverse(perm)
        mapped = [where[d] for d in dims]
        order = sorted(range(len(mapped)), key=mapped.__getitem__)
        if order != list(range(len(order))):
            operand = lax.transpose(operand, tuple(order))
        shape = tuple(_shape(x)[p] for p in perm)
        return lax.broadcast_in_dim(operand, shape, tuple(sorted(mapped)))

    # The evaluation ------------------------------------------------------------------------

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """The outputs of ``jaxpr``, computed (none left pending)."""
        return [self.value(v) for v in self.evaluate(jaxpr, consts, args)]

    def evaluate(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """The outputs of ``jaxpr``, some possibly pending."""
        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jcore.Literal) else env[v]

        for var, val in zip(jaxpr.constvars, consts):
            env[var] = val
        for var, val in zip(jaxpr.invars, args):
            env[var] = val
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            with eqn.ctx.manager:
                outs = self.apply(eqn, ins)
            for var, val in zip(eqn.outvars, outs):
                env[var] = val
        return [read(v) for v in jaxpr.outvars]

    def apply(self, eqn: Any, ins: list[Any]) -> list[Any]:
        name = eqn.primitive.name
        if name in INLINED:
            closed = eqn.params[INLINED[name]]
            return self.evaluate(closed.jaxpr, closed.consts, ins)
        if name == INLINED_VJP:
            closed = eqn.params["call_jaxpr"]
            return self.evaluate(closed.jaxpr, closed.consts, ins)
        if name == "scan":
            return _scan(self, eqn, ins)
        if name == "transpose":
            x, perm = ins[0], tuple(eqn.params["permutation"])
            self.note_transpose(x, perm)
            return [transpose_of(x, perm)]
        if any(isinstance(v, Pending) for v in ins):
            rule = _RULES.get(name)
            if rule is None and name in ELEMENTWISE:
                rule = _elementwise
            elif rule is None and name in REDUCTIONS:
                rule = _reduction
            elif rule is None and name in CUMULATIVE:
                rule = _cumulative
            sunk = rule(self, eqn, ins) if rule is not None else None
            if sunk is not None:
                return sunk
        return self.bind(eqn, [self.value(v) for v in ins])

    def bind(self, eqn: Any, ins: list[Any], **changed: Any) -> list[Any]:
        params = dict(eqn.primitive.get_bind_params(eqn.params))  # (may be eqn.params itself)
        params.update(changed)
        for key, val in params.items():
            params[key] = _bodies_rewritten(val)
        out = eqn.primitive.bind(*ins, **params)
        if eqn.primitive.multiple_results:
            return list(out)
        self._note_broadcast(eqn, ins[0] if ins else None, out, params)
        return [out]

    def _note_broadcast(self, eqn: Any, x: Any, out: Any, params: dict) -> None:
        """Remembers ``out`` as a broadcast (``transposed`` broadcasts it again): made by
        ``broadcast_in_dim``, or converted from one (a weakly typed literal's broadcast,
        ``jnp.full(shape, 1.0)``, is converted to the program's dtype)."""
        name = eqn.primitive.name
        if name == "broadcast_in_dim" and _ndim(x) < _ndim(out):
            made = (x, tuple(params["broadcast_dimensions"]))
        elif (
            name == "convert_element_type"
            and id(x) in self._broadcasts
            and params.get("sharding") is None  # (one for the result, not its operand)
        ):
            operand, dims = self._broadcasts[id(x)]
            made = (eqn.primitive.bind(operand, **params), dims)
        else:
            return
        self._broadcasts[id(out)] = made
        self._keep.append(out)

    def bind_one(self, eqn: Any, ins: list[Any], **changed: Any) -> Any:
        params = dict(eqn.params)
        params.update(changed)
        return eqn.primitive.bind(*ins, **params)


def _bodies_rewritten(param: Any) -> Any:
    """An equation's parameter with the loop and branch bodies it holds rewritten: a closed
    jaxpr, or one in a tuple (``cond``'s branches, ``custom_linear_solve``'s named tuple,
    whose absent members are None). Anything else is returned as it is."""
    if isinstance(param, jcore.ClosedJaxpr):
        return _rewritten(param)
    if not isinstance(param, tuple) or not any(isinstance(v, jcore.ClosedJaxpr) for v in param):
        return param
    members = [_bodies_rewritten(v) for v in param]
    return type(param)(*members) if hasattr(param, "_fields") else tuple(members)


def _rewritten(closed: Any) -> Any:
    """A loop or branch body with its own transposes sunk; its signature unchanged."""
    avals = closed.in_avals

    def body(*args: Any) -> list[Any]:
        return Sinker().run(closed.jaxpr, closed.consts, args)

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
    try:
        new = jax.make_jaxpr(body)(*specs)
    except TypeError:  # an operand JAX cannot describe as a ShapeDtypeStruct (a token)
        return closed
    if [(a.shape, a.dtype, a.weak_type) for a in new.out_avals] != [
        (a.shape, a.dtype, a.weak_type) for a in closed.out_avals
    ]:
        return closed
    return new


def _scan(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any]:
    """A ``scan`` whose loop-invariant operands and carries keep their layouts through the
    body: a pending operand enters as its base and the body's argument pends the same
    transpose, so a weight kept channels-last meets its convolutions' transposes inside the
    body (a gradient-accumulation loop's forward and backward). A carry is kept in the
    layout the body leaves its new value in (a gradient accumulator, made in the weight
    gradient's layout), and a transpose the body makes of a loop-invariant operand (a
    weight's for its input gradient) is made once, before the loop, and passed in. The
    body is evaluated with the carries as they come, and once more if it leaves any in
    another layout or transposes an invariant operand. Its carries are returned in their
    layouts, and the loop's final carries pend them."""
    params = eqn.params
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    carry_end = n_consts + n_carry
    perms = [
        v.perm if isinstance(v, Pending) and i < carry_end else None for i, v in enumerate(ins)
    ]
    body, left, asked = _scan_body(s, eqn, ins, perms, [])
    wanted = perms[:n_consts] + left + perms[carry_end:]
    hoist = sorted(asked)
    if body is not None and (wanted != perms or hoist):
        perms = wanted
        body, _, _ = _scan_body(s, eqn, ins, perms, hoist)
    if body is None:
        return s.bind(eqn, [s.value(v) for v in ins])
    operands = [_in_layout(s, v, p) for v, p in zip(ins, perms)]
    extra = [s.value(pending_transpose(operands[i], perm)) for i, perm in hoist]
    changed = {"jaxpr": body, "num_consts": n_consts + len(hoist)}
    if "linear" in params:
        linear = tuple(params["linear"])
        changed["linear"] = linear[:n_consts] + (False,) * len(hoist) + linear[n_consts:]
    try:
        outs = eqn.primitive.bind(
            *operands[:n_consts], *extra, *operands[n_consts:], **{**params, **changed}
        )
    except TypeError:  # a body JAX will not take (carry types changed)
        return s.bind(eqn, [s.value(v) for v in ins])
    return [
        pending_transpose(o, perms[n_consts + k]) if k < n_carry and perms[n_consts + k] else o
        for k, o in enumerate(outs)
    ]


def _in_layout(s: Sinker, v: Any, perm: tuple[int, ...] | None) -> Any:
    """The array that, transposed by ``perm`` (None: as it is), is the value ``v``."""
    if perm is None:
        return s.value(v)
    back = inverse(perm)
    if isinstance(v, Pending):
        return s.value(transpose_of(v, back))
    s.note_transpose(v, back)
    return s.transposed(v, back)  # (a broadcast, such as zeros, is broadcast again)


def _scan_body(
    s: Sinker, eqn: Any, ins: list[Any], perms: list[Any], hoist: list[tuple[int, Any]]
) -> tuple[Any, list[Any], set]:
    """The scan's body taking the bases of the operands with a ``perms`` entry (pending
    that transpose), after its loop-invariant operands the transposes ``hoist`` of them,
    and returning its carries in the layouts they come in; the layouts the body leaves its
    carries in; and the transposes of invariant operands it makes. (None, [], set()) where
    JAX cannot describe an operand."""
    closed = eqn.params["jaxpr"]
    n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
    left: list[Any] = [None] * n_carry
    asked: set = set()

    def body(*args: Any) -> list[Any]:
        extra = args[n_consts : n_consts + len(hoist)]
        args = args[:n_consts] + args[n_consts + len(hoist) :]
        stored = [a for a, p in zip(args, perms) if p is not None]
        sinker = s.child(list(zip(ins, args)), stored)
        sinker.invariant = {id(a): i for i, a in enumerate(args[:n_consts])}
        sinker.hoisted = dict(zip(hoist, extra))
        values = [Pending(a, p) if p is not None else a for a, p in zip(args, perms)]
        outs = sinker.evaluate(closed.jaxpr, closed.consts, values)
        for k in range(n_carry):
            out, perm = outs[k], perms[n_consts + k]
            left[k] = out.perm if isinstance(out, Pending) else None
            if perm is not None:  # the new carry in its base's layout
                outs[k] = transpose_of(out, inverse(perm))
        computed = [sinker.value(o) for o in outs]
        asked.update(sinker.hoistable)
        return computed

    specs = []
    for aval, p in zip(closed.in_avals, perms):
        shape = tuple(aval.shape) if p is None else tuple(aval.shape[i] for i in inverse(p))
        specs.append(jax.ShapeDtypeStruct(shape, aval.dtype, weak_type=aval.weak_type))
    extra_specs = [
        jax.ShapeDtypeStruct(tuple(specs[i].shape[d] for d in perm), specs[i].dtype)
        for i, perm in hoist
    ]
    specs = specs[:n_consts] + extra_specs + specs[n_consts:]
    try:
        return jax.make_jaxpr(body)(*specs), left, asked
    except TypeError:  # an operand JAX cannot describe as a ShapeDtypeStruct (a token)
        return None, [], set()


# The rules: each returns the outputs (pending where it could), or None to compute the
# operands and apply the op as it is. ----------------------------------------------------


def _elementwise(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    rank = len(eqn.outvars[0].aval.shape)
    pending = [v for v in ins if isinstance(v, Pending)]
    perms = {v.perm for v in pending}
    if len(perms) != 1:
        return _toward_stored(s, eqn, ins)
    (perm,) = perms
    full = [v for v in ins if not isinstance(v, Pending) and _ndim(v) == rank]
    if len(full) - sum(id(v) in s._broadcasts for v in full) > len(pending):
        return None  # more arrays to transpose than pending ones to compute
    back = inverse(perm)
    args = [
        v.base if isinstance(v, Pending) else (s.transposed(v, back) if _ndim(v) == rank else v)
        for v in ins
    ]
    outs = s.bind(eqn, args)
    return [pending_transpose(o, perm) for o in outs]


def _toward_stored(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """Operands pending different transposes, one of them state kept in a layout of its own
    (``Sinker.stored``): the others are transposed to that state's layout, so an update
    (``w - lr * g``, the gradient in its kernel's layout) writes the state as it is kept."""
    anchor = next((v for v in ins if isinstance(v, Pending) and id(v.base) in s.stored), None)
    if anchor is None:
        return None
    rank = len(eqn.outvars[0].aval.shape)
    back = inverse(anchor.perm)
    args = []
    for v in ins:
        if isinstance(v, Pending):
            v = (
                v.base
                if v.perm == anchor.perm
                else lax.transpose(v.base, tuple(v.perm[i] for i in back))
            )
        elif _ndim(v) == rank:
            v = s.transposed(v, back)
        args.append(v)
    return [pending_transpose(o, anchor.perm) for o in s.bind(eqn, args)]


def _bitcast(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """A bitcast between types of one width is elementwise (across widths it adds or drops
    a trailing axis, and the value is computed)."""
    if eqn.invars[0].aval.ndim != eqn.outvars[0].aval.ndim:
        return None
    return _elementwise(s, eqn, ins)


def _reduction(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """A reduction (variadic ``reduce`` too: its operands, then their initial values)."""
    key = "axes" if "axes" in eqn.params else "dimensions"
    n = len(eqn.outvars)
    arrays, inits = ins[:n], ins[n:]
    perm = _shared_perm(arrays)
    if perm is None or any(isinstance(v, Pending) for v in inits):
        return None
    axes = tuple(eqn.params[key])
    base_axes = tuple(sorted(perm[a] for a in axes))
    kept = [perm[i] for i in range(len(perm)) if i not in axes]
    order = sorted(kept)
    outs = s.bind(eqn, [v.base for v in arrays] + inits, **{key: base_axes})
    return [pending_transpose(out, tuple(order.index(d) for d in kept)) for out in outs]


def _cumulative(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    (x,) = ins
    out = s.bind_one(eqn, [x.base], axis=x.perm[eqn.params["axis"]])
    return [Pending(out, x.perm)]


def _pad(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    x, fill = ins
    if isinstance(fill, Pending):
        return None
    config = eqn.params["padding_config"]
    base = [config[i] for i in inverse(x.perm)]
    out = s.bind_one(eqn, [x.base, fill], padding_config=tuple(base))
    return [Pending(out, x.perm, (eqn, ins))]


def _slice(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    (x,) = ins
    back = inverse(x.perm)
    params = eqn.params
    strides = params["strides"]
    changed = {
        "start_indices": tuple(params["start_indices"][i] for i in back),
        "limit_indices": tuple(params["limit_indices"][i] for i in back),
        "strides": None if strides is None else tuple(strides[i] for i in back),
    }
    return [Pending(s.bind_one(eqn, [x.base], **changed), x.perm, (eqn, ins))]


def _rev(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    (x,) = ins
    dims = tuple(sorted(x.perm[d] for d in eqn.params["dimensions"]))
    return [Pending(s.bind_one(eqn, [x.base], dimensions=dims), x.perm, (eqn, ins))]


def _barrier(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """An optimisation barrier holds each base, pending as its operand was."""
    outs = s.bind(eqn, [v.base if isinstance(v, Pending) else v for v in ins])
    return [Pending(o, v.perm) if isinstance(v, Pending) else o for o, v in zip(outs, ins)]


def _shared_perm(ins: list[Any]) -> tuple[int, ...] | None:
    """The transpose every operand pends, if they all pend the same one."""
    perms = {v.perm if isinstance(v, Pending) else None for v in ins}
    if len(perms) != 1:
        return None
    return perms.pop()


def _concatenate(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """Operands pending one transpose are joined as their bases. Where they pend different
    ones, the result pends the transpose of the largest pending operand and only the others
    are transposed to match it; where plain operands hold at least as many elements as the
    pending ones, the pending ones are computed instead, as any op would. DenseNet joins its
    running features (channels-last, from the 1x1 convolutions' forms) with each layer's
    output (channels-first, from the 3x3's matmul form on small maps): the running
    features' layout is the one the next 1x1 reads, even once the layers' outputs together
    outweigh them, and each output is transposed once (XLA computes the same transpose in
    every later join once)."""
    pending = [v for v in ins if isinstance(v, Pending)]
    plain = sum(_size(v) for v in ins if not isinstance(v, Pending))
    if plain >= sum(_size(v) for v in pending):
        return None
    perm = max(pending, key=_size).perm
    back = inverse(perm)
    bases = [
        v.base
        if isinstance(v, Pending) and v.perm == perm
        else (
            lax.transpose(v.base, tuple(v.perm[i] for i in back))
            if isinstance(v, Pending)
            else s.transposed(v, back)
        )
        for v in ins
    ]
    dim = perm[eqn.params["dimension"]]
    return [Pending(s.bind_one(eqn, bases, dimension=dim), perm)]


def _size(v: Any) -> int:
    return math.prod(_shape(v))


def _split(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """A split (the gradient of a concatenation) of a pending value: of its base, each part
    pending the same transpose."""
    (x,) = ins
    outs = s.bind(eqn, [x.base], axis=x.perm[eqn.params["axis"]])
    return [Pending(o, x.perm) for o in outs]


def _reshape(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """A reshape (``reshape``, ``squeeze``, a broadcast that only adds unit axes) of a
    pending transpose: applied to the base, itself transposed first only where the axes the
    reshape merges are not neighbours there (one transpose, as computing the value would
    cost, but the result keeps the base's layout)."""
    x = ins[0]
    if eqn.primitive.name == "reshape" and eqn.params.get("dimensions") is not None:
        return None
    target = tuple(eqn.outvars[0].aval.shape)
    if eqn.primitive.name == "broadcast_in_dim" and math.prod(target) != math.prod(x.base.shape):
        return None
    planned = reshape_plan(tuple(x.base.shape), x.perm, target)
    if planned is None:
        return None
    first, shape, perm = planned
    base = x.base if first is None else lax.transpose(x.base, first)
    return [pending_transpose(lax.reshape(base, shape), perm)]


def reshape_plan(
    base: tuple[int, ...], perm: tuple[int, ...], target: tuple[int, ...]
) -> tuple[tuple[int, ...] | None, tuple[int, ...], tuple[int, ...]] | None:
    """``(first, shape, perm2)`` with ``reshape(transpose(b, perm), target) ==
    transpose(reshape(transpose(b, first), shape), perm2)`` for every ``b`` of shape
    ``base``; ``first`` is None (no transpose) where the axes the reshape merges are
    neighbours, in order, among ``b``'s axes of extent above 1. None where the reshape does
    not split into runs of axes merged into one or one split into several."""
    if 0 in base:
        return None
    value = [base[p] for p in perm]
    vdims = [i for i, n in enumerate(value) if n != 1]
    tdims = [j for j, n in enumerate(target) if n != 1]
    groups = _groups([value[i] for i in vdims], [target[j] for j in tdims])
    if groups is None:
        return None
    # Each base axis of extent above 1 is in one group; the groups are laid out in the
    # order of their first base axis, a merged group's axes in the value's order.
    runs = sorted(([perm[vdims[i]] for i in vs], [tdims[j] for j in ts]) for vs, ts in groups)
    order = [d for axes, _ in runs for d in axes]
    first = None
    if order != sorted(order):
        first = tuple(order) + tuple(d for d, n in enumerate(base) if n == 1)
    shape: list[int] = []
    where: dict[int, int] = {}
    for axes, ts in runs:
        sizes = [target[t] for t in ts] if len(axes) == 1 else [math.prod(base[d] for d in axes)]
        for size, t in zip(sizes, ts):
            where[t] = len(shape)
            shape.append(size)
    for j, n in enumerate(target):
        if n == 1:
            where[j] = len(shape)
            shape.append(1)
    return first, tuple(shape), tuple(where[j] for j in range(len(target)))


def _groups(a: list[int], b: list[int]) -> list[tuple[list[int], list[int]]] | None:
    """Runs of ``a`` and ``b`` with equal products, each one axis on at least one side."""
    groups = []
    i = j = 0
    while i < len(a) and j < len(b):
        ga, gb, pa, pb = [i], [j], a[i], b[j]
        while pa != pb:
            if pa < pb:
                i += 1
                if i == len(a):
                    return None
                ga.append(i)
                pa *= a[i]
            else:
                j += 1
                if j == len(b):
                    return None
                gb.append(j)
                pb *= b[j]
        if len(ga) > 1 and len(gb) > 1:
            return None
        groups.append((ga, gb))
        i, j = i + 1, j + 1
    if i != len(a) or j != len(b):
        return None
    return groups


def _stack(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """Operands pending the same transpose, stacked on a new leading axis: their bases
    stacked on a new leading axis. On another axis the operands are computed and stacked as
    they are: with the new axis inside the base, each operand's copy would be scattered
    (im2col's patches stacked channels-last cost ResNet-18's training step 3x its stacks)."""
    perm = _shared_perm(ins)
    if eqn.params["axis"] != 0 or perm is None:
        return None
    out = s.bind_one(eqn, [v.base for v in ins])
    return [Pending(out, (0, *(p + 1 for p in perm)))]


def _dot_general(s: Sinker, eqn: Any, ins: list[Any]) -> list[Any] | None:
    """A pending operand whose base is still a (batched) matrix for the product, its batch
    axes leading and its contracted axes one run before or after its free ones, is folded
    into the dimension numbers (as XLA's transpose folding does); another is computed, as
    XLA would otherwise transpose it anyway (on im2col's patches, 5 MB, for each weight
    gradient of ResNet-18). The result pends the order of the free axes."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    folded = [_matrix(v, c, b) for v, c, b in zip(ins, (lc, rc), (lb, rb))]
    if not any(folded):
        return None
    bases, perms = [], []
    for v, f in zip(ins, folded):
        x = v.base if f else s.value(v)
        bases.append(x)
        perms.append(v.perm if f else tuple(range(_ndim(x))))
    lperm, rperm = perms
    numbers = (
        (tuple(lperm[d] for d in lc), tuple(rperm[d] for d in rc)),
        (tuple(lperm[d] for d in lb), tuple(rperm[d] for d in rb)),
    )
    out = s.bind_one(eqn, bases, dimension_numbers=numbers)
    lfree = [lperm[d] for d in range(len(lperm)) if d not in lc and d not in lb]
    rfree = [rperm[d] for d in range(len(rperm)) if d not in rc and d not in rb]
    lsorted, rsorted = sorted(lfree), sorted(rfree)
    nb = len(lb)
    perm = (
        list(range(nb))
        + [nb + lsorted.index(d) for d in lfree]
        + [nb + len(lfree) + rsorted.index(d) for d in rfree]
    )
    return [pending_transpose(out, tuple(perm))]


def _matrix(v: Any, contract: Sequence[int], batch: Sequence[int]) -> bool:
    """Whether ``v`` is pending and its base, past its unit axes, has the runs of batch,
    free and contracted axes the value has, each run in order: the product then reads the
    base as it would the value. (With the runs swapped, XLA transposes the other operand
    instead: folding ``(G, M, NP)`` from an ``(NP, M)`` base moved the transpose onto
    ResNet-18's im2col patches, 9 times larger.)"""
    if not isinstance(v, Pending):
        return False
    kinds = {d: "b" for d in batch} | {d: "c" for d in contract}
    sizes = [v.base.shape[p] for p in v.perm]  # the value's shape

    def runs(axes: list[int]) -> str:
        order = [kinds.get(d, "f") for d in axes if sizes[d] != 1]
        return "".join(k for i, k in enumerate(order) if i == 0 or order[i - 1] != k)

    where = inverse(v.perm)
    in_base = [where[d] for d in range(len(v.perm))]  # value axes in the base's order
    in_order = all(
        [v.perm[d] for d in dims if sizes[d] != 1]
        == sorted(v.perm[d] for d in dims if sizes[d] != 1)
        for dims in (batch, contract)
    )
    return in_order and runs(in_base) == runs(list(range(len(v.perm))))


_RULES = {
    "pad": _pad,
    "slice": _slice,
    "rev": _rev,
    "concatenate": _concatenate,
    "split": _split,
    "stack": _stack,
    "optimization_barrier": _barrier,
    "reshape": _reshape,
    "squeeze": _reshape,
    "broadcast_in_dim": _reshape,
    "dot_general": _dot_general,
    "bitcast_convert_type": _bitcast,
}
