"""Cross-entropy over logits sharded across replicas (tensor parallelism)."""

from .cross_entropy_sharded_loss import cross_entropy_sharded_loss as cross_entropy_sharded_loss

__all__ = ["cross_entropy_sharded_loss"]
