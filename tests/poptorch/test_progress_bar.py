"""The progress bar of a model's first call (``Options.showCompilationProgressBar``)."""

from __future__ import annotations

import io
import sys

import pytest
import torch

import poptorch


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _first_call(options: poptorch.Options | None = None) -> None:
    model = torch.nn.Linear(4, 2)
    poptorch.inferenceModel(model, options)(torch.randn(3, 4))


def test_a_terminal_shows_each_stage_of_the_first_call(monkeypatch: pytest.MonkeyPatch):
    stderr = Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    _first_call()
    text = stderr.getvalue()
    for stage in ("capture", "building the program", "compiling", "first run"):
        assert f"Graph compilation: {stage}" in text
    assert "[4/4]" in text


def test_the_bar_is_off_when_the_option_says_so(monkeypatch: pytest.MonkeyPatch):
    stderr = Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    _first_call(poptorch.Options().showCompilationProgressBar(False))
    assert "Graph compilation" not in stderr.getvalue()


def test_nothing_is_drawn_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch):
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    _first_call()
    assert "Graph compilation" not in stderr.getvalue()
