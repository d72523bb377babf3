"""Indexing: gather, scatter, index_select, index (advanced indexing), index_put, masked ops, embedding lookups, sort/topk."""

from __future__ import annotations
