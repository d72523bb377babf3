"""compileAndExport / poptorch.load / loadExecutable with torch.nn models (seed 004 §4.10)."""

from __future__ import annotations

import pytest
import torch

import poptorch


class _Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return poptorch.identity_loss(((self.layer(x) - target) ** 2).mean(), "none")


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 4, generator=g), torch.randn(2, 1, generator=g)


def test_inference_model_exported_and_loaded_gives_torchs_outputs(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
    x, _ = _data()
    path = str(tmp_path / "model.poptorch")
    poptorch.inferenceModel(model).compileAndExport(path, x)
    loaded = poptorch.load(path)
    assert loaded.isCompiled()
    torch.testing.assert_close(loaded(x), model(x).detach())


def test_training_model_resumes_with_its_weights_and_optimizer_state(tmp_path):
    torch.manual_seed(0)
    model = _Regression()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    training = poptorch.trainingModel(model, optimizer=optimizer)
    x, target = _data()
    for _ in range(3):
        training(x, target)
    path = str(tmp_path / "training.poptorch")
    training.compileAndExport(path, x, target)
    resumed = poptorch.load(path)
    # Same weights and the same momentum: the next steps agree exactly.
    original = [float(training(x, target)) for _ in range(3)]
    again = [float(resumed(x, target)) for _ in range(3)]
    assert original == again
    assert len(set(original)) == 3  # each call trained


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * 2.0


class _Layers(torch.nn.Module):
    """Three identical layers (one subgraph called per layer) and a loss: the training
    step keeps the layers' stash in scratch buffers (runtime/lowering/scratch.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer() for _ in range(3)])

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return poptorch.identity_loss(((x[:, :1] - target) ** 2).mean(), "none")


def test_exported_training_step_with_a_stash_runs_when_loaded(tmp_path, monkeypatch):
    # The stash is the scratch of scanned layers: scanned, though on the CPU this model's
    # layers would be inlined (``runtime.lowering.runs.prefer_inline``).
    monkeypatch.setenv("POPXL_CALLS", "scan")
    torch.manual_seed(0)
    model = _Layers()
    training = poptorch.trainingModel(
        model, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1)
    )
    x, target = _data()
    training(x, target)
    assert training._session._program.scratch  # the case this test is about
    path = str(tmp_path / "layers.poptorch")
    training.compileAndExport(path, x, target)
    resumed = poptorch.load(path)
    original = [float(training(x, target)) for _ in range(2)]
    again = [float(resumed(x, target)) for _ in range(2)]
    assert original == again and original[0] != original[1]


def test_load_executable_into_a_model_built_by_the_user(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x, _ = _data()
    path = str(tmp_path / "linear.poptorch")
    poptorch.inferenceModel(model).compileAndExport(path, x, export_model=False)
    with pytest.raises(poptorch.Error, match="export_model=False"):
        poptorch.load(path)
    fresh = poptorch.inferenceModel(model)
    fresh.loadExecutable(path)
    torch.testing.assert_close(fresh(x), model(x).detach())


def test_compiling_keeps_no_copy_of_the_call_s_data_and_an_export_still_recaptures(tmp_path):
    """The model remembers the compiled call's shapes only (a combined batch can be
    gigabytes: 8,192 images at 380x380 in the CNN application); an export made later still
    carries inputs to capture the model again with."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
    x, _ = _data()
    inference = poptorch.inferenceModel(model)
    inference.compile(x)
    args, _ = inference._example_call
    assert [a.device.type for a in args] == ["meta"]
    path = str(tmp_path / "model.poptorch")
    inference.compileAndExport(path, x)
    torch.testing.assert_close(poptorch.load(path)(x), model(x).detach())
