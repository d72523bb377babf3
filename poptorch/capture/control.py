"""Regions of a captured program that become one popxl op each: loops, branches, MultiConv.

``poptorch.for_loop`` and ``poptorch.cond`` trace their bodies once, between marker ops
(``poptorch::start_for_loop`` ... ``end_for_loop``; ``start_if_block`` ...
``start_else_block`` ... ``end_if_block``), as PopTorch did. At the start marker the
translator hands the region to this module, which lowers the nodes between the markers
into a popxl subgraph and records one ``repeat`` (``Loop``) or ``conditional`` (``If``) op:
device-side control flow, not unrolled. Values of the enclosing graph a body uses (the
model's weights, tensors of ``forward``) become inputs of the subgraph; inputs are passed
by value. Regions nest.

The convolutions of a ``poptorch.MultiConv`` carry an annotation; at the first of them this
module records one ``MultiConv`` op for the whole group (hoisting the group's other inputs,
which may be computed later in the graph, in front of it).

The translator asks ``claims(node)`` before its own table: nodes lowered here ahead of the
translator's walk answer True, and ``lower`` returns their values.
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

import popxl
from popxl import ops
from popxl.errors import InternalError

from ..aten.fx import args_of, node_arg
from ..errors import Error
from ..ops import torch_ops as _torch_ops  # noqa: F401 (registers torch.ops.poptorch)
from ..ops.functions import MULTICONV_KEY

if TYPE_CHECKING:
    from torch.fx import Node


class Translator(Protocol):
    """What a region's lowering uses of the capture's translator (``translate.Translator``):
    its values by node, its seed and its per-node lowering."""

    env: dict[Node, Any]
    training: bool
    _seed: popxl.Tensor | None
    _seed_input: popxl.Tensor | None
    seed_is_state: bool

    def _arg(self, a: Any) -> Any: ...

    def _lower(self, node: Node) -> Any: ...

    def next_seed(self) -> popxl.Tensor: ...

    def scope_of(self, node: Node) -> str: ...


_P = torch.ops.poptorch
START_FOR = _P.start_for_loop.default
END_FOR = _P.end_for_loop.default
START_IF = _P.start_if_block.default
START_ELSE = _P.start_else_block.default
END_IF = _P.end_if_block.default
_STARTS = (START_FOR, START_IF)
_ENDS = (END_FOR, END_IF)
_CONVOLUTION = torch.ops.aten.convolution.default

INFERENCE_ONLY_MSG = (
    "poptorch.{what}() is only supported in inference. Use an inferenceModel, or write the "
    "{kind} in plain torch operations (unrolled) in a trainingModel."
)
LOOP_OUTPUTS_MSG = (
    "poptorch.for_loop: the body returned {got} for the inputs {want}. The body must "
    "return one tensor per input, of the input's shape and dtype (each output is the next "
    "iteration's input)."
)
BRANCH_OUTPUTS_MSG = (
    "poptorch.cond: output {index} of then_body is {a} but that of else_body is {b}; both "
    "branches must return tensors of the same shapes and dtypes."
)
RANDOM_LOOP_MSG = (
    "poptorch.for_loop: the loop body draws random numbers, which device-side loops do not "
    "support yet (every iteration would draw the same ones). Draw them outside the loop "
    "and pass them in, or unroll the loop in plain torch."
)
ESCAPE_MSG = (
    "poptorch.{what}: a value computed inside the body ({name}) is used after it. Return it "
    "from the body instead."
)
MULTICONV_DEPENDENT_MSG = (
    "poptorch.MultiConv: the convolutions of a MultiConv must be data-independent, but "
    "{later} depends on {earlier}. Move one of them out of the MultiConv block."
)
MULTICONV_OPTION_MSG = (
    "poptorch.MultiConv: {option} has {got} values for {n} convolutions; give one value for "
    "all of them or one per convolution."
)
MULTICONV_TRANSPOSED_MSG = (
    "poptorch.MultiConv combines convolutions only; {name} is a transposed convolution. "
    "Move it out of the MultiConv block."
)


@dataclass
class _State:
    """What this module did to one translator's walk."""

    done: set[Any] = field(default_factory=set)  # nodes lowered ahead of the walk
    multiconv: dict[int, list[Any]] = field(default_factory=dict)


