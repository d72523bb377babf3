"""PopTorch's control flow on torch.nn models: ``poptorch.for_loop`` and ``poptorch.cond``
against torch references; ``poptorch.CPU`` host ops under device iterations and replicas."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class LoopNet(torch.nn.Module):
    """``count`` applications of ``tanh(fc(x)) + x``: a device loop, or a Python one."""

    def __init__(self, count: int = 4, unrolled: bool = False) -> None:
        super().__init__()
        self.count, self.unrolled = count, unrolled
        self.fc = torch.nn.Linear(6, 6)

    def body(self, x: torch.Tensor, total: torch.Tensor):
        y = torch.tanh(self.fc(x)) + x
        return y, total + y.sum()

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None):
        total = torch.zeros(())
        if self.unrolled:
            for _ in range(self.count):
                x, total = self.body(x, total)
        else:
            x, total = poptorch.for_loop(self.count, self.body, [x, total])
        if target is None:
            return x, total
        return x, torch.nn.functional.mse_loss(x, target)


class CondNet(torch.nn.Module):
    def __init__(self, eager: bool = False) -> None:
        super().__init__()
        self.eager = eager
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, condition: torch.Tensor, x: torch.Tensor):
        def then_body(a):
            return [self.fc(a).relu(), a.sum(dim=0)]

        def else_body(b):
            return [b * 2.0 - 1.0, b.amax(dim=0)]

        if self.eager:
            return then_body(x) if bool(condition) else else_body(x)
        return poptorch.cond(condition, then_body, [x], else_body, [x])


def test_for_loop_inference_matches_the_unrolled_torch_loop():
    model = LoopNet()
    reference = copy.deepcopy(model)
    reference.unrolled = True
    x = torch.randn(3, 6)
    pm = poptorch.inferenceModel(model)
    y, total = pm(x)
    ref_y, ref_total = reference(x)
    torch.testing.assert_close(y, ref_y.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(total, ref_total.detach(), rtol=1e-5, atol=1e-4)
    schedule = pm.print_schedule()
    assert "Loop." in schedule and schedule.count("Tanh.") == 1  # one body, not unrolled


def test_for_loop_with_device_iterations_runs_per_micro_batch():
    model = LoopNet(count=3)
    reference = copy.deepcopy(model)
    reference.unrolled = True
    opts = poptorch.Options().deviceIterations(4)
    opts.outputMode(poptorch.OutputMode.All)
    x = torch.randn(4 * 2, 6)
    y, _ = poptorch.inferenceModel(model, opts)(x)
    want = torch.cat([reference(xs)[0] for xs in x.split(2)]).detach()
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_for_loop_sees_weights_trained_by_a_training_model():
    model = LoopNet(count=2, unrolled=True)
    reference = copy.deepcopy(model)
    x, target = torch.randn(3, 6), torch.randn(3, 6)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        training(x, target)
        opt.zero_grad()
        reference(x, target)[1].backward()
        opt.step()
    model.unrolled = False
    inference = poptorch.inferenceModel(model)
    torch.testing.assert_close(inference(x)[0], reference(x)[0].detach(), rtol=1e-5, atol=1e-5)


def test_for_loop_and_cond_are_refused_in_training():
    training = poptorch.trainingModel(LoopNet())
    with pytest.raises(
        poptorch.Error, match=r"poptorch.for_loop\(\) is only supported in inference"
    ):
        training(torch.randn(2, 6), torch.randn(2, 6))

    class CondLoss(CondNet):
        def forward(self, condition, x):
            out, _ = super().forward(condition, x)
            return out, poptorch.identity_loss(out.sum(), reduction="sum")

    training = poptorch.trainingModel(CondLoss())
    with pytest.raises(poptorch.Error, match=r"poptorch.cond\(\) is only supported in inference"):
        training(torch.tensor([True]), torch.randn(3, 4))


def test_cond_decides_on_the_device_and_matches_torch():
    model = CondNet()
    reference = copy.deepcopy(model)
    reference.eager = True
    pm = poptorch.inferenceModel(model)
    x = torch.randn(3, 4)
    for flag in (True, False, True):
        condition = torch.tensor([flag])
        got = pm(condition, x)
        want = reference(condition, x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w.detach(), rtol=1e-5, atol=1e-6)
    assert pm.isCompiled() and "If." in pm.print_schedule()


def test_cond_branches_may_use_values_of_the_enclosing_forward():
    class Closure(torch.nn.Module):
        def forward(self, condition, x, y):
            scale = y * 3.0
            return poptorch.cond(condition, lambda a: [a * scale], [x], lambda b: [b - scale], [x])

    pm = poptorch.inferenceModel(Closure())
    x, y = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(pm(torch.tensor([True]), x, y)[0], x * y * 3.0)
    torch.testing.assert_close(pm(torch.tensor([False]), x, y)[0], x - y * 3.0)


# poptorch.CPU --------------------------------------------------------------------------------


class HostFunction:
    """The host side of a CPU op; it records the inputs of its calls (outside the module:
    torch.export refuses tensors stored on a module while it captures ``forward``)."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor):
        self.calls.append(x.clone())
        return x * 2.0, x.sum(dim=-1)


