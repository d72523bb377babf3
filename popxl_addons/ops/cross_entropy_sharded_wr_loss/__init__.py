"""Cross-entropy over logits sharded across the IPUs of one replica."""

from .cross_entropy_sharded_wr_loss import (
    cross_entropy_sharded_wr_loss as cross_entropy_sharded_wr_loss,
)

__all__ = ["cross_entropy_sharded_wr_loss"]
