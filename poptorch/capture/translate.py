"""Translate a captured ATen program into a popxl graph, one table record per node.

The graph's inputs are the model's tensor inputs (in the order ``torch.export`` flattens
them), then its parameters and buffers, named by their torch names (``layer1.0.conv1.weight``),
then, if the model draws random numbers, a seed. Its outputs are the model's tensor outputs,
then the new values of the buffers the model updates, then the new values of the inputs it
modifies in place: the program writes those back (``_program``, the executor).

Each repeated child captured as a ``block`` (see ``blocks``) becomes one subgraph per call
signature, called once per child with that child's weights.
"""

from __future__ import annotations

import contextlib
import operator
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.export.graph_signature import InputKind, OutputKind

import popxl
from popxl import ops
from popxl._op import Op
from popxl.ops.random_seed import create_random_seed
from popxl_addons import NamedTensors
from popxl_addons.variable_factory import NamedVariableFactories, VariableFactory

from .._names import tree_key
from ..aten.fx import args_of, node_arg
from ..aten.loss import LOSS_OPS as ATEN_LOSS_OPS
from ..aten.registry import NodeContext, lowering_of, popxl_dtype
from ..blocks import BLOCK_KEY, NO_ACTIVE_BLOCK, current_recorder, mark_node_block
from ..errors import Error
from ..ops import lowerings as poptorch_lowerings  # also registers PopTorch's ops in the table
from . import composite as _composite
from . import control, overlap
from .blocks import is_block_node
from .describe import describe_node
from .export import Capture, signature
from .scopes import ATTRIBUTE_KEY, MODULE_PATH, NAME_SCOPE_KEY, scope_path

# Every op that is a model's loss: torch's losses and PopTorch's own.
ALL_LOSS_OPS = ATEN_LOSS_OPS | poptorch_lowerings.LOSS_OPS

MISSING_OP_MSG = (
    "poptorch does not support the ATen op {op} (used in {where}). The model cannot be "
    "compiled for the IPU: rewrite that line with supported operations, or register a "
    "lowering for {op} with poptorch's ATen table (poptorch.aten.lowering). Nothing runs "
    "on the CPU in its place."
)
NO_ACTIVE_BLOCK_MSG = (
    "No active Block, all the ops must belong to a Block: {where} runs after a "
    "`with poptorch.Block(...)` ended and before another block started. Put it inside a "
    "block, or start one with poptorch.Block.start(...) (which lasts until the next)."
)
OP_FAILED_MSG = "poptorch could not lower the ATen op {op} (used in {where}): {error}"
UNSUPPORTED_INPUT_MSG = (
    "poptorch cannot capture {cls}.forward: its export has a {kind} input ({name}); only "
    "tensors, parameters, buffers and tensor constants are supported."
)

SEED_NAME = "poptorch.random_seed"


@dataclass
class Forward:
    """The popxl graph of a captured forward and what the executor needs to call it."""

    graph: popxl.Graph
    factories: NamedVariableFactories
    args: NamedTensors
    inputs: list[popxl.Tensor]  # the model's tensor inputs, in call order
    n_outputs: int  # graph outputs that are the model's tensor outputs
    # The model's outputs: a pytree of graph-output indices (ints in ``Leaf``) and constants.
    out_spec: Any
    out_leaves: list[Any]
    # Names of the state (buffers, the seed) the extra outputs update, in output order.
    state_outputs: list[str] = field(default_factory=list)
    # Indices (into ``inputs``) of the inputs the extra outputs after them update.
    input_outputs: list[int] = field(default_factory=list)
    trainable: list[str] = field(default_factory=list)
    loss_index: int | None = None
    # Which inputs and outputs overlap their host transfers (``overlap``).
    overlaps: overlap.Overlaps = field(default_factory=overlap.Overlaps)


@dataclass(frozen=True)
class Leaf:
    """An output leaf that is graph output ``index``."""

    index: int


def _spec_of(val: torch.Tensor, what: str) -> tuple[tuple[int, ...], popxl.dtype]:
    return tuple(int(d) for d in val.shape), popxl_dtype(val.dtype, what)


def _canonical_names(module: torch.nn.Module) -> dict[str, str]:
    """Each name of a parameter or buffer that is also reachable under another name
    (tied weights), mapped to the name ``named_parameters()``/``named_buffers()`` keep."""
    kept: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for named in (module.named_parameters, module.named_buffers):
        for name, t in named(remove_duplicate=False):
            first = kept.setdefault(id(t), name)
            if first != name:
                aliases[name] = first
    return aliases


