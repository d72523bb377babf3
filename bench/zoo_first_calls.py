"""Every zoo model's first call: ``poptorch`` against ``torch.compile``, both cold.

The models are the zoo tests' (``tests/poptorch/zoo``: torchvision, transformers and timm,
each at its smallest config, random weights), called as there: inference, and one SGD step
with the loss computed inside the model (dropout off). For each model, mode and side a fresh
interpreter builds the model and times its first call, then a few steady calls:

* ``poptorch``: ``inferenceModel`` / ``trainingModel``, with the first call's stages
  (capture, building the program, compiling, first run); JAX's persistent cache is off
  unless ``POPXL_CACHE_DIR`` is set, so the compile is cold;
* ``compile``: ``torch.compile`` of the same model; a training call is the forward, the
  backward and ``optimizer.step()``, so the first one compiles both graphs. Each worker gets
  an empty ``TORCHINDUCTOR_CACHE_DIR``: inductor's on-disk caches would otherwise make every
  run after the first a warm one.

Only first calls are compared; the steady figures (a median of ``--calls`` calls) are a
sanity check, not a speed measurement (``bench/poptorch_zoo.py`` times those). Nothing else
may run on the machine meanwhile; the table says the load.

``--against eager`` compares with eager torch instead (the model called as it is): a sweep
of every zoo model's steady speed against eager's, each side in its own process; give it
``--calls 5`` or more.

Run: python bench/zoo_first_calls.py [--families torchvision,transformers,timm]
     [--models resnet18,gpt2] [--modes infer,train] [--calls 3] [--timeout 900]
     [--against compile|eager]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import child_env, peak_rss_mb  # noqa: E402

FAMILIES = ("torchvision", "transformers", "timm")
AGAINST = {"compile": "torch.compile", "eager": "eager torch"}


def _names(family: str) -> list[str]:
    return list(_family_module(family).CASES)


def _family_module(family: str) -> Any:
    import importlib  # noqa: PLC0415

    return importlib.import_module(f"tests.poptorch.zoo.test_{family}")


def _case(family: str, name: str, mode: str) -> tuple[Any, tuple, dict, Callable[[Any], Any]]:
    """(model, args, kwargs, loss of an output) as the zoo test of ``family`` calls it."""
    import torch  # noqa: PLC0415

    from tests.poptorch.zoo._compare import without_dropout  # noqa: PLC0415

    module = _family_module(family)
    torch.manual_seed(0)
    if family == "transformers":
        case = module.CASES[name]
        model = case.build()
        if mode == "train" and case.marks_loss:
            model = module.MarkedLoss(model)
        kwargs = case.inputs()
        return without_dropout(model), (), kwargs, lambda out: out.loss
    if family == "torchvision":
        case = module.CASES[name]
        model = case.build()
        x, y = case.inputs()
    else:
        model, x = module._model(name)
        y = torch.randint(0, 10, (x.shape[0],))
    if mode == "train":
        return without_dropout(_with_loss(model)), (x, y), {}, lambda out: out[-1]
    return model, (x,), {}, lambda out: out


def _with_loss(model: Any) -> Any:
    from tests.poptorch.zoo.test_torchvision import WithLoss  # noqa: PLC0415

    return WithLoss(model)


def worker(family: str, name: str, mode: str, side: str, calls: int) -> dict:
    import torch  # noqa: PLC0415

    import poptorch  # noqa: PLC0415

    model, args, kwargs, loss_of = _case(family, name, mode)
    opts = poptorch.Options().showCompilationProgressBar(False)
    if mode == "infer":
        model.eval()
        if side == "poptorch":
            pm = poptorch.inferenceModel(model, opts)
            call: Callable[[], Any] = lambda: pm(*args, **kwargs)  # noqa: E731
        else:
            compiled = torch.compile(model) if side == "compile" else model

            def call() -> Any:
                with torch.no_grad():
                    return compiled(*args, **kwargs)
    else:
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        if side == "poptorch":
            pm = poptorch.trainingModel(model, opts, optimizer)
            call = lambda: pm(*args, **kwargs)  # noqa: E731
        else:
            compiled = torch.compile(model) if side == "compile" else model

            def call() -> Any:
                optimizer.zero_grad()
                loss = loss_of(compiled(*args, **kwargs))
                loss.backward()
                optimizer.step()
                return loss

    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    steady = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        steady.append(time.perf_counter() - start)
    result: dict[str, Any] = {
        "first_s": first,
        "steady_ms": statistics.median(steady) * 1e3 if steady else None,
        "peak_mb": peak_rss_mb(),
    }
    if side == "poptorch":
        result["stages_s"] = dict(getattr(pm, "_first_call_seconds", {}) or {})
    return result


def _run(family: str, name: str, mode: str, side: str, calls: int, timeout: float) -> dict:
    """The worker in a fresh interpreter with an empty inductor cache; ``{"error": ...}``
    when it fails or runs past ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="zoo-first-call-") as cache:
        env = child_env(TORCHINDUCTOR_CACHE_DIR=cache)
        command = [sys.executable, __file__, "--calls", str(calls)]
        command += ["--worker", family, name, mode, side]
        try:
            out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"over {timeout:.0f} s"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:120]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cell(result: dict, key: str, fmt: str) -> str:
    value = result.get(key)
    return result.get("error", "-") if value is None else format(value, fmt)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--models", default="", help="names within the families (default all)")
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--against", choices=sorted(AGAINST), default="compile")
    parser.add_argument("--worker", nargs=4, metavar=("FAMILY", "MODEL", "MODE", "SIDE"))
    args = parser.parse_args()
    if args.worker:
        family, name, mode, side = args.worker
        print(json.dumps(worker(family, name, mode, side, args.calls)))
        return
    wanted = set(filter(None, args.models.split(",")))
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average) at {time.strftime('%H:%M')} UTC")
    other = AGAINST[args.against]
    print(
        f"| family | model | mode | poptorch first s | stages s | {other} first s "
        f"| {args.against} / poptorch first | steady ms poptorch / {args.against} "
        f"| steady speed x {args.against} |"
    )
    print("|" + "---|" * 9, flush=True)
    for family in args.families.split(","):
        for name in _names(family):
            if wanted and name not in wanted:
                continue
            for mode in args.modes.split(","):
                ours, theirs = (
                    _run(family, name, mode, side, args.calls, args.timeout)
                    for side in ("poptorch", args.against)
                )
                stages = ", ".join(f"{k} {v:.1f}" for k, v in ours.get("stages_s", {}).items())
                steady = f"{_cell(ours, 'steady_ms', '.1f')} / {_cell(theirs, 'steady_ms', '.1f')}"
                print(
                    f"| {family} | {name} | {mode} | {_cell(ours, 'first_s', '.1f')} | "
                    f"{stages or '-'} | {_cell(theirs, 'first_s', '.1f')} | "
                    f"{_ratio(theirs, ours, 'first_s')} | {steady} | "
                    f"{_ratio(theirs, ours, 'steady_ms')} |",
                    flush=True,
                )
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average) at {time.strftime('%H:%M')} UTC")


def _ratio(theirs: dict, ours: dict, key: str) -> str:
    a, b = theirs.get(key), ours.get(key)
    return f"{a / b:.2f}" if a and b else "-"


if __name__ == "__main__":
    main()
