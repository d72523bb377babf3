"""The tutorials run as tests: full default runs (1, 2) or short runs (3, 5) on the digits;
tutorial 9's custom ops against NumPy, torch and finite differences."""

import numpy as np
import pytest
import torch

import poptorch
from tutorials import load_tutorial


@pytest.mark.parametrize("folder", ["1_basic_concepts", "2_custom_optimiser"])
def test_default_run_reaches_90_percent(folder, capsys):
    accuracy = load_tutorial(folder).main(["--device", "ipu_model"])
    printed = capsys.readouterr().out
    assert f"Accuracy on test set: {accuracy:0.2f}%" in printed
    assert "bundled handwritten digits" in printed or "Using MNIST" in printed
    assert accuracy >= 90.0


def test_custom_optimiser_demo_shows_graph_and_state(capsys):
    load_tutorial("2_custom_optimiser").demo_single_variable()
    printed = capsys.readouterr().out
    assert "Accumulate.100" in printed and "AdamUpdater.102" in printed
    assert "ScaledAddLhsInplace.103" in printed
    assert "step: 1.0" in printed


def test_data_parallel_tutorial_trains(capsys):
    args = [
        "--epochs",
        "4",  # 93% on the bundled digits
        "--data-parallel",
        "2",
        "--gradient-accumulation",
        "2",
        "--throughput",
    ]
    accuracy = load_tutorial("3_data_parallelism").main(args)
    printed = capsys.readouterr().out
    assert (
        "global batch = micro batch 8 x gradient accumulation 2 x data parallel 2 = 32" in printed
    )
    assert "Throughput:" in printed
    assert accuracy >= 85.0


def test_remote_rts_tutorial_trains_and_demos(capsys):
    accuracy = load_tutorial("5_remote_variables_and_rts").main(["--epochs", "4", "--demo"])  # 92%
    printed = capsys.readouterr().out
    assert "RemoteLoad.102" in printed and "RemoteStore.103" in printed
    assert "out: 2.0 then 2.3333335" in printed
    assert "assignment [0, 1, 0, 1, 2, 3, 2, 3]" in printed
    assert accuracy >= 85.0


def test_poptorch_style_tutorial_trains_and_prints_its_program(capsys):
    args = ["--digits", "--switch-loss", "0.5", "--lr", "0.002"]
    accuracy = load_tutorial("7_poptorch_style").main(args)
    printed = capsys.readouterr().out
    assert "The program trainingModel built (main graph):" in printed
    assert "Loop." in printed and "HostStore." in printed
    assert "lr now 0.0002" in printed  # the momentum loss fell below 0.5: setOptimizer
    assert f"Accuracy on test set: {accuracy:0.2f}%" in printed
    assert accuracy >= 90.0


def test_torch_models_tutorial_trains_a_real_torch_cnn(capsys):
    tutorial = load_tutorial("8_poptorch_torch_models")
    accuracy = tutorial.main(["--digits", "--epochs", "3", "--print-program"])
    printed = capsys.readouterr().out
    assert "The program inferenceModel captured" in printed
    assert "Conv.100" in printed and "block1.0.weight" in printed  # torch's names
    assert "TrainingModelWithLoss_subgraph(0)_bwd" in printed and "ConvGrad." in printed
    losses = [float(line.rsplit(" ", 1)[1]) for line in printed.splitlines() if "mean loss" in line]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert f"Accuracy on test set: {accuracy:0.2f}%" in printed
    assert accuracy >= 90.0


# Tutorial 9: custom ops ----------------------------------------------------------------------


def _finite_difference(loss, x, eps=1e-3):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (loss(up) - loss(down)) / (2 * eps)
    return grad


def _numeric_gradients(reference, inputs, seeds):
    """Finite differences (in float64) of ``sum_k sum(reference(*inputs)[k] * seeds[k])``."""
    inputs64 = [v.astype(np.float64) for v in inputs]

    def loss_of(i):
        def loss(v):
            args = [*inputs64[:i], v, *inputs64[i + 1 :]]
            return sum(float(np.sum(o * s)) for o, s in zip(reference(*args), seeds))

        return loss

    return [_finite_difference(loss_of(i), x) for i, x in enumerate(inputs64)]


