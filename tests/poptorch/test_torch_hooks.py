"""Compile hooks: registerPreCompileHook / registerPostCompileHook around each compile."""

from __future__ import annotations

import pytest
import torch

import poptorch


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


@pytest.fixture
def handles():
    """Handles registered by a test, removed afterwards (the hook lists are process-wide)."""
    held: list = []
    yield held
    for h in held:
        h.remove()


def test_hooks_run_once_around_the_compile_in_order(handles):
    model = poptorch.inferenceModel(Double())
    seen: list[tuple[str, bool]] = []
    handles += [
        poptorch.registerPreCompileHook(lambda: seen.append(("pre1", model.isCompiled()))),
        poptorch.registerPreCompileHook(lambda: seen.append(("pre2", model.isCompiled()))),
        poptorch.registerPostCompileHook(lambda: seen.append(("post", model.isCompiled()))),
    ]
    x = torch.arange(6.0).reshape(2, 3)
    torch.testing.assert_close(model(x), 2 * x)
    torch.testing.assert_close(model(x + 1), 2 * x + 2)  # compiled already: no hooks
    assert seen == [("pre1", False), ("pre2", False), ("post", True)]


def test_removed_hook_is_not_called(handles):
    calls: list[str] = []
    handle = poptorch.registerPostCompileHook(lambda: calls.append("post"))
    handle.remove()
    handle.remove()  # a second remove is harmless
    handles.append(poptorch.registerPreCompileHook(lambda: calls.append("pre")))
    model = poptorch.inferenceModel(Double())
    model(torch.ones(2, 2))
    assert calls == ["pre"]


def test_post_hook_skipped_when_compile_fails(handles):
    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    calls: list[str] = []
    handles += [
        poptorch.registerPreCompileHook(lambda: calls.append("pre")),
        poptorch.registerPostCompileHook(lambda: calls.append("post")),
    ]
    with pytest.raises(ValueError, match="boom"):
        poptorch.inferenceModel(Broken())(torch.ones(2))
    assert calls == ["pre"]


@pytest.mark.parametrize(
    "register", [poptorch.registerPreCompileHook, poptorch.registerPostCompileHook]
)
def test_non_callable_hook_is_refused(register):
    with pytest.raises(RuntimeError, match="must be callable, got 3 of type int"):
        register(3)
