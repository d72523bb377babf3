"""Custom ops from PopTorch: ``poptorch.custom_op`` and ``poptorch.lower_torch_op`` in
inference and training models against torch references; build-time errors."""

from __future__ import annotations

import copy

import jax.numpy as jnp
import pytest
import torch

import poptorch
from popxl import custom_ops

from ._torch_sgd import assert_trains_as_torch

DOMAIN = "test.poptorch_custom"


def _leaky(x, *, alpha):
    return jnp.where(x >= 0, x, alpha * x)


def _cube(x, bias):
    cubed = x * x * x
    return cubed + bias, cubed


def _cube_vjp(inputs, outputs, grads):
    (x, _), (g_sum, g_cube) = inputs, grads
    return 3 * x * x * (g_sum + g_cube), g_sum


@pytest.fixture(autouse=True)
def _ops():
    torch.manual_seed(0)
    leaky = custom_ops.register("LeakyRelu", _leaky, domain=DOMAIN, attributes={"alpha": 0.01})
    cube = custom_ops.register("Cube", _cube, domain=DOMAIN, vjp=_cube_vjp)
    yield leaky, cube
    custom_ops.unregister("LeakyRelu", DOMAIN)
    custom_ops.unregister("Cube", DOMAIN)


class CubeNet(torch.nn.Module):
    """``Linear -> Cube(h, bias) -> sum of both outputs`` (bias of h's shape)."""

    def __init__(self, in_torch: bool = False) -> None:
        super().__init__()
        self.in_torch = in_torch
        self.fc = torch.nn.Linear(3, 3)
        self.bias = torch.nn.Parameter(torch.full((4, 3), 0.2))

    def forward(self, x, target=None):
        h = self.fc(x)
        if self.in_torch:
            total, cubed = h**3 + self.bias, h**3
        else:
            total, cubed = poptorch.custom_op([h, self.bias], "Cube", DOMAIN, 1, [h, h])
        out = total - 0.5 * cubed
        if target is None:
            return out
        return out, torch.nn.functional.mse_loss(out, target)


class LeakyNet(torch.nn.Module):
    def __init__(self, alpha=0.2, in_torch: bool = False) -> None:
        super().__init__()
        self.alpha, self.in_torch = alpha, in_torch
        self.fc = torch.nn.Linear(3, 5)

    def forward(self, x, target=None):
        h = self.fc(x)
        if self.in_torch:
            out = torch.nn.functional.leaky_relu(h, self.alpha)
        else:
            attrs = {"alpha": self.alpha}
            (out,) = poptorch.custom_op([h], "LeakyRelu", DOMAIN, 1, [h], attributes=attrs)
        if target is None:
            return out
        return out, torch.nn.functional.mse_loss(out, target)


@pytest.mark.parametrize("make", [CubeNet, LeakyNet], ids=["Cube", "LeakyRelu"])
def test_inference_matches_torch(make):
    model, reference = make(), make(in_torch=True)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 3)
    pm = poptorch.inferenceModel(model)
    torch.testing.assert_close(pm(x), reference(x).detach(), rtol=1e-5, atol=1e-6)
    name = "Cube." if make is CubeNet else "LeakyRelu."
    assert name in pm.print_schedule()


@pytest.mark.parametrize("make", [CubeNet, LeakyNet], ids=["Cube", "LeakyRelu"])
def test_training_matches_torch_sgd(make):
    model = make()
    reference = copy.deepcopy(model)
    reference.in_torch = True
    x, target = torch.randn(4, 3), torch.randn(4, 5 if make is LeakyNet else 3)
    assert_trains_as_torch(model, reference, (x, target), steps=3)


def test_plain_pytorch_runs_the_jax_implementation():
    x = torch.tensor([-2.0, 0.5])
    (y,) = poptorch.custom_op([x], "LeakyRelu", DOMAIN, 1, [x], {"alpha": 0.5})
    torch.testing.assert_close(y, torch.tensor([-1.0, 0.5]))


class Call(torch.nn.Module):
    def __init__(self, name, domain=DOMAIN, version=1, attributes=None, example=None):
        super().__init__()
        self.args = (name, domain, version, attributes, example)

    def forward(self, x):
        name, domain, version, attributes, example = self.args
        examples = [x if example is None else example]
        return poptorch.custom_op([x], name, domain, version, examples, attributes)[0]


