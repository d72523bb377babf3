"""The tutorials run on the bundled digits in tests, whatever MNIST files the machine has.

``tutorials/mnist_data.py`` prefers IDX files found in the usual folders (e.g. a
``~/.torch/datasets`` left by another tool); tests must not depend on them, nor take the
ten times longer that 60 000 images would.
"""

import pytest

from tutorials import mnist_data


@pytest.fixture(autouse=True)
def bundled_digits_only(monkeypatch):
    monkeypatch.delenv("MNIST_DIR", raising=False)
    monkeypatch.setattr(mnist_data, "SEARCH_DIRS", ())
