"""Where a compiled step's time goes: XLA:CPU's kernel time by kind, from `jax.profiler` traces.

On a shared 2-core host the wall time of one compiled step drifts by half within minutes
(the encoder's step: kernels summing to 117-165 ms in one evening), more than most changes
move it. Summed by kind (`dot`, `dynamic-slice_bitcast_fusion`, `copy_bitcast_fusion`...;
a fusion's number stripped from its name), a trace says which kernels a change removed or
added, and the kinds it should not touch (the products) show how far the host moved
meanwhile.

    python bench/kernel_profile.py                      # the 12-layer encoder's SGD step
    python bench/kernel_profile.py --model resnet18 --mode infer --by-name

`--model` is `encoder` (`bench/poptorch_models.py`'s) or a model of `bench/poptorch_zoo.py`.
Each of `--rounds` traces records `--steps` calls; the table gives milliseconds and kernels
per call, averaged over all of them.

A kernel's event covers only its launch where XLA hands the work to its thread pool
(Eigen's products, some loop fusions): the `ms` column undercounts those. XLA marks their
completion with an `end: <kernel>` event; the `to end` column is the time from each
kernel's start to that mark, which also counts any wait for a free thread, so it
overcounts where kernels run side by side, and the two columns bracket a kernel's cost.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Host-side events around the kernels (dispatch, the executor, its thread pool's waits, the
# markers YNNPACK leaves at a fusion's end): counted, they would count time twice.
NOT_KERNELS = (
    "$",
    "end: ",
    "PjitFunction",
    "ThunkExecutor",
    "SlinkyThreadPool",
    "ThreadpoolListener",
    "CommonPjRt",
    "DevicePut",
    "ParseArguments",
    "AllocateOutputBuffers",
    "PythonRefManager",
    "Wait for",
)
_NUMBERED = re.compile(r"[.\d]+$")


def kernel_table(
    events: Iterable[dict], calls: int, by_name: bool = False
) -> list[tuple[str, float, float]]:
    """``(kind, ms per call, kernels per call)`` from a trace's complete events, longest
    first. A kind is a kernel's name without its trailing number (``dot.12`` is a
    ``dot``) unless ``by_name``; Python frames and the host's events around the kernels
    (``NOT_KERNELS``) are left out."""
    time: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.defaultdict(int)
    for e in events:
        name = e["name"]
        if e.get("ph") != "X" or name.startswith(NOT_KERNELS):
            continue
        key = name if by_name else _NUMBERED.sub("", name)
        time[key] += e.get("dur", 0.0)
        count[key] += 1
    rows = [(k, time[k] / calls / 1e3, count[k] / calls) for k in time]
    return sorted(rows, key=lambda r: -r[1])


def completion_times(events: Iterable[dict], calls: int, by_name: bool = False) -> dict[str, float]:
    """Per kind (as ``kernel_table``), milliseconds per call from each kernel's start to
    the ``end: <kernel>`` mark XLA leaves when its work is done, for the kernels that have
    one; each mark closes the earliest open kernel of its name."""
    open_starts: dict[str, list[float]] = collections.defaultdict(list)
    time: dict[str, float] = collections.defaultdict(float)
    for e in sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"]):
        name = e["name"]
        if name.startswith("end: "):
            kernel = name[len("end: ") :]
            if open_starts[kernel]:
                start = open_starts[kernel].pop(0)
                key = kernel if by_name else _NUMBERED.sub("", kernel)
                time[key] += e["ts"] + e.get("dur", 0.0) - start
        elif not name.startswith(NOT_KERNELS):
            open_starts[name].append(e["ts"])
    return {k: t / calls / 1e3 for k, t in time.items()}


def traced_events(step: Callable[[], Any], calls: int) -> list[dict]:
    """The complete events of a `jax.profiler` trace of ``calls`` calls of ``step``."""
    import jax

    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(calls):
                step()
        (path,) = glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def build_step(model: str, mode: str, batch: int, size: int) -> Callable[[], Any]:
    """One call of ``model`` through `poptorch`, compiled and called once already."""
    import torch

    import poptorch

    torch.manual_seed(0)
    if model == "encoder":
        from bench.poptorch_models import Encoder, WithLoss

        x, target = torch.randn(8, 64, 128), torch.randn(8, 64, 128)
        net = WithLoss(Encoder(12))
        inputs: tuple = (x, target)
        if mode == "train":
            wrapped = poptorch.trainingModel(
                net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01)
            )
        else:
            wrapped = poptorch.inferenceModel(net.eval())
    else:
        from bench.poptorch_zoo import MODELS, _Trained

        built, inputs, labels = MODELS[model](batch, size)
        opts = poptorch.Options().showCompilationProgressBar(False)
        if mode == "train":
            trained = _Trained(built, labels)
            trained.train()
            sgd = torch.optim.SGD(trained.parameters(), lr=0.01)
            wrapped = poptorch.trainingModel(trained, opts, sgd)
        else:
            wrapped = poptorch.inferenceModel(built.eval(), opts)
    wrapped(*inputs)
    return lambda: wrapped(*inputs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="encoder", help="encoder, or a poptorch_zoo model")
    parser.add_argument("--mode", choices=("train", "infer"), default="train")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="image side for the zoo's models")
    parser.add_argument("--steps", type=int, default=10, help="calls per trace")
    parser.add_argument("--rounds", type=int, default=3, help="traces")
    parser.add_argument("--top", type=int, default=25, help="rows shown")
    parser.add_argument("--by-name", action="store_true", help="each kernel, not each kind")
    args = parser.parse_args(argv)
    step = build_step(args.model, args.mode, args.batch, args.size)
    for _ in range(3):
        step()
    events = [e for _ in range(args.rounds) for e in traced_events(step, args.steps)]
    calls = args.steps * args.rounds
    rows = kernel_table(events, calls, args.by_name)
    to_end = completion_times(events, calls, args.by_name)
    print(f"{args.model} {args.mode}: kernel time per call ({args.rounds} x {args.steps} calls)")
    print("| kernel | ms | to end ms | kernels |\n|---|---|---|---|")
    print(f"| all | {sum(r[1] for r in rows):.2f} | - | {sum(r[2] for r in rows):g} |")
    for name, ms, n in rows[: args.top]:
        end = f"{to_end[name]:.2f}" if name in to_end else "-"
        print(f"| {name} | {ms:.2f} | {end} | {n:g} |")


if __name__ == "__main__":
    main()
