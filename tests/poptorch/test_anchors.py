"""``Options.anchorTensor`` / ``getAnchoredTensor``: a training step's gradients, updated
weights and loss scale, checked against torch's own backward and SGD step."""

from __future__ import annotations

import pytest
import torch

import poptorch


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.fc(x), y)


def _torch_grads(model: Regression, xs: torch.Tensor, ys: torch.Tensor) -> list[torch.Tensor]:
    """fc.bias's gradient for each micro-batch, at the model's current weights."""
    grads = []
    for x, y in zip(xs, ys):
        model.zero_grad()
        model(x, y).backward()
        grads.append(model.fc.bias.grad.clone())
    return grads


def _trained(anchors: dict, ga: int = 1, di: int = 1, ls: float = 1.0):
    torch.manual_seed(0)
    model = Regression()
    reference = Regression()
    reference.load_state_dict(model.state_dict())
    opts = poptorch.Options().deviceIterations(di)
    opts.Training.gradientAccumulation(ga)
    for short, (long, mode, period) in anchors.items():
        opts.anchorTensor(short, long, mode, period)
    sgd = poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=ls)
    pm = poptorch.trainingModel(model, opts, sgd)
    n = ga * di * 2
    xs, ys = torch.randn(n, 3), torch.randn(n, 2)
    pm(xs, ys)
    return pm, reference, xs.reshape(ga * di, 2, 3), ys.reshape(ga * di, 2, 2)


def test_final_gradient_and_updated_weight_match_torch():
    pm, reference, xs, ys = _trained(
        {
            "grad": ("Gradient___fc.bias", None, 1),
            "weight": ("UpdatedVar___fc.weight", None, 1),
        }
    )
    (expected,) = _torch_grads(reference, xs, ys)
    torch.testing.assert_close(pm.getAnchoredTensor("grad"), expected)
    with torch.no_grad():
        reference.fc.weight -= 0.1 * reference.fc.weight.grad
    torch.testing.assert_close(pm.getAnchoredTensor("weight"), reference.fc.weight)


def test_a_weight_anchored_by_its_name_is_the_value_the_step_read():
    # Conformer's tests anchor a weight and its gradient by the weight's own name.
    pm, reference, xs, ys = _trained(
        {
            "fc.weight": ("fc.weight", None, 1),
            "Gradient___fc.weight": ("Gradient___fc.weight", None, 1),
            "all": ("fc.bias", poptorch.OutputMode.All, 1),
        },
        ga=2,
    )
    torch.testing.assert_close(pm.getAnchoredTensor("fc.weight"), reference.fc.weight)
    torch.testing.assert_close(
        pm.getAnchoredTensor("all"), torch.stack([reference.fc.bias.detach()] * 2)
    )
    _torch_grads(reference, xs, ys)
    torch.testing.assert_close(
        pm.getAnchoredTensor("Gradient___fc.weight"), reference.fc.weight.grad
    )


@pytest.mark.parametrize(
    "mode, period, pick",
    [
        (poptorch.OutputMode.All, 1, lambda g: torch.stack(g)),
        (poptorch.OutputMode.Sum, 1, lambda g: torch.stack(g).sum(0)),
        (poptorch.OutputMode.EveryN, 2, lambda g: torch.stack(g)[1::2]),
        (poptorch.OutputMode.Final, 1, lambda g: g[-1]),
    ],
)
def test_every_micro_batch_gradient_in_the_anchors_output_mode(mode, period, pick, capfd):
    poptorch.setLogLevel("DEBUG")
    try:
        pm, reference, xs, ys = _trained({"grad": ("Gradient___fc.bias", mode, period)}, ga=4)
    finally:
        poptorch.setLogLevel("WARN")
    grads = _torch_grads(reference, xs, ys)  # the weights change only after the 4th
    torch.testing.assert_close(pm.getAnchoredTensor("grad"), pick(grads))
    label = {"All": "ALL", "Sum": "Sum", "EveryN": "EVERYN", "Final": "FINAL"}[mode.name]
    assert f"Gradient___fc.bias {label}/{period}" in capfd.readouterr().out


def test_loss_scale_and_loss_scaled_gradients():
    pm, reference, xs, ys = _trained(
        {
            "scale": ("finalLossScale", poptorch.OutputMode.All, 1),
            "grad": ("Gradient___fc.bias", None, 1),
        },
        di=3,
        ls=8.0,
    )
    assert pm.getAnchoredTensor("scale").tolist() == [8.0, 8.0, 8.0]
    grads = []
    for x, y in zip(xs, ys):  # one optimiser step per device iteration
        reference.zero_grad()
        reference(x, y).backward()
        grads.append(reference.fc.bias.grad.clone())
        with torch.no_grad():
            for p in reference.parameters():
                p -= 0.1 * p.grad
    torch.testing.assert_close(pm.getAnchoredTensor("grad"), grads[-1] * 8.0)


def test_anchorable_names_are_among_the_tensor_names():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(AssertionError, match="Model must be compiled before calling getTensorN"):
        poptorch.inferenceModel(model).getTensorNames()
    pm, *_ = _trained({})
    names = pm.getTensorNames()
    for name in ("Gradient___fc.bias", "UpdatedVar___fc.weight", "finalLossScale", "fc.weight"):
        assert name in names


def test_unknown_names_are_refused_when_compiling():
    with pytest.raises(
        poptorch.Error, match="the program has no tensor of that name.*Gradient___fc.bias"
    ):
        _trained({"typo": ("Gradient___fc.bais", None, 1)})
    pm, *_ = _trained({"grad": ("Gradient___fc.bias", None, 1)})
    with pytest.raises(poptorch.Error, match="No anchored tensor named 'other'"):
        pm.getAnchoredTensor("other")