def _custom_op_cases(acme):
    """(name, popxl function, inputs, NumPy reference returning a tuple of outputs)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
    x[np.abs(x) < 0.05] = 0.5  # keep finite differences away from LeakyRelu's kink
    bias = rng.normal(size=(4,)).astype(np.float32)
    attrs = acme.MANY_ATTRIBUTES
    return [
        (
            "LeakyRelu",
            lambda t: acme.LEAKY_RELU(t, alpha=0.3),
            [x],
            lambda v: (np.where(v >= 0, v, 0.3 * v),),
        ),
        ("Cube", lambda a, b: acme.CUBE(a, b), [x, bias], lambda a, b: (a**3 + b, a**3)),
        (
            "ManyAttributeOp",
            lambda t: acme.MANY_ATTRIBUTE_OP(t, **attrs),
            [x],
            lambda v: (acme.many_attribute_reference(v, attrs),),
        ),
    ]


def test_custom_ops_tutorial_popxl_matches_numpy_and_finite_differences(capsys):
    tutorial = load_tutorial("9_custom_ops", "popxl_leaky_relu.py")
    out = tutorial.main(["--alpha", "0.25", "--input_data", "-4", "-1", "0.5", "2"])
    np.testing.assert_allclose(out, [-1.0, -0.25, 0.5, 2.0])
    printed = capsys.readouterr().out
    assert "ALPHA param: 0.25" in printed and "LeakyRelu gradient: [0.25 0.25 1.   1.  ]" in printed
    assert "Cube.100" in printed and "CubeGrad.101" in printed  # the registered vjp
    rng = np.random.default_rng(1)
    for name, fn, inputs, reference in _custom_op_cases(tutorial.acme):
        expected = reference(*inputs)
        seeds = [rng.normal(size=e.shape).astype(np.float32) for e in expected]
        outputs, grads = tutorial.forward_and_gradients(fn, inputs, seeds)
        for got, want in zip(outputs, expected):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
        for grad, numeric in zip(grads, _numeric_gradients(reference, inputs, seeds)):
            np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-3, err_msg=name)


def test_custom_ops_tutorial_poptorch_inference_and_training_match_torch(capsys):
    tutorial = load_tutorial("9_custom_ops", "poptorch_custom_ops.py")
    curves = tutorial.main(["--steps", "2"])
    printed = capsys.readouterr().out
    assert "Cube: 12.0 8.0" in printed  # listing 4.24: 2**3 + 4 and 2**3
    assert "ManyAttributeOp." in printed
    leaky = poptorch.inferenceModel(tutorial.LeakyReluModel())
    x = torch.randn(5, 3)
    torch.testing.assert_close(leaky(x), torch.nn.functional.leaky_relu(x, 0.02))
    many = poptorch.inferenceModel(tutorial.ManyAttributesModel())
    expected = tutorial.acme.many_attribute_reference(x.numpy(), tutorial.acme.MANY_ATTRIBUTES)
    np.testing.assert_allclose(many(x).numpy(), expected, rtol=1e-6)
    assert set(curves) == {"Cube", "LeakyRelu", "ManyAttributeOp"}
    for op in curves:
        model, reference, losses, reference_losses = tutorial.train_both(op, steps=4)
        np.testing.assert_allclose(losses, reference_losses, rtol=1e-4, err_msg=op)
        assert losses[-1] < losses[0], op
        for (name, got), want in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"{op} {name}")


def test_custom_ops_tutorial_torch_library_ops_are_captured_and_train(capsys):
    tutorial = load_tutorial("9_custom_ops", "torch_library_ops.py")
    tutorial.main(["--steps", "2"])
    printed = capsys.readouterr().out
    difference = float(printed.split("largest difference from plain PyTorch ")[1].split()[0])
    assert difference < 1e-5
    model, reference, losses, reference_losses, schedule = tutorial.train_both(steps=4)
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-4)
    assert losses[-1] < losses[0]
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    # One captured program: the ops are in the forward graph, their gradients in the
    # backward graph (no graph break, no host round trip).
    for op in ("Cube.", "LeakyRelu.", "ManyAttributeOp.", "CubeGrad.", "LeakyReluGrad."):
        assert op in schedule, op
    assert "HostLoad" not in schedule.split("Graph : Network_subgraph(0)")[1]
