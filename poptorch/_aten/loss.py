"""Loss functions kept whole by the capture (nll, cross entropy, mse, bce, ...)."""

from __future__ import annotations
