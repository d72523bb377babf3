"""Cases for ``poptorch/_aten/poptorch_ops.py`` (PopTorch's own ops in captured models)."""

from __future__ import annotations

import torch

import poptorch

from .harness import Case

_OPS = torch.ops.poptorch


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


CASES = [
    Case(
        "identity_loss_sum",
        lambda x: poptorch.identity_loss(x * x, reduction="sum"),
        lambda: (_randn(3, 4),),
        [_OPS.identity_loss.default],
    ),
    Case(
        "identity_loss_mean",
        lambda x: poptorch.identity_loss(x * x, reduction="mean"),
        lambda: (_randn(3, 4),),
        [_OPS.identity_loss.default],
    ),
    Case(
        "identity_loss_none",
        lambda x: poptorch.identity_loss(x * 2, reduction="none"),
        lambda: (_randn(3, 4),),
        [_OPS.identity_loss.default],
    ),
    Case(
        "ipu_print_tensor",
        lambda x: poptorch.ipu_print_tensor(x * 2, "doubled") + 1,
        lambda: (_randn(2, 3),),
        [_OPS.ipu_print_tensor.default],
    ),
    Case("nop", lambda x: poptorch.nop(x * 2), lambda: (_randn(2, 3),), [_OPS.nop.default]),
    Case(
        "set_available_memory",
        lambda a, b: poptorch.set_available_memory(a @ b, 0.3),
        lambda: (_randn(3, 4), _randn(4, 5)),
        [_OPS.set_available_memory.default],
    ),
    Case(
        "recomputation_checkpoint",
        lambda x: poptorch.recomputationCheckpoint(x.sin()) * 2,
        lambda: (_randn(3, 4),),
        [_OPS.recomputation_checkpoint.default],
    ),
    Case(
        "serialized_matmul",
        lambda a, b: poptorch.serializedMatMul(
            a, b, poptorch.MatMulSerializationMode.OutputChannels, 2
        ),
        lambda: (_randn(3, 4), _randn(4, 6)),
        [_OPS.set_matmul_serialization.default],
    ),
    Case(
        "dynamic_slice",
        lambda x, i: poptorch.dynamic_slice(x, 1, i, 2, 1) * 3,
        lambda: (_randn(3, 5), torch.tensor([2])),
        [_OPS.dynamic_slice.default],
        grad_inputs=[0],
    ),
    Case(
        "dynamic_slice_step",
        lambda x, i: poptorch.dynamic_slice(x, 0, i, 4, 2),
        lambda: (_randn(6, 2), torch.tensor([1])),
        [_OPS.dynamic_slice.default],
        grad_inputs=[0],
    ),
    Case(
        "dynamic_update",
        lambda x, s, i: poptorch.dynamic_update(x, s, 1, i, 2),
        lambda: (_randn(3, 5), _randn(3, 2), torch.tensor([1])),
        [_OPS.dynamic_update.default],
        grad_inputs=[0, 1],
    ),
]
