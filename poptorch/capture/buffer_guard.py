"""Checks on what a captured ``forward`` does to the model's registered buffers.

A forward may update a buffer in place (``self.y.copy_(x)``, ``self.y += 1``): the update
becomes a write to the buffer's variable. Deleting a buffer or binding its name to another
tensor (``self.y = x``) cannot be expressed on the device, so PopTorch refused both; so
does ``guard_buffers``, by comparing the buffers at the start and end of the traced call.
"""

from __future__ import annotations

import contextlib
import pydoc
from collections.abc import Iterator

import torch

from ..errors import Error

REMOVED_MSG = "Buffer {name} is removed from the model when calling the forward method."
REASSIGNED_MSG = (
    "Buffer {name} is reassigned within the model when calling the forward method. This is "
    "not supported. Consider using self.{name}.copy_(src) to copy data from a source tensor, "
    "where src is the name of the source tensor."
)


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_buffers(remove_duplicate=False))


@contextlib.contextmanager
def guard_buffers(model: torch.nn.Module) -> Iterator[None]:
    """While active, a call of ``model`` that removes or rebinds one of the buffers it has
    now raises ``poptorch.Error``; a removed buffer is put back (export leaves it out)."""
    real = _buffers(model)
    at_start: dict[str, torch.Tensor] = {}

    # Strict export (dynamo) retraces the hooks; the non-strict attempt has checked already.
    def before(module: torch.nn.Module, args: object) -> None:
        if torch.compiler.is_dynamo_compiling():
            return
        at_start.clear()
        at_start.update((n, t) for n, t in _buffers(module).items() if n in real)

    def after(module: torch.nn.Module, args: object, out: object) -> None:
        if torch.compiler.is_dynamo_compiling():
            return
        now = _buffers(module)
        removed = [n for n in at_start if n not in now]
        rebound = [n for n in at_start if n in now and now[n] is not at_start[n]]
        if removed or rebound:
            _put_back(module, at_start)  # so that export's own clean-up finds them unchanged
            msg = REMOVED_MSG if removed else REASSIGNED_MSG
            raise Error(msg.format(name=(removed or rebound)[0]), "poptorch")

    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        _restore_removed(model, real)


def _put_back(model: torch.nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    for name, tensor in buffers.items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        module._buffers[leaf] = tensor


def _restore_removed(model: torch.nn.Module, real: dict[str, torch.Tensor]) -> None:
    now = _buffers(model)
    _put_back(model, {n: t for n, t in real.items() if n not in now})


def replica_local_buffers(program: torch.export.ExportedProgram) -> set[str]:
    """Buffers the forward updates that replicas may keep apart, as PopTorch let them.

    PopTorch refused in-place buffer updates under replication (``broadcastBuffers``), but
    BatchNorm's running statistics were never such updates: PopART's BatchNormalization
    updated them on each replica from that replica's own micro-batch, and the host read
    replica 0's. The buffers a BatchNorm module updates (its statistics and its
    ``num_batches_tracked``, equal on every replica) are returned; any other update is
    refused, whatever it reads (upstream's ``test_failing_on_replicas``).
    """
    sig = program.graph_signature
    output = next(n for n in program.graph.nodes if n.op == "output")
    by_name = {getattr(v, "name", None): v for v in output.args[0]}
    local = set()
    for out_name, buffer in sig.buffers_to_mutate.items():
        value = by_name.get(out_name)
        if value is not None and (_from_batch_norm(value) or _in_batch_norm_module(value)):
            local.add(buffer)
    return local


def _from_batch_norm(node: torch.fx.Node) -> bool:
    """``node`` is one of a batch norm's outputs (its updated running mean or variance)."""
    if node.op == "call_function" and getattr(node.target, "__name__", "") == "getitem":
        node = node.args[0]  # type: ignore[assignment]
    name = getattr(getattr(node, "target", None), "__name__", "")
    return node.op == "call_function" and "batch_norm" in name


def _in_batch_norm_module(node: torch.fx.Node) -> bool:
    """``node`` was made inside a BatchNorm module's forward (its ``num_batches_tracked``)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return False
    _, cls = list(stack.values())[-1]
    if isinstance(cls, str):  # torch.export records the class by its qualified name
        cls = pydoc.locate(cls)
    return isinstance(cls, type) and issubclass(cls, torch.nn.modules.batchnorm._NormBase)
