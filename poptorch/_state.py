"""Process-wide PopTorch state that the capture and the public functions share."""

from __future__ import annotations

import contextvars

# True while a model's forward is being captured (``poptorch.isRunningOnIpu()``).
TRACING: contextvars.ContextVar[bool] = contextvars.ContextVar("poptorch_tracing", default=False)
