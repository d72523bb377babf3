"""Layer normalisation of a tensor whose hidden axis is sharded over replicas."""

from .layer_norm_distributed import layer_norm_distributed as layer_norm_distributed

__all__ = ["layer_norm_distributed"]
