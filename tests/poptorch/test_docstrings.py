"""The ``>>>`` examples in poptorch's docstrings run and print what they say."""

import doctest

import pytest

from poptorch import blocks, strategies
from poptorch.data import loader as data
from poptorch.optim import optimizers as optim
from poptorch.options import core as options


@pytest.mark.parametrize(
    "module", [blocks, data, optim, options, strategies], ids=lambda m: m.__name__
)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
