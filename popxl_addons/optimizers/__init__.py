"""Optimizers built as ``popxl_addons.Module``s: ``from popxl_addons.optimizers import
AdamOptimizerStep``. Not imported by ``import popxl_addons``."""

from .adam import AdamOptimizerStep as AdamOptimizerStep

__all__ = ["AdamOptimizerStep"]
