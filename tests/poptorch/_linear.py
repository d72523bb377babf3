"""A linear least-squares model with a NumPy gradient, shared by the poptorch tests."""

from __future__ import annotations

import numpy as np

import poptorch
import popxl
import popxl_addons as addons

IN, OUT = 4, 3


def initial_w() -> np.ndarray:
    return np.linspace(-0.5, 0.6, IN * OUT, dtype=np.float32).reshape(IN, OUT)


class Linear(addons.Module):
    """``y = x @ w``; returns ``(y, mean((y - t)^2))``."""

    def build(self, x: popxl.Tensor, t: popxl.Tensor):
        w = self.add_variable_input("w", initial_w, x.dtype)
        y = x @ w
        d = y - t
        return y, poptorch.identity_loss(d * d, "mean")


def grad(w: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """d mean((x w - t)^2) / dw."""
    return x.T @ (2 * (x @ w - t) / (x.shape[0] * w.shape[1]))


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n, IN)).astype(np.float32),
        rng.normal(size=(n, OUT)).astype(np.float32),
    )
