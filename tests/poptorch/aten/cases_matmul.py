"""Cases for ``poptorch/aten/matmul.py``."""

from __future__ import annotations

import torch
from torch.ops import aten

from .harness import Case


def _randn(*shapes: tuple) -> tuple:
    return lambda: tuple(torch.randn(*s) for s in shapes)


def _with_nans(*shapes: tuple, nan_in: tuple = ()) -> tuple:
    def make() -> tuple:
        xs = [torch.randn(*s) for s in shapes]
        for i in nan_in:
            xs[i].view(-1)[0] = float("nan")
        return tuple(xs)

    return make


_MM = [aten.mm.default]
_MATMUL = [aten.matmul.default]
_ADDMM = [aten.addmm.default]
_ADDMV = [aten.addmv.default]

# torch's CPU float16 kernels still propagate the NaNs of an operand scaled by alpha=0
# (float32 ones do not), so the alpha=0 cases compare in float32 only.
CASES = [
    Case("mm", torch.mm, _randn((3, 5), (5, 4)), _MM),
    # nn.Bilinear: x1 A x2 + b through aten._trilinear
    Case("bilinear", torch.nn.functional.bilinear, _randn((4, 3), (4, 5), (2, 3, 5), (2,)), [aten._trilinear.default]),
    Case("bilinear_no_bias", torch.nn.functional.bilinear, _randn((2, 6, 3), (2, 6, 5), (4, 3, 5)), [aten._trilinear.default]),
    Case("mm_int", torch.mm, lambda: (torch.randint(-3, 3, (3, 5)), torch.randint(-3, 3, (5, 2))), _MM, grad=False),
    Case("bmm", torch.bmm, _randn((2, 3, 5), (2, 5, 4)), [aten.bmm.default]),
    Case("matmul_2d", torch.matmul, _randn((3, 5), (5, 4)), _MATMUL),
    Case("matmul_mv", torch.matmul, _randn((3, 5), (5,)), _MATMUL),
    Case("matmul_vm", torch.matmul, _randn((5,), (5, 4)), _MATMUL),
    Case("matmul_dot", torch.matmul, _randn((5,), (5,)), _MATMUL),
    Case("matmul_batched_broadcast", torch.matmul, _randn((2, 1, 3, 5), (4, 5, 2)), _MATMUL),
    Case("matmul_3d_1d", torch.matmul, _randn((2, 3, 5), (5,)), _MATMUL),
    Case("matmul_operator", lambda a, b: a @ b, _randn((2, 3, 5), (5, 4)), _MATMUL),
    Case("addmm", lambda c, a, b: torch.addmm(c, a, b), _randn((4,), (3, 5), (5, 4)), _ADDMM),
    Case("addmm_scaled", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2.0), _randn((3, 1), (3, 5), (5, 4)), _ADDMM),
    Case("addmm_beta0_nan", lambda c, a, b: torch.addmm(c, a, b, beta=0), _with_nans((3, 4), (3, 5), (5, 4), nan_in=(0,)), _ADDMM, grad_inputs=[1, 2]),
    Case("addmm_alpha0_nan", lambda c, a, b: torch.addmm(c, a, b, beta=0.75, alpha=0), _with_nans((1, 4), (3, 5), (5, 4), nan_in=(1,)), _ADDMM, grad_inputs=[0], half=False),
    Case("linear", torch.nn.functional.linear, _randn((2, 3, 5), (4, 5), (4,)), _ADDMM),
    Case("linear_no_bias", torch.nn.functional.linear, _randn((2, 3, 5), (4, 5)), _MATMUL),
    Case("addmv", lambda c, a, b: torch.addmv(c, a, b, beta=0.5, alpha=1.5), _randn((3,), (3, 5), (5,)), _ADDMV),
    Case("addmv_beta0_nan", lambda c, a, b: torch.addmv(c, a, b, beta=0), _with_nans((3,), (3, 5), (5,), nan_in=(0,)), _ADDMV, grad_inputs=[1, 2]),
    Case("addmv_alpha0_nan", lambda c, a, b: torch.addmv(c, a, b, alpha=0, beta=0.5), _with_nans((3,), (3, 5), (5,), nan_in=(1, 2)), _ADDMV, grad_inputs=[0], half=False),
    Case("addmv_zero", lambda c, a, b: torch.addmv(c, a, b, alpha=0, beta=0) + 1, _with_nans((3,), (3, 5), (5,), nan_in=(0, 1, 2)), _ADDMV, grad=False, half=False),
    Case("addbmm", lambda c, a, b: torch.addbmm(c, a, b, beta=2, alpha=0.5), _randn((3, 4), (2, 3, 5), (2, 5, 4)), [aten.addbmm.default]),
    Case("baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, beta=0.75, alpha=0.5), _randn((1, 4), (2, 3, 5), (2, 5, 4)), [aten.bmm.default]),
    Case("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b), _randn((2, 3, 5), (2, 5, 4)), [aten.bmm.default]),
    Case("outer_dot", lambda a, b: (torch.outer(a, b), torch.dot(a, b)), _randn((5,), (5,)), [aten.mul.Tensor, aten.sum.dim_IntList]),
]
