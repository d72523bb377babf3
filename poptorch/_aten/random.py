"""Random sampling with PopTorch's seed semantics (Options.randomSeed): rand, randn, bernoulli, dropout, normal, uniform, randint."""

from __future__ import annotations
