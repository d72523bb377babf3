"""A training pipeline over several IPUs recomputes each stage's forward in its backward
(PopTorch's default, PopART's ``RecomputationType::Pipeline``). What the backward needs is
stashed as PopART stashed it: a stage's inputs that its gradient depends on, each
``recomputationCheckpoint`` inside it and the random seed, never the values passed between
blocks of one stage. Dropout's recomputed mask is the forward's: each random op's seed
depends on the micro-batch's seed alone, which travels with the micro-batch."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import poptorch

B, IN, HID, OUT, STEPS = 2, 5, 7, 3, 6


def _options(kind: str = "pipelined", recompute: bool = True) -> poptorch.Options:
    opts = poptorch.Options()
    opts.randomSeed(7)
    opts.Training.gradientAccumulation(STEPS)
    opts.outputMode(poptorch.OutputMode.All)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    strategy = poptorch.PipelinedExecution if kind == "pipelined" else poptorch.ShardedExecution
    opts.setExecutionStrategy(strategy(poptorch.AutoStage.AutoIncrement))
    if not recompute:
        opts._Popart.set("autoRecomputation", 0)
    return opts


class DropoutFirst(torch.nn.Module):
    """Dropout in the first stage (IPU 0), whose backward is pipelined four stages later."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(IN, HID, bias=False)
        self.b = torch.nn.Linear(HID, HID, bias=False)
        self.drop = torch.nn.Dropout(0.4)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with poptorch.Block("a", ipu_id=0):
            h = self.drop(self.a(x))
        with poptorch.Block("b", ipu_id=1):
            z = self.b(h)
        with poptorch.Block("c", ipu_id=1):
            loss = (z * c).sum()
        with poptorch.Block("d", ipu_id=0):
            loss = poptorch.identity_loss(loss * 1.0, reduction="sum")
        return h, loss


@pytest.mark.parametrize(
    "kind,recompute", [("pipelined", True), ("pipelined", False), ("sharded", False)]
)
def test_the_backward_of_a_dropout_uses_the_forward_s_mask(kind, recompute):
    """The weight update equals the one computed by hand from the dropout output each
    micro-batch returned (its zeros are the mask)."""
    torch.manual_seed(0)
    model = DropoutFirst()
    wa, wb = model.a.weight.detach().clone(), model.b.weight.detach().clone()
    training = poptorch.trainingModel(
        model, _options(kind, recompute), torch.optim.SGD(model.parameters(), lr=1.0)
    )
    g = torch.Generator().manual_seed(1)
    x, c = torch.randn(STEPS * B, IN, generator=g), torch.randn(STEPS * B, HID, generator=g)
    h, _ = training(x, c)
    kept = (h != 0).float() / (1 - 0.4)
    assert 0 < float((h == 0).float().mean()) < 1
    grad_a = (kept * (c @ wb)).T @ x
    torch.testing.assert_close(model.a.weight.detach(), wa - grad_a, rtol=1e-5, atol=1e-5)


class Encoder(torch.nn.Module):
    """BERT's layout: an embedding with dropout that also makes a mask from an input of its
    own (no gradient depends on it), two encoder layers with dropout on IPU 1 (the first
    optionally checkpointed), the head on IPU 0."""

    def __init__(self, checkpoint: bool) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.embed = torch.nn.Linear(IN, HID)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(HID, HID) for _ in range(2))
        self.head = torch.nn.Linear(HID, OUT)
        self.drop = torch.nn.Dropout(0.25)

    def forward(self, x, m, t):
        with poptorch.Block("Embedding", ipu_id=0):
            h = self.drop(self.embed(x))
            mask = (1.0 - m) * -2.0
        with poptorch.Block("Encoder0", ipu_id=1):
            h = self.drop(torch.tanh(self.layers[0](h) + mask))
            if self.checkpoint:
                h = poptorch.recomputationCheckpoint(h)
        with poptorch.Block("Encoder1", ipu_id=1):
            h = self.drop(torch.tanh(self.layers[1](h) + mask))
        with poptorch.Block("Head", ipu_id=0):
            y = self.head(h)
            loss = torch.nn.functional.mse_loss(y, t)
        return y, loss


def _train(checkpoint: bool, recompute: bool) -> tuple[dict, list[str]]:
    torch.manual_seed(0)
    model = Encoder(checkpoint)
    opts = _options(recompute=recompute)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.2))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(STEPS * B, IN, generator=g)
    m = (torch.rand(STEPS * B, 1, generator=g) > 0.5).float()
    t = torch.randn(STEPS * B, OUT, generator=g)
    for _ in range(2):
        training(x, m, t)
    records = json.loads(training._debugGetPopartIR())["maingraph"]
    stashed = [r["inputs"][0]["name"] for r in records if r["type"] == "Stash"]
    return copy.deepcopy(model.state_dict()), stashed


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_recomputed_stage_stashes_what_popart_stashed_and_trains_as_a_stashing_one(checkpoint):
    """IPU 0: the embedding's input and the seed (not the mask's input ``m``); IPU 1: the
    embedding's output, the mask and the seed, plus the checkpointed value when there is
    one; never Encoder0's output otherwise (PopART recomputed the whole stage). The weights
    after two steps equal those of the same pipeline stashing every activation."""
    recomputed, stashed = _train(checkpoint, recompute=True)
    stashing, _ = _train(checkpoint, recompute=False)
    assert len(stashed) == (6 if checkpoint else 5), stashed
    assert sum(name.startswith("x0") for name in stashed) == 1, stashed
    assert not any(name.startswith("x1") for name in stashed), stashed  # the mask's input
    assert sum("random_seed" in name for name in stashed) == 2, stashed
    assert sum("recomputation_checkpoint" in name for name in stashed) == int(checkpoint)
    for name, want in stashing.items():
        torch.testing.assert_close(recomputed[name], want, rtol=1e-5, atol=1e-6, msg=name)
