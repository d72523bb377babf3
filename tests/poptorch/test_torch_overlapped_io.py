"""Overlapped host IO (``poptorch.set_overlap_for_input`` / ``set_overlap_for_output``):
the marked transfers run on the IO tiles, the numbers are those of the unmarked model, and
the marks PopTorch refused are refused with its errors."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch
from poptorch import OverlapMode

ACC = OverlapMode.OverlapAccumulationLoop
DEV = OverlapMode.OverlapDeviceIterationLoop


def _io_options(**kw: int) -> poptorch.Options:
    opts = poptorch.Options()
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    opts.TensorLocations.numIOTiles(32)
    if "device_iterations" in kw:
        opts.deviceIterations(kw["device_iterations"])
    if "accumulation" in kw:
        opts.Training.gradientAccumulation(kw["accumulation"])
        opts.outputMode(poptorch.OutputMode.All)
    return opts


class Net(torch.nn.Module):
    """A linear layer whose inputs and outputs may be marked for overlapped IO."""

    def __init__(self, in_mode: OverlapMode | None = None, out_mode: OverlapMode | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)
        self.loss = torch.nn.CrossEntropyLoss()
        self.in_mode, self.out_mode = in_mode, out_mode

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
        if self.in_mode is not None:
            x, y = poptorch.set_overlap_for_input((x, y), self.in_mode)
        out = self.fc(x)
        loss = self.loss(out, y)
        if self.out_mode is not None:
            out, loss = poptorch.set_overlap_for_output([out, loss], self.out_mode)
        return out, loss


def _batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _host_ops(model: object) -> list:
    ir = model.ir  # type: ignore[attr-defined]
    return [
        op for g in ir._graphs.values() for op in g._ops if op.type in ("HostLoad", "HostStore")
    ]


def test_inference_outputs_equal_torch_and_marked_loads_run_on_io_tiles():
    x, y = _batch(8)
    model = Net(ACC, DEV)
    want_out, want_loss = Net()(x[:2], y[:2])
    pm = poptorch.inferenceModel(model, _io_options(device_iterations=4))
    out, loss = pm(x, y)
    for i in range(4):
        ref_out, ref_loss = Net()(x[2 * i : 2 * i + 2], y[2 * i : 2 * i + 2])
        torch.testing.assert_close(out[2 * i : 2 * i + 2], ref_out.detach())
        torch.testing.assert_close(loss[i], ref_loss.detach())
    torch.testing.assert_close(out[:2], want_out.detach())
    host = _host_ops(pm)
    assert [op.tile_set for op in host] == ["io"] * 4
    strategies = [op.attrs["exchange_strategy"] for op in host]
    assert strategies == ["OverlapInnerLoop"] * 2 + ["OverlapLoops"] * 2
    for op in host:
        if op.type == "HostLoad":  # the value reaches the compute tiles through a copy
            (consumer,) = op.outputs[0]._consumers
            assert consumer.type == "IoTileCopy" and consumer.tile_set != "io"
        else:
            assert op.inputs[0]._producer.type == "IoTileCopy"


def test_unmarked_and_no_overlap_transfers_stay_on_the_compute_tiles():
    x, y = _batch(2)
    pm = poptorch.inferenceModel(Net(OverlapMode.NoOverlap), poptorch.Options())
    pm(x, y)
    assert {op.tile_set for op in _host_ops(pm)} == {"compute"}
    assert all("exchange_strategy" not in op.attrs for op in _host_ops(pm))


def test_training_with_overlapped_io_gives_the_unmarked_weights_and_losses():
    x, y = _batch(12)
    marked, plain = Net(ACC, ACC), Net()
    reference = copy.deepcopy(plain)
    outs = []
    for model in (marked, plain):
        opts = _io_options(device_iterations=2, accumulation=3)
        pm = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
        outs.append(pm(x, y))
        pm.copyWeightsToHost()
    for got, want in zip(outs[0], outs[1]):
        torch.testing.assert_close(got, want)
    # The same two steps in torch: each step the mean of 3 micro-batches' gradients.
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(2):
        optimizer.zero_grad()
        for m in range(3):
            rows = slice(6 * step + 2 * m, 6 * step + 2 * m + 2)
            (reference(x[rows], y[rows])[1] / 3).backward()
        optimizer.step()
    for got, want in zip(marked.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_tuple_inputs_and_outputs_can_be_marked_together():
    class Model(torch.nn.Module):
        def forward(self, xs: tuple) -> tuple:
            xs = poptorch.set_overlap_for_input(xs, DEV)
            x = torch.cat(xs) + 1
            return poptorch.set_overlap_for_output(x.chunk(2), ACC)

    xs = torch.arange(8.0).reshape(4, 2).chunk(2)
    got = poptorch.inferenceModel(Model(), _io_options())(xs)
    for g, w in zip(got, (torch.cat(xs) + 1).chunk(2)):
        torch.testing.assert_close(g, w)


def test_marks_run_eagerly_as_identities_and_take_only_tensors():
    x = torch.randn(3)
    torch.testing.assert_close(poptorch.set_overlap_for_input(x, ACC), x)
    got = poptorch.set_overlap_for_output({"a": x, "b": [x]}, DEV)
    torch.testing.assert_close(got["b"][0], x)
    with pytest.raises(poptorch.Error, match="You may only set overlap for torch.tensor inputs"):
        poptorch.set_overlap_for_input((x, 3), ACC)
    with pytest.raises(ValueError, match="mode must be a poptorch.OverlapMode"):
        poptorch.set_overlap_for_output(x, "overlap_accumulation_loop")


class _Uses(torch.nn.Module):
    def __init__(self, forward: object):
        super().__init__()
        self.body = forward

    def forward(self, x: torch.Tensor) -> object:
        return self.body(x)  # type: ignore[operator]


def _mark_in(t: torch.Tensor) -> torch.Tensor:
    return poptorch.set_overlap_for_input(t, ACC)


def _mark_out(t: torch.Tensor) -> torch.Tensor:
    return poptorch.set_overlap_for_output(t, ACC)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            lambda x: (x + 1, _mark_in(x)),
            "must be the only op applied to an input. This is not "
            "the case for input 0 to the model",
        ),
        (
            lambda x: _mark_in(x + 1),
            "set_overlap_for_input applied on a node which is not a tensor input to the model.",
        ),
        (
            lambda x: _mark_out(x) + 1,
            "set_overlap_for_output applied on a node which is not a tensor output to the model.",
        ),
        (lambda x: (x + 1, _mark_out(x + 1)), None),
    ],
    ids=["input-used-twice", "not-an-input", "not-an-output", "distinct-values"],
)
def test_misplaced_marks_are_refused_when_the_model_compiles(body: object, message: str | None):
    pm = poptorch.inferenceModel(_Uses(body), _io_options())
    if message is None:
        pm(torch.ones(2))
        return
    with pytest.raises(poptorch.Error, match=message):
        pm(torch.ones(2))


def test_a_marked_output_returned_twice_is_refused():
    def body(x: torch.Tensor) -> tuple:
        y = x + 1
        return y, [_mark_out(y)]

    with pytest.raises(poptorch.Error, match="cannot be used with a tensor that is returned twice"):
        poptorch.inferenceModel(_Uses(body), _io_options())(torch.ones(2))


def test_overlapped_io_needs_sharded_execution_io_tiles_and_all_or_sum_outputs():
    model = _Uses(lambda x: _mark_in(x) * 2)
    with pytest.raises(poptorch.Error, match="Overlapped IO is not supported with poptorch.Pipe"):
        poptorch.inferenceModel(model)(torch.ones(2))
    opts = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution())
    with pytest.raises(poptorch.Error, match="No IO tiles allocated. You must allocate at least"):
        poptorch.inferenceModel(model, opts)(torch.ones(2))
    opts = _io_options(device_iterations=2)
    opts.outputMode(poptorch.OutputMode.Final)
    with pytest.raises(poptorch.Error, match="Unsupported output mode for overlapped IO"):
        poptorch.inferenceModel(model, opts)(torch.ones(4))
    opts = _io_options(device_iterations=2)
    opts.outputMode(poptorch.OutputMode.Sum)
    got = poptorch.inferenceModel(model, opts)(torch.arange(4.0))
    torch.testing.assert_close(got, torch.tensor([4.0, 8.0]))


def test_marks_inside_a_repeated_block_are_not_model_inputs():
    class Layer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _mark_in(x) + 1

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    with pytest.raises(poptorch.Error, match="not a tensor input to the model"):
        poptorch.inferenceModel(Model(), _io_options())(torch.ones(2))


def test_a_returned_loss_function_is_the_loss_whatever_its_position():
    """``return loss_fn(out, y), out``: no identity_loss, and the last output is not a
    scalar; PopTorch trains on the loss function's value."""

    class LossFirst(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
            out = self.fc(x)
            return torch.nn.functional.cross_entropy(out, y), out

    x, y = _batch(2)
    model = LossFirst()
    reference = copy.deepcopy(model)
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        loss, _ = pm(x, y)
        optimizer.zero_grad()
        want, _ = reference(x, y)
        want.backward()
        optimizer.step()
        torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    pm.copyWeightsToHost()
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
