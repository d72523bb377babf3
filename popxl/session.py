"""``popxl.Session`` comes from the runtime package, imported on first use."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Session":
        from runtime.session.session import Session  # noqa: PLC0415  (lazy: keeps `import popxl` light)

        return Session
    raise AttributeError(name)
