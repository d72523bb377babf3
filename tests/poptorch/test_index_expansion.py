"""Gathers and scatters of an expanded index read whole rows (``_capture/index_expansion``):
same values and gradients as torch, the expansion gone from the program, and the TRACE log
saying so."""

from __future__ import annotations

import pytest
import torch

import poptorch


@pytest.fixture
def trace_log():
    poptorch.setLogLevel("TRACE")
    yield
    poptorch.setLogLevel("WARN")


class ScatterReduce(torch.nn.Module):
    def __init__(self, reduce: str, include_self: bool) -> None:
        super().__init__()
        self.reduce, self.include_self = reduce, include_self

    def forward(self, inp, index, src):
        return inp.scatter_reduce(
            -2, index.expand_as(src), src, reduce=self.reduce, include_self=self.include_self
        )


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin", "prod"])
def test_scatter_reduce_of_an_expanded_index(reduce, include_self, trace_log, capfd):
    torch.manual_seed(0)
    index = torch.tensor([[4], [0], [4], [2], [0], [4]])  # rows 1 and 3 untouched
    src, inp = torch.rand(6, 3), torch.randn(5, 3)
    model = ScatterReduce(reduce, include_self)
    torch.testing.assert_close(
        poptorch.inferenceModel(model)(inp, index, src), model(inp, index, src)
    )
    log = capfd.readouterr().out
    assert "Removing index expansion node: %expand" in log
    assert "aten::expand" not in log.split("Removing index expansion node:")[1].split("\n", 1)[1]


@pytest.mark.parametrize(
    "shape, gather_dim, expand_dim, rows",
    [
        ((3, 5), 0, 1, True),
        ((3, 5), 1, 0, True),
        ((1, 1, 3, 1, 5, 1), 4, 2, True),
        ((3, 5), 0, 0, False),  # expanded along the gathered dimension
        ((3, 4, 5), 0, 1, False),  # three dimensions larger than one
    ],
)
def test_gather_of_an_expanded_index(shape, gather_dim, expand_dim, rows, trace_log, capfd):
    torch.manual_seed(0)
    data = torch.randint(10, shape, dtype=torch.int32)
    index_shape = list(shape)
    index_shape[expand_dim] = 1
    index = torch.randint(high=shape[gather_dim], size=index_shape)

    class Gather(torch.nn.Module):
        def forward(self, data, index):
            return torch.gather(data, gather_dim, index.expand(data.shape)) + 8

    torch.testing.assert_close(
        poptorch.inferenceModel(Gather())(data, index), Gather()(data, index)
    )
    log = capfd.readouterr().out
    assert ("Optimising gather:" in log) == rows
    graph = log.split("Graph after capture (core ATen):")[1]
    assert ("aten::expand" in graph) != rows


def test_row_gathers_and_scatters_train_as_torch():
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(5, 3))

        def forward(self, index, src):
            rows = index.expand(6, 3)
            y = self.w.scatter_reduce(0, rows, src, reduce="mean", include_self=True)
            z = torch.gather(self.w, 0, rows)
            s = self.w.scatter_add(0, rows, src * 2)
            return poptorch.identity_loss((y**2).sum() + (z**3).sum() + s.sum(), "sum")

    torch.manual_seed(0)
    model, reference = Model(), Model()
    reference.load_state_dict(model.state_dict())
    index, src = torch.tensor([[1], [3], [1], [0], [3], [1]]), torch.rand(6, 3)
    pm = poptorch.trainingModel(model, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1))
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        loss = pm(index, src)
        expected = reference(index, src)
        expected.backward()
        sgd.step()
        sgd.zero_grad()
        torch.testing.assert_close(loss, expected.detach())
    pm.copyWeightsToHost()
    torch.testing.assert_close(model.w, reference.w)
