"""``poptorch.DataLoader`` and ``poptorch.AsynchronousDataAccessor``: the batches of one model
call (``loader``), their collation and each process's share of a dataset (``utils``), and the
accessor's worker process (``worker``)."""

from __future__ import annotations

from .loader import AsynchronousDataAccessor as AsynchronousDataAccessor
from .loader import DataLoader as DataLoader
from .loader import combined_batch_size as combined_batch_size
from .utils import collate as collate

__all__ = ["AsynchronousDataAccessor", "DataLoader", "collate", "combined_batch_size"]
