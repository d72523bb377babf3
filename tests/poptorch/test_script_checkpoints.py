"""A checkpoint a PopTorch-era training script wrote (its arguments beside the weights)
loads with a plain ``torch.load``, under torch's weights-only default."""

from __future__ import annotations

import argparse
import pickle

import pytest

torch = pytest.importorskip("torch")
import poptorch  # noqa: E402,F401  (importing poptorch allowlists the script's classes)


class _ScriptState:
    """A class of the script's own: not allowlisted."""

    def __init__(self) -> None:
        self.step = 3


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--pipeline-splits", nargs="*", default=[])
    args = parser.parse_args(["--lr", "0.05", "--pipeline-splits", "layer2", "layer3"])
    args.engine_options = {"opt.useAutoloader": "true"}
    return args


def test_a_checkpoint_with_the_script_s_arguments_loads_with_the_default_torch_load(tmp_path):
    path = tmp_path / "resnet18_cifar10_1.pt"
    weights = {"fc.weight": torch.arange(6.0).reshape(2, 3)}
    torch.save({"epoch": 1, "model_state_dict": weights, "args": _args()}, path)

    checkpoint = torch.load(path)

    assert checkpoint["epoch"] == 1
    torch.testing.assert_close(checkpoint["model_state_dict"]["fc.weight"], weights["fc.weight"])
    args = checkpoint["args"]
    assert isinstance(args, argparse.Namespace)
    assert vars(args) == vars(_args())


def test_other_classes_stay_refused_by_the_weights_only_load(tmp_path):
    path = tmp_path / "state.pt"
    torch.save({"state": _ScriptState()}, path)

    with pytest.raises(pickle.UnpicklingError, match="_ScriptState"):
        torch.load(path)
    assert torch.load(path, weights_only=False)["state"].step == 3
