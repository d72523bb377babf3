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
    # inference first: its convolution's weight laid out once (runtime.lowering.hoisting)
    x = torch.linspace(-1, 1, 2 * 3 * 8 * 8).reshape(2, 3, 8, 8)
    inference = poptorch.inferenceModel(net.eval(), opts)
    out = inference(x)
    torch.testing.assert_close(out, net(x).detach(), rtol=1e-5, atol=1e-6)
    inference.destroy()
    print(repr(out.sum().item()))
    model = poptorch.trainingModel(WithLoss(), opts, torch.optim.SGD(net.parameters(), lr=0.1))
    _, loss = model(torch.ones(2, 3, 8, 8), torch.tensor([0, 2]))
    print(repr(loss.item()))
    """
)


def _run(cache_dir):
    """(the inference output's sum and the training step's loss, as printed; the log) of one
    process running an inference model and then a training model, both cached in
    ``cache_dir``."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache_dir)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "POPART_LOG_LEVEL": "DEBUG"},
    )
    return done.stdout.strip().splitlines()[-2:], done.stderr


def test_a_second_process_loads_the_inference_and_training_executables(tmp_path):
    """One pair of processes for both models (each process start imports torch and JAX)."""
    first, first_log = _run(tmp_path)
    assert first_log.count("Saved serialized PopART executable") == 2
    second, second_log = _run(tmp_path)
    assert second_log.count("Loading serialized PopART executable") == 2
    assert "Starting compilation" not in second_log
    assert second == first
