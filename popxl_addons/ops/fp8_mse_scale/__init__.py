"""Float8 scaling bias chosen by the mean squared error of the cast."""

from .fp8_mse_scale import fp8_mse_scale as fp8_mse_scale

__all__ = ["fp8_mse_scale"]
