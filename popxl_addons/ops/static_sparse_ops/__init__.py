"""Dense x constant-sparse matrix multiplication."""

from .dense_sparse_matmul import dense_const_sparse_matmul as dense_const_sparse_matmul
from .dense_sparse_matmul import random_sparse as random_sparse

__all__ = ["dense_const_sparse_matmul", "random_sparse"]
