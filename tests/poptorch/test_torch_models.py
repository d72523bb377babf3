"""torch.nn models through poptorch: capture, program, call semantics, weights, errors."""

from __future__ import annotations

import collections
import copy
import functools
import re

import pytest
import torch

import poptorch

from ._torch_sgd import assert_trains_as_torch


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class MlpWithLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = Mlp()

    def forward(self, x: torch.Tensor, target: torch.Tensor):
        out = self.net(x)
        return out, torch.nn.functional.mse_loss(out, target)


class Stack(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [
                torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
                for _ in range(n)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_inference_matches_torch_and_program_uses_torch_names():
    model = Mlp()
    x = torch.randn(5, 4)
    pm = poptorch.inferenceModel(model)
    torch.testing.assert_close(pm(x), model(x).detach(), rtol=1e-5, atol=1e-6)
    schedule = pm.print_schedule()
    assert "fc1.weight=%" in schedule and "fc2.bias=%" in schedule
    assert "MatMul." in schedule and "Relu." in schedule
    assert pm.isCompiled() and isinstance(pm.ir, __import__("popxl").Ir)


def test_device_iterations_and_replicas_split_the_combined_batch():
    model = Mlp()
    opts = poptorch.Options().deviceIterations(3).replicationFactor(2)
    x = torch.randn(3 * 2 * 4, 4)
    pm = poptorch.inferenceModel(model, opts)
    torch.testing.assert_close(pm(x), model(x).detach(), rtol=1e-5, atol=1e-6)
    with pytest.raises(poptorch.Error, match="must be a multiple of"):
        poptorch.inferenceModel(Mlp(), opts)(torch.randn(5, 4))


def test_repeated_layers_are_one_subgraph_called_per_layer():
    model = Stack(3).eval()
    x = torch.randn(2, 5, 16)
    pm = poptorch.inferenceModel(model)
    torch.testing.assert_close(pm(x), model(x).detach(), rtol=1e-4, atol=1e-5)
    schedule = pm.print_schedule()
    calls = re.findall(r"Call\.\d+\((TransformerEncoderLayer_subgraph\(\d+\))\)", schedule)
    assert len(calls) == 3 and len(set(calls)) == 1
    assert schedule.count("Graph : TransformerEncoderLayer_subgraph") == 1


class Indexed(torch.nn.Module):
    """A layer that keeps its position in the stack, as HuggingFace's keep ``layer_idx``."""

    def __init__(self, index: int, reads_index: bool) -> None:
        super().__init__()
        self.index = index
        self.reads_index = reads_index
        self.fc = torch.nn.Linear(4, 4)
        # One object per layer, equal in what it computes (Gemma's layers keep one).
        self.act = functools.partial(torch.nn.functional.gelu, approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.fc(x))
        return y / (self.index + 1) if self.reads_index else y


@pytest.mark.parametrize("reads_index", [False, True])
def test_layers_differing_in_an_unread_index_are_one_subgraph(reads_index):
    """Layers that differ only in an integer attribute (and in equal ``functools.partial``
    objects) are one subgraph while their forward never reads it; one that computes with it
    is captured inline, each layer as it is."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Indexed(i, reads_index) for i in range(3)])
    x = torch.randn(2, 4)
    pm = poptorch.inferenceModel(model)
    torch.testing.assert_close(pm(x), model(x).detach(), rtol=1e-5, atol=1e-6)
    calls = re.findall(r"Call\.\d+\((Indexed_subgraph\(\d+\))\)", pm.print_schedule())
    assert len(calls) == (0 if reads_index else 3) and len(set(calls)) <= 1
    assert [m.index for m in model] == [0, 1, 2]  # the attributes are the user's again


def test_training_matches_torch_sgd_and_weights_come_back_lazily():
    model = MlpWithLoss()
    reference = copy.deepcopy(model)
    x, target = torch.randn(6, 4), torch.randn(6, 3)
    pm = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        _, loss = pm(x, target)
        opt.zero_grad()
        _, ref_loss = reference(x, target)
        ref_loss.backward()
        opt.step()
    assert loss.shape == ()
    # Reading the torch model's parameters copies the device's weights back.
    torch.testing.assert_close(model.net.fc1.weight, reference.net.fc1.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.state_dict()["net.fc2.bias"], reference.net.fc2.bias)
    # An inference model of the same torch model runs the trained weights.
    inference = poptorch.inferenceModel(model.net)
    torch.testing.assert_close(inference(x), reference.net(x).detach(), rtol=1e-5, atol=1e-6)


def test_trained_weights_reach_an_inference_model_of_the_same_model():
    model = MlpWithLoss()
    x, target = torch.randn(6, 4), torch.randn(6, 3)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    inference = poptorch.inferenceModel(model)
    before = inference(x, target)[0]
    for _ in range(5):
        training(x, target)
    after = inference(x, target)[0]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, model.net(x).detach(), rtol=1e-5, atol=1e-6)


def test_buffers_persist_and_plain_tensor_attributes_are_constants():
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(1))
            self.frozen = torch.zeros(1)

        def forward(self, x: torch.Tensor):
            self.count += 1
            self.frozen += 1
            return x + self.count, self.frozen * 1

    model = Counter()
    pm = poptorch.inferenceModel(model)
    x = torch.zeros(1)
    assert float(pm(x)[0]) == 1.0 and float(pm(x)[0]) == 2.0
    assert float(pm(x)[1]) == 1.0  # PopTorch froze the attribute's value
    pm.copyWeightsToHost()
    assert float(model.count) == 3.0


def test_inputs_modified_in_place_are_updated_on_the_host():
    class AddOne(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> None:
            x += 1

    pm = poptorch.inferenceModel(AddOne())
    x = torch.tensor([1.0, 2.0])
    assert pm(x) is None
    torch.testing.assert_close(x, torch.tensor([2.0, 3.0]))


def test_list_inputs_stay_lists_and_their_tensors_are_updated_in_place():
    class AddToFirst(torch.nn.Module):
        def forward(self, xs: list) -> None:
            assert isinstance(xs, list)
            xs[0] += 4

    pm = poptorch.inferenceModel(AddToFirst())
    xs = [torch.tensor([1.0]), torch.tensor([5.0])]
    assert pm(xs) is None
    assert xs[0].item() == 5.0 and xs[1].item() == 5.0


def test_dict_inputs_are_matched_by_key_whatever_their_order():
    class Divide(torch.nn.Module):
        def forward(self, d: dict) -> torch.Tensor:
            return d["x"] / d["y"]

    pm = poptorch.inferenceModel(Divide())
    assert pm({"x": torch.tensor([1.0]), "y": torch.tensor([2.0])}).item() == 0.5
    assert pm({"y": torch.tensor([2.0]), "x": torch.tensor([1.0])}).item() == 0.5


def _keywords_only_past_the_first(forward):
    """A decorator that, like transformers' ``merge_with_config_defaults``, reads ``scale``
    among the keywords only and passes it again by name."""

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        kwargs["scale"] = kwargs.get("scale") or 2.0
        return forward(self, *args, **kwargs)

    return wrapper


def test_arguments_reach_the_forward_by_name_as_the_caller_passed_them():
    """PopTorch binds a call to the forward's parameters; the model is still called with
    them by name, in order, so decorators that look for a keyword see it (M2M100's)."""

    class Scaled(torch.nn.Module):
        @_keywords_only_past_the_first
        def forward(self, x, y=None, scale=None, shift=0.0):
            return x * scale + (0.0 if y is None else y) + shift

    x, y = torch.arange(3.0), torch.ones(3)
    pm = poptorch.inferenceModel(Scaled())
    assert pm(x, y=y, shift=0.5).tolist() == [1.5, 3.5, 5.5]
    assert pm(x, y, shift=0.5).tolist() == [1.5, 3.5, 5.5]  # the same program, positional


def test_custom_argument_types_are_split_into_micro_batches_and_returned():
    class Pair:
        def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
            self.a, self.b = a, b

    class PairParser(poptorch.ICustomArgParser):
        def yieldTensors(self, struct: Pair):  # noqa: N802 (PopTorch's name)
            yield struct.a
            yield struct.b

        def reconstruct(self, original: Pair, tensors):
            return Pair(next(tensors), next(tensors))

    class Results(collections.OrderedDict):
        pass

    poptorch.registerCustomArgParser(Pair, PairParser())

    class Model(torch.nn.Module):
        def forward(self, p: Pair) -> Results:
            assert p.a.shape[0] == 2  # one micro-batch
            out = Results()
            out["sum"] = p.a + p.b
            out["a"] = p.a
            return out

    pm = poptorch.inferenceModel(Model(), poptorch.Options().deviceIterations(3))
    for _ in range(2):
        a, b = torch.randn(6, 2), torch.randn(6, 2)
        out = pm(Pair(a, b))
        assert isinstance(out, Results) and list(out) == ["sum", "a"]
        torch.testing.assert_close(out["sum"], a + b)
        torch.testing.assert_close(out["a"], a)


def test_tensors_created_on_the_ipu_device_are_part_of_the_program():
    class Ones(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ones((2, 3), dtype=x.dtype, device="ipu") + x.to("ipu")

    out = poptorch.inferenceModel(Ones())(torch.tensor([2.0, 3.0, 4.0], dtype=torch.float16))
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, torch.tensor([[3.0, 4.0, 5.0]] * 2, dtype=torch.float16))


@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_layers_run_in_their_activations_float_type(layer):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3) if layer == "linear" else torch.nn.Conv1d(4, 3, 2)
    x = torch.randn(2, 4) if layer == "linear" else torch.randn(1, 4, 5)
    expected = model(x)
    out = poptorch.inferenceModel(model)(x.half())  # float16 activations, float32 weights
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)
    model.half()
    out = poptorch.inferenceModel(model)(x)  # float32 activations, float16 weights
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)


