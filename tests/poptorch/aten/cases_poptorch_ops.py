"""Cases for ``poptorch/ops/lowerings.py`` (PopTorch's own ops in captured models)."""

from __future__ import annotations

import jax.numpy as jnp
import torch

import poptorch
import popxl

from .harness import Case

_OPS = torch.ops.poptorch


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


CASES = [
    # torch.bincount with minlength: a fixed-length count (redirected while capturing).
    Case(
        "bincount_minlength",
        lambda x: torch.bincount(x, minlength=9),
        lambda: (torch.tensor([0, 3, 3, 8, 1, 0, 3]),),
        [_OPS.bincount.default],
        grad=False,
        half=False,
    ),
    Case(
        "bincount_weights",
        lambda x, w: x.bincount(w, minlength=6),
        lambda: (torch.tensor([5, 1, 1, 2, 0]), torch.rand(5)),
        [_OPS.bincount.default],
        grad=False,
        half=False,
    ),
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
        "set_overlap_for_input_output",
        lambda x: poptorch.set_overlap_for_output(
            poptorch.set_overlap_for_input(x, poptorch.OverlapMode.NoOverlap) * 2,
            poptorch.OverlapMode.NoOverlap,
        ),
        lambda: (_randn(2, 3),),
        [_OPS.set_overlap_for_input.default, _OPS.set_overlap_for_output.default],
        # The gradient harness offsets the inputs, so they are no longer model inputs:
        # test_torch_overlapped_io trains through the marks instead.
        grad=False,
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
        lambda: (_randn(3, 6), torch.tensor([2])),
        [_OPS.dynamic_slice.default],
        grad_inputs=[0],
    ),
    Case(
        "dynamic_slice_step",
        lambda x, i: poptorch.dynamic_slice(x, 0, i, 4, 2),
        lambda: (_randn(8, 2), torch.tensor([1])),
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


# Host callbacks, custom ops and CTC decoding --------------------------------------------------

_CASE_DOMAIN = "tests.aten.cases"


def _cube(x, bias):
    cubed = x * x * x
    return cubed + bias, cubed


def _cube_vjp(inputs, outputs, grads):
    (x, _), (g_sum, g_cube) = inputs, grads
    return 3 * x * x * (g_sum + g_cube), g_sum


popxl.custom_ops.register("Cube", _cube, domain=_CASE_DOMAIN, vjp=_cube_vjp, replace=True)
popxl.custom_ops.register(
    "LeakyRelu",
    lambda x, *, alpha: jnp.where(x >= 0, x, alpha * x),
    domain=_CASE_DOMAIN,
    attributes={"alpha": 0.01},
    replace=True,
)
_HOST_DOUBLE = poptorch.CPU(lambda x, y: (x * 2.0, x + y), "cases.host_double")


def _ctc_inputs():
    gen = torch.Generator().manual_seed(3)
    log_probs = torch.randn(6, 2, 4, generator=gen).log_softmax(-1)
    return log_probs, torch.tensor([6, 4], dtype=torch.int32)


CASES += [
    Case(
        "call_cpu_op",
        lambda x, y: [t + 1 for t in _HOST_DOUBLE(x, y)],
        lambda: (_randn(2, 3), _randn(2, 3)),
        [_OPS.call_cpu_op.default],
        grad=False,
    ),
    Case(
        "custom_operation_cube",
        lambda x, b: poptorch.custom_op([x, b], "Cube", _CASE_DOMAIN, 1, example_outputs=[x, x]),
        lambda: (_randn(2, 3), _randn(2, 3)),
        [_OPS.custom_operation.default],
    ),
    Case(
        "custom_operation_attribute",
        lambda x: (
            poptorch.custom_op(
                [x], "LeakyRelu", _CASE_DOMAIN, 1, example_outputs=[x], attributes={"alpha": 0.2}
            )[0]
            * 2
        ),
        lambda: (_randn(3, 4),),
        [_OPS.custom_operation.default],
    ),
    Case(
        "ctc_beam_search_decoder",
        lambda lp, n: poptorch.ctc_beam_search_decoder(lp, n, blank=0, beam_width=5, top_paths=2),
        _ctc_inputs,
        [_OPS.ctc_beam_search_decoder.default],
        grad=False,
        half=False,
    ),
]