class HostNet(torch.nn.Module):
    """A host op between two device computations."""

    def __init__(self, host: HostFunction, op_id: str = "MyHostOp") -> None:
        super().__init__()
        self.cpu = poptorch.CPU(host, op_id)

    def forward(self, x: torch.Tensor):
        doubled, sums = self.cpu(x + 1.0)
        return doubled - 1.0, sums


@pytest.mark.parametrize(
    "iterations, replicas", [(3, 1), (1, 2), (3, 2)], ids=["iterations", "replicas", "both"]
)
def test_cpu_op_runs_once_per_device_iteration_and_replica(iterations, replicas):
    host = HostFunction()
    model = HostNet(host)
    opts = poptorch.Options().deviceIterations(iterations).replicationFactor(replicas)
    opts.outputMode(poptorch.OutputMode.All)
    micro = 2
    x = torch.arange(iterations * replicas * micro * 4, dtype=torch.float32).reshape(-1, 4)
    pm = poptorch.inferenceModel(model, opts)
    pm.compile(x)
    assert len(host.calls) == 1  # compiling made one trial call (the outputs' shapes)
    host.calls.clear()
    for _ in range(2):
        doubled, sums = pm(x)
        torch.testing.assert_close(doubled, (x + 1.0) * 2.0 - 1.0)
        torch.testing.assert_close(sums, (x + 1.0).sum(dim=-1))
    # Each call runs the host function once per micro-batch: per device iteration and per
    # replica, each time on that replica's micro-batch of the iteration.
    n = iterations * replicas
    assert len(host.calls) == 2 * n
    assert all(c.shape == (micro, 4) for c in host.calls)
    seen = torch.cat(host.calls[:n]).sort(dim=0).values
    torch.testing.assert_close(seen, (x + 1.0).sort(dim=0).values)
    assert "HostOp." in pm.print_schedule()
    assert '"type":"HostOp","name":"HostOp","attributes":{"cpu_id":"MyHostOp"' in (
        pm._debugGetPopartIR()
    )


def test_cpu_op_id_names_one_callable_per_model():
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0
            self.cpu = poptorch.CPU(self.on_host, "Shared")

        def on_host(self, x):
            self.count += 1
            return x + 1.0

        def forward(self, x):
            return self.cpu(self.cpu(x))  # the same callable twice: one ID, allowed

    model = Twice()
    pm = poptorch.inferenceModel(model)
    pm.compile(torch.zeros(3))
    model.count = 0
    torch.testing.assert_close(pm(torch.zeros(3)), torch.full((3,), 2.0))
    assert model.count == 2

    class Clash(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = poptorch.CPU(lambda x: x + 1.0, "Shared")
            self.b = poptorch.CPU(lambda x: x * 2.0, "Shared")

        def forward(self, x):
            return self.b(self.a(x))

    with pytest.raises(poptorch.Error, match="share the ID 'Shared'"):
        poptorch.inferenceModel(Clash())(torch.zeros(3))


def test_cpu_op_is_refused_in_training():
    class HostLoss(HostNet):
        def __init__(self) -> None:
            super().__init__(HostFunction())
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            out, _ = super().forward(self.fc(x))
            return out, poptorch.identity_loss(out.sum(), reduction="sum")

    with pytest.raises(poptorch.Error, match="only supported in inference models"):
        poptorch.trainingModel(HostLoss())(torch.randn(2, 4))
