"""``torch.ops.poptorch.push_name_scope`` / ``pop_name_scope`` from forward hooks, as
Graphcore's CNN application names each layer's ops."""

from __future__ import annotations

import json

import torch

import poptorch


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3)
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x, target):
        out = self.fc(self.conv(x).mean((2, 3)))
        return out, torch.nn.functional.mse_loss(out, target)


def _named_by_hooks(model: torch.nn.Module) -> torch.nn.Module:
    for name, module in model.named_modules():
        if name:
            module.register_forward_pre_hook(
                lambda _m, _i, name=name: torch.ops.poptorch.push_name_scope(f"layer_{name}")
            )
            module.register_forward_hook(lambda _m, _i, _o: torch.ops.poptorch.pop_name_scope())
    return model


def _op_names(pm) -> list[str]:
    return [op["name"] for op in json.loads(pm._debugGetPopartIR())["maingraph"]]


def test_pushed_scopes_name_the_ops_between_push_and_pop():
    torch.manual_seed(0)
    model = _named_by_hooks(Net())
    x, target = torch.randn(2, 2, 5, 5), torch.randn(2, 2)
    expected, _ = model(x, target)  # eagerly the ops do nothing
    pm = poptorch.inferenceModel(model)
    out, _ = pm(x, target)
    torch.testing.assert_close(out, expected)
    names = _op_names(pm)
    assert "conv/layer_conv/Conv" in names
    assert any(n.startswith("fc/layer_fc/") for n in names)
    assert "ReduceMean" in names  # between the layers: no scope left open


def test_a_model_named_by_hooks_trains_as_torch():
    from ._torch_sgd import assert_trains_as_torch

    torch.manual_seed(0)
    model, reference = _named_by_hooks(Net()), Net()
    reference.load_state_dict(model.state_dict())
    assert_trains_as_torch(model, reference, (torch.randn(2, 2, 5, 5), torch.randn(2, 2)), steps=2)
