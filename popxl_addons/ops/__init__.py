"""Ops built from popxl ops: losses, host IO helpers and fp8 scaling.

As in the original, the custom-op packages (``replicated_all_reduce_TP``,
``cross_entropy_sharded_loss``...) are not imported here: import them explicitly.
"""

from .cross_entropy import cross_entropy as cross_entropy
from .cross_entropy import cross_entropy_with_grad as cross_entropy_with_grad
from .fp8_amax_scale import fp8_amax_scale as fp8_amax_scale
from .streams import host_load as host_load
from .streams import host_store as host_store

__all__ = ["cross_entropy", "cross_entropy_with_grad", "fp8_amax_scale", "host_load", "host_store"]