_STATES: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()


def _state(translator: Translator) -> _State:
    state = _STATES.get(translator)
    if state is None:
        state = _STATES[translator] = _State()
    return state


def _multiconv_of(node: Node) -> tuple | None:
    if node.target is not _CONVOLUTION:
        return None
    return (node.meta.get("custom") or {}).get(MULTICONV_KEY)


def claims(translator: Translator, node: Node) -> bool:
    """Whether this module lowers ``node`` (a region's start, or a node it lowered)."""
    return (
        node.target in _STARTS or node in _state(translator).done or _multiconv_of(node) is not None
    )


def lower(translator: Translator, node: Node) -> Any:
    """The value of ``node``: a region's results, or a value lowered earlier."""
    state = _state(translator)
    if node in state.done:
        return translator.env[node]
    if node.target is START_FOR:
        return _lower_for_loop(translator, node)
    if node.target is START_IF:
        return _lower_cond(translator, node)
    return _lower_multiconv(translator, node)


# Regions ---------------------------------------------------------------------------------


def _walk(start: Node) -> Iterator[Node]:
    node = start.next
    while node.op != "output":
        yield node
        node = node.next


def _region(start: Node, stop_targets: tuple) -> tuple[list[Node], Node]:
    """The call_function nodes after ``start`` up to the first node of ``stop_targets`` at
    the same nesting depth, and that node."""
    depth = 0
    body: list[Node] = []
    for node in _walk(start):
        if node.op != "call_function":
            continue
        if depth == 0 and node.target in stop_targets:
            return body, node
        if node.target in _STARTS:
            depth += 1
        elif node.target in _ENDS:
            depth -= 1
        body.append(node)
    raise AssertionError(f"{start.target} has no matching end marker")


