"""Refuse CPU tensors that a model's ``forward`` makes with torch's legacy constructors.

On the IPU, PopTorch placed the tensors a ``forward`` creates with factory functions
(``torch.tensor``, ``torch.zeros``...) on the device; the legacy typed constructors
(``torch.LongTensor([1, 0])``, ``torch.Tensor([...])``) bypassed that and made CPU tensors,
which PopTorch refused. The same programs are refused here, with PopTorch's message, so a
model that works here works there.

While the root module's ``forward`` runs under capture, a ``TorchFunctionMode`` watches the
calls it makes. A legacy constructor reaches torch's function layer only as a bare
``aten.lift_fresh``/``lift_fresh_copy`` of the new CPU tensor (export's tracer lifts it as a
constant); factory functions reach it as themselves (the mode does not see what runs inside
them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import Error

CPU_TENSOR_MSG = (
    "Expected an IPU tensor but got tensor(device=cpu, shape={shape}, dtype={dtype}): "
    "forward created it with a legacy constructor (torch.LongTensor(...), torch.Tensor(...)), "
    "which makes a CPU tensor. Create it with torch.tensor(..., dtype=...) instead."
)
# c10's names of the dtypes, as PopTorch printed them.
_SCALAR_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
}


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


class _LegacyConstructorGuard(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _LIFTS and args:
            t = args[0]
            dtype = _SCALAR_NAMES.get(t.dtype, str(t.dtype))
            raise Error(
                CPU_TENSOR_MSG.format(shape=list(t.shape), dtype=dtype), "poptorch", "capture"
            )
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def refuse_legacy_constructors(model: torch.nn.Module) -> Iterator[None]:
    """While active, each call of ``model`` runs under the guard."""
    modes: list[_LegacyConstructorGuard] = []

    def enter(*_: Any) -> None:
        if torch.compiler.is_dynamo_compiling():
            return  # strict export's retry: TorchDynamo traces the call, not the guard
        mode = _LegacyConstructorGuard()
        mode.__enter__()
        modes.append(mode)

    def leave(*_: Any) -> None:
        if modes and not torch.compiler.is_dynamo_compiling():
            modes.pop().__exit__(None, None, None)

    pre = model.register_forward_pre_hook(enter)
    post = model.register_forward_hook(leave, always_call=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        while modes:
            modes.pop().__exit__(None, None, None)