def test_repeated_float_layers_run_in_float16_activations():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])  # one subgraph
    x = torch.randn(2, 4)
    out = poptorch.inferenceModel(model)(x.half())
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), model(x), rtol=2e-2, atol=2e-2)


def test_inference_batch_norm_in_training_mode_leaves_running_statistics():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(3)  # left in training mode
    bn.running_mean += torch.tensor([1.0, 2.0, 3.0])
    before = bn.running_mean.clone()
    x = torch.randn(8, 3) * 2 + 5
    expected = torch.nn.functional.batch_norm(x, None, None, bn.weight, bn.bias, True)
    out = poptorch.inferenceModel(bn)(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)  # the batch's statistics
    torch.testing.assert_close(bn.running_mean, before)


def test_training_batch_norm_updates_running_statistics_as_torch():
    torch.manual_seed(0)

    class Normalised(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(3, momentum=0.3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return poptorch.identity_loss(self.bn(x).pow(2).mean(), "none")

    model, reference = Normalised(), Normalised()
    xs = [torch.randn(8, 3) * 2 + 5 for _ in range(2)]
    pm = poptorch.trainingModel(model, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1))
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x in xs:
        pm(x)
        reference(x).backward()
        sgd.step()
        sgd.zero_grad()
    pm.copyWeightsToHost()
    torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)
    torch.testing.assert_close(model.bn.running_var, reference.bn.running_var)


