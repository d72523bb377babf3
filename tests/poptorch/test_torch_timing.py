"""Timing and export conveniences of a torch model: compilationTime, getPerfCounters,
logCycleCount's refusal, compileAndExport into a directory."""

from __future__ import annotations

import datetime
import os

import pytest
import torch

import poptorch


class MatMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, y)


def test_compilation_time_needs_a_compiled_model_and_the_progress_bar_option():
    quiet = poptorch.inferenceModel(MatMul(), poptorch.Options().showCompilationProgressBar(False))
    timed = poptorch.inferenceModel(MatMul(), poptorch.Options().showCompilationProgressBar(True))
    x = torch.randn(3, 3)
    for model in (quiet, timed):
        with pytest.raises(poptorch.Error, match="Please compile the model before"):
            model.compilationTime()
        model(x, x)
    with pytest.raises(poptorch.Error, match="Please set showCompilationProgressBar"):
        quiet.compilationTime()
    elapsed = timed.compilationTime()
    assert isinstance(elapsed, datetime.timedelta) and elapsed.total_seconds() > 0


@pytest.mark.parametrize("steps", [1, 5])
def test_perf_counters_give_every_transfer_in_order(steps):
    model = poptorch.inferenceModel(MatMul(), poptorch.Options().deviceIterations(steps))
    x = torch.randn(steps, 4, 4)
    model(x, x)
    perf = model.getPerfCounters()
    assert [len(perf[k]) for k in ("input", "input_complete", "output", "output_complete")] == [
        2,
        2,
        1,
        1,
    ]
    for stream in perf["input"] + perf["output"]:
        assert len(stream) == steps
    for start, done in zip(perf["input"][0], perf["input_complete"][0]):
        assert start <= done <= perf["output"][0][-1] <= perf["output_complete"][0][-1]
    lo, hi, mean = model.getLatency()
    assert 0 <= lo <= mean <= hi


def test_cycle_count_is_refused_without_ipu_hardware():
    model = poptorch.inferenceModel(MatMul(), poptorch.Options().logCycleCount(True))
    with pytest.raises(poptorch.Error, match="only supported on actual IPU hardware"):
        model(torch.ones(2, 2), torch.ones(2, 2))


def test_compile_and_export_into_a_directory(tmp_path):
    model = poptorch.inferenceModel(MatMul(), poptorch.Options().useOfflineIpuTarget())
    x = torch.randn(2, 2)
    model.compileAndExport(str(tmp_path), x, x, export_model=False)
    (written,) = os.listdir(tmp_path)
    restored = poptorch.inferenceModel(MatMul())
    restored.loadExecutable(str(tmp_path / written))
    torch.testing.assert_close(restored(x, x), x @ x)


def test_synthetic_data_runs_without_host_transfers():
    """``enableSyntheticData``: the device makes its inputs (so training ignores the host's
    data), returns zeros, and no transfer is timed."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x):
            out = self.fc(x)
            return out, poptorch.identity_loss(out * out, reduction="mean")

    trained = []
    for fill in (1.0, -5.0):
        model = Net()
        opts = poptorch.Options().deviceIterations(2).enableSyntheticData(True)
        pm = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
        out, loss = pm(torch.full((4, 3), fill))
        assert torch.equal(loss, torch.zeros(()))
        perf = pm.getPerfCounters()
        assert perf["input"] == [[]] and perf["output"] == [[], []]
        assert pm.getLatency() == (0.0, 0.0, 0.0)
        pm.copyWeightsToHost()
        trained.append(model.fc.weight.detach().clone())
    assert torch.equal(trained[0], trained[1])
    assert not torch.equal(trained[0], Net().fc.weight.detach())
