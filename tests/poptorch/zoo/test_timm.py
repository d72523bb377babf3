"""timm models through poptorch: a representative model of each family timm ships, built
with ``timm.create_model`` (random weights, nothing downloaded, ``num_classes=10``).

timm's ``test_vit`` is in the fast sample; every other family runs with ``-m zoo_full``
(see ``conftest``).
"""

from __future__ import annotations

from typing import Any

import pytest
import timm
import torch

from ._compare import assert_trains_as_eager, inference_error
from .test_torchvision import WithLoss

# name: (the model's name in timm, create_model's keyword arguments, input size)
CASES: dict[str, tuple[str, dict[str, Any], int]] = {
    # Resamples its position embedding on every call (antialiased bicubic, dynamic_img_size).
    "vit": ("test_vit", {"img_size": 32, "dynamic_img_size": True}, 32),
    "resnet": ("resnet10t", {}, 64),
    "efficientnet": ("efficientnet_b0", {}, 64),
    "convnext": ("convnext_atto", {}, 64),
    "deit": ("deit_tiny_patch16_224", {"img_size": 32}, 32),
    "swin": ("swin_tiny_patch4_window7_224", {"img_size": 64, "window_size": 4}, 64),
    "regnet": ("regnetx_002", {}, 64),
    "mobilenetv3": ("mobilenetv3_small_050", {}, 64),
    "cspnet": ("cspresnet50", {}, 64),
}
FAST = {"vit"}


def _params() -> list[Any]:
    return [
        pytest.param(name, marks=() if name in FAST else pytest.mark.zoo_full, id=name)
        for name in CASES
    ]


def _model(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    timm_name, kwargs, size = CASES[name]
    model = timm.create_model(timm_name, pretrained=False, num_classes=10, **kwargs)
    return model, torch.randn(2, 3, size, size)


@pytest.mark.parametrize("name", _params())
def test_inference_matches_eager(name: str) -> None:
    model, x = _model(name)
    assert inference_error(model, (x,)) < 1e-3


@pytest.mark.parametrize("name", _params())
def test_a_training_step_matches_eager(name: str) -> None:
    model, x = _model(name)
    assert_trains_as_eager(WithLoss(model), (x, torch.randint(0, 10, (2,))))