def test_transformer_with_attention_masks():
    torch.manual_seed(0)
    model = torch.nn.Transformer(
        d_model=8,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=16,
        batch_first=True,
    ).eval()
    src, tgt = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(4)
    src_mask = torch.zeros(5, 5)
    expected = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    out = poptorch.inferenceModel(model)(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_training_a_frozen_model_runs_its_forward_only():
    torch.manual_seed(0)
    model = MlpWithLoss()
    for p in model.parameters():
        p.requires_grad = False
    before = copy.deepcopy(model.state_dict())
    x, y = torch.randn(4, 4), torch.randn(4, 3)
    expected = model(x, y)
    pm = poptorch.trainingModel(model)
    for got, want in zip(pm(x, y), expected):
        torch.testing.assert_close(got, want)
    pm.copyWeightsToHost()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name])


class TwoLosses(torch.nn.Module):
    """An MSE and an L1 loss of one output, summed; ``wrap`` marks the sum as the loss."""

    def __init__(self, wrap: bool) -> None:
        super().__init__()
        self.net = Mlp()
        self.wrap = wrap

    def forward(self, x: torch.Tensor, target: torch.Tensor):
        out = self.net(x)
        mse = torch.nn.functional.mse_loss(out, target)
        total = mse + 0.5 * torch.nn.functional.l1_loss(out, target)
        return out, poptorch.identity_loss(total, reduction="mean") if self.wrap else total


