"""Capture a ``torch.nn.Module``'s ``forward`` as a core-ATen graph with ``torch.export``.

The export runs the user's Python as is on fake tensors (``strict=False``, as PopTorch's
dispatcher tracing did; torch's own default), falling back to the stricter TorchDynamo
export where that fails, and is then lowered to core ATen (``run_decompositions``).
Identical repeated children are captured once each (``blocks``).
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import traceback as fx_traceback
from torch.utils import _pytree as pytree

from .. import _state
from .. import blocks as blocks_api
from .._log import logger
from ..errors import Error
from .arguments import register_types
from .blocks import Block, NotABlock, as_blocks, as_representative, find_groups
from .composite import decomposition_table
from .composite_ops import composite_ops_cached
from .cpu_tensors import refuse_legacy_constructors
from .index_expansion import log_graph, remove_index_expansions
from .redirects import Redirects, masks_as_given
from .scatter_groups import group_scatters
from .scope_ops import closing_pushed_scopes
from .scopes import tracking_module_depth

EXPORT_FAILED_MSG = (
    "poptorch could not capture {cls}.forward with torch.export{where}:\n  {reason}\n"
    "What to change: {hint}"
)
_HINTS = (
    (
        ("data-dependent", "guard_on_data_dependent", "GuardOnDataDependent", "unbacked"),
        "the model branches on, or sizes a tensor by, the value of a tensor. A compiled "
        "program has fixed control flow and shapes: use torch.where / masks instead of "
        "Python `if` on tensor values, poptorch.cond or poptorch.for_loop for device-side "
        "control flow, and avoid value-sized ops such as nonzero or masked_select.",
    ),
    (
        ("not supported", "Unsupported", "unsupported"),
        "rewrite the failing line (shown above) with plain tensor operations, or move it "
        "out of forward (into the data pipeline, or around the model call).",
    ),
)
_DEFAULT_HINT = (
    "forward must be a function of its tensor inputs, parameters and buffers that torch.export "
    "can trace: see the reason above for the line it stopped at."
)


@dataclass
class Capture:
    """A captured forward: the ATen program and how to call it."""

    program: torch.export.ExportedProgram
    module: torch.nn.Module
    # Repeated children called as ``block`` ops in ``program``, by the op's key.
    blocks: dict[int, Block] = field(default_factory=dict)
    # The representative child's own capture, per call signature (see ``signature``).
    block_captures: dict[Any, Capture] = field(default_factory=dict)
    # Plain tensor attributes the forward modifies: captured as buffers whose updates are
    # dropped, since PopTorch froze them as constants (seed listing 4.21).
    frozen: set[str] = field(default_factory=set)

    @property
    def in_spec(self) -> Any:
        return self.program.call_spec.in_spec

    @property
    def out_spec(self) -> Any:
        return self.program.call_spec.out_spec


def signature(blk: Block, tensors: list[Any]) -> Any:
    """What makes two calls of a group's children the same subgraph."""
    metas = tuple((tuple(t.shape), t.dtype) for t in tensors)
    return (blk.group, blk.spec, blk.constants, metas)


def _hint(reason: str) -> str:
    for needles, hint in _HINTS:
        if any(n in reason for n in needles):
            return hint
    return _DEFAULT_HINT


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n  ".join(lines[:6])


@contextlib.contextmanager
def _registering_output_types(model: torch.nn.Module) -> Iterator[None]:
    """User containers the forward returns (a ``dict`` subclass, a type with a custom
    argument parser) registered with pytree before ``torch.export`` flattens them."""
    handle = model.register_forward_hook(lambda _module, _args, out: register_types(out))
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _tracing() -> Iterator[None]:
    token = _state.TRACING.set(True)
    try:
        yield
    finally:
        _state.TRACING.reset(token)


@contextlib.contextmanager
def _distributions_unvalidated() -> Iterator[None]:
    """``torch.distributions`` made in the forward skip their argument checks (``low <
    high``, ``scale > 0``): each is a Python ``if`` on tensor values, which a compiled program
    cannot take, and which PopTorch's tracing did not take either. The values are not
    checked on the device (as ``validate_args=False`` in torch)."""
    dist = torch.distributions.Distribution
    saved = dist._validate_args
    dist.set_default_validate_args(False)
    try:
        yield
    finally:
        dist.set_default_validate_args(saved)


