"""Pipeline stages that read values of any earlier stage, as BERT, GPT-2 and CLIP do.

BERT builds its attention mask in the embedding stage and every encoder stage reads it;
CLIP's text encoder reads a model input in a late stage. PopTorch forwarded such values
through the stages in between; here they are stashed on their producer's IPU and restored
(or copied on) for the stage that reads them, and their gradients travel back the same
way. Each case runs against the same model in eager torch."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import poptorch

IN, HID, OUT, B = 4, 6, 3, 2


class MaskedEncoder(torch.nn.Module):
    """Four blocks on ``ipus``: an embedding that also builds a mask and a skip value,
    three encoder layers, the last with the head and the loss. The mask (stage 0) is read
    by stages 2 and 3, the skip value (stage 0, weight-dependent) and a scalar by stage 2,
    the input ``x`` by stages 0 and 3, and the target only by stage 3."""

    def __init__(self, ipus: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.ipus = ipus
        self.embed = torch.nn.Linear(IN, HID)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(HID, HID) for _ in range(3))
        self.head = torch.nn.Linear(HID, OUT)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with poptorch.Block("Embedding", ipu_id=self.ipus[0]):
            h = self.embed(x)
            mask = (1.0 - (x[:, :1] > 0).float()) * -2.0  # BERT's extended attention mask
            skip = torch.tanh(h)
            gate = torch.sigmoid(h.mean())  # a scalar: one element of its stash
        with poptorch.Block("Encoder0", ipu_id=self.ipus[1]):
            h = torch.tanh(self.layers[0](h))
        with poptorch.Block("Encoder1", ipu_id=self.ipus[2]):
            h = torch.tanh(self.layers[1](h) + mask) + skip * gate
        with poptorch.Block("Encoder2", ipu_id=self.ipus[3]):
            h = torch.tanh(self.layers[2](h) + mask) + x.mean(-1, keepdim=True)
            y = self.head(h)
            loss = torch.nn.functional.mse_loss(y, t)
        return y, loss


# (0, 1, 2, 3): every read crosses IPUs; (0, 1, 0, 1): stage 2 reads stage 0's values on
# the same IPU and stage 3 reads them on another; (0, 0, 1, 1): neighbouring stages share
# an IPU too.
PLACEMENTS = [(0, 1, 2, 3), (0, 1, 0, 1), (0, 0, 1, 1)]
PLACEMENT_IDS = ["ipus_0123", "ipus_0101", "ipus_0011"]


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, IN, generator=g), torch.randn(n, OUT, generator=g)


def _strategy(kind: str) -> poptorch.PipelinedExecution:
    return {"pipelined": poptorch.PipelinedExecution, "sharded": poptorch.ShardedExecution}[kind](
        poptorch.AutoStage.AutoIncrement
    )


@pytest.mark.parametrize("kind", ["pipelined", "sharded"])
@pytest.mark.parametrize("ipus", PLACEMENTS, ids=PLACEMENT_IDS)
def test_later_stages_read_earlier_stages_values_in_inference(ipus, kind):
    torch.manual_seed(0)
    model = MaskedEncoder(ipus)
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(6)
    opts.setExecutionStrategy(_strategy(kind))
    x, t = _data(6 * B)
    y, loss = poptorch.inferenceModel(model, opts)(x, t)
    for k in range(6):
        rows = slice(k * B, (k + 1) * B)
        want_y, want_loss = reference(x[rows], t[rows])
        torch.testing.assert_close(y[rows], want_y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss[k], want_loss, rtol=1e-5, atol=1e-6)


# Every placement pipelined (carried values wait in stashes, differently per placement);
# sharded and on one device, one placement each (each micro-batch goes through the stages
# in turn, so nothing waits).
TRAINING = [(ipus, "pipelined") for ipus in PLACEMENTS]
TRAINING += [((0, 1, 0, 1), "sharded"), ((0, 1, 2, 3), "pipelined_one_device")]


@pytest.mark.parametrize(
    ("ipus", "kind"),
    TRAINING,
    ids=[f"ipus_{''.join(map(str, i))}-{k}" for i, k in TRAINING],
)
def test_later_stages_read_earlier_stages_values_in_training(ipus, kind, monkeypatch):
    """Gradient accumulation over 8 micro-batches (a 4-stage pipeline has 7 stages when
    training), two device iterations, two calls: four SGD steps, each on the mean
    gradient of its micro-batches (the scalar is a micro-batch's mean), as torch computes
    it. Placed, each IPU on a device of its own, the stages overlap in cycles; on one
    device (as on one GPU) each micro-batch runs through the stages in turn."""
    one_device = kind == "pipelined_one_device"
    if one_device:
        monkeypatch.setenv("POPXL_PLACEMENT", "off")
        kind = "pipelined"
    torch.manual_seed(0)
    model = MaskedEncoder(ipus)
    reference = copy.deepcopy(model)
    start = copy.deepcopy(model)
    ga, di = 8, 2
    opts = poptorch.Options().deviceIterations(di)
    opts.Training.gradientAccumulation(ga)
    opts.setExecutionStrategy(_strategy(kind))
    training = poptorch.trainingModel(
        model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    )
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for call in range(2):
        x, t = _data(di * ga * B, seed=call)
        training(x, t)
        for xs, ts in zip(x.chunk(di), t.chunk(di)):
            optimizer.zero_grad()
            losses = [reference(xm, tm)[1] for xm, tm in zip(xs.chunk(ga), ts.chunk(ga))]
            (sum(losses) / ga).backward()
            optimizer.step()
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    assert not torch.equal(model.embed.weight, start.embed.weight)
    assert ("stages over 8 steps on one device" in training.print_schedule()) == one_device


class TiedHead(torch.nn.Module):
    """GPT-2's pattern: unnamed BeginBlocks (automatic ids), the LM head on IPU 0 sharing
    the embedding's weight and called twice, a scalar made between the two calls."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, HID)
        self.linear = torch.nn.Linear(HID, HID)
        self.head = torch.nn.Linear(HID, 20, bias=False)
        self.head.weight = self.emb.weight
        poptorch.BeginBlock(self.emb, ipu_id=0)
        poptorch.BeginBlock(self.linear, ipu_id=1)
        poptorch.BeginBlock(self.head, ipu_id=0)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.linear(self.emb(ids))).view(-1, HID)
        logits = self.head(h)
        weight = (labels.view(-1) > 0).float().sum() + 1.0
        logits = self.head(h) + logits
        loss = torch.nn.functional.cross_entropy(logits, labels.view(-1), reduction="sum")
        return poptorch.identity_loss(loss / weight, reduction="none")


