"""Re-map a tensor linearly over tiles (an identity off the IPU)."""

from .linear_layout import linear_layout as linear_layout

__all__ = ["linear_layout"]
