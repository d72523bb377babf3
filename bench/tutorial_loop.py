"""Tutorial 1's training loop as a user runs it, vs ``session.run`` alone and the MNIST step.

Four loops, timed in this process in alternating rounds (iterations per second, higher is
better):

* **tutorial loop**: ``train()`` from ``tutorials/1_basic_concepts/mnist.py`` unchanged:
  batches from ``tutorials.mnist_data``, a dict of inputs per step, ``session.run``, the
  loss read back as a float, the tqdm progress bar (written to ``os.devnull``, so the
  terminal's speed does not count);
* **session.run alone**: the same session, one fixed batch, ``session.run`` and nothing else;
* **mnist_step (1 step per run)**: ``bench/mnist_step.py``'s project step, loss read each step;
* **hand-written JAX step**: ``bench/mnist_step.py``'s reference step.

Targets: tutorial loop >= 0.9 x mnist_step's figure, within 10% of session.run alone, and
>= 1.3 x the IPU's 307 it/s recorded in the seed tutorial.

Run: python bench/tutorial_loop.py [--steps 500] [--rounds 7]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import mnist_step  # noqa: E402
from bench._common import device_name, report, set_matmul_precision  # noqa: E402

IPU_IT_PER_S = 307


def load_tutorial():
    path = os.path.join(ROOT, "tutorials", "1_basic_concepts", "mnist.py")
    spec = importlib.util.spec_from_file_location("tutorial1_mnist", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loops(steps: int):
    """(name, function running ``steps`` iterations) for each loop; the sessions to enter."""
    from tutorials.mnist_data import Batches, get_mnist_data

    tutorial = load_tutorial()
    np.random.seed(42)
    with contextlib.redirect_stdout(io.StringIO()):
        train_data, _ = get_mnist_data(80, 8)
    data = Batches(train_data.images[: steps * 8], train_data.labels[: steps * 8], 8)
    session, streams, _, loss_stream = tutorial.train_program(8, "ipu_hw", 0.05)
    images, labels = next(iter(data))
    fixed = dict(zip(streams, [images, labels]))
    devnull = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the benchmark)

    def tutorial_loop():
        with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
            tutorial.train(session, streams, loss_stream, data, 1)

    def run_alone():
        for _ in range(steps):
            session.run(fixed)

    step_session, step = mnist_step.project_runner("step")
    reference = mnist_step.reference_runner("step")

    def bench_step():
        for _ in range(steps):
            step()

    def reference_step():
        for _ in range(steps):
            reference()

    named = [
        ("tutorial loop", tutorial_loop),
        ("session.run alone", run_alone),
        ("mnist_step (1 step per run)", bench_step),
        ("hand-written JAX step", reference_step),
    ]
    return named, [session, step_session]


def measure(steps: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """(iterations per second, CPU microseconds of this process per iteration) of each
    loop, the best of ``rounds`` alternating rounds. The CPU time (every thread of this
    process) is what other processes on a loaded machine disturb least."""
    named, sessions = loops(steps)
    best = {name: float("inf") for name, _ in named}
    cpu = dict(best)
    with contextlib.ExitStack() as stack:
        for s in sessions:
            stack.enter_context(s)
        for _, fn in named:
            fn()  # warm-up
        for _ in range(rounds):
            for name, fn in named:
                start, start_cpu = time.perf_counter(), time.process_time()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
                cpu[name] = min(cpu[name], time.process_time() - start_cpu)
    rates = {name: steps / seconds for name, seconds in best.items()}
    return rates, {name: seconds / steps * 1e6 for name, seconds in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=500, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    rates, cpu = measure(args.steps, args.rounds)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    loop = rates["tutorial loop"]
    print(f"device: {device_name()}; iterations per second, best of {args.rounds} rounds")
    report([
        ("tutorial loop vs session.run alone (it/s)", loop, rates["session.run alone"], "/s"),
        ("tutorial loop vs mnist_step 1/run (it/s)", loop, rates["mnist_step (1 step per run)"], "/s"),
        ("tutorial loop vs hand-written JAX (it/s)", loop, rates["hand-written JAX step"], "/s"),
        ("tutorial loop vs IPU (it/s)", loop, IPU_IT_PER_S, "/s"),
    ])  # fmt: skip
    print("CPU time of this process per iteration (us), best round:")
    for name, us in cpu.items():
        print(f"  {name:30s} {us:8.1f}")


if __name__ == "__main__":
    set_matmul_precision()
    main()
