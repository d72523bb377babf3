"""``SparseMatmul``: ``dense @ sparse`` with a constant CSR right-hand side.

The original used popsparse's static (gather/scatter) matmul for inference. Here the CSR
matrix is an attribute of the op, and the lowering multiplies by its non-zeros directly
(a gather of the ``lhs`` columns and a segment sum into the output columns), so only
the non-zeros cost work. The gradient w.r.t. ``lhs`` follows from JAX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import popxl
from popxl.tensor_spec import TensorSpec

from .._native import define, jax, jnp, record


@dataclass(frozen=True)
class ConstCSR:
    """A hashable constant CSR matrix (the op's attribute)."""

    data: tuple[float, ...]
    indices: tuple[int, ...]
    indptr: tuple[int, ...]
    cols: int

    @property
    def rows(self) -> int:
        return len(self.indptr) - 1

    def coordinates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row of each non-zero, its column, its value)."""
        counts = np.diff(np.asarray(self.indptr))
        rows = np.repeat(np.arange(self.rows), counts)
        return rows, np.asarray(self.indices, np.int32), np.asarray(self.data, np.float32)


def _infer(lhs: Any, *, rhs: ConstCSR) -> list:
    return [TensorSpec((*lhs.shape[:-1], rhs.cols), lhs.dtype)]


def _lower(x: Any, *, rhs: ConstCSR) -> Any:
    rows, cols, values = rhs.coordinates()
    terms = x[..., rows] * values.astype(x.dtype)  # one term per non-zero
    moved = jnp.moveaxis(terms, -1, 0)
    out = jax.ops.segment_sum(moved, cols, num_segments=rhs.cols)
    return jnp.moveaxis(out, 0, -1)


SPARSE_MATMUL = define("dense_sparse_matmul", "SparseMatmul", _infer, _lower, grad_needs="none")


def random_sparse(dense: np.ndarray, density: float = 0.5) -> np.ndarray:
    """Zero each element of ``dense`` in place with probability ``1 - density`` (keeping
    at least one), using NumPy's global random state. Returns ``dense``."""
    drop = np.random.random_sample(dense.shape) >= density
    if np.all(drop):
        drop.reshape(-1)[0] = False
    dense[drop] = 0
    return dense


def dense_const_sparse_matmul(lhs: popxl.Tensor, rhs: Any, output_cols: int) -> popxl.Tensor:
    """``lhs @ rhs`` for a constant sparse ``rhs`` in CSR form (for inference with a
    fixed sparsity pattern).

    Args:
        lhs: ``(..., m, k)`` float16 or float32; leading axes of size 1 only, as in the
            original (``[G][m][k]`` with ``G = 1``).
        rhs: a ``scipy.sparse.csr_matrix`` (or anything with ``data``, ``indices`` and
            ``indptr``) of shape ``(k, output_cols)``; its values are cast to ``lhs``'s
            dtype.
        output_cols: the number of columns of ``rhs``.

    Raises:
        RuntimeError: ``lhs`` is neither float16 nor float32.
        ValueError: ``rhs`` does not have ``lhs.shape[-1]`` rows.
    """
    if lhs.dtype not in (popxl.float16, popxl.float32):
        raise RuntimeError(f"dtype {lhs.dtype} not currently supported.")
    csr = ConstCSR(
        tuple(np.asarray(rhs.data, np.float32).tolist()),
        tuple(np.asarray(rhs.indices, np.int64).tolist()),
        tuple(np.asarray(rhs.indptr, np.int64).tolist()),
        int(output_cols),
    )
    if csr.rows != lhs.shape[-1]:
        raise ValueError(
            f"dense_const_sparse_matmul: the sparse matrix has {csr.rows} rows but lhs "
            f"{lhs.id} has {lhs.shape[-1]} columns."
        )
    return record(SPARSE_MATMUL, {"lhs": lhs}, {"rhs": csr}, ["sparse_matmul_out"])[0]


__all__ = ["dense_const_sparse_matmul", "random_sparse"]
