"""MNIST for the tutorials, without downloads.

``get_mnist_data`` reads the standard MNIST IDX files (``train-images-idx3-ubyte`` etc.,
optionally gzipped) from ``data_dir``, or from ``$MNIST_DIR``, ``./data/mnist``,
``~/.torch/datasets/MNIST/raw`` or ``~/.keras/datasets``. When none is found it falls back
to the handwritten digits bundled with scikit-learn (1797 8×8 images), drawn into the
centre 20×20 of a 28×28 frame as in MNIST, so the same 784-input models run on them.
Images are normalised with MNIST's mean and standard deviation.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MEAN, STD = 0.1307, 0.3081
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
SEARCH_DIRS = ("data/mnist", "~/.torch/datasets/MNIST/raw", "~/.keras/datasets", "~/mnist")


@dataclass
class Batches:
    """Shuffled mini-batches of (images, labels); incomplete last batches are dropped."""

    images: np.ndarray
    labels: np.ndarray
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    source: str = "mnist"

    def __post_init__(self) -> None:
        self._epoch = 0

    def __len__(self) -> int:
        return len(self.labels) // self.batch_size

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order = np.arange(len(self.labels))
        if self.shuffle:
            np.random.default_rng(self.seed + self._epoch).shuffle(order)
        self._epoch += 1
        for i in range(len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self.images[idx], self.labels[idx]


def _find_idx_dir(data_dir: str | Path | None) -> Path | None:
    candidates = [data_dir] if data_dir else [os.environ.get("MNIST_DIR"), *SEARCH_DIRS]
    for candidate in candidates:
        if not candidate:
            continue
        path = Path(candidate).expanduser()
        if all(_idx_path(path, name) is not None for name in IDX_FILES.values()):
            return path
    if data_dir:
        raise FileNotFoundError(
            f"No MNIST IDX files in {data_dir}: expected {', '.join(IDX_FILES.values())} (optionally .gz)."
        )
    return None


def _idx_path(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.exists():
            return candidate
    return None


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (the MNIST format): magic, dimensions, then unsigned bytes."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _normalise(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0 - MEAN) / STD).astype(np.float32)


def load_idx(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    arrays = {k: read_idx(_idx_path(folder, v)) for k, v in IDX_FILES.items()}  # type: ignore[arg-type]
    return (
        _normalise(arrays["train_images"]),
        arrays["train_labels"].astype(np.int32),
        _normalise(arrays["test_images"]),
        arrays["test_labels"].astype(np.int32),
    )


def digits_as_mnist(test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, ...]:
    """scikit-learn's digits drawn at 28×28 like MNIST, split into train and test sets."""
    from sklearn.datasets import load_digits  # noqa: PLC0415 (optional dependency)

    digits = load_digits()
    small = digits.images / 16.0  # (n, 8, 8) in [0, 1]
    # Upsample 8x8 -> 20x20 by bilinear interpolation, then centre in 28x28 like MNIST.
    grid = np.linspace(0, 7, 20)
    lo = np.floor(grid).astype(int)
    hi = np.minimum(lo + 1, 7)
    w = grid - lo
    rows = small[:, lo, :] * (1 - w)[None, :, None] + small[:, hi, :] * w[None, :, None]
    big = rows[:, :, lo] * (1 - w)[None, None, :] + rows[:, :, hi] * w[None, None, :]
    images = np.zeros((len(small), 28, 28), np.float32)
    images[:, 4:24, 4:24] = big
    images = ((images - MEAN) / STD).astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return images[train], labels[train], images[test], labels[test]


def get_mnist_data(
    test_batch_size: int, batch_size: int, data_dir: str | Path | None = None, seed: int = 0
) -> tuple[Batches, Batches]:
    """Training and test batches of MNIST (or the bundled digits), with a note of which.

    Images are ``(batch, 28, 28)`` float32, labels ``(batch,)`` int32.
    """
    folder = _find_idx_dir(data_dir)
    if folder is not None:
        print(f"Using MNIST from {folder}")
        x_train, y_train, x_test, y_test = load_idx(folder)
        source = "mnist"
    else:
        print("MNIST IDX files not found: using scikit-learn's bundled handwritten digits at 28x28")
        x_train, y_train, x_test, y_test = digits_as_mnist(seed=seed)
        source = "digits"
    return (
        Batches(x_train, y_train, batch_size, shuffle=True, seed=seed, source=source),
        Batches(x_test, y_test, test_batch_size, shuffle=False, seed=seed, source=source),
    )


def default_epochs(data: Batches, mnist_epochs: int = 1, digits_epochs: int = 8) -> int:
    """Epochs for a full run: the bundled digits are ~40x smaller than MNIST, so they need
    more passes for the same number of steps."""
    return mnist_epochs if data.source == "mnist" else digits_epochs


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Percentage of rows whose argmax equals the label."""
    return float(np.mean(np.argmax(predictions, axis=-1).flatten() == labels.flatten()) * 100.0)


__all__ = ["get_mnist_data", "read_idx", "digits_as_mnist", "accuracy", "default_epochs", "Batches"]