def test_two_independent_losses_need_one_final_identity_loss():
    """As PopTorch: two loss functions whose sum is returned as it is are two independent
    losses, refused when training; marked with identity_loss they are one, and train as
    torch does."""
    x, y = torch.randn(4, 4), torch.randn(4, 3)
    with pytest.raises(poptorch.Error, match="Multiple independent losses found in graph"):
        poptorch.trainingModel(TwoLosses(wrap=False))(x, y)
    model = TwoLosses(wrap=True)
    assert_trains_as_torch(model, copy.deepcopy(model), (x, y))
    # Inference has no loss to single out: the unwrapped model runs.
    out, _ = poptorch.inferenceModel(TwoLosses(wrap=False))(x, y)
    assert out.shape == (4, 3)


def test_one_hot_needs_its_number_of_classes():
    class OneHot(torch.nn.Module):
        def __init__(self, num_classes: int) -> None:
            super().__init__()
            self.num_classes = num_classes

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(x, num_classes=self.num_classes)

    x = torch.tensor([0, 3, 1])
    assert poptorch.inferenceModel(OneHot(4))(x).tolist() == [
        [1, 0, 0, 0],
        [0, 0, 0, 1],
        [0, 1, 0, 0],
    ]
    with pytest.raises(poptorch.Error, match="OneHot num classes must be specified"):
        poptorch.inferenceModel(OneHot(-1))(x)


def test_output_structure_is_kept():
    class Structured(torch.nn.Module):
        def forward(self, x: torch.Tensor):
            return {"double": x * 2, "pair": (x + 1, None)}

    out = poptorch.inferenceModel(Structured())(torch.ones(2))
    assert set(out) == {"double", "pair"} and out["pair"][1] is None
    torch.testing.assert_close(out["pair"][0], torch.full((2,), 2.0))


def test_outputs_are_separate_tensors_each_call():
    """Outputs share the runtime's fresh host arrays, but never with each other or with
    the outputs of another call: writing to one leaves the rest alone."""

    class Twice(torch.nn.Module):
        def forward(self, x: torch.Tensor):
            y = x * 2
            return y, y

    model = poptorch.inferenceModel(Twice())
    a, b = model(torch.ones(3))
    c, _ = model(torch.ones(3))
    a += 1
    torch.testing.assert_close(b, torch.full((3,), 2.0))
    torch.testing.assert_close(c, torch.full((3,), 2.0))
    torch.testing.assert_close(a, torch.full((3,), 3.0))


