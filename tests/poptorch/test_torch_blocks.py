"""Blocks in torch models as PopTorch placed them: the default block, ended ``with`` blocks,
automatic stages, re-assigned modules, and the DEBUG log of each op's placement."""

from __future__ import annotations

import re

import pytest
import torch

import poptorch


class Scale(torch.nn.Module):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l0, self.l1, self.l2 = Scale(2.0), Scale(3.0), Scale(5.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.l1(self.l0(x)))


def _placements(capfd, build) -> dict[str, str]:
    """Run ``build()`` with PopTorch's DEBUG log on; each logged op id -> its placement."""
    poptorch.setLogLevel("DEBUG")
    try:
        build()
    finally:
        poptorch.setLogLevel("WARN")
    out = capfd.readouterr().out
    found = re.findall(r"was lowered to (\S+) \[[^,\]]*(?:, \d+)*\), (mode\([^]]*)\]", out)
    settings = dict(re.findall(r"\] (\S+) set to value (\S+)", out))
    return {"ops": dict(found), "settings": settings}


def test_ops_before_the_first_block_run_on_ipu_0(capfd):
    model = Chain()
    poptorch.BeginBlock(model.l1, ipu_id=1)
    x = torch.randn(2, 3)
    pm = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    log = _placements(capfd, lambda: torch.testing.assert_close(pm(x), model(x)))
    assert log["settings"]["enablePipelining"] == "1"
    assert log["ops"]["l0/Mul:0"] == "mode(Pipelined), ipu(0), stage(0)"
    assert log["ops"]["l1/Mul:0"] == "mode(Pipelined), ipu(1), stage(1)"
    assert log["ops"]["l2/Mul:0"] == "mode(Pipelined), ipu(1), stage(1)"


def test_auto_increment_stages_count_from_the_default_block(capfd):
    class Inline(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            poptorch.Block.useAutoId()
            for k, ipu in zip((2, 3, 4), (0, 1, 0)):
                with poptorch.Block(ipu_id=ipu):
                    x = x * k
            return x

    opts = poptorch.Options().deviceIterations(4)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    x = torch.randn(4, 3)
    pm = poptorch.inferenceModel(Inline(), opts)
    log = _placements(capfd, lambda: torch.testing.assert_close(pm(x), x * 24))
    assert log["ops"] == {
        "Mul:0": "mode(Pipelined), ipu(0), stage(1)",
        "Mul:0/1": "mode(Pipelined), ipu(1), stage(2)",
        "Mul:0/2": "mode(Pipelined), ipu(0), stage(3)",
    }


def test_ops_after_a_with_block_ends_are_refused():
    class Outside(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with poptorch.Block(ipu_id=0):
                x = x * 4
            return x + 1

    pm = poptorch.inferenceModel(Outside())
    with pytest.raises(poptorch.Error, match="No active Block, all the ops must belong"):
        pm.compile(torch.randn(1, 3))


def test_block_start_lasts_until_the_next_block():
    class Started(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            poptorch.Block.start("a", ipu_id=0)
            x = x * 4
            poptorch.Block.start("b", ipu_id=1)
            return x + 1

    x = torch.randn(2, 3)
    pm = poptorch.inferenceModel(Started(), poptorch.Options().deviceIterations(2))
    torch.testing.assert_close(pm(x), x * 4 + 1)


def test_a_module_starts_one_block_at_a_time():
    model = Chain()
    poptorch.BeginBlock(model.l1, ipu_id=1)
    with pytest.raises(poptorch.Error, match="module has already been assigned to a block"):
        poptorch.BeginBlock(model.l1, ipu_id=2)
    poptorch.removeBlocks(model)
    poptorch.BeginBlock(model.l1, ipu_id=2)
    assert "BeginBlock(user_id=None, ipu_id=2)" in poptorch.module_repr(model)


def test_phased_log_spreads_phases_by_liveness(capfd):
    class Phased(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for k in range(3):
                with poptorch.Block(str(k), ipu_id=0):
                    x = x * (k + 2)
            return x

    strategy = poptorch.SerialPhasedExecution("0", "1", "2")
    strategy.setTensorsLiveness(poptorch.Liveness.OffChipAfterEachPhase)
    opts = poptorch.Options().setExecutionStrategy(strategy)
    x = torch.randn(1, 3)
    pm = poptorch.inferenceModel(Phased(), opts)
    log = _placements(capfd, lambda: torch.testing.assert_close(pm(x), x * 24))
    # Forward phases 0, 4, 8 (room for the off-chip transfers), then a gap of 3.
    assert log["settings"]["executionPhaseSettings.phases"] == "12"
    assert log["settings"]["executionPhaseSettings.stages"] == "1"
    assert log["ops"]["Mul:0/2"] == "mode(Phased), ipu(0), phase(8)"


def test_a_block_id_reused_on_another_ipu_keeps_each_blocks_ipu(capfd):
    class TwoIpus(torch.nn.Module):
        def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple:
            a, b = torch.split(x, 2)
            with poptorch.Block("0", ipu_id=0):
                a = torch.relu(a * 2)
            with poptorch.Block("0", ipu_id=2):
                b = torch.relu(b * 3)
            with poptorch.Block("1", ipu_id=1):
                out = a + b
                return out, torch.nn.functional.l1_loss(out, target)

    opts = poptorch.Options().setExecutionStrategy(poptorch.ParallelPhasedExecution("0", "1"))
    x, target = torch.randn(4, 3), torch.randn(2, 3)
    pm = poptorch.inferenceModel(TwoIpus(), opts)
    log = _placements(capfd, lambda: pm(x, target))
    assert log["ops"]["Relu:0"] == "mode(Phased), ipu(0), phase(0)"
    assert log["ops"]["Relu:0/1"] == "mode(Phased), ipu(2), phase(0)"
    # The loss reads as the PopART ops PopTorch lowered it to.
    assert log["ops"]["L1:0"] == "mode(Phased), ipu(1), phase(1)"
    assert log["ops"]["IdentityLoss:0"] == "mode(Phased), ipu(1), phase(1)"
    out, loss = pm(x, target)
    expected = torch.relu(x[:2] * 2) + torch.relu(x[2:] * 3)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(loss, torch.nn.functional.l1_loss(expected, target))


def test_begin_block_takes_the_module_by_poptorchs_keyword():
    """Graphcore's CNN application calls ``BeginBlock(ipu_id=..., layer_to_call=module)``."""
    model = Chain()
    assert poptorch.BeginBlock(ipu_id=1, layer_to_call=model.l1) is model.l1
    assert "BeginBlock(user_id=None, ipu_id=1)" in poptorch.module_repr(model)
    opts = poptorch.Options().deviceIterations(2)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu))
    x = torch.randn(2, 3)
    torch.testing.assert_close(poptorch.inferenceModel(model, opts)(x), x * 30)