@pytest.mark.parametrize(
    "name, domain, version",
    [("Missing", DOMAIN, 1), ("LeakyRelu", "other.domain", 1), ("LeakyRelu", DOMAIN, 2)],
    ids=["name", "domain", "version"],
)
def test_unknown_op_lists_the_registered_ones(name, domain, version):
    pm = poptorch.inferenceModel(Call(name, domain, version))
    with pytest.raises(poptorch.Error, match="is registered") as info:
        pm(torch.ones(2))
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert f"{DOMAIN}::LeakyRelu:1" in message and f"{DOMAIN}::Cube:1" in message
    assert not pm.isCompiled()


def test_wrong_attribute_type_is_refused_at_build_time():
    pm = poptorch.inferenceModel(Call("LeakyRelu", attributes={"alpha": "big"}))
    with pytest.raises(TypeError, match=r"attribute 'alpha' must be a float .*got 'big'"):
        pm(torch.ones(2))
    assert not pm.isCompiled()
    pm = poptorch.inferenceModel(Call("LeakyRelu", attributes={"beta": 1.0}))
    with pytest.raises(ValueError, match="unknown attribute 'beta'"):
        pm(torch.ones(2))


def test_example_outputs_disagreeing_with_inference_are_refused_at_build_time():
    pm = poptorch.inferenceModel(Call("LeakyRelu", example=torch.ones(3)))
    with pytest.raises(poptorch.Error, match=r"example_outputs \['float32\(3,\)'\] disagree"):
        pm(torch.ones(2))
    assert not pm.isCompiled()
    pm = poptorch.inferenceModel(Call("LeakyRelu", example=torch.ones(2, dtype=torch.int32)))
    with pytest.raises(poptorch.Error, match="disagree"):
        pm(torch.ones(2))


# torch.library operators -------------------------------------------------------------------

_LIB = torch.library.Library("test_custom_ops_torch", "FRAGMENT")
_LIB.define("leaky(Tensor x, float alpha) -> Tensor")


def _torch_leaky(x, alpha):
    return torch.where(x >= 0, x, alpha * x)


def _leaky_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.where(x >= 0, grad, ctx.alpha * grad), None


def _leaky_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.alpha = inputs[1]


torch.library.impl("test_custom_ops_torch::leaky", "CompositeExplicitAutograd", lib=_LIB)(
    _torch_leaky
)
torch.library.register_fake("test_custom_ops_torch::leaky", lambda x, alpha: torch.empty_like(x))
torch.library.register_autograd(
    "test_custom_ops_torch::leaky", _leaky_backward, setup_context=_leaky_context
)


class TorchLibraryNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(3, 6)
        self.fc2 = torch.nn.Linear(6, 2)

    def forward(self, x, target=None):
        h = torch.ops.test_custom_ops_torch.leaky(self.fc1(x), 0.25)
        out = self.fc2(h)
        if target is None:
            return out
        return out, torch.nn.functional.mse_loss(out, target)


def test_torch_library_op_is_lowered_without_a_graph_break(_ops):
    leaky, _ = _ops
    poptorch.lower_torch_op(torch.ops.test_custom_ops_torch.leaky, leaky)
    model = TorchLibraryNet()
    reference = copy.deepcopy(model)
    x, target = torch.randn(5, 3), torch.randn(5, 2)
    inference = poptorch.inferenceModel(model)
    torch.testing.assert_close(inference(x), reference(x).detach(), rtol=1e-5, atol=1e-6)
    schedule = inference.print_schedule()
    # One device graph: both layers and the op, no host callback in between.
    network = schedule[schedule.index("Graph : TorchLibraryNet") :]
    assert network.count("MatMul.") == 2 and "LeakyRelu." in network
    assert "HostStore" not in network and "CallCpuOp" not in schedule
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        _, loss = training(x, target)
        opt.zero_grad()
        _, ref_loss = reference(x, target)
        ref_loss.backward()
        opt.step()
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.fc1.weight, reference.fc1.weight, rtol=1e-5, atol=1e-6)


def test_lower_torch_op_refuses_arguments_the_op_does_not_declare(_ops):
    _, cube = _ops
    with pytest.raises(ValueError, match="argument 'alpha' .* not an attribute"):
        poptorch.lower_torch_op(torch.ops.test_custom_ops_torch.leaky, cube)
