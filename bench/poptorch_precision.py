"""Float16 against float32 through ``poptorch`` and in eager torch, on the CPU (issue 38, item 2).

Models, each trained one step per call:

* ``cnn``: the network of Graphcore's mixed-precision tutorial (``CustomModel``: convolutions
  of 1->5 and 5->12 channels, a max pool, a group norm, a 41,772->100 linear), batch 12 of
  128x128 images, ``poptorch.optim.AdamW`` as the tutorial sets it: in float16 the model and
  data halved, float16 accumulators, loss scaling 1024 and stochastic rounding; in float32
  none of these;
* ``transformer``: ``poptorch_models.Encoder(12)`` (d_model 128, 4 heads), batch 8 of 64
  tokens, ``torch.optim.SGD`` on the mean square against a target, the model halved for float16.

Eager torch runs the same models and optimizers (``torch.optim.AdamW``; float16 eager
training on the CPU is what torch offers, not what it recommends). Each side runs in its own
process, sides alternate over ``--rounds`` rounds, and the figures are medians of the per-run
medians. bfloat16 is not a side: ``poptorch`` refuses bfloat16 models as PopTorch did.

Run: python bench/poptorch_precision.py [--models cnn,transformer] [--rounds 2] [--calls 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import first_and_median, run_variant  # noqa: E402

SIDES = ("poptorch float32", "poptorch float16", "eager float32", "eager float16")


def _tutorial_cnn() -> Any:
    import torch  # noqa: PLC0415

    class CustomModel(torch.nn.Module):
        """The mixed-precision tutorial's model (its loss computed inside, in training)."""

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 5, 3)
            self.pool = torch.nn.MaxPool2d(2, 2)
            self.conv2 = torch.nn.Conv2d(5, 12, 5)
            self.norm = torch.nn.GroupNorm(3, 12)
            self.fc1 = torch.nn.Linear(41772, 100)
            self.relu = torch.nn.ReLU()
            self.fc2 = torch.nn.Linear(100, 10)
            self.log_softmax = torch.nn.LogSoftmax(dim=0)
            self.loss = torch.nn.NLLLoss()

        def forward(self, x: Any, labels: Any = None) -> Any:
            x = self.pool(self.relu(self.conv1(x)))
            x = self.norm(self.relu(self.conv2(x)))
            x = self.log_softmax(self.fc2(self.relu(self.fc1(torch.flatten(x, start_dim=1)))))
            return (x, self.loss(x, labels)) if self.training else x

    return CustomModel()


def _eager_step(model: Any, optimizer: Any, *inputs: Any) -> Any:
    """One eager training step of ``model``, which returns ``(output, loss)``."""

    def step() -> Any:
        optimizer.zero_grad()
        _, loss = model(*inputs)
        loss.backward()
        optimizer.step()
        return loss

    return step


def _cnn_call(side: str) -> Any:
    import torch  # noqa: PLC0415

    import poptorch  # noqa: PLC0415

    half = side.endswith("float16")
    model = _tutorial_cnn()
    x = torch.randn(12, 1, 128, 128)
    labels = torch.randint(0, 10, (12,))
    if half:
        model, x = model.half(), x.half()
    if side.startswith("eager"):
        return _eager_step(model, torch.optim.AdamW(model.parameters(), lr=0.001), x, labels)
    accum, scaling = (torch.float16, 1024) if half else (torch.float32, None)
    optimizer = poptorch.optim.AdamW(
        model.parameters(), lr=0.001, accum_type=accum, loss_scaling=scaling
    )
    opts = poptorch.Options().showCompilationProgressBar(False)
    opts.Precision.enableStochasticRounding(half)
    opts.Precision.setPartialsType(torch.float)
    pm = poptorch.trainingModel(model, opts, optimizer)
    return lambda: pm(x, labels)


def _transformer_call(side: str) -> Any:
    import torch  # noqa: PLC0415

    import poptorch  # noqa: PLC0415
    from bench.poptorch_models import Encoder, WithLoss  # noqa: PLC0415

    model = WithLoss(Encoder(12))
    x, target = torch.randn(8, 64, 128), torch.randn(8, 64, 128)
    if side.endswith("float16"):
        model, x, target = model.half(), x.half(), target.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if side.startswith("eager"):
        return _eager_step(model, optimizer, x, target)
    opts = poptorch.Options().showCompilationProgressBar(False)
    pm = poptorch.trainingModel(model, opts, optimizer)
    return lambda: pm(x, target)


MODELS = {"cnn": _cnn_call, "transformer": _transformer_call}


def worker(name: str, side: str, calls: int) -> dict:
    import torch  # noqa: PLC0415

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    first, steady = first_and_median(MODELS[name](side), calls)
    return {"first_s": first, "steady_ms": steady}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="cnn,transformer")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "SIDE"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.calls)))
        return
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average)")
    script = os.path.abspath(__file__)
    models, sides = args.models.split(","), args.sides.split(",")
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name in models:
            for side in sides:
                got = run_variant(script, "--calls", str(args.calls), "--worker", name, side)
                runs.setdefault((name, side), []).append(got["steady_ms"])
    print("| model | side | steady ms (per run) | x poptorch float32's time |")
    print("|---|---|---|---|")
    for name in models:
        base = statistics.median(runs[(name, sides[0])])
        for side in sides:
            times = runs[(name, side)]
            ms = statistics.median(times)
            shown = ", ".join(f"{t:.1f}" for t in times)
            print(f"| {name} | {side} | {ms:.1f} ({shown}) | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
