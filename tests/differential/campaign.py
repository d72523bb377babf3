"""The differential-testing campaign: many random programs, each feature in turn.

    python -m tests.differential.campaign --seconds 600 --seed 1 [--features call repeat]

Programs are generated from consecutive seeds, grouped by replication factor, micro-batch
count and placement into batches that share one session (one compile), and compared with
the reference. Every disagreement is shrunk and printed; the summary gives the programs
run and the disagreements per feature set.

Throughput: nearly all the time is the session tracing and XLA-compiling each batch (the
reference takes about a tenth). Op-by-op dispatch (``jax.disable_jit``) measured 15x
slower, larger batches gain nothing (trace and compile grow with the op count), and a
persistent compilation cache cannot hit (no two programs are alike). Placed programs
(several IPUs) compile 3-5x slower, so they are batched apart and mixed sets place only
15% of their programs.
"""

from __future__ import annotations

import os

# Eight CPU devices for replication; cheap XLA optimisation, since each program runs once.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true",
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

from .generator import FEATURES, generate  # noqa: E402
from .runner import Outcome, batches, check, check_batch  # noqa: E402
from .shrink import describe, shrink  # noqa: E402

# Each feature alone (with the core ops), then everything together.
FEATURE_SETS = [(f,) for f in FEATURES if f != "core"] + [tuple(FEATURES)]
BATCH = 16


def feature_set(index: int, chosen: tuple[str, ...] | None) -> tuple[str, ...]:
    return chosen if chosen else FEATURE_SETS[index % len(FEATURE_SETS)]


def run(seconds: float, seed: int, chosen: tuple[str, ...] | None, out=sys.stdout) -> dict:  # noqa: ANN001
    start, cpu = time.monotonic(), time.process_time()
    counts: Counter[str] = Counter()
    found: Counter[str] = Counter()
    failures: list[dict] = []
    index = 0
    while time.monotonic() - start < seconds:
        batch = []
        for _ in range(BATCH * 4):
            features = feature_set(index, chosen)
            batch.append(generate(seed * 1_000_003 + index, features))
            counts["+".join(features)] += 1
            index += 1
        for group in batches(batch, BATCH):
            for outcome in check_batch(group):
                failures.append(report(outcome, out))
                found["+".join(outcome.program.features)] += 1
        print(f"{time.monotonic() - start:7.0f}s {index} programs, {len(failures)} disagreements",
              file=out, flush=True)  # fmt: skip
    summary = {
        "seed": seed,
        "programs": index,
        "per_feature_set": dict(counts),
        "disagreements": len(failures),
        "disagreements_per_feature_set": dict(found),
        "seconds": round(time.monotonic() - start),
        "cpu_seconds": round(time.process_time() - cpu),
    }
    print(json.dumps(summary, indent=1), file=out, flush=True)
    return {"summary": summary, "failures": failures}


def report(outcome: Outcome, out) -> dict:  # noqa: ANN001
    """Shrink a disagreement, print it, and return it as a record."""
    text = describe(shrink(outcome, check))
    seed = outcome.program.seed
    print(f"DISAGREEMENT (program seed {seed})\n{text}\n", file=out, flush=True)
    return {"seed": seed, "report": text, "features": outcome.program.features}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--features", nargs="*", choices=FEATURES, default=None)
    args = parser.parse_args(argv)
    result = run(args.seconds, args.seed, tuple(args.features) if args.features else None)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
