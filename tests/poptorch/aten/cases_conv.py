"""Cases for ``poptorch/aten/conv.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.ops import aten

from .harness import Case

CONV = aten.convolution.default


def _conv(name, fn, x_shape, w_shape, bias=0):
    """``fn(x, w)``, or ``fn(x, w, b)`` with a bias of ``bias`` channels."""

    def inputs():
        x, w = torch.randn(*x_shape), torch.randn(*w_shape) * 0.3
        return (x, w, torch.randn(bias)) if bias else (x, w)

    return Case(name, fn, inputs, [CONV], atol=1e-4)


CASES = [
    _conv("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2), (2, 4, 10), (6, 4, 3), 6),
    _conv(
        "conv1d_dilated_padded",
        lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=4, dilation=3),
        (1, 4, 10),
        (6, 4, 3),
        6,
    ),
    _conv(
        "conv2d_groups",
        lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 2), groups=2),
        (1, 4, 7, 8),
        (6, 2, 3, 5),
    ),
    _conv(
        "conv3d",
        lambda x, w, b: F.conv3d(x, w, b, stride=(2, 1, 1), padding=(1, 0, 1)),
        (1, 2, 4, 5, 6),
        (3, 2, 3, 2, 2),
        3,
    ),
    _conv(
        "conv_transpose1d",
        lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1),
        (1, 4, 6),
        (4, 3, 3),
        3,
    ),
    _conv(
        "conv_transpose2d_groups_dilated",
        lambda x, w: F.conv_transpose2d(x, w, stride=2, groups=2, dilation=(1, 2)),
        (1, 4, 4, 5),
        (4, 2, 3, 2),
    ),
    _conv(
        "conv_transpose3d_output_padding",
        lambda x, w, b: F.conv_transpose3d(
            x, w, b, stride=(2, 1, 1), groups=2, output_padding=(1, 0, 0)
        ),
        (1, 4, 3, 4, 4),
        (4, 1, 3, 2, 2),
        2,
    ),
    Case(
        "unfold",
        lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
        lambda: (torch.randn(2, 3, 6, 7),),
        [aten.im2col.default],
    ),
    Case(
        "unfold_unbatched",
        lambda x: F.unfold(x, 2),
        lambda: (torch.randn(3, 4, 5),),
        [aten.im2col.default],
    ),
    Case(
        "fold",
        lambda x: F.fold(x, (7, 8), (2, 3), dilation=(2, 1), padding=(1, 2), stride=(2, 3)),
        lambda: (torch.randn(2, 3 * 6, 4 * 4),),
        [aten.col2im.default],
    ),
]
