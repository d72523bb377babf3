"""``Options.enableExecutableCaching`` for torch models: another process loads the executable
the first saved (as PopTorch's executable cache did), and computes the same step."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import poptorch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 3)
    )

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, y):
            out = self.net(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    opts = poptorch.Options().enableExecutableCaching(sys.argv[1])
    if sys.argv[2] == "infer":  # its convolution's weight laid out once (runtime.lowering.hoisting)
        x = torch.linspace(-1, 1, 2 * 3 * 8 * 8).reshape(2, 3, 8, 8)
        out = poptorch.inferenceModel(net.eval(), opts)(x)
        torch.testing.assert_close(out, net(x).detach(), rtol=1e-5, atol=1e-6)
        print(repr(out.sum().item()))
        sys.exit()
    model = poptorch.trainingModel(WithLoss(), opts, torch.optim.SGD(net.parameters(), lr=0.1))
    _, loss = model(torch.ones(2, 3, 8, 8), torch.tensor([0, 2]))
    print(repr(loss.item()))
    """
)


def _run(cache_dir, mode="train"):
    """(the loss printed, the log) of one process training one step (or the sum of one
    inference call's output)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache_dir), mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "POPART_LOG_LEVEL": "DEBUG"},
    )
    return done.stdout.strip().splitlines()[-1], done.stderr


def test_a_second_process_loads_the_torch_models_executable(tmp_path):
    first_loss, first_log = _run(tmp_path)
    assert "Saved serialized PopART executable" in first_log
    second_loss, second_log = _run(tmp_path)
    assert "Loading serialized PopART executable" in second_log
    assert "Starting compilation" not in second_log
    assert second_loss == first_loss


def test_a_second_process_loads_an_inference_models_executable(tmp_path):
    first, first_log = _run(tmp_path, "infer")
    assert "Saved serialized PopART executable" in first_log
    second, second_log = _run(tmp_path, "infer")
    assert "Loading serialized PopART executable" in second_log
    assert second == first
