"""Cases for ``poptorch/aten/pool.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.ops import aten

from .harness import Case


def _randn(*shape: int):
    return lambda: (torch.randn(*shape),)


def _idx(*shape: int, high: int = 10):
    return torch.randint(0, high, shape)


MAX2 = aten.max_pool2d_with_indices.default
MAX3 = aten.max_pool3d_with_indices.default
AVG2 = aten.avg_pool2d.default
AVG3 = aten.avg_pool3d.default

_POOLS = [
    Case("max_pool1d", lambda x: F.max_pool1d(x, 3, 2), _randn(2, 3, 9), [MAX2]),
    Case(
        "max_pool2d_ceil_padded",
        lambda x: F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        _randn(1, 2, 8, 9),
        [MAX2],
    ),
    Case(
        "max_pool2d_dilated",
        lambda x: F.max_pool2d(x, (3, 2), (2, 1), dilation=(1, 2)),
        _randn(1, 2, 7, 8),
        [MAX2],
    ),
    Case(
        "max_pool2d_indices",
        lambda x: F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True, return_indices=True),
        _randn(1, 2, 8, 9),
        [MAX2],
    ),
    Case(
        "max_pool3d_indices",
        lambda x: F.max_pool3d(x, 2, (2, 1, 2), padding=(1, 0, 0), return_indices=True),
        _randn(1, 2, 4, 5, 6),
        [MAX3],
    ),
    Case(  # EfficientNet's final pool: a window far wider than the map it covers
        "max_pool2d_kernel_outsizes_input",
        lambda x: F.max_pool2d(x, 640, ceil_mode=True),
        _randn(1, 2, 3, 7),
        [MAX2],
    ),
    Case(
        "max_pool2d_taps_in_padding_dilated",
        lambda x: F.max_pool2d(x, (9, 3), (4, 1), padding=(4, 1), ceil_mode=True, dilation=(1, 2)),
        _randn(1, 2, 3, 7),
        [MAX2],
    ),
    Case("avg_pool1d", lambda x: F.avg_pool1d(x, 3, 2), _randn(2, 3, 9), [AVG2]),
    Case(
        "avg_pool2d_kernel_outsizes_input",
        lambda x: F.avg_pool2d(x, 640, ceil_mode=True),
        _randn(1, 2, 3, 7),
        [AVG2],
    ),
    Case(
        "avg_pool2d_taps_in_padding",
        lambda x: F.avg_pool2d(x, (9, 3), (4, 2), padding=(4, 1), ceil_mode=True),
        _randn(1, 2, 3, 7),
        [AVG2],
    ),
    Case(
        "avg_pool2d_exclude_pad_ceil",
        lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        _randn(1, 2, 8, 9),
        [AVG2],
    ),
    Case(
        "avg_pool2d_include_pad_ceil",
        lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        _randn(1, 2, 8, 9),
        [AVG2],
    ),
    Case(
        "avg_pool2d_divisor",
        lambda x: F.avg_pool2d(x, (3, 2), (2, 1), divisor_override=5),
        _randn(1, 2, 7, 8),
        [AVG2],
    ),
    Case(
        "avg_pool3d",
        lambda x: F.avg_pool3d(x, 2, (2, 1, 2), padding=(1, 0, 1)),
        _randn(1, 2, 4, 5, 6),
        [AVG3],
        half=False,  # torch has no float16 avg_pool3d on the CPU
    ),
    Case(
        "adaptive_avg_pool1d",
        lambda x: F.adaptive_avg_pool1d(x, 3),
        _randn(2, 3, 7),
        [aten._adaptive_avg_pool2d.default],
    ),
    Case(
        "adaptive_avg_pool2d",
        lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
        _randn(1, 2, 7, 6),
        [aten._adaptive_avg_pool2d.default],
    ),
    Case(
        "adaptive_avg_pool3d",
        lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)),
        _randn(1, 2, 5, 7, 4),
        [aten._adaptive_avg_pool3d.default],
    ),
    Case(
        "adaptive_max_pool2d",
        lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
        _randn(1, 2, 7, 6),
        [aten.adaptive_max_pool2d.default],
    ),
    Case(
        "adaptive_max_pool3d",
        lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True),
        _randn(1, 2, 5, 7, 4),
        [aten.adaptive_max_pool3d.default],
    ),
]

_PADS = [
    Case(
        "constant_pad",
        lambda x: F.pad(x, (1, 2, 0, 3), value=1.5),
        _randn(2, 3, 4),
        [aten.constant_pad_nd.default],
    ),
    Case(
        "constant_pad_crop",
        lambda x: F.pad(x, (-1, 2, 1, -2)),
        _randn(2, 5, 6),
        [aten.constant_pad_nd.default],
    ),
    Case(
        "reflection_pad1d",
        lambda x: F.pad(x, (3, 2), mode="reflect"),
        _randn(1, 2, 5),
        [aten.reflection_pad1d.default],
    ),
    Case(
        "reflection_pad2d",
        lambda x: F.pad(x, (3, 2, 1, 3), mode="reflect"),
        _randn(1, 2, 4, 5),
        [aten.reflection_pad2d.default],
    ),
    Case(
        "reflection_pad3d",
        lambda x: F.pad(x, (1, 2, 1, 0, 2, 1), mode="reflect"),
        _randn(1, 2, 3, 4, 5),
        [aten.reflection_pad3d.default],
    ),
    Case(
        "replication_pad1d",
        lambda x: F.pad(x, (3, 2), mode="replicate"),
        _randn(1, 2, 4),
        [aten.replication_pad1d.default],
    ),
    Case(
        "replication_pad2d",
        lambda x: F.pad(x, (3, 2, 1, 3), mode="replicate"),
        _randn(1, 2, 4, 4),
        [aten.replication_pad2d.default],
    ),
    Case(
        "replication_pad3d",
        lambda x: F.pad(x, (3, 2, 1, 5, 3, 4), mode="replicate"),
        _randn(1, 2, 2, 3, 4),
        [aten.replication_pad3d.default],
    ),
    Case(
        "circular_pad",
        lambda x: F.pad(x, (2, 1, 1, 2), mode="circular"),
        _randn(1, 2, 3, 4),
        [aten._pad_circular.default],
    ),
]


def _up(name, op, shape, atol=1e-5, **kw):
    # torch's CPU kernels of the antialiased modes have no float16 to compare with.
    half = not kw.get("antialias", False)
    return Case(name, lambda x: F.interpolate(x, **kw), _randn(*shape), [op], half, atol=atol)


_UPSAMPLE = [
    _up("upsample_nearest1d", aten.upsample_nearest1d.vec, (1, 2, 5), scale_factor=2.5),
    _up("upsample_nearest2d", aten.upsample_nearest2d.vec, (1, 2, 3, 4), scale_factor=5.12498),
    _up("downsample_nearest2d", aten.upsample_nearest2d.vec, (1, 2, 9, 9), scale_factor=0.4357),
    _up("upsample_nearest3d", aten.upsample_nearest3d.vec, (1, 2, 2, 3, 4), size=(3, 5, 7)),
    _up(
        "upsample_nearest_exact1d",
        aten._upsample_nearest_exact1d.vec,
        (1, 2, 5),
        size=8,
        mode="nearest-exact",
    ),
    _up(
        "upsample_nearest_exact2d",
        aten._upsample_nearest_exact2d.vec,
        (1, 2, 5, 4),
        scale_factor=1.7,
        mode="nearest-exact",
    ),
    _up(
        "upsample_nearest_exact3d",
        aten._upsample_nearest_exact3d.vec,
        (1, 2, 2, 3, 3),
        size=(3, 4, 5),
        mode="nearest-exact",
    ),
    _up(
        "upsample_linear1d", aten.upsample_linear1d.vec, (1, 2, 5), scale_factor=2.5, mode="linear"
    ),
    _up(
        "upsample_bilinear2d",
        aten.upsample_bilinear2d.vec,
        (2, 2, 3, 4),
        scale_factor=2,
        mode="bilinear",
    ),
    _up(
        "upsample_bilinear2d_align",
        aten.upsample_bilinear2d.vec,
        (1, 2, 3, 4),
        size=(6, 9),
        mode="bilinear",
        align_corners=True,
    ),
    _up(
        "upsample_trilinear3d",
        aten.upsample_trilinear3d.vec,
        (1, 2, 2, 3, 4),
        size=(3, 5, 3),
        mode="trilinear",
    ),
    _up(
        "downsample_bicubic2d",
        aten.upsample_bicubic2d.vec,
        (1, 2, 9, 9),
        scale_factor=0.4357,
        mode="bicubic",
        atol=1e-4,
    ),
    _up(
        "upsample_bicubic2d_align",
        aten.upsample_bicubic2d.vec,
        (1, 2, 3, 4),
        size=(5, 7),
        mode="bicubic",
        align_corners=True,
        atol=1e-4,
    ),
    _up(
        "downsample_bilinear2d_aa",
        aten._upsample_bilinear2d_aa.vec,
        (1, 2, 17, 23),
        scale_factor=0.4357,
        mode="bilinear",
        antialias=True,
    ),
    _up(
        "downsample_bicubic2d_aa",
        aten._upsample_bicubic2d_aa.vec,
        (1, 2, 17, 23),
        size=(5, 9),
        mode="bicubic",
        antialias=True,
        atol=1e-4,
    ),
    _up(
        "upsample_bicubic2d_aa_align",
        aten._upsample_bicubic2d_aa.vec,
        (1, 2, 7, 4),
        size=(15, 6),
        mode="bicubic",
        antialias=True,
        align_corners=True,
        atol=1e-4,
    ),
    Case(
        "upsample_aa_ops_default",
        lambda x: (
            aten._upsample_bilinear2d_aa.default(x, [4, 9], False),
            aten._upsample_bicubic2d_aa.default(x, [4, 9], True, 0.25, 0.5),
        ),
        _randn(1, 2, 11, 13),
        [aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default],
        half=False,
        atol=1e-4,
    ),
    Case(
        "upsample_ops_default",
        lambda x: (
            aten.upsample_nearest1d.default(x[0], [7], 2.5),
            aten.upsample_nearest2d.default(x, [5, 7]),
            aten.upsample_nearest3d.default(x[None], [2, 5, 7]),
            aten._upsample_nearest_exact1d.default(x[0], [7]),
            aten._upsample_nearest_exact2d.default(x, [5, 7]),
            aten._upsample_nearest_exact3d.default(x[None], [2, 5, 7]),
            aten.upsample_linear1d.default(x[0], [7], False),
            aten.upsample_trilinear3d.default(x[None], [2, 5, 7], False),
        ),
        _randn(1, 2, 3, 4),
        [
            aten.upsample_nearest1d.default,
            aten.upsample_nearest2d.default,
            aten.upsample_nearest3d.default,
            aten._upsample_nearest_exact1d.default,
            aten._upsample_nearest_exact2d.default,
            aten._upsample_nearest_exact3d.default,
            aten.upsample_linear1d.default,
            aten.upsample_trilinear3d.default,
        ],
        atol=1e-4,
    ),
]

GRID2 = aten.grid_sampler_2d.default
GRID3 = aten.grid_sampler_3d.default


def _grid_inputs(*x_shape: int, out: tuple[int, ...]):
    """An input and a grid of points inside and up to 1.5 widths outside [-1, 1], so every
    padding mode matters."""
    k = len(x_shape) - 2
    return lambda: (torch.randn(*x_shape), torch.rand(x_shape[0], *out, k) * 3.2 - 1.6)


def _grid(mode: str, padding: str, align: bool, k: int = 2) -> Case:
    corners = "_align_corners" if align else ""
    shape, out = ((2, 3, 5, 6), (4, 3)) if k == 2 else ((1, 2, 3, 4, 5), (2, 3, 2))
    return Case(
        f"grid_sample_{k}d_{mode}_{padding}{corners}",
        lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align),
        _grid_inputs(*shape, out=out),
        [GRID2 if k == 2 else GRID3],
        # torch's float16 kernel unnormalises in float16: the nearest pixel may differ.
        half=mode == "bilinear",
        atol=1e-4 if mode == "bicubic" else 1e-5,
    )


_GRID_SAMPLE = [
    _grid(mode, padding, align, k)
    for k, modes in ((2, ("bilinear", "nearest", "bicubic")), (3, ("bilinear", "nearest")))
    for mode in modes
    for padding in ("zeros", "border", "reflection")
    for align in (False, True)
]

_EMBEDDINGS = [
    Case(
        "embedding",
        lambda w, i: F.embedding(i, w),
        lambda: (torch.randn(10, 3), _idx(2, 4)),
        [aten.embedding.default],
    ),
    Case(
        "embedding_padding_idx",
        lambda w, i: F.embedding(i, w, padding_idx=0),
        lambda: (torch.randn(10, 3), torch.tensor([[0, 2, 4, 0], [4, 3, 0, 9]])),
        [aten.embedding.default],
    ),
    Case(
        "embedding_scale_grad_by_freq",
        lambda w, i: F.embedding(i, w, scale_grad_by_freq=True),
        lambda: (torch.randn(10, 3), torch.tensor([[1, 2, 4, 1], [4, 3, 1, 9]])),
        [aten.embedding.default],
    ),
    Case(
        "embedding_bag_sum",
        lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
        lambda: (torch.randn(10, 3), _idx(8), torch.tensor([0, 4, 5]), torch.randn(8)),
        [aten._embedding_bag_forward_only.default],
        grad=False,
    ),
    Case(
        "embedding_bag_mean_offsets",
        lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"),
        lambda: (torch.randn(10, 3), _idx(7), torch.tensor([0, 2, 2, 5])),
        [aten._embedding_bag_forward_only.default],
        grad=False,
    ),
    Case(
        "embedding_bag_max_last_offset",
        lambda w, i, o: F.embedding_bag(i, w, o, mode="max", include_last_offset=True),
        lambda: (torch.randn(10, 3), _idx(7), torch.tensor([0, 3, 3, 6])),
        [aten._embedding_bag_forward_only.default],
        grad=False,
    ),
    Case(
        "embedding_bag_train",
        lambda w, i, o: aten._embedding_bag.default(w, i, o, False, 1, False, None, False, 0)[0],
        lambda: (torch.randn(10, 3), torch.tensor([1, 0, 4, 5, 0, 3, 2]), torch.tensor([0, 2, 5])),
        [aten._embedding_bag.default],
    ),
]

CASES = _POOLS + _PADS + _UPSAMPLE + _GRID_SAMPLE + _EMBEDDINGS