def test_a_module_called_twice_starts_one_block():
    """The head's two calls are one block (PopTorch's hook keeps the automatic id of its
    first call): three stages, so five when training, and GA 5 is enough."""
    torch.manual_seed(0)
    model = TiedHead()
    reference = copy.deepcopy(model)
    poptorch.removeBlocks(reference)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(5)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (5, 3), generator=g)
    labels = torch.randint(0, 20, (5, 3), generator=g)
    training(ids, labels)
    assert "block '2': stage 2, IPU 0" in training.print_schedule()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = [reference(i[None], t[None]) for i, t in zip(ids, labels)]
    (sum(losses) / len(losses)).backward()
    optimizer.step()
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


class RunningMean(torch.nn.Module):
    """A buffer read by the first block (IPU 0) and updated by the third (IPU 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(IN, HID)
        self.layer = torch.nn.Linear(HID, HID)
        self.register_buffer("running", torch.zeros(HID))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with poptorch.Block("Embedding", ipu_id=0):
            h = self.embed(x) + self.running
        with poptorch.Block("Encoder", ipu_id=1):
            h = torch.tanh(self.layer(h))
        with poptorch.Block("Update", ipu_id=2):
            self.running.copy_(0.5 * self.running + h.mean(0))
            return h * 2.0


def test_state_updated_on_another_ipu_than_the_one_holding_it():
    """Sharded, each micro-batch reads the buffer the one before it left, as in torch."""
    torch.manual_seed(0)
    model = RunningMean()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(4)
    opts.setExecutionStrategy(_strategy("sharded"))
    x = _data(4 * B)[0]
    y = poptorch.inferenceModel(model, opts)(x)
    want = torch.cat([reference(rows) for rows in x.chunk(4)])
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)


class Dropouts(torch.nn.Module):
    """Dropout in every block: the random seed each one advances passes from block to
    block, and the last one's new seed goes back to IPU 0, which holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(IN if i == 0 else HID, HID) for i in range(3)
        )
        self.head = torch.nn.Linear(HID, OUT)
        self.drop = torch.nn.Dropout(0.25)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for i, layer in enumerate(self.layers):
            with poptorch.Block(f"layer{i}", ipu_id=i):
                x = self.drop(torch.tanh(layer(x)))
        with poptorch.Block("head", ipu_id=3):
            y = self.head(x)
            return y, torch.nn.functional.mse_loss(y, t)


def test_pipelined_dropout_trains_across_ipus():
    torch.manual_seed(0)
    model = Dropouts()
    start = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(8)
    opts.setExecutionStrategy(_strategy("pipelined"))
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, t = _data(8 * B)
    losses = [float(training(x, t)[1].mean()) for _ in range(3)]
    assert all(np.isfinite(losses)) and len(set(losses)) == 3  # new masks each call
    assert not torch.equal(model.layers[2].weight, start.layers[2].weight)


class SharedMask(torch.nn.Module):
    """BERT's layout: the embedding and the head on IPU 0, two encoder layers on IPU 1 that
    both read the embedding stage's mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(IN, HID)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(HID, HID) for _ in range(2))
        self.head = torch.nn.Linear(HID, OUT)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with poptorch.Block("Embedding", ipu_id=0):
            h = self.embed(x)
            mask = (1.0 - (x[:, :1] > 0).float()) * -2.0
        with poptorch.Block("Encoder0", ipu_id=1):
            h = torch.tanh(self.layers[0](h) + mask)
        with poptorch.Block("Encoder1", ipu_id=1):
            h = torch.tanh(self.layers[1](h) + mask)
        with poptorch.Block("Head", ipu_id=0):
            y = self.head(h)
            loss = torch.nn.functional.mse_loss(y, t)
        return y, loss


def test_consecutive_blocks_on_one_ipu_are_one_stage_and_a_shared_value_is_stashed_once():
    """PopTorch counted a pipeline's stages by IPU switches: blocks on IPUs 0, 1, 1, 0 are
    three stages, so five micro-batches suffice when training (four blocks as four stages
    would need seven). The two encoder layers' backward recomputes them (PopTorch's default
    recomputation over several IPUs) from their stashed inputs, the mask among them once."""
    torch.manual_seed(0)
    model = SharedMask()
    reference = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(5)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, t = _data(5 * B)
    training(x, t)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = [reference(xm, tm)[1] for xm, tm in zip(x.chunk(5), t.chunk(5))]
    (sum(losses) / 5).backward()
    optimizer.step()
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    records = json.loads(training._debugGetPopartIR())["maingraph"]
    stashed = [r["inputs"][0]["name"] for r in records if r["type"] == "Stash"]
    assert stashed and len(stashed) == len(set(stashed)), stashed
