"""Convolutional CTC heads trained through ``poptorch.trainingModel`` as torch trains them.

A convolution makes the CPU program sink its transposes (``runtime.backend.transpose_sinking``),
and ``F.ctc_loss`` runs its recursion as a loop whose body holds weakly typed literals: the
two met in a wav2vec2-style CTC head and a CRNN text recogniser (issue 69)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from ._torch_sgd import assert_trains_as_torch


class ConvCtc(torch.nn.Module):
    """wav2vec2's head, small: a 1-D convolution over the frames, log-probabilities in
    ``(T, N, C)``, CTC with per-sample lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 5, 3)

    def forward(self, x, targets, input_lengths, target_lengths):
        log_probs = self.conv(x).permute(2, 0, 1).log_softmax(-1)
        return log_probs, F.ctc_loss(log_probs, targets, input_lengths, target_lengths)


class Crnn(torch.nn.Module):
    """A CRNN text recogniser, small: Conv2d and pooling collapse the image's height, its
    width becomes the sequence read by an LSTM (or only a linear layer), then CTC."""

    def __init__(self, recurrent: bool) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.pool = torch.nn.MaxPool2d((2, 1))
        self.rnn = torch.nn.LSTM(8, 6) if recurrent else None
        self.fc = torch.nn.Linear(6 if recurrent else 8, 5)

    def forward(self, image, targets, input_lengths, target_lengths):
        features = self.pool(torch.relu(self.conv(image)))  # (N, 4, 2, W)
        n, c, h, w = features.shape
        sequence = features.reshape(n, c * h, w).permute(2, 0, 1)  # (W, N, 8)
        if self.rnn is not None:
            sequence, _ = self.rnn(sequence)
        log_probs = self.fc(sequence).log_softmax(-1)
        return log_probs, F.ctc_loss(log_probs, targets, input_lengths, target_lengths)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _ctc_inputs(batch: int, frames: int, classes: int):
    targets = torch.randint(1, classes, (batch, 3))
    input_lengths = torch.tensor([frames, frames - 2])[:batch]
    target_lengths = torch.tensor([3, 2])[:batch]
    return targets, input_lengths, target_lengths


def test_a_conv1d_ctc_head_trains_as_in_torch():
    model = ConvCtc()
    x = torch.randn(2, 4, 10)
    assert_trains_as_torch(model, copy.deepcopy(model), (x, *_ctc_inputs(2, 8, 5)), steps=3)


@pytest.mark.parametrize("recurrent", [True, False], ids=["lstm", "linear"])
def test_a_crnn_text_recogniser_trains_as_in_torch(recurrent):
    model = Crnn(recurrent)
    image = torch.randn(2, 1, 4, 9)
    inputs = (image, *_ctc_inputs(2, 9, 5))
    assert_trains_as_torch(model, copy.deepcopy(model), inputs, steps=3)
