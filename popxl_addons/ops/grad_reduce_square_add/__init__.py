"""Sum of squares of a loss-scaled gradient, unscaled."""

from .grad_reduce_square_add import grad_reduce_square_add as grad_reduce_square_add

__all__ = ["grad_reduce_square_add"]
