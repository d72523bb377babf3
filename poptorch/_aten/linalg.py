"""Linear-algebra helpers beyond matmul: norms, distances (cdist, pairwise), cumulative ops."""

from __future__ import annotations
