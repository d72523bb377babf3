"""PopART's enumerations given to PopTorch's options, as Graphcore's applications give them."""

from __future__ import annotations

import pytest
import torch

import popart
import poptorch


class _Net(torch.nn.Module):
    """One linear layer trained on the mean square of its output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x):
        out = self.fc(x)
        return out, poptorch.identity_loss(out * out, reduction="mean")


def _train(opts: poptorch.Options, fill: float) -> tuple[_Net, poptorch.PoplarExecutor]:
    """Two SGD steps (lr 0.1) on a host batch filled with ``fill``; the trained model."""
    model = _Net()
    pm = poptorch.trainingModel(
        model, opts.deviceIterations(2), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    pm(torch.full((4, 3), fill))
    pm.copyWeightsToHost()
    return model, pm


@pytest.mark.parametrize(
    "mode",
    [popart.SyntheticDataMode.RandomNormal, popart.SyntheticDataMode.RandomUniform],
    ids=str,
)
def test_synthetic_data_modes_ignore_the_host_input(mode):
    trained = []
    for fill in (1.0, -5.0):
        opts = poptorch.Options()
        opts._Popart.set("syntheticDataMode", int(mode))
        model, _ = _train(opts, fill)
        trained.append(model.fc.weight.detach().clone())
    torch.testing.assert_close(trained[0], trained[1], rtol=0, atol=0)
    assert not torch.equal(trained[0], _Net().fc.weight.detach())


def test_zeros_mode_trains_on_zeros():
    # Zero inputs: out = bias, d(mean(out^2))/d bias = 2 bias, the weight's gradient is 0,
    # so two SGD steps scale the bias by (1 - 0.1 * 2) ** 2 and leave the weight.
    opts = poptorch.Options()
    opts._Popart.set("syntheticDataMode", popart.SyntheticDataMode.Zeros)  # a member
    model, _ = _train(opts, 7.0)
    start = _Net()
    torch.testing.assert_close(model.fc.weight, start.fc.weight)
    torch.testing.assert_close(model.fc.bias, start.fc.bias * 0.64)


def test_enable_synthetic_data_as_the_applications_call_it():
    model = torch.nn.Linear(3, 2)
    opts = poptorch.Options().enableSyntheticData(int(popart.SyntheticDataMode.RandomNormal))
    pm = poptorch.inferenceModel(model, opts)
    # The device reads its own data and sends nothing back: the output is zeros.
    assert torch.equal(pm(torch.randn(1, 3)), torch.zeros(1, 2))
    assert pm.ir.session_options.syntheticDataMode is popart.SyntheticDataMode.RandomNormal


def test_recomputation_is_recorded_and_changes_no_value():
    weights = {}
    for mode in (popart.RecomputationType.NoRecompute, popart.RecomputationType.RecomputeAll):
        opts = poptorch.Options()
        opts._Popart.set("autoRecomputation", int(mode))
        model, pm = _train(opts, 0.5)
        assert pm.ir.session_options.autoRecomputation is mode
        weights[mode] = model.fc.weight.detach().clone()
    torch.testing.assert_close(*weights.values(), rtol=0, atol=0)


def _options() -> poptorch.Options:
    return poptorch.Options().outputMode(poptorch.OutputMode.All)  # toDict() needs one


def test_the_applications_popart_settings_are_accepted(caplog):
    # nlp/bert/pytorch/ipu_options.py and multimodal/CLIP/pytorch/ipu_options.py.
    opts = _options()
    settings = {
        "accumulateOuterFragmentSettings.schedule": int(
            popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized
        ),
        "subgraphCopyingStrategy": int(popart.SubgraphCopyingStrategy.JustInTime),
        "virtualGraphMode": int(popart.VirtualGraphMode.Manual),
        "autoRecomputation": popart.RecomputationType.Pipeline,
        "batchSerializationSettings.batchSchedule": popart.BatchSerializationBatchSchedule.Isomorphic,
    }
    for key, value in settings.items():
        opts._Popart.set(key, value)
    assert {k: opts._Popart.options[k] for k in settings} == settings
    with caplog.at_level("DEBUG", logger="poptorch::python"):
        poptorch.poptorch_core._validateOptions(opts.toDict())
    assert "set accumulateOuterFragmentSettings.schedule to value 3" in caplog.text
    assert "set autoRecomputation to value 3" in caplog.text  # the member, as its number


def test_unknown_keys_are_recorded_and_refused_when_checked():
    opts = _options()
    opts._Popart.set("notAnOption", 1)
    assert opts._Popart.options["notAnOption"] == 1
    with pytest.raises(poptorch.Error, match="Unknown uint64 option notAnOption"):
        poptorch.poptorch_core._validateOptions(opts.toDict())


@pytest.mark.parametrize(
    ("key", "enumeration"),
    [
        ("syntheticDataMode", popart.SyntheticDataMode),
        ("autoRecomputation", popart.RecomputationType),
        ("mergeVarUpdate", popart.MergeVarUpdateType),
        ("batchSerializationSettings.transformContext", popart.BatchSerializationTransformContext),
    ],
)
def test_enumerated_options_take_exactly_poparts_members(key, enumeration):
    last = max(enumeration)
    opts = _options()
    opts._Popart.set(key, last)
    poptorch.poptorch_core._validateOptions(opts.toDict())
    opts._Popart.set(key, int(last) + 1)
    with pytest.raises(poptorch.Error, match=f"{int(last)} {last.name}\\)"):
        poptorch.poptorch_core._validateOptions(opts.toDict())


def test_poptorchs_deprecated_mean_reduction_strategy_is_out_of_poparts_range():
    # PopTorch kept PostAndLoss (2) after PopART removed it, so PopTorch's backend refused it.
    opts = _options()
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(
        poptorch.MeanReductionStrategy.PostAndLoss
    )
    with pytest.raises(poptorch.Error, match=r"out of range.*\(valid: 0 Running, 1 Post\)"):
        poptorch.poptorch_core._validateOptions(opts.toDict())
