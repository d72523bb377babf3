"""Layers built as ``popxl_addons.Module``s: ``from popxl_addons.layers import Linear``.

Not imported by ``import popxl_addons``.
"""

from .conv import Conv2D as Conv2D
from .embedding import Embedding as Embedding
from .group_norm import GroupNorm as GroupNorm
from .layer_norm import LayerNorm as LayerNorm
from .linear import Linear as Linear

__all__ = ["Conv2D", "Embedding", "GroupNorm", "LayerNorm", "Linear"]
