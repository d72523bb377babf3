"""Normalisations: batch, layer, group, instance norm (inference and training)."""

from __future__ import annotations
