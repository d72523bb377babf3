"""Convolutions: 1-3d, transposed, groups, dilation, padding."""

from __future__ import annotations
