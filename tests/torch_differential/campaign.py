"""The torch differential campaign: random torch programs through poptorch, feature by feature.

    python -m tests.torch_differential.campaign --seconds 300 --seed 1 [--features conv]

Programs come from consecutive seeds, rotating over the feature sets (each feature with
the core ops, some combinations, all of them, and the random ops). Each runs through poptorch and through eager
torch; a disagreement is shrunk and printed as a standalone pytest case, a refusal is
counted with its reason (apart, one the generator makes on purpose: ``EXPECTED_REFUSALS``),
and a known fault (one kept in ``found_faults.py``) is counted apart. The summary gives
programs, disagreements and refusals per feature set.
"""

from __future__ import annotations

import os

# Eight CPU devices for replication; cheap XLA optimisation, since each program runs once,
# but XLA's default backend optimisation level: at level 0, LLVM contracts a multiply and an
# add into an FMA in some of the kernels XLA copies a value into and not in others, so copies
# of one value differ in the last bit (program 7300021974), which no user's program sees.
XLA_FLAGS = "--xla_force_host_platform_device_count=8 --xla_llvm_disable_expensive_passes=true"
os.environ.setdefault("XLA_FLAGS", XLA_FLAGS)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

from .generator import FEATURES, generate  # noqa: E402
from .random_ops import check_random, generate_random  # noqa: E402
from .runner import IllConditioned, Outcome, Refusal, check  # noqa: E402
from .shrink import as_pytest, shrink  # noqa: E402

# Each feature alone (with the core ops), pairs where features interact (state and
# call modes, training of each nn family), everything together, and the random ops.
PAIRS = [
    ("structure", "modes"),
    ("control", "modes"),
    ("norm", "training", "modes"),
    ("conv", "training"),
    ("index", "training"),
    ("lowp", "training"),
    ("loss", "optim"),
    ("attention", "rnn", "embedding", "training"),
]
FEATURE_SETS = [(f,) for f in FEATURES if f != "core"] + PAIRS + [FEATURES, ("random",)]
# Refusals the generator makes on purpose, to check that poptorch refuses them properly, by
# what was refused and the words its message has: counted apart from the other refusals,
# which are listed with a program seed each (one may be poptorch's fault).
EXPECTED_REFUSALS = {
    "bfloat16 (the IPU has none)": ("has dtype torch.bfloat16",),
    "an optimiser PopTorch lacks": (
        "Unsupported optimizer type",
        "(amsgrad=True) is not supported",
    ),
    "a value-dependent shape": (
        "aten.nonzero.",
        "aten.masked_select.",
        "aten._unique2.",
        "MaskedIndexError",
        # torch.export stops first where an op reads such a size (8400026528: logsumexp of
        # torch.unique's result); poptorch's error then says what to change
        "Could not guard on data-dependent expression",
    ),
}


def set_name(features: tuple[str, ...]) -> str:
    if features == ("random",):
        return "random"
    return "all" if len(features) > 5 else "+".join(f for f in features if f != "core") or "core"


def expected_refusal(reason: str) -> str | None:
    """What the generator refused on purpose in a refusal's ``reason``, if it did
    (``EXPECTED_REFUSALS``)."""
    for what, words in EXPECTED_REFUSALS.items():
        if any(w in reason for w in words):
            return what
    return None


def program_seed(seed: int, index: int) -> int:
    return seed * 1_000_003 + index


def run(seconds: float, seed: int, chosen: tuple[str, ...] | None, out=sys.stdout) -> dict:  # noqa: ANN001
    start = time.monotonic()
    counts: Counter[str] = Counter()
    found: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    expected: Counter[str] = Counter()  # refusals the generator made on purpose
    known: Counter[str] = Counter()
    ill: Counter[str] = Counter()  # disagreements float32 rounding decides (runner.check)
    examples: dict[str, int] = {}  # a program seed per refusal reason
    failures: list[dict] = []
    index = 0
    while time.monotonic() - start < seconds:
        features = chosen or FEATURE_SETS[index % len(FEATURE_SETS)]
        name = set_name(features)
        try:
            result = run_one(program_seed(seed, index), features)
        except KeyboardInterrupt:  # stopped early (Ctrl-C, SIGINT): summarise what ran
            break
        counts[name] += 1
        index += 1
        if isinstance(result, Refusal):
            refused[name] += 1
            purpose = expected_refusal(result.reason)
            if purpose:
                expected[purpose] += 1
            else:
                reason = result.reason.splitlines()[0][:120]
                reasons[reason] += 1
                examples.setdefault(reason, program_seed(seed, index - 1))
        elif isinstance(result, IllConditioned):
            ill[name] += 1
        elif isinstance(result, Outcome) and result.message.startswith("known fault"):
            known[result.message.split(":", 1)[0]] += 1
        elif isinstance(result, Outcome):
            found[name] += 1
            failures.append(report(result, out))
        if index % 25 == 0:
            print(f"{time.monotonic() - start:6.0f}s {index} programs, {len(failures)} "
                  f"disagreements, {sum(refused.values())} refusals", file=out, flush=True)  # fmt: skip
    summary = {
        "seed": seed,
        "programs": index,
        "per_feature_set": dict(counts),
        "disagreements": len(failures),
        "disagreements_per_feature_set": dict(found),
        "refusals_per_feature_set": dict(refused),
        "expected_refusals": dict(expected),
        "other_refusal_reasons": {r: [n, examples[r]] for r, n in reasons.most_common(12)},
        "known_faults": dict(known),
        "ill_conditioned_per_feature_set": dict(ill),
        "seconds": round(time.monotonic() - start),
    }
    print(json.dumps(summary, indent=1), file=out, flush=True)
    return {"summary": summary, "failures": failures}


def run_one(seed: int, features: tuple[str, ...]) -> Outcome | Refusal | None:
    """Generate and check the program of ``seed``."""
    if features == ("random",):
        return check_random(generate_random(seed))
    return check(generate(seed, features))


def report(outcome: Outcome, out) -> dict:  # noqa: ANN001
    """Shrink a disagreement, print it as a pytest case, and return it as a record."""
    small = shrink(outcome, check) if "random" not in outcome.program.features else outcome
    text = as_pytest(small)
    seed = outcome.program.seed
    print(f"DISAGREEMENT (program seed {seed})\n{text}\n", file=out, flush=True)
    return {"seed": seed, "report": text, "features": outcome.program.features}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--features", nargs="*", choices=(*FEATURES, "random"), default=None)
    args = parser.parse_args(argv)
    result = run(args.seconds, args.seed, tuple(args.features) if args.features else None)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
