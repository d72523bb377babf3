"""Checkpoints that PopTorch-era training scripts wrote load under today's ``torch.load``.

PopTorch ran on torch 2.0, whose ``torch.load`` unpickled anything; since torch 2.6 it
defaults to ``weights_only=True`` and refuses every class not on its allowlist. Training
scripts written for PopTorch commonly store their command line, an ``argparse.Namespace``,
beside the weights (``torch.save({"model_state_dict": ..., "args": args}, path)``) and read
the file back with a plain ``torch.load(path)``, which now fails with ``Unsupported global:
GLOBAL argparse.Namespace``.

Importing ``poptorch`` therefore allowlists ``argparse.Namespace`` (torch's own suggested
remedy, ``torch.serialization.add_safe_globals``). Unpickling a ``Namespace`` only sets
attributes, each of which the weights-only unpickler still checks, so nothing beyond plain
data can load through it. No other class is added.
"""

from __future__ import annotations

import argparse

import torch

# The classes PopTorch-era checkpoints carry besides tensors and builtin containers.
SCRIPT_CHECKPOINT_CLASSES: tuple[type, ...] = (argparse.Namespace,)


def allow_script_checkpoint_classes() -> None:
    """Allowlist ``SCRIPT_CHECKPOINT_CLASSES`` for ``torch.load(..., weights_only=True)``."""
    serialization = torch.serialization
    if hasattr(serialization, "add_safe_globals"):  # torch >= 2.4
        serialization.add_safe_globals(list(SCRIPT_CHECKPOINT_CLASSES))