def _nodes_in(value: Any) -> Iterator[Node]:
    if isinstance(value, torch.fx.Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _nodes_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _nodes_in(v)


def _tensors_in(value: Any) -> Iterator[popxl.Tensor]:
    if isinstance(value, popxl.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)


@dataclass
class _Body:
    """A popxl subgraph lowered from a region, with the outer tensors it needs."""

    graph: popxl.Graph
    closures: list[popxl.Tensor]  # outer tensors, in the order of the graph's inputs
    seed: popxl.Tensor | None  # the body's seed input, if it draws random numbers


def _lower_body(
    translator: Translator,
    name: str,
    nodes: list[Node],
    outputs: list[Node],
    carried: list[popxl.Tensor] | None = None,
    carrier: Node | None = None,
) -> _Body:
    """Lower ``nodes`` into a new subgraph. Its inputs are first one per ``carried`` tensor
    (of its spec; together the value of the node ``carrier``), then one per outer tensor the
    nodes use."""

    members = set(nodes)
    used = [n for node in nodes for a in (*node.args, *node.kwargs.values()) for n in _nodes_in(a)]
    outer_nodes = _unique(n for n in (*used, *outputs) if n not in members and n is not carrier)
    graph = popxl.gcg().ir.create_empty_graph(name)
    outer_env = translator.env
    saved_seed = (translator._seed, translator._seed_input, translator.seed_is_state)
    translator._seed = translator._seed_input = None
    translator.seed_is_state = False  # the body's seed is an input its caller passes
    closures: dict[popxl.Tensor, popxl.Tensor] = {}
    try:
        with graph:
            inner_carried = [
                popxl.graph_input(t.shape, t.dtype, f"{name}_in{i}")
                for i, t in enumerate(carried or [])
            ]
            env = dict(outer_env)
            if carrier is not None:
                env[carrier] = tuple(inner_carried)
            for node in outer_nodes:
                env[node] = _capture(outer_env.get(node), closures)
            translator.env = env
            for node in nodes:
                scope = translator.scope_of(node)
                with popxl.name_scope(scope) if scope else contextlib.nullcontext():
                    env[node] = translator._lower(node)
            for i, node in enumerate(outputs):
                popxl.graph_output(_fresh(_single(env[node], name, i), graph))
        seed = translator._seed_input
    finally:
        translator.env = outer_env
        translator._seed, translator._seed_input, translator.seed_is_state = saved_seed
    state = _state(translator)
    for node in nodes:
        outer_env[node] = env[node]
        state.done.add(node)
    return _Body(graph, list(closures), seed)


def _unique(nodes: Iterable[Node]) -> list[Node]:
    return list(dict.fromkeys(nodes))


def _capture(value: Any, closures: dict[popxl.Tensor, popxl.Tensor]) -> Any:
    """``value`` with each outer tensor replaced by an input of the current subgraph."""
    if isinstance(value, popxl.Tensor):
        if value not in closures:
            closures[value] = popxl.graph_input(value.shape, value.dtype, value.name)
        return closures[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_capture(v, closures) for v in value)
    return value


def _single(value: Any, what: str, index: int) -> popxl.Tensor:
    if not isinstance(value, popxl.Tensor):
        raise Error(
            f"poptorch.{what}: output {index} of the body is {value!r}, not a tensor. Bodies "
            "must return tensors.",
            "poptorch_py_error",
        )
    return value


def _fresh(t: popxl.Tensor, graph: popxl.Graph) -> popxl.Tensor:
    if t._producer is None or t in graph.outputs:
        return ops.identity(t)
    return t


def _inference_only(translator: Translator, what: str, kind: str) -> None:
    if translator.training:
        raise Error(INFERENCE_ONLY_MSG.format(what=what, kind=kind), "poptorch_py_error")


def _mark_done(translator: Translator, *nodes: Node) -> None:
    _state(translator).done.update(nodes)


def _spec(t: popxl.Tensor) -> str:
    return f"{t.dtype.name}{t.shape}"


# for_loop ---------------------------------------------------------------------------------


def _lower_for_loop(translator: Translator, start: Node) -> tuple:
    _inference_only(translator, "for_loop", "loop")
    nodes, end = _region(start, (END_FOR,))
    outer_inputs = [translator.env[n] for n in args_of(start)[0]]
    outputs = list(args_of(end)[0])
    count = int(args_of(end)[2])
    body = _lower_body(translator, "for_loop", nodes, outputs, outer_inputs, start)
    if body.seed is not None:
        raise NotImplementedError(RANDOM_LOOP_MSG)
    results = body.graph.outputs
    if [_spec(t) for t in results] != [_spec(t) for t in outer_inputs]:
        raise Error(
            LOOP_OUTPUTS_MSG.format(
                got=[_spec(t) for t in results], want=[_spec(t) for t in outer_inputs]
            ),
            "poptorch_py_error",
        )
    looped = ops.repeat(body.graph, count, *outer_inputs, *body.closures)
    translator.env[end] = tuple(looped)
    _mark_done(translator, end)
    return tuple(outer_inputs)


# cond -------------------------------------------------------------------------------------


def _lower_cond(translator: Translator, start: Node) -> popxl.Tensor:
    _inference_only(translator, "cond", "branch")
    then_nodes, middle = _region(start, (START_ELSE,))
    else_nodes, end = _region(middle, (END_IF,))
    else_nodes = [n for n in else_nodes if not _reads(n, middle)]
    condition = _as_condition(translator.env[node_arg(start, 0)])
    translator.env[start] = condition
    then_body = _lower_body(translator, "then_body", then_nodes, list(args_of(middle)[0]))
    else_body = _lower_body(translator, "else_body", else_nodes, list(args_of(end)[1]))
    for i, (a, b) in enumerate(zip(then_body.graph.outputs, else_body.graph.outputs)):
        if _spec(a) != _spec(b):
            raise Error(
                BRANCH_OUTPUTS_MSG.format(index=i, a=_spec(a), b=_spec(b)), "poptorch_py_error"
            )
    results = ops.conditional(
        condition,
        then_body.graph,
        else_body.graph,
        then_inputs=_with_seed(translator, then_body),
        else_inputs=_with_seed(translator, else_body),
    )
    translator.env[middle] = [None] * len(args_of(middle)[0])
    translator.env[end] = tuple(results)
    _mark_done(translator, middle, end, *(u for u in middle.users if _reads(u, middle)))
    return condition


def _reads(node: Node, marker: Node) -> bool:
    return node.target is operator.getitem and node.args[0] is marker


def _as_condition(t: popxl.Tensor) -> popxl.Tensor:
    """A one-element bool tensor (PopTorch took any one-element tensor)."""
    if t.dtype is not popxl.bool:
        t = ops.cast(t, popxl.bool)
    return t if t.shape == (1,) else ops.reshape(t, (1,))


def _with_seed(translator: Translator, body: _Body) -> list[popxl.Tensor]:
    """The body's outer inputs, then a fresh seed if it draws random numbers."""
    return [*body.closures, translator.next_seed()] if body.seed is not None else body.closures


# MultiConv --------------------------------------------------------------------------------


def _lower_multiconv(translator: Translator, first: Node) -> Any:
    from ..ops.lowerings import multi_conv  # noqa: PLC0415

    multiconv = _multiconv_of(first)
    if multiconv is None:
        raise InternalError(f"{first} is lowered as a MultiConv but is not one")
    key, options = multiconv
    group = [n for n in first.graph.nodes if (_multiconv_of(n) or (None,))[0] == key]
    for node in group:
        if node.args[6]:
            raise NotImplementedError(MULTICONV_TRANSPOSED_MSG.format(name=node.name))
    _check_options(dict(options), len(group))
    _hoist_inputs(translator, group)
    args = [[translator._arg(a) for a in node.args] for node in group]
    dtypes = [_out_dtype(node) for node in group]
    outputs = multi_conv(args, dtypes, dict(options))
    for node, out in zip(group, outputs):
        translator.env[node] = out
    _mark_done(translator, *group)
    return translator.env[first]


def _out_dtype(node: Node) -> popxl.dtype:
    from ..aten.registry import popxl_dtype  # noqa: PLC0415

    return popxl_dtype(node.meta["val"].dtype)


def _check_options(options: dict, n: int) -> None:
    for option in ("available_memory_proportions", "partials_types", "enable_conv_dithering"):
        values = options.get(option)
        if values is not None and len(values) not in (1, n):
            raise ValueError(MULTICONV_OPTION_MSG.format(option=option, got=len(values), n=n))


def _hoist_inputs(translator: Translator, group: list[Node]) -> None:
    """Lower, ahead of the walk, the nodes the group's inputs need that come later in the
    graph; refuse a group where one convolution feeds another."""
    members = set(group)
    pending: dict[Node, None] = {}

    def need(node: Node, user: Node) -> None:
        if node in translator.env or node in pending:
            return
        if node in members:
            raise ValueError(MULTICONV_DEPENDENT_MSG.format(later=user.name, earlier=node.name))
        for a in (*node.args, *node.kwargs.values()):
            for n in _nodes_in(a):
                need(n, user)
        pending[node] = None

    for conv in group:
        for a in conv.args:
            for n in _nodes_in(a):
                need(n, conv)
    order = {n: i for i, n in enumerate(group[0].graph.nodes)}
    for node in sorted(pending, key=order.__getitem__):
        translator.env[node] = translator._lower(node)
        _mark_done(translator, node)
