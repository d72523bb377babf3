"""Random ops, checked by distribution and by seed determinism rather than by value.

A random program applies one random op (from ``RANDOM_OPS``: the source and the mean and
variance of what it draws) to a large input. poptorch runs it twice with one
``Options().randomSeed`` and once with another: the first two must be equal, the third
different, and the sample's mean and variance must lie within six standard errors of
the distribution's (a false alarm about once in a few hundred million programs).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

import poptorch

from .program import Input, Mode, Program, Spec, make_inputs, module_class
from .runner import Outcome

# (expression of ``x``, mean, variance, trains: run as a trainingModel, where dropout is on)
RANDOM_OPS = [
    ("torch.rand_like(x)", 0.5, 1 / 12, False),
    ("torch.randn_like(x)", 0.0, 1.0, False),
    ("torch.bernoulli(torch.full_like(x, 0.3))", 0.3, 0.21, False),
    ("torch.empty_like(x).uniform_(-2.0, 2.0)", 0.0, 16 / 12, False),
    ("torch.empty_like(x).normal_(1.0, 0.5)", 1.0, 0.25, False),
    ("torch.rand(x.shape) * 2 + x * 0", 1.0, 4 / 12, False),
    ("torch.normal(torch.zeros_like(x), 2.0)", 0.0, 4.0, False),
    ("F.dropout(torch.ones_like(x), 0.25, training=True)", 1.0, 1 / 3, True),
    ("torch.nn.functional.dropout(x * 0 + 2, 0.5)", 2.0, 4.0, True),
]
SAMPLE = (2, 32, 64)


@dataclass
class RandomCase:
    expr: str
    mean: float
    var: float
    trains: bool
    seed: int

    def program(self) -> Program:
        mode = (
            Mode(kind="training", optimizer="torch.optim.SGD(params, lr=0.0)")
            if self.trains
            else Mode()
        )
        stmts_source = _SOURCE.format(expr=self.expr)
        return Program(self.seed, ("random",), [Input("x", Spec(SAMPLE, "float32"))], [], [], [],
                       mode=mode, raw=stmts_source, families=("creation",))  # fmt: skip


_SOURCE = """
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
    def forward(self, x):
        y = {expr}
        return y, poptorch.identity_loss((x * self.w).mean(), reduction="mean")
"""


def generate_random(seed: int) -> RandomCase:
    expr, mean, var, trains = random.Random(seed).choice(RANDOM_OPS)
    return RandomCase(expr, mean, var, trains, seed)


def _draw(case: RandomCase, random_seed: int) -> torch.Tensor:
    program = case.program()
    torch.manual_seed(case.seed)
    model = module_class(program.source())().train(case.trains)
    opts = poptorch.Options().randomSeed(random_seed)
    if case.trains:
        pm = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.0))
    else:
        pm = poptorch.inferenceModel(model, opts)
    out = pm(*make_inputs(program))[0].detach().clone()
    pm.destroy()
    return out


def check_random(case: RandomCase) -> Outcome | None:
    """Determinism under one seed, change under another, and the first two moments."""
    first, again, other = (_draw(case, s) for s in (case.seed, case.seed, case.seed + 1))
    problem = None
    if not torch.equal(first, again):
        problem = "two runs with the same randomSeed differ"
    elif torch.equal(first, other):
        problem = "runs with different randomSeeds are equal"
    else:
        problem = _moments(first.double().flatten(), case)
    return None if problem is None else Outcome(case.program(), f"random op {case.expr}: {problem}")


def _moments(sample: torch.Tensor, case: RandomCase) -> str | None:
    n = sample.numel()
    mean, var = float(sample.mean()), float(sample.var())
    if abs(mean - case.mean) > 6 * math.sqrt(case.var / n):
        return f"mean {mean:.4f}, expected {case.mean:.4f} (n={n})"
    # The standard error of a sample variance is sqrt((mu4 - var^2) / n); mu4 - var^2 is at
    # most 3 var^2 for every distribution in the table.
    if abs(var - case.var) > 6 * math.sqrt(3 * case.var**2 / n) + 1e-9:
        return f"variance {var:.4f}, expected {case.var:.4f} (n={n})"
    return None
