"""The zoo's full run: ``pytest -m zoo_full tests/poptorch/zoo -n 2 --dist loadgroup`` runs
every model family at its smallest config (the largest steps in one xdist group). Without ``-m zoo_full`` those tests are deselected and only the fast
sample (a few small models) runs, within the README's test command."""

from __future__ import annotations

import pytest
import torch

FULL = "zoo_full"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{FULL}: a zoo model outside the fast sample")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FULL in (config.getoption("markexpr") or ""):
        return
    kept = [item for item in items if item.get_closest_marker(FULL) is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
