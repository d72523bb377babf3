"""The program as PopART's serialized IR (``_debugGetPopartIR``), name scopes, attributes,
PopART's log, and the input checks PopTorch made before compiling."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch

import poptorch


def _ops(model: poptorch.PoplarExecutor) -> list[dict]:
    ir = json.loads(model._debugGetPopartIR())
    assert list(ir) == ["maingraph"]
    return ir["maingraph"]


class Checkpointed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(poptorch.recomputationCheckpoint(torch.relu(self.first(x))))


def test_a_recomputation_checkpoint_is_popart_s_identity_named_checkpoint():
    model = Checkpointed()
    pm = poptorch.inferenceModel(model)
    x = torch.randn(2, 4)
    torch.testing.assert_close(pm(x), model(x).detach())
    checkpoints = [op for op in _ops(pm) if "Checkpoint" in op["name"]]
    assert [op["type"] for op in checkpoints] == ["Identity"], checkpoints
    assert checkpoints[0]["name"].endswith("/Checkpoint") or checkpoints[0]["name"] == "Checkpoint"


class TwoConvs(torch.nn.Module):
    def __init__(self, multiconv: poptorch.MultiConv | None = None) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3)
        self.conv2 = torch.nn.Conv2d(1, 4, 3, stride=2, bias=False)
        self.multiconv = multiconv or poptorch.MultiConv()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.multiconv:
            a = self.conv1(x)
            b = self.conv2(torch.abs(x))
        return a, b


def test_multiconv_is_one_op_with_each_convolution_s_attributes_and_the_options():
    torch.manual_seed(0)
    options = (
        poptorch.MultiConv()
        .availableMemoryProportions((0.5, 0.25))
        .planType(poptorch.MultiConvPlanType.Parallel)
        .perConvReservedTiles(10)
    )
    model = TwoConvs(options)
    x = torch.randn(2, 1, 9, 9)
    pm = poptorch.inferenceModel(model)
    a, b = pm(x)
    ref_a, ref_b = model(x)
    torch.testing.assert_close(a, ref_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b, ref_b, rtol=1e-5, atol=1e-5)

    ops = _ops(pm)
    multiconvs = [op for op in ops if op["type"] == "MultiConv"]
    assert len(multiconvs) == 1
    assert not [op for op in ops if op["type"] == "Conv"]
    attributes = multiconvs[0]["attributes"]
    assert attributes["stride"] == "[[1, 1], [2, 2]]"
    assert attributes["bias"] == "[True, False]"
    assert attributes["available_memory_proportions"] == "[0.5, 0.25]"
    assert attributes["plan_type"] == "Parallel"
    assert attributes["per_conv_reserved_tiles"] == "10"
    assert multiconvs[0]["outputs"][0]["shape"] == "[2, 4, 7, 7]"
    assert multiconvs[0]["outputs"][1]["shape"] == "[2, 4, 4, 4]"


class Network(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3), torch.nn.MaxPool2d(2), torch.nn.ReLU()
        )
        self.layer2 = torch.nn.Linear(36, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(x).flatten(1)
        with poptorch.NameScope("head"), poptorch.NameScope("logits"):
            return self.layer2(x) * 2.0


def test_op_names_follow_torch_module_paths_and_name_scopes():
    torch.manual_seed(0)
    model = Network()
    x = torch.randn(3, 1, 8, 8)
    pm = poptorch.inferenceModel(model)
    torch.testing.assert_close(pm(x), model(x), rtol=1e-5, atol=1e-5)
    names = [op["name"] for op in _ops(pm)]
    assert "layer1/0/Conv" in names
    assert "layer1/1/MaxPool" in names
    assert "layer1/2/Relu" in names
    assert "head/logits/layer2/MatMul" in names
    assert "head/logits/Mul" in names
    compact = pm._debugGetPopartIR()
    assert '"name":"layer1/0/Conv"' in compact  # PopART's compact JSON


def test_name_scope_and_attribute_do_nothing_outside_a_capture():
    x = torch.ones(2)
    with poptorch.NameScope("outer"), poptorch.Attribute(__outline={"layer": "x"}):
        assert torch.equal(x + 1, torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="non-empty name"):
        poptorch.NameScope("")
    with pytest.raises(ValueError, match="takes a dict"):
        poptorch.Attribute(__outline="embedding")


class Outlined(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gn1 = torch.nn.GroupNorm(2, 8)
        self.gn2 = torch.nn.GroupNorm(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with poptorch.Attribute(__outline={"layer": "embedding"}):
            x = self.gn1(x)
            with poptorch.Attribute(__outline={"part": "inner"}):
                x = x * 3.0
        return self.gn2(x)


def test_attributes_are_recorded_on_the_ops_made_inside_their_scope_only():
    torch.manual_seed(0)
    model = Outlined()
    x = torch.randn(3, 8)
    pm = poptorch.inferenceModel(model)
    torch.testing.assert_close(pm(x), model(x), rtol=1e-4, atol=1e-4)
    by_name = {op["name"]: op["attributes"] for op in _ops(pm)}
    assert by_name["gn1/GroupNormalization"]["__outline"] == "{layer: embedding}"
    assert by_name["Mul"]["__outline"] == "{layer: embedding, part: inner}"
    assert "__outline" not in by_name["gn2/GroupNormalization"]


def test_the_device_iteration_loop_and_calls_are_inlined_but_the_model_s_branches_are_not():
    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, condition: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return poptorch.cond(condition, lambda a: [a + 1.0], [y], lambda a: [a - 1.0], [y])[0]

    torch.manual_seed(0)
    model = Branchy()
    opts = poptorch.Options().deviceIterations(2)
    pm = poptorch.inferenceModel(model, opts)
    condition = torch.tensor([True, False])
    x = torch.randn(2, 3)
    out = pm(condition, x)
    torch.testing.assert_close(out[0], model.fc(x[:1])[0] + 1.0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1], model.fc(x[1:])[0] - 1.0, rtol=1e-5, atol=1e-5)
    types = [op["type"] for op in _ops(pm)]
    assert "Loop" not in types and "Call" not in types
    assert types.count("If") == 1
    assert types.count("MatMul") == 1


def test_the_ir_needs_a_compiled_model():
    pm = poptorch.inferenceModel(torch.nn.Linear(2, 2))
    with pytest.raises(poptorch.Error, match="_debugGetPopartIR"):
        pm._debugGetPopartIR()


def test_popart_log_level_shows_popart_s_messages_in_its_format(capfd):
    model = torch.nn.Linear(2, 2)
    line = r"^\d{{4}}-\d\d-\d\dT[\d:.]+Z popart:{} \d+\.\d+ {}: "
    try:
        poptorch._logging.setPopartLogLevel("WARN")
        poptorch.inferenceModel(model)(torch.randn(2, 2))
        quiet = capfd.readouterr().err
        assert not re.search(line.format("session", "T"), quiet, re.M)
        poptorch._logging.setPopartLogLevel("TRACE")
        poptorch.inferenceModel(model)(torch.randn(2, 2))
        log = capfd.readouterr().err
    finally:
        poptorch._logging.setPopartLogLevel("WARN")
    for module, level in [("session", "T"), ("devicex", "T"), ("ir", "I"), ("ir", "D")]:
        assert re.search(line.format(module, level), log, re.M), (module, level)
    assert re.search(r'Op "MatMul", \d+ of type ai\.graphcore\.MatMul:1', log)
    with pytest.raises(ValueError, match="Level must be one of"):
        poptorch._logging.setPopartLogLevel("LOUD")


def test_zero_sized_inputs_are_refused_with_their_shape():
    pm = poptorch.inferenceModel(torch.nn.ReLU())
    with pytest.raises(poptorch.Error, match=r"Zero-sized tensors .*\[0, 3\]"):
        pm(torch.zeros(0, 3))


def test_phases_accept_stage_objects_and_block_ids():
    phased = poptorch.SerialPhasedExecution(poptorch.Stage("0"), ["1", "2"], "3")
    assert [[s.blocks for s in p.stages] for p in phased.phases] == [
        [["0"]],
        [["1"], ["2"]],
        [["3"]],
    ]
    parallel = poptorch.ParallelPhasedExecution(*[poptorch.Stage(f"{k}") for k in range(2)])
    assert [p.parity for p in parallel.phases] == [0, 1]


def test_legacy_constructors_in_forward_are_refused_but_factories_work():
    class Legacy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.index_select(x, 0, torch.LongTensor([1, 0]))

    class Factories(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.offset = torch.Tensor([1.0, 2.0])  # made outside forward: a constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            picked = torch.index_select(x, 0, torch.tensor([1, 0]))
            return picked + torch.as_tensor([10.0, 20.0]) + self.offset

    expected = "Expected an IPU tensor but got tensor(device=cpu, shape=[2], dtype=Long)"
    with pytest.raises(poptorch.Error, match=re.escape(expected)):
        poptorch.inferenceModel(Legacy()).compile(torch.rand(4))
    x = torch.arange(4.0)
    assert torch.equal(poptorch.inferenceModel(Factories())(x), torch.tensor([12.0, 22.0]))


def test_ops_of_a_repeated_block_are_named_after_each_block_s_path():
    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(2, 4)
    pm = poptorch.inferenceModel(model, poptorch.Options().modelName("net"))
    torch.testing.assert_close(pm(x), model(x), rtol=1e-5, atol=1e-5)
    matmuls = [op["name"] for op in _ops(pm) if op["type"] == "MatMul"]
    assert matmuls == [f"net/layers/{k}/MatMul" for k in range(3)]


def test_disabling_module_name_scopes_keeps_only_name_scopes():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with poptorch.NameScope("scaled"):
                return self.body(x) * 2.0

    torch.manual_seed(0)
    model = Net()
    x = torch.randn(2, 3)
    names = {}
    for enabled in (True, False):
        opts = poptorch.Options()
        if not enabled:
            opts.disableModuleNamescope()
        pm = poptorch.inferenceModel(model, opts)
        torch.testing.assert_close(pm(x), model(x), rtol=1e-5, atol=1e-5)
        names[enabled] = {op["type"]: op["name"] for op in _ops(pm)}
    assert names[True]["MatMul"] == "scaled/body/0/MatMul"
    assert names[True]["Relu"] == "scaled/body/1/Relu"
    assert names[False]["MatMul"] == "scaled/MatMul"
    assert names[False]["Mul"] == "scaled/Mul"


def test_a_name_scope_opened_in_a_submodule_sits_after_its_path():
    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with poptorch.NameScope("attention"):
                return self.proj(x) - 1.0

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(x) + 1.0

    torch.manual_seed(0)
    model = Outer()
    x = torch.randn(2, 3)
    pm = poptorch.inferenceModel(model)
    torch.testing.assert_close(pm(x), model(x), rtol=1e-5, atol=1e-5)
    names = {op["type"]: op["name"] for op in _ops(pm)}
    assert names["MatMul"] == "block/attention/proj/MatMul"
    assert names["Sub"] == "block/attention/Sub"
    assert names["Add"] == "Add"


@pytest.mark.parametrize("ptype, name", [(torch.float16, "half"), (torch.float32, "float")])
def test_partials_type_is_on_matmuls_and_convolutions_and_trace_logs_the_ir(capfd, ptype, name):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Conv1d(16, 16, 1))
    x = torch.randn(1, 16, 16)
    opts = poptorch.Options()
    opts.Precision.setPartialsType(ptype)
    pm = poptorch.inferenceModel(model, opts)
    poptorch.setLogLevel("TRACE")
    try:
        torch.testing.assert_close(pm(x), model(x), rtol=1e-4, atol=1e-5)
    finally:
        poptorch.setLogLevel("WARN")
    kinds = {op["type"]: op["attributes"] for op in _ops(pm)}
    assert kinds["MatMul"]["partialsType"] == f"MatMulPartialsType::{name.upper()}"
    assert kinds["Conv"]["partialsType[0]"] == name
    out = capfd.readouterr().out
    assert "Popart IR: " in out and f'"partialsType[0]":"{name}"' in out
    # DEBUG (not TRACE) leaves the IR out of the log.
    poptorch.setLogLevel("DEBUG")
    try:
        poptorch.inferenceModel(model, opts)(x)
    finally:
        poptorch.setLogLevel("WARN")
    assert "Popart IR: " not in capfd.readouterr().out


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda p: torch.optim.SGD(p, lr=0.01), ["SGD0VarUpdate"] * 2),
        (lambda p: poptorch.optim.SGD(p, lr=0.01, use_combined_accum=True), ["SGD0VarUpdate"] * 2),
        (lambda p: torch.optim.AdamW(p, lr=0.01), ["AdamUpdater", "AdamVarUpdate"] * 2),
        (lambda p: poptorch.optim.Adam(p, lr=0.01), ["AdamUpdater", "AdamVarUpdate"] * 2),
    ],
)
def test_each_weight_s_optimiser_update_is_shown_as_popart_s_ops(make, expected):
    """PopART made one SGD0VarUpdate per weight (SGD without momentum), an AdamUpdater and
    an AdamVarUpdate for Adam and AdamW: the serialized IR shows those, named after the
    weight, in place of the update's arithmetic (upstream optimizers_test::test_sgd_IR)."""

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(10, 10)

        def forward(self, x, y):
            out = self.linear(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    model = WithLoss()
    training = poptorch.trainingModel(model, optimizer=make(model.parameters()))
    training(torch.randn(1, 10), torch.tensor([3]))
    updates = [op for op in _ops(training) if "Update" in op["type"] and "Copy" not in op["type"]]
    assert [op["type"] for op in updates] == expected
    assert {op["name"].split("_", 1)[1] for op in updates} == {"linear.weight", "linear.bias"}


class TwoIpuTrainer(torch.nn.Module):
    """Two blocks on two IPUs, the second checkpointing its hidden value, and the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 8)
        self.second = torch.nn.Linear(8, 8)
        self.third = torch.nn.Linear(8, 2)
        poptorch.BeginBlock(self.first, "A", ipu_id=0)
        poptorch.BeginBlock(self.second, "B", ipu_id=1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = poptorch.recomputationCheckpoint(torch.tanh(self.second(torch.tanh(self.first(x)))))
        out = self.third(torch.tanh(h))
        return out, torch.nn.functional.mse_loss(out, target)


def _pipelined(recompute: int | None) -> tuple[poptorch.PoplarExecutor, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = TwoIpuTrainer()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    opts.setExecutionStrategy(poptorch.PipelinedExecution("A", "B"))
    if recompute is not None:
        opts._Popart.set("autoRecomputation", recompute)
    pm = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, target = torch.randn(8, 4), torch.randn(8, 2)
    pm(x, target)
    return pm, [p.detach().clone() for p in model.parameters()]


def test_a_pipeline_shows_each_stage_s_ops_once_and_its_stashes_as_popart_s_ops():
    pm, _ = _pipelined(recompute=None)
    ops = _ops(pm)
    types = [op["type"] for op in ops]
    assert "Loop" not in types and "Call" not in types and "If" not in types
    # each forward product once, block A's again where its backward recomputes it (block B,
    # the last stage, runs its backward in its forward's stage and recomputes nothing)
    products = [op["name"] for op in ops if op["type"] == "MatMul"]
    assert products == ["first/MatMul", "second/MatMul", "third/MatMul", "first/MatMul"]
    stashes, restores = types.count("Stash"), types.count("Restore")
    assert stashes >= 1 and stashes == restores, types
    assert [op["type"] for op in ops if op["name"].endswith("Checkpoint")] == ["Identity"]
    assert all(
        op["name"] in ("Stash", "Restore") for op in ops if op["type"] in ("Stash", "Restore")
    )


def test_a_pipeline_over_two_ipus_recomputes_unless_told_not_to():
    """PopTorch's default for a pipeline over several IPUs is ``RecomputationType::Pipeline``:
    the backward stage runs its block's forward again, so only the block's inputs are stashed;
    ``NoRecompute`` set explicitly stashes the activations. The weights come out the same."""
    recomputing, weights = _pipelined(recompute=None)
    stashing, same = _pipelined(recompute=0)  # popart.RecomputationType.NoRecompute
    count = lambda pm: [op["type"] for op in _ops(pm)].count("Stash")  # noqa: E731
    assert count(recomputing) < count(stashing)
    # the IR's session options say so, as PopTorch's did after compiling (3: ``Pipeline``)
    assert int(recomputing.ir.session_options.autoRecomputation) == 3
    assert int(stashing.ir.session_options.autoRecomputation) == 0
    for a, b in zip(weights, same):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class CheckpointInsideABlock(torch.nn.Module):
    """Block A (IPU 0) checkpoints a value half-way through; block B (IPU 1) has the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.last = torch.nn.Linear(8, 2)
        poptorch.BeginBlock(self.first, "A", ipu_id=0)
        poptorch.BeginBlock(self.last, "B", ipu_id=1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = poptorch.recomputationCheckpoint(torch.tanh(self.first(x)))
        out = self.last(torch.tanh(self.mid(h)))
        return out, torch.nn.functional.mse_loss(out, target)


def test_a_recomputing_pipeline_stashes_a_checkpoint_and_recomputes_from_it():
    """PopART's recomputation keeps checkpointed values: block A's backward stage restores
    the checkpoint and recomputes only the layers after it from there (and the layer before
    it from A's input), with the weights torch computes."""
    torch.manual_seed(0)
    model = CheckpointInsideABlock()
    reference = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    opts.setExecutionStrategy(poptorch.PipelinedExecution("A", "B"))
    pm = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, target = torch.randn(6, 4), torch.randn(6, 2)
    pm(x, target)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = [reference(xm, tm)[1] for xm, tm in zip(x.chunk(3), target.chunk(3))]
    (sum(losses) / 3).backward()
    optimizer.step()
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    records = _ops(pm)
    stashed = [r["inputs"][0]["name"] for r in records if r["type"] == "Stash"]
    assert any("recomputation_checkpoint" in name for name in stashed), stashed
    # the product before the checkpoint is recomputed once, the one after it once
    products = [r["name"] for r in records if r["type"] == "MatMul"]
    assert products.count("first/MatMul") == 2 and products.count("mid/MatMul") == 2, products
