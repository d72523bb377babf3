"""Plain tensor attributes of torch models (not parameters, not buffers): constants of the
captured program, whatever their names."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch

from ._torch_sgd import assert_trains_as_torch

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class Doubles(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


class NormalisesBytes(torch.nn.Module):
    """Casts 8-bit images and normalises them with plain tensor attributes named after the
    ops they feed (``self.mul``, ``self.sub``), as input-normalising wrappers do."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype
        self.mul = (1.0 / (255.0 * torch.tensor(STD))).view(-1, 1, 1).to(dtype)
        self.sub = (torch.tensor(MEAN) / torch.tensor(STD)).view(-1, 1, 1).to(dtype)

    def forward(self, img):
        img = img.to(self.dtype)
        img = img.mul(self.mul.to(img.device))
        img = img.sub(self.sub.to(img.device))
        return self.model(img)


def _bytes(*shape: int) -> torch.Tensor:
    return torch.randint(
        0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attributes_named_as_ops_normalise_8_bit_input_as_torch(dtype):
    model = NormalisesBytes(Doubles(), dtype)
    img = _bytes(2, 3, 5, 5)
    out = poptorch.inferenceModel(model)(img)
    expected = model(img)
    assert out.dtype == expected.dtype == dtype
    tolerance = {"rtol": 1e-3, "atol": 4e-3} if dtype == torch.float16 else {}
    torch.testing.assert_close(out, expected, **tolerance)


def test_attributes_named_as_ops_inside_name_scopes_keep_the_scopes():
    class Scoped(NormalisesBytes):
        def forward(self, img):
            with poptorch.NameScope("normalise"):
                img = img.to(self.dtype).mul(self.mul).sub(self.sub)
            with poptorch.NameScope("scale"):
                return img.mul(3.0)

    model = Scoped(Doubles(), torch.float32)
    img = _bytes(1, 3, 4, 4)
    pm = poptorch.inferenceModel(model)
    torch.testing.assert_close(pm(img), model(img))
    ops = pm._debugGetPopartIR()
    assert "normalise/" in ops and "scale/" in ops


class Classifies(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


class WithLoss(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, img, target):
        out = self.model(img)
        return out, torch.nn.functional.cross_entropy(out, target)


def test_a_model_normalising_8_bit_input_trains_as_torch():
    torch.manual_seed(0)
    model = WithLoss(NormalisesBytes(Classifies(), torch.float32))
    reference = copy.deepcopy(model)
    inputs = (_bytes(2, 3, 5, 5), torch.tensor([0, 1]))
    assert_trains_as_torch(model, reference, inputs, steps=2)
