"""A model whose core-ATen decomposition fails in torch is still captured (HF GPT-2's
attention: ``scaled_dot_product_attention``, then a ``view`` of its transposed output)."""

from __future__ import annotations

import pytest
import torch

import poptorch

from ._compare import inference_error, training_errors


class Gpt2LikeAttention(torch.nn.Module):
    """GPT-2's attention output path: ``Conv1D`` views the transposed attention."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 16) / 4)
        self.bias = torch.nn.Parameter(torch.zeros(16))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        b, n, _ = x.shape
        q = x.view(b, n, 2, 8).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        a = a.transpose(1, 2).reshape(b, n, -1).contiguous()
        out = torch.addmm(self.bias, a.view(-1, a.size(-1)), self.weight).view(b, n, 16)
        return out if y is None else (out, torch.nn.functional.mse_loss(out, y))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_torch_cannot_decompose_the_model_to_core_aten():
    """The premise: the default decomposition fails in torch itself."""
    ep = torch.export.export(Gpt2LikeAttention(), (torch.randn(2, 5, 16),), strict=False)
    with pytest.raises(Exception, match="Cannot view a tensor"):
        ep.run_decompositions()


def test_inference_falls_back_to_keeping_the_composite_op():
    x = torch.randn(2, 5, 16)
    assert inference_error(Gpt2LikeAttention(), (x,)) < 1e-5
    compiled = poptorch.inferenceModel(Gpt2LikeAttention())
    compiled(x)
    # The kept op is lowered through the table: its core ATen ops are in the program.
    assert "softmax" in compiled.print_schedule().lower()


def test_training_falls_back_to_keeping_the_composite_op():
    loss_error, step_error = training_errors(
        Gpt2LikeAttention(), (torch.randn(2, 5, 16), torch.randn(2, 5, 16))
    )
    assert loss_error < 1e-5
    assert step_error < 1e-4