def test_a_model_without_inputs_returning_global_tensors():
    """torch.export's non-strict trace of such a model fails its own graph check (torch
    2.15); the capture's strict retry exports it, and the outputs are the tensors'
    values."""
    first, second = torch.tensor([1, 2]), torch.tensor([3, 4])

    class Constants(torch.nn.Module):
        def forward(self):
            return first + second, [first, second], second

    total, pair, last = poptorch.inferenceModel(Constants())()
    assert total.tolist() == [4, 6] and last.tolist() == [3, 4]
    assert [t.tolist() for t in pair] == [[1, 2], [3, 4]]


def test_64_bit_inputs_run_in_32_bits():
    class Gather(torch.nn.Module):
        def forward(self, table: torch.Tensor, index: torch.Tensor):
            return table[index] * 2

    table = torch.randn(5, 3, dtype=torch.float64)
    index = torch.tensor([4, 0, 2])
    out = poptorch.inferenceModel(Gather())(table, index)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, (table[index] * 2).float())


def test_is_running_on_ipu_while_captured():
    class Branch(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + (1 if poptorch.isRunningOnIpu() else 100)

    model = Branch()
    assert float(model(torch.zeros(1))) == 100.0
    assert float(poptorch.inferenceModel(model)(torch.zeros(1))) == 1.0
    assert not poptorch.ipuHardwareIsAvailable()


def test_changed_inputs_get_poptorchs_errors():
    pm = poptorch.inferenceModel(Mlp())
    pm(torch.randn(2, 4))
    with pytest.raises(poptorch.Error, match=re.escape("expected torch.Size([2, 4])")):
        pm(torch.randn(3, 4))
    with pytest.raises(poptorch.Error, match="Data type mismatch for x"):
        pm(torch.randn(2, 4, dtype=torch.float16))


def test_missing_op_error_names_op_module_and_line():
    class Unsupported(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.linalg.cholesky(self.inner(x) @ self.inner(x).T + 3 * torch.eye(3))

    with pytest.raises(NotImplementedError) as info:
        poptorch.inferenceModel(Unsupported())(torch.randn(3, 3))
    message = str(info.value)
    assert "aten.linalg_cholesky_ex" in message or "aten.cholesky" in message
    assert "test_torch_models.py" in message and "Unsupported" in message


def test_unexportable_model_gets_torchs_reason_and_a_hint():
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(poptorch.Error) as info:
        poptorch.inferenceModel(DataDependent())(torch.ones(2))
    assert "could not capture DataDependent.forward" in str(info.value)
    assert "What to change" in str(info.value)


def test_an_unexportable_submodule_is_named_with_its_method():
    class Gate(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.choose(x)

        def choose(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(2, 2), Gate())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    with pytest.raises(
        poptorch.Error, match=r"capture Net.forward with torch.export in body.1.choose \(Gate\)"
    ):
        poptorch.inferenceModel(Net())(torch.ones(2))


def test_errors_raised_by_the_model_itself_reach_the_caller_unchanged():
    """As running the model in torch would raise them (PopTorch's op harness compares the two)."""

    class Checks(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] != 3:
                raise ValueError("Checks expects 3 rows")
            return x

    with pytest.raises(ValueError, match="^Checks expects 3 rows$"):
        poptorch.inferenceModel(Checks())(torch.ones(2))


def test_torch_argument_errors_read_as_in_eager_torch():
    class BadScatter(torch.nn.Module):
        def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            return x.scatter(0, i, x, "add")  # reduce must be passed by keyword

    x, i = torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(TypeError) as eager:
        BadScatter()(x, i)
    with pytest.raises(TypeError) as captured:
        poptorch.inferenceModel(BadScatter())(x, i)
    assert str(captured.value) == str(eager.value)
    assert "FakeTensor" not in str(captured.value)


def test_inputs_requiring_grad_are_detached_with_poptorchs_warning(capfd):
    model = poptorch.inferenceModel(torch.nn.Linear(1, 1))
    out = model(torch.tensor([0.5], requires_grad=True))
    assert not out.requires_grad
    printed = capfd.readouterr()
    assert "Input tensor has requires_grad=True set. This tensor will be detached" in (
        printed.out + printed.err
    )


def test_begin_block_places_layers_in_pipeline_stages():
    model = MlpWithLoss()
    reference = copy.deepcopy(model)
    poptorch.BeginBlock(model.net.fc2, "head", ipu_id=1)
    opts = poptorch.Options()
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    opts.Training.gradientAccumulation(4)
    pm = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, target = torch.randn(8, 4), torch.randn(8, 3)
    pm(x, target)
    assert "PipelinedExecution" in pm.print_schedule()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt.zero_grad()
    losses = [reference(xs, ts)[1] for xs, ts in zip(x.split(2), target.split(2))]
    (sum(losses) / len(losses)).backward()
    opt.step()
    torch.testing.assert_close(model.net.fc2.weight, reference.net.fc2.weight, rtol=1e-4, atol=1e-5)


def test_unnamed_blocks_get_poptorchs_automatic_ids():
    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            poptorch.Block.useAutoId()
            with poptorch.Block(ipu_id=0):
                x = self.a(x)
            with poptorch.Block(ipu_id=1):
                return self.b(x)

    opts = poptorch.Options().deviceIterations(2)
    opts.setExecutionStrategy(poptorch.ShardedExecution(poptorch.Stage("0"), poptorch.Stage("1")))
    model = Two()
    pm = poptorch.inferenceModel(model, opts)
    x = torch.randn(4, 4)
    torch.testing.assert_close(pm(x), model(x))
    text = pm.print_schedule()
    assert "block '0': stage 0, IPU 0" in text and "block '1': stage 1, IPU 1" in text


def test_module_repr_shows_begin_blocks_and_survives_copies():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sequential(torch.nn.ReLU()))
    assert poptorch.module_repr(model) == repr(model)
    poptorch.BeginBlock(model[1], user_id="b", ipu_id=1)
    for m in (model, copy.deepcopy(model)):
        text = poptorch.module_repr(m)
        assert "(1): BeginBlock(user_id=b, ipu_id=1) Sequential(" in text
        assert "(0): Linear(in_features=2" in text
    assert "BeginBlock(user_id=b, ipu_id=1)" in repr(poptorch.inferenceModel(model))
    poptorch.removeBlocks(model)
    assert poptorch.module_repr(model) == repr(model)


def test_begin_block_of_a_function_starts_a_block_at_each_call():
    double = poptorch.BeginBlock(lambda x: x * 2, "twice", 1)
    assert (double._user_id, double._ipu_id) == ("twice", 1)
    assert double(3) == 6


def test_bincount_needs_minlength_and_drops_larger_values():
    class Count(torch.nn.Module):
        def __init__(self, minlength: int | None) -> None:
            super().__init__()
            self.minlength = minlength

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.minlength is None:
                return torch.bincount(x)
            return torch.bincount(x, minlength=self.minlength)

    x = torch.tensor([0, 2, 2, 7, 4])
    out = poptorch.inferenceModel(Count(5))(x)
    assert out.tolist() == [1, 0, 2, 0, 1]  # 7 >= minlength is not counted (the IPU's rule)
    with pytest.raises(poptorch.Error, match="Bincount `minlength` must be specified"):
        poptorch.inferenceModel(Count(None))(x)


def test_group_norm_with_popart_strided_channel_grouping():
    """``groupNormStridedChannelGrouping``: group g normalises channels g, g + G, ..."""
    torch.manual_seed(0)
    norm = torch.nn.GroupNorm(2, 6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 6))
        norm.bias.copy_(torch.linspace(-1.0, 1.0, 6))
    x = torch.randn(3, 6, 4)
    opts = poptorch.Options()
    opts._Popart.set("groupNormStridedChannelGrouping", True)
    out = poptorch.inferenceModel(norm, opts)(x)
    order = [0, 2, 4, 1, 3, 5]  # channels of group 0, then of group 1
    back = [order.index(i) for i in range(6)]
    expected = torch.nn.functional.group_norm(
        x[:, order], 2, norm.weight[order], norm.bias[order], norm.eps
    )[:, back]
    torch.testing.assert_close(out, expected.detach(), rtol=1e-5, atol=1e-5)
    plain = poptorch.inferenceModel(norm)(x)
    torch.testing.assert_close(plain, norm(x).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (0, "The start and end of a slice must be different"),
        (-2, "Taking a slice of a tensor with the end less than the start is not supported"),
        (3, r"The size of the slice \(3\) must be a factor of the slicing dimension \(8\)"),
    ],
)
def test_dynamic_slice_sizes_the_device_refuses(size, message):
    class Slicer(torch.nn.Module):
        def forward(self, t: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
            return poptorch.dynamic_slice(t, 0, start, size, 1)

    t, start = torch.arange(8.0), torch.tensor([1])
    Slicer()(t, start)  # plain PyTorch runs it (an empty or short slice)
    with pytest.raises(poptorch.Error, match=message):
        poptorch.inferenceModel(Slicer())(t, start)


def test_dynamic_update_dtype_error_names_the_device_dtypes():
    class Updater(torch.nn.Module):
        def forward(self, t: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
            return poptorch.dynamic_update(t, src, 0, torch.tensor([1]), 1)

    with pytest.raises(poptorch.Error, match=r"same dtype\. \(torch\.float32 vs torch\.int32\)"):
        poptorch.inferenceModel(Updater())(torch.zeros(8), torch.tensor([-1]))


def test_a_training_model_whose_loss_reads_no_weight_runs_its_forward():
    """Upstream's misc_nn_layers test: a dropout in eval mode with a dummy parameter the loss
    never reads. PopTorch runs it (nothing to train); the parameter is left as it was."""
    dropout = torch.nn.Dropout()
    dropout.eval()
    dropout.register_parameter("param", torch.nn.Parameter(torch.ones(10)))

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dropout = dropout

        def forward(self, x, target):
            out = self.dropout(x)
            return out, torch.nn.functional.l1_loss(out, target)

    model = WithLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.5)
    training = poptorch.trainingModel(model, optimizer=optimizer)
    x = torch.randn(8, 20)
    out, loss = training(x, torch.zeros_like(x))
    torch.testing.assert_close(out, x)
    torch.testing.assert_close(loss, x.abs().mean())
    training.copyWeightsToHost()
    torch.testing.assert_close(dropout.param.detach(), torch.ones(10))


def test_distributions_made_in_forward_are_captured_without_their_value_checks():
    """torch.distributions check their arguments with a Python ``if`` on tensor values, which
    export cannot take; capture skips those checks (upstream half_float_test samples from
    Uniform and Normal in forward) and leaves torch's default as it was."""

    class Sampler(torch.nn.Module):
        def forward(self, loc: torch.Tensor) -> torch.Tensor:
            return torch.distributions.Normal(loc, 2.0).sample((4000,))

    before = torch.distributions.Distribution._validate_args
    samples = poptorch.inferenceModel(Sampler())(torch.tensor([3.0]))
    assert samples.shape == (4000, 1)
    assert abs(samples.mean().item() - 3.0) < 0.2 and abs(samples.std().item() - 2.0) < 0.2
    assert torch.distributions.Distribution._validate_args == before


class OneElementLoss(torch.nn.Module):
    """A loss of shape ``(1,)``, as a mixup weight of shape ``(1,)`` makes it (ViT)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x, target, lam):
        out = self.fc(x)
        loss = lam * torch.nn.functional.cross_entropy(out, target)
        return out, poptorch.identity_loss(loss, reduction="none")


def test_a_one_element_loss_trains_as_torch():
    torch.manual_seed(0)
    model = OneElementLoss()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0]), torch.tensor([0.7]))
    assert_trains_as_torch(model, reference, inputs, steps=2)
