"""The tutorials run as tests: full default runs (1, 2) or short runs (3, 5) on the digits."""

import pytest

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
        "10",
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
    accuracy = load_tutorial("5_remote_variables_and_rts").main(["--epochs", "8", "--demo"])
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
