"""Cases for ``poptorch/aten/reduce.py``."""

from __future__ import annotations

import torch
from torch.ops import aten

from .harness import Case


def _randn(*shape: int) -> tuple:
    return lambda: (torch.randn(*shape),)


def _ints(*shape: int, high: int = 3) -> tuple:
    return lambda: (torch.randint(0, high, shape, dtype=torch.int32),)


def _with_nans() -> tuple:
    x = torch.randn(4, 5)
    x[torch.rand(4, 5) < 0.3] = float("nan")
    return (x,)


def _zero_rows() -> tuple:
    """A 3x4 tensor whose first row is zeros: where torch's norm derivatives are 0."""
    x = torch.randn(3, 4)
    x[0] = 0.0
    return (x,)


def _ties() -> tuple:
    return (torch.randint(0, 4, (3, 7)).float(),)


CASES = [
    Case("sum_all", torch.sum, _randn(3, 4), [aten.sum.dim_IntList]),
    Case("sum_dim_keep", lambda x: x.sum((0, -1), keepdim=True), _randn(2, 3, 4), [aten.sum.dim_IntList]),
    Case("sum_int", lambda x: x.sum(1), _ints(3, 4), [aten.sum.dim_IntList], grad=False),
    Case("sum_dtype_half", lambda x: torch.sum(x, 1, dtype=torch.float16).float(), _randn(3, 4), [aten.sum.dim_IntList], atol=1e-2, rtol=1e-2),
    Case("mean_all", torch.mean, _randn(3, 4), [aten.mean.default]),
    Case("mean_dim", lambda x: x.mean(-1, keepdim=True), _randn(3, 4), [aten.mean.dim]),
    Case("prod_all", torch.prod, _randn(2, 3), [aten.prod.default]),
    Case("prod_dim", lambda x: x.prod(1, keepdim=True), _randn(3, 4), [aten.prod.dim_int]),
    Case("prod_int", lambda x: x.prod(0), _ints(3, 4), [aten.prod.dim_int], grad=False),
    Case("nansum", lambda x: torch.nansum(x, 1), _with_nans, [aten.nansum.default], grad=False),
    Case("nansum_all_half", lambda x: torch.nansum(x, dtype=torch.float16).float(), _with_nans, [aten.nansum.default], grad=False, atol=1e-2, rtol=1e-2),
    Case("amax", lambda x: torch.amax(x, (0, 2)), _randn(2, 3, 4), [aten.amax.default]),
    Case("amin_keep", lambda x: torch.amin(x, -1, keepdim=True), _randn(3, 4), [aten.amin.default]),
    Case("max_all", torch.max, _randn(3, 4), [aten.max.default]),
    Case("min_all", torch.min, _randn(3, 4), [aten.min.default]),
    Case("max_ties_grad", lambda x: torch.amax(x, 1), _ties, [aten.amax.default]),
    Case("max_dim", lambda x: torch.max(x, 1), _randn(3, 4), [aten.max.dim]),
    Case("min_dim_keep", lambda x: torch.min(x, 0, keepdim=True), _randn(3, 4), [aten.min.dim]),
    Case("max_dim_ties", lambda x: torch.max(x, -1), _ties, [aten.max.dim]),
    Case("argmax", lambda x: torch.argmax(x, 1), _randn(3, 4), [aten.argmax.default], grad=False),
    Case("argmax_flat_keep", lambda x: torch.argmax(x, keepdim=True), _randn(3, 4), [aten.argmax.default], grad=False),
    Case("argmin", lambda x: torch.argmin(x, 0, keepdim=True), _randn(3, 4), [aten.argmin.default], grad=False),
    Case("argmin_flat", torch.argmin, _randn(3, 4), [aten.argmin.default], grad=False),
    Case("median_all", torch.median, _randn(3, 5), [aten.median.default]),
    Case("median_dim", lambda x: torch.median(x, 1), _randn(3, 5), [aten.median.dim]),
    Case("median_dim_even_keep", lambda x: torch.median(x, 0, keepdim=True), _randn(4, 3), [aten.median.dim]),
    Case("mode", lambda x: torch.mode(x, 1), _ties, [aten.mode.default], grad=False, half=False),
    Case("var", lambda x: torch.var(x, 1), _randn(3, 5), [aten.var.correction]),
    Case("var_all_biased", lambda x: torch.var(x, unbiased=False), _randn(3, 5), [aten.var.correction]),
    Case("std", lambda x: torch.std(x, (0, 1), correction=2, keepdim=True), _randn(3, 5), [aten.std.correction]),
    # A deviation of 0 (one element per row): torch's gradient there is 0, not sqrt's NaN.
    Case("std_of_one", lambda x: torch.std(x, 1, correction=0) + x.sum(1), _randn(3, 1), [aten.std.correction]),
    Case("var_mean", lambda x: torch.var_mean(x, 0), _randn(4, 3), [aten.var_mean.correction]),
    Case("std_mean", lambda x: torch.std_mean(x, -1, keepdim=True), _randn(4, 3), [aten.var_mean.correction]),
    Case("any", lambda x: torch.any(x), _ints(3, 4), [aten.any.default], grad=False),
    Case("any_dim", lambda x: torch.any(x, 1), _ints(3, 4), [aten.any.dim], grad=False),
    Case("any_float", lambda x: torch.any(x > 1, 0, keepdim=True), _randn(3, 4), [aten.any.dim], grad=False),
    Case("all", lambda x: torch.all(x), _ints(3, 4, high=2), [aten.any.dims], grad=False),
    Case("all_dim", lambda x: torch.all(x, -1), _ints(5, 2, high=2), [aten.any.dim], grad=False),
    Case("is_all_true", lambda x: torch.ops.aten._is_all_true(x > -3), _randn(3, 4), [aten._is_all_true.default], grad=False),
    Case("is_any_true", lambda x: torch.ops.aten._is_any_true(x > 1), _randn(3, 4), [aten._is_any_true.default], grad=False),
    Case("logsumexp", lambda x: torch.logsumexp(x, 1), _randn(3, 4), [aten.logsumexp.default]),
    Case("logsumexp_keep", lambda x: torch.logsumexp(x * 30, (0, 1), keepdim=True), _randn(3, 4), [aten.logsumexp.default], atol=1e-4),
    Case("norm_2", lambda x: torch.linalg.vector_norm(x), _randn(3, 4), [aten.linalg_vector_norm.default]),
    Case("norm_zero_grad", lambda x: torch.linalg.vector_norm(x * (x > 10), dim=1), _randn(3, 4), [aten.linalg_vector_norm.default]),
    Case("norm_1", lambda x: torch.norm(x, p=1, dim=0), _randn(3, 4), [aten.linalg_vector_norm.default]),
    Case("norm_3", lambda x: torch.norm(x, p=3, dim=1, keepdim=True), _randn(3, 4), [aten.linalg_vector_norm.default]),
    Case("norm_inf", lambda x: torch.linalg.vector_norm(x, ord=float("inf"), dim=1), _randn(3, 4), [aten.linalg_vector_norm.default]),
    Case("norm_half_zeros", lambda x: torch.linalg.vector_norm(x * (x > 0), ord=0.5, dim=1), _zero_rows, [aten.linalg_vector_norm.default]),
    Case("norm_inf_zeros", lambda x: torch.linalg.vector_norm(x, ord=float("inf"), dim=1), _zero_rows, [aten.linalg_vector_norm.default]),
    Case("norm_neg_inf", lambda x: torch.linalg.vector_norm(x, ord=float("-inf")), _randn(3, 4), [aten.linalg_vector_norm.default]),
    Case("norm_0", lambda x: torch.linalg.vector_norm(x * (x > 0), ord=0, dim=1), _randn(3, 4), [aten.linalg_vector_norm.default], grad=False),
    Case("count_nonzero", lambda x: torch.count_nonzero(x, (0, 2)), _ints(2, 3, 4), [aten.sum.dim_IntList], grad=False),
    # Expert ids counted as MoE layers do; values below, above and on the range's edges.
    Case("histc_ids", lambda x: torch.histc(x.float(), bins=4, min=0, max=3), _ints(3, 7, high=5), [aten.histc.default], grad=False),
    Case("histc_edges", lambda x: torch.histc(x * 2, bins=5, min=-1.5, max=2.5), lambda: (torch.tensor([-0.75, -1.0, 1.25, 0.1, 3.0, 1.3, 0.0]),), [aten.histc.default], grad=False),
    Case("histc_own_range", lambda x, y: (torch.histc(x, bins=7), torch.histc(y, bins=3)), lambda: (torch.randn(40), torch.ones(5)), [aten.histc.default], grad=False),
]