def _export(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    # preserve_node_meta: annotations made while tracing (torch.fx.traceback.annotate, which
    # poptorch.Block, BeginBlock and NameScope use) stay on the nodes; run_decompositions
    # then carries them to the nodes each op decomposes into.
    with (
        _tracing(),
        _distributions_unvalidated(),
        torch.no_grad(),
        warnings.catch_warnings(),
        fx_traceback.preserve_node_meta(),
        blocks_api.capturing(),
        refuse_legacy_constructors(model),
        Redirects(),
        masks_as_given(),
        _registering_output_types(model),
    ):
        # torch's own deprecation notices while tracing are not the user's concern.
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            with tracking_module_depth(model), closing_pushed_scopes():
                return torch.export.export(model, args, kwargs, strict=False)
        except (NotABlock, Error):
            raise
        except Exception as first:  # torch raises many types; strict export may still work
            if _not_a_block(first):
                raise NotABlock(str(first)) from first
            # Strict export (TorchDynamo) refuses global module hooks, so it runs without the
            # module-depth tracking: name scopes then take the names of the modules they are in.
            try:
                with closing_pushed_scopes():
                    return torch.export.export(model, args, kwargs, strict=True)
            except Exception:  # report the non-strict reason: it names the user's line
                raise first from None


def _not_a_block(error: BaseException | None) -> bool:
    while error is not None:
        if isinstance(error, NotABlock):
            return True
        error = error.__cause__ or error.__context__
    return False


def _decompose(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    # Not under preserve_node_meta: run_decompositions keeps the nodes' annotations itself,
    # and with it active the re-traced placeholders take annotations too, which torch then
    # refuses ("Mismatch in custom metadata") for a plain tensor attribute named as an op
    # of the graph (an input normaliser's ``self.mul``: torch matches the two by name).
    with warnings.catch_warnings(), composite_ops_cached():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            ep = ep.run_decompositions(decomposition_table())
        except Exception as error:  # torch raises many types; see poptorch.capture.composite
            logger.debug("Decomposing to core ATen failed (%s); keeping composite ops", error)
            ep = ep.run_decompositions({})
    if remove_index_expansions(ep.graph) | group_scatters(ep.graph):
        ep.graph_module.recompile()
    log_graph("Graph after capture (core ATen):", ep.graph)
    return ep


def capture(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> Capture:
    """Export ``model(*args, **kwargs)`` to core ATen; raises ``poptorch.Error`` with torch's
    reason and a hint when it cannot be exported."""
    saved = _plain_tensors(model)
    try:
        return _capture(model, args, kwargs or {})
    except Exception as error:
        if "is mutated in the forward method" not in str(error):
            raise
    with torch.no_grad():  # the failed attempt may have modified them
        for t, value in saved:
            t.copy_(value)
    with _as_buffers(model) as frozen:
        result = _capture(model, args, kwargs or {})
    result.frozen = frozen
    return result


def _plain_tensors(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each plain tensor attribute of the model's modules, with a copy of its value."""
    return [
        (value, value.detach().clone())
        for module in model.modules()
        for value in vars(module).values()
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
    ]


@contextlib.contextmanager
def _as_buffers(model: torch.nn.Module) -> Iterator[set[str]]:
    """While active, plain tensor attributes of the model's modules are (non-persistent)
    buffers, so that a forward modifying one can be exported."""
    moved: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
    names: set[str] = set()
    for prefix, module in model.named_modules():
        for key, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                delattr(module, key)
                module.register_buffer(key, value, persistent=False)
                moved.append((module, key, value))
                names.add(f"{prefix}.{key}" if prefix else key)
    try:
        yield names
    finally:
        for module, key, value in moved:
            module._buffers.pop(key, None)
            module._non_persistent_buffers_set.discard(key)
            object.__setattr__(module, key, value)


def _capture(model: torch.nn.Module, args: tuple, kwargs: dict) -> Capture:
    from ..errors import Error  # noqa: PLC0415 (errors imports nothing of torch)

    try:
        groups = find_groups(model)
        if groups:
            try:
                return _capture_with_blocks(model, args, kwargs, groups)
            except NotABlock:
                pass  # a child cannot be a block: export everything inline
        return Capture(_decompose(_export(model, args, kwargs)), model)
    except Error:
        raise
    except Exception as error:
        if _raised_by_model_code(error):
            # The model's own error, as running it in torch raises it (as PopTorch did).
            _as_in_eager_torch(error)
            raise
        reason = _first_line(error)
        message = EXPORT_FAILED_MSG.format(
            cls=type(model).__name__,
            where=_failing_module(model, error),
            reason=reason,
            hint=_hint(str(error)),
        )
        raise Error(message, "poptorch", "capture") from error


def _failing_module(model: torch.nn.Module, error: BaseException) -> str:
    """`` in <module>.<method> (<class>)``: the innermost method of ``model`` or of one of
    its submodules that was running when ``error`` was raised (export runs the forward's
    Python), or "" if none was."""
    names = {id(m): name for name, m in model.named_modules()}
    found = ""
    tb = error.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_locals.get("self")
        if id(module) in names:
            name = names[id(module)] or type(module).__name__
            found = f" in {name}.{tb.tb_frame.f_code.co_name} ({type(module).__name__})"
        tb = tb.tb_next
    return found


_TORCH_DIR = os.path.dirname(torch.__file__)


def _raised_by_model_code(error: BaseException) -> bool:
    """Whether ``error`` is an ordinary exception raised in the model's own code (a frame
    outside torch), rather than one of torch.export's limitations."""
    if type(error).__module__.split(".")[0] == "torch":
        return False
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_TORCH_DIR)


_TRACING_TENSORS = re.compile(r"\b(?:Fake|Functional)Tensor\b")


def _as_in_eager_torch(error: BaseException) -> None:
    """The message of an error the model's code raised while traced, as eager torch words
    it: the tensor types torch names are the tracer's (``FakeTensor``), not the user's."""
    if error.args and isinstance(error.args[0], str):
        error.args = (_TRACING_TENSORS.sub("Tensor", error.args[0]), *error.args[1:])


def _capture_with_blocks(
    model: torch.nn.Module, args: tuple, kwargs: dict, groups: list
) -> Capture:
    with as_blocks(groups) as blocks:
        ep = _export(model, args, kwargs)
        calls = _block_calls(ep, blocks)
        result = Capture(_decompose(ep), model, dict(blocks))
    for sig, (blk, metas) in calls.items():
        example = tuple(torch.zeros(shape, dtype=dtype) for shape, dtype in metas)
        with as_representative(blk):
            inner = capture(blk.module, example)
        if _mutates_state(inner.program):
            raise NotABlock("it updates buffers or inputs")
        result.block_captures[sig] = inner
    return result


def _block_calls(
    ep: torch.export.ExportedProgram, blocks: dict[int, Block]
) -> dict[Any, tuple[Block, list]]:
    """Each distinct block call signature of the exported graph, with a child making it."""
    from .blocks import is_block_node  # noqa: PLC0415

    calls: dict[Any, tuple[Block, list]] = {}
    for node in ep.graph.nodes:
        if node.op != "call_function" or not is_block_node(node.target):
            continue
        tensors_arg, key = node.args
        blk = blocks[key]
        metas = [n.meta["val"] for n in tensors_arg[: blk.n_inputs]]
        sig = signature(blk, metas)
        calls.setdefault(sig, (blk, [(tuple(t.shape), t.dtype) for t in metas]))
    return calls


def _mutates_state(ep: torch.export.ExportedProgram) -> bool:
    sig = ep.graph_signature
    return bool(sig.buffers_to_mutate) or bool(sig.user_inputs_to_mutate)


def flatten_inputs(args: tuple, kwargs: dict) -> tuple[list[Any], Any]:
    """The leaves of a call's arguments, as ``torch.export`` flattens them."""
    return pytree.tree_flatten((args, kwargs))
