"""4-bit group-quantised tensors (FlexGen): decompression op and NumPy codecs."""

from .group_quantize_decompress import (
    group_quantize_compress_numpy as group_quantize_compress_numpy,
)
from .group_quantize_decompress import group_quantize_decompress as group_quantize_decompress
from .group_quantize_decompress import (
    group_quantize_decompress_numpy as group_quantize_decompress_numpy,
)

__all__ = [
    "group_quantize_compress_numpy",
    "group_quantize_decompress",
    "group_quantize_decompress_numpy",
]