def _constantly(value: np.ndarray) -> Any:
    return lambda: value


def _host_value(t: torch.Tensor) -> np.ndarray:
    """``t``'s value as NumPy: a view of its memory where the dtypes agree. The popxl
    variable or constant made from it takes its own copy; a second copy here held every
    weight of the model once more (ResNet-18: 45 MiB) for as long as the model lived."""
    dtype = popxl_dtype(t.dtype).as_numpy()
    return t.detach().cpu().numpy().astype(dtype, copy=False)


class Translator:
    """Walks one captured program's graph, recording popxl ops in the current graph."""

    def __init__(
        self, capture: Capture, training: bool, subgraphs: dict[Any, Any], options: Any = None
    ) -> None:
        self.capture = capture
        self.training = training
        # The model's poptorch.Options (records may read PopART options from them).
        self.options = options
        # Block subgraphs of this IR by call signature, shared with nested translators.
        self.subgraphs = subgraphs
        self.env: dict[torch.fx.Node, Any] = {}
        self._seed_input: popxl.Tensor | None = None
        self._seed: popxl.Tensor | None = None
        # Whether the graph's seed is model state that each run advances (the model's own
        # graph), rather than a seed its caller passes (a block's or a branch's subgraph).
        self.seed_is_state = True
        # Random ops seeded so far, per seed input (``next_seed``'s modifiers).
        self._seed_uses: dict[popxl.Tensor, int] = {}
        # Tensors marked by poptorch.identity_loss, in order.
        self.losses: list[popxl.Tensor] = []
        # The value of the training graph's final loss (``final_loss``), if any.
        self.final_loss: popxl.Tensor | None = None
        # The overlapped IO marks found valid (``overlap.find``); none in a block.
        self.overlap_marks: set[torch.fx.Node] = set()

    # ---- seeds ------------------------------------------------------------------------

    def describe(self, node: torch.fx.Node) -> str:
        return describe_node(node)

    def next_seed(self) -> popxl.Tensor:
        """A fresh seed for one random op: the graph's seed input modified by the op's own
        number (1, 2, ...; PopART's ``ModifyRandomSeed`` scheme). Every random op's seed
        depends on the seed input alone, never on the ops before it, so any part of the
        graph can be run again (recomputed) from the seed input and its own inputs."""
        if self._seed_input is None:
            self._seed_input = popxl.graph_input((2,), popxl.uint32, SEED_NAME)
            # The seed the next run starts from, made where the first random op is (so a
            # pipeline writes it back in the stage that reads the seed).
            self._seed = (
                self._next_run_seed(self._seed_input) if self.seed_is_state else self._seed_input
            )
        uses = self._seed_uses.get(self._seed_input, 0) + 1
        self._seed_uses[self._seed_input] = uses
        return create_random_seed(self._seed_input, popxl.constant(uses, popxl.uint32))

    @staticmethod
    def _next_run_seed(seed_input: popxl.Tensor) -> popxl.Tensor:
        """The seed the next run starts from: the seed input modified by 0."""
        return create_random_seed(seed_input, popxl.constant(0, popxl.uint32))

    # ---- inputs -----------------------------------------------------------------------

    def _inputs(self, state_order: Sequence[str] | None) -> tuple[list, dict, dict]:
        """Graph inputs: user inputs first, then state (params, buffers) as named inputs.

        Returns (user inputs, {name: tensor}, {name: factory})."""
        ep = self.capture.program
        nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        constants = ep.constants
        state_dict = {**constants, **dict(ep.named_parameters()), **dict(ep.named_buffers())}
        user, factories = [], {}
        named: dict[str, popxl.Tensor] = {}
        state_specs = []
        for spec in ep.graph_signature.input_specs:
            node = nodes[spec.arg.name]
            if spec.kind == InputKind.USER_INPUT:
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    self.env[node] = val
                    continue
                shape, dtype = _spec_of(val, f"Input {spec.arg.name}")
                t = popxl.graph_input(shape, dtype, spec.arg.name)
                self.env[node] = t
                user.append(t)
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                state_specs.append((spec.target, node))
            elif spec.kind == InputKind.TOKEN:
                self.env[node] = None  # effect ordering: ops run in graph order anyway
            elif spec.kind == InputKind.CONSTANT_TENSOR:
                value = constants[spec.target]
                if isinstance(value, torch.Tensor):
                    dtype = popxl_dtype(value.dtype, f"Constant {spec.target}")
                    self.env[node] = popxl.constant(_host_value(value), dtype, spec.target)
                else:
                    self.env[node] = value
            else:
                raise TypeError(
                    UNSUPPORTED_INPUT_MSG.format(
                        cls=type(self.capture.module).__name__,
                        kind=spec.kind.name.lower(),
                        name=spec.target or spec.arg.name,
                    )
                )
        # A tied weight (``proj.weight = emb.weight``) is one graph input under the name
        # torch's ``named_parameters()`` gives it, so its gradient sums every use.
        canonical = _canonical_names(self.capture.module)
        state_specs = [(canonical.get(name, name), node) for name, node in state_specs]
        if state_order is not None:
            rank = {name: i for i, name in enumerate(state_order)}
            state_specs.sort(key=lambda s: rank[s[0]])
        for name, node in state_specs:
            key = tree_key(name)
            if key in named:
                self.env[node] = named[key]
                continue
            value = state_dict[name]
            shape, dtype = _spec_of(value, f"Weight {name}")
            t = popxl.graph_input(shape, dtype, name)
            self.env[node] = t
            named[key] = t
            data = _host_value(value)
            factories[key] = VariableFactory(_constantly(data), dtype, name)
        return user, named, factories

    # ---- nodes ------------------------------------------------------------------------

    def _arg(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return a

    def _lower(self, node: torch.fx.Node) -> Any:
        target = node.target
        if target is operator.getitem:
            return self.env[node_arg(node, 0)][node.args[1]]
        if control.claims(self, node):  # loops, branches, MultiConv: whole regions
            return control.lower(self, node)
        if is_block_node(target):
            return self._call_block(node)
        if target is torch.ops.higher_order.with_effects:
            return (None, *_as_tuple(self._lower(_without_token(node))))
        fn = lowering_of(target)
        if fn is None and _composite.decomposable(target):
            return _composite.lower(self, node)
        if fn is None:
            raise NotImplementedError(
                MISSING_OP_MSG.format(op=_op_name(target), where=describe_node(node))
            )
        args = [self._arg(a) for a in node.args]
        kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
        ctx = NodeContext(node, self)
        try:
            return fn(ctx, *args, **kwargs)
        except (NotImplementedError, TypeError, ValueError) as error:
            if getattr(error, "_poptorch_located", False):
                raise
            located: Exception = type(error)(
                OP_FAILED_MSG.format(op=_op_name(target), where=describe_node(node), error=error)
            )
            located._poptorch_located = True  # type: ignore[attr-defined]
            raise located from error

    def run(self, marks_blocks: bool = False) -> None:
        recorder = current_recorder() if marks_blocks else None
        block = None
        for node in self.capture.program.graph.nodes:
            if node.op == "call_function":
                annotation = (node.meta.get("custom") or {}).get(BLOCK_KEY)
                if annotation is not None and tuple(annotation) == NO_ACTIVE_BLOCK:
                    raise Error(NO_ACTIVE_BLOCK_MSG.format(where=describe_node(node)))
                if annotation is not None and annotation != block:
                    mark_node_block(recorder, annotation)
                    block = annotation
                # A block call is built outside the block's scope: its subgraph is shared
                # by every child of the group, whatever their paths.
                scope = "" if is_block_node(node.target) else self.scope_of(node)
                graph_ops = popxl.gcg()._ops
                first = len(graph_ops)
                with popxl.name_scope(scope) if scope else contextlib.nullcontext():
                    self.env[node] = self._lower(node)
                _attach_attributes(node, graph_ops[first:])

    def scope_of(self, node: torch.fx.Node) -> str:
        """The name scope of ``node``'s ops: its module path (unless the options disable
        module name scopes), then the ``poptorch.NameScope`` names around it."""
        modules = getattr(self.options, "module_namescope_enabled", True)
        return _scope_of(node, modules)

    # ---- blocks -----------------------------------------------------------------------

    def _call_block(self, node: torch.fx.Node) -> tuple:
        tensors_arg, key = args_of(node)
        blk = self.capture.blocks[key]
        metas = [n.meta["val"] for n in tensors_arg[: blk.n_inputs]]
        sig = signature(blk, metas)
        if sig not in self.subgraphs:
            self.subgraphs[sig] = _block_subgraph(
                self.capture.block_captures[sig], blk, self.training, self.subgraphs, self.options
            )
        sub = self.subgraphs[sig]
        inputs = [self.env[n] for n in tensors_arg]
        if sub.needs_seed:
            inputs.append(self.next_seed())
        outputs = tuple(ops.call(sub.graph, *inputs))
        call_op = popxl.gcg()._ops[-1]
        path = self.scope_of(node)
        if path and call_op.type == "Call":  # for op names: the block this call runs
            call_op.hints[MODULE_PATH] = path
        return outputs

    # ---- outputs ----------------------------------------------------------------------

    def outputs(self) -> Outputs:
        """Mark the graph outputs: the model's tensor outputs, the buffers it updates (and
        the seed), the inputs it modifies, and last the marked loss if it is not returned."""
        ep = self.capture.program
        out_node = next(n for n in ep.graph.nodes if n.op == "output")
        user_names = [
            s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT
        ]
        result = Outputs()
        user_values, state, inputs = [], [], []
        for spec, value in zip(ep.graph_signature.output_specs, out_node.args[0]):
            if spec.kind == OutputKind.USER_OUTPUT:
                user_values.append(self._arg(value))
            elif spec.kind == OutputKind.BUFFER_MUTATION:
                if spec.target not in self.capture.frozen:
                    state.append((tree_key(spec.target), self._arg(value)))
            elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                inputs.append((user_names.index(spec.target), self._arg(value)))
            elif spec.kind == OutputKind.TOKEN:
                continue
            else:
                raise TypeError(
                    f"poptorch cannot capture an export output of kind {spec.kind.name}."
                )
        returned: list[popxl.Tensor] = []
        for v in user_values:
            if isinstance(v, popxl.Tensor):
                result.leaves.append(Leaf(len(returned)))
                returned.append(v)
                popxl.graph_output(_fresh(v))
            else:
                result.leaves.append(v)
        result.n_outputs = len(returned)
        if self._seed is not None and self.seed_is_state:
            state.append((SEED_NAME, self._seed))
        for name, v in state:
            popxl.graph_output(_fresh(v))
            result.state.append(name)
        for index, v in inputs:
            popxl.graph_output(_fresh(v))
            result.inputs.append(index)
        if not self.losses:
            result.loss_index = self._returned_loss(returned)
        if self.losses:
            loss = self.losses[-1]
            if any(loss is t for t in returned):
                result.loss_index = next(i for i, t in enumerate(returned) if t is loss)
            else:
                result.loss_index = len(self.graph_outputs())
                popxl.graph_output(_fresh(loss))
        return result

    def _returned_loss(self, returned: list[popxl.Tensor]) -> int | None:
        """Where the model returns its final loss function's value, when no
        ``identity_loss`` marks one and the last output (taken as the loss by default)
        is not a scalar: ``return loss_fn(out, y), out`` trains on the loss, as in
        PopTorch. An integer scalar is no loss (a transformers cache ends with its
        sliding window's length)."""
        loss = self.final_loss
        last = returned[-1] if returned else None
        if loss is None or last is None or (last.shape == () and last.dtype.is_floating_point):
            return None
        return next((i for i, t in enumerate(returned) if t is loss), None)

    def graph_outputs(self) -> tuple[popxl.Tensor, ...]:
        return popxl.gcg().outputs


@dataclass
class Outputs:
    """What ``Translator.outputs`` marked."""

    leaves: list[Any] = field(default_factory=list)
    n_outputs: int = 0
    state: list[str] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    loss_index: int | None = None


def _as_tuple(value: Any) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _without_token(node: torch.fx.Node) -> Any:
    """The op a ``with_effects(token, op, *args)`` node runs, as a node-like record (its
    results are the node's results after the token)."""
    val = node.meta.get("val")
    inner = (
        val[1]
        if isinstance(val, (tuple, list)) and len(val) == 2
        else (tuple(val[1:]) if isinstance(val, (tuple, list)) else val)
    )
    return types.SimpleNamespace(
        op="call_function",
        target=node.args[1],
        args=tuple(node.args[2:]),
        kwargs=dict(node.kwargs),
        name=node.name,
        meta={**node.meta, "val": inner},
    )


def _fresh(t: popxl.Tensor) -> popxl.Tensor:
    """``t``, or an identity of it when ``t`` is a graph input or already an output (each
    output is a distinct tensor made by the graph)."""
    if t._producer is None or t in t._graph.outputs:
        return ops.identity(t)
    return t


def _scope_of(node: torch.fx.Node, modules: bool = True) -> str:
    """The node's torch module path (if ``modules``), then the ``poptorch.NameScope`` names
    around it."""
    stack = node.meta.get("nn_module_stack") or {}
    scopes = (node.meta.get("custom") or {}).get(NAME_SCOPE_KEY, ())
    if not modules:
        return "/".join(name for name, _ in scopes)
    return scope_path([path for path, _ in stack.values()], scopes)


def _attach_attributes(node: torch.fx.Node, created: list[Op]) -> None:
    """Record the ``poptorch.Attribute`` scopes around ``node`` on the ops made for it."""
    attributes: dict[str, dict[str, str]] = (node.meta.get("custom") or {}).get(ATTRIBUTE_KEY) or {}
    for op in created if attributes else ():
        for name, values in attributes.items():
            op.hints.setdefault(name, {}).update(values)


def _op_name(target: Any) -> str:
    name = str(target)
    return name if name.startswith("aten") else getattr(target, "__name__", name)


@dataclass
class BlockSubgraph:
    graph: popxl.Graph
    needs_seed: bool


def _block_subgraph(
    capture: Capture, blk: Any, training: bool, subgraphs: dict[Any, Any], options: Any
) -> BlockSubgraph:
    ir = popxl.gcg().ir
    graph = ir.create_empty_graph(type(blk.module).__name__)
    with graph:
        t = Translator(capture, training, subgraphs, options)
        t.seed_is_state = False
        t._inputs(blk.state_names)
        t.run()
        marked = t.outputs()
    if marked.state:
        raise ValueError(f"block {blk.path} updates state; it should have been exported inline")
    return BlockSubgraph(graph, t._seed_input is not None)


MULTIPLE_LOSSES_MSG = (
    "Multiple independent losses found in graph. Graph must have one final loss. Wrap final "
    "graph loss in poptorch.identity_loss."
)


def final_loss(graph: torch.fx.Graph) -> torch.fx.Node | None:
    """A training graph's losses (torch's loss functions and ``poptorch.identity_loss``)
    must all flow into one final loss, as PopTorch required: ``loss1 + loss2`` returned
    as it is has two independent losses, ``poptorch.identity_loss(loss1 + loss2, ...)``
    one. Returns that final loss (None if the graph has no loss).

    Raises:
        poptorch.Error: more than one loss feeds no other loss.
    """
    losses = [n for n in graph.nodes if n.op == "call_function" and n.target in ALL_LOSS_OPS]
    feeds_a_loss: dict[torch.fx.Node, bool] = {}
    for node in reversed(graph.nodes):  # users come after their inputs
        feeds_a_loss[node] = any(u.target in ALL_LOSS_OPS or feeds_a_loss[u] for u in node.users)
    independent = [n for n in losses if not feeds_a_loss[n]]
    if len(independent) > 1:
        raise Error(MULTIPLE_LOSSES_MSG, "poptorch_cpp_error")
    return independent[0] if independent else None


def translate(capture: Capture, training: bool, name: str, options: Any = None) -> Forward:
    """Build the popxl graph of ``capture`` in the current IR."""
    final = final_loss(capture.program.graph) if training else None
    overlaps = overlap.find(capture.program)
    ir = popxl.gcg().ir
    graph = ir.create_empty_graph(name)
    with graph:
        t = Translator(capture, training, {}, options)
        t.overlap_marks = overlaps.marks
        user, named, factories = t._inputs(None)
        t.run(marks_blocks=True)
        if final is not None:
            t.final_loss = t.env[final]
        marked = t.outputs()
        if t._seed_input is not None:
            named[SEED_NAME] = t._seed_input
    trainable = [tree_key(n) for n, p in capture.module.named_parameters() if p.requires_grad]
    trainable = [k for k in trainable if k in named]
    return Forward(
        graph=graph,
        factories=NamedVariableFactories.from_dict(factories),
        args=NamedTensors.from_dict(named),
        inputs=user,
        n_outputs=marked.n_outputs,
        out_spec=capture.out_spec,
        out_leaves=marked.leaves,
        state_outputs=marked.state,
        input_outputs=marked.inputs,
        trainable=trainable,
        loss_index=marked.loss_index,
        overlaps=overlaps,
    )
