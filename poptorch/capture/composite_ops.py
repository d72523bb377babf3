"""torch.export's list of composite (CompositeImplicitAutograd) ops, worked out once per set
of registered ops instead of on every decomposition.

``ExportedProgram.run_decompositions`` asks ``torch._export.utils`` for every composite op
twice per call, and each time walks all of the dispatcher's ~2,000 composite registrations
once per op namespace (about 30): 0.3 s of the 0.9 s an elementwise op's capture took
(2026-11-28, torch 2.14, profiled over 69 of the ATen table's cases). The answer only
changes when ops are registered, so it is kept against the registrations it was computed
from (the namespaces and the composite registrations), and computed again when they change.
This is the one place the capture reaches into torch's private export helpers; where a
torch release no longer has them, decompositions run as torch has them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

# (registrations they were computed from, the ops)
_known: tuple[Any, frozenset] | None = None


def registrations() -> tuple[Any, ...]:
    """What the composite ops depend on: the op namespaces and the composite registrations."""
    names = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    return (tuple(torch.ops._dir), len(names))


def _collected(collect: Any) -> Any:
    def cached() -> frozenset:
        global _known
        key = registrations()
        if _known is None or _known[0] != key:
            _known = (key, frozenset(collect()))
        return _known[1]

    return cached


@contextlib.contextmanager
def composite_ops_cached() -> Iterator[None]:
    """Within the block, torch.export's decompositions reuse the composite ops found before."""
    try:
        from torch._export import utils  # noqa: PLC0415 (private: looked up where used)
        from torch.export import decomp_utils, exported_program  # noqa: PLC0415
    except ImportError:
        yield
        return
    users = [
        m for m in (exported_program, decomp_utils) if hasattr(m, "_collect_all_valid_cia_ops")
    ]
    original = getattr(utils, "_collect_all_valid_cia_ops", None)
    if original is None or not users:
        yield
        return
    name = "_collect_all_valid_cia_ops"  # private: reached by name, where it exists
    saved = [getattr(m, name) for m in users]
    cached = _collected(original)
    for m in users:
        setattr(m, name, cached)
    try:
        yield
    finally:
        for m, fn in zip(users, saved):
            setattr(m, name, fn)
