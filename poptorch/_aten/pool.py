"""Pooling and padding: max/avg pools (1-3d, adaptive), constant/reflect/replicate padding, upsampling."""

from __future__ import annotations
