"""The tutorials run as tests: full default runs on the bundled digits."""

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
