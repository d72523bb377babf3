"""Op-table cases: convolution, pooling, normalisation, resize and RoIAlign.

The NumPy references are direct loops over output positions (convolutions as sums over
kernel taps, transposed convolutions as scatters, pools as explicit windows), with the
paddings that ``same_*``/``output_shape`` imply worked out by hand in each case.
"""

import math

import ml_dtypes
import numpy as np

import popxl.ops as ops

from .harness import OpCase, f32

FP8 = np.dtype(ml_dtypes.float8_e4m3fnuz)


# matmul and softmax ----------------------------------------------------------------------


def _softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


MATMUL_CASES = [
    OpCase("matmul_2d", ops.matmul, [f32(3, 4, seed=1), f32(4, 5, seed=2)], np.matmul, atol=1e-5),
    OpCase(
        "matmul_batch_broadcast",
        ops.matmul,
        [f32(2, 1, 3, 4, seed=3), f32(3, 4, 2, seed=4)],
        np.matmul,
        atol=1e-5,
    ),
    OpCase(
        "matmul_vector_promotion",
        lambda a, v: (ops.matmul(a, v), ops.matmul(v, a.T)),
        [f32(3, 4, seed=5), f32(4, seed=6)],
        lambda a, v: (a @ v, v @ a.T),
        atol=1e-5,
    ),
    # PopART's MatMul took the left operand's dtype and never compared the right one's.
    OpCase(
        "matmul_mixed_f32_by_f16",
        ops.matmul,
        [f32(3, 4, seed=9), f32(4, 5, seed=10).astype(np.float16)],
        lambda a, b: a @ b.astype(np.float32),
        atol=1e-5,
        fp16_grad=False,
    ),
    OpCase(
        "matmul_mixed_f16_by_f32",
        ops.matmul,
        [f32(3, 4, seed=11).astype(np.float16), f32(4, 5, seed=12)],
        lambda a, b: (a.astype(np.float32) @ b.astype(np.float16).astype(np.float32)).astype(
            np.float16
        ),
        rtol=1e-3,
        atol=1e-3,
        grad=False,  # finite differences of a float16 result are rounding noise
    ),
    OpCase(
        "softmax",
        lambda t: ops.softmax(t, -1),
        [f32(3, 5, seed=7)],
        lambda x: _softmax(x, -1),
        atol=1e-6,
    ),
    OpCase(
        "log_softmax",
        lambda t: ops.log_softmax(t, 0),
        [f32(3, 5, seed=8)],
        lambda x: np.log(_softmax(x, 0)).astype(np.float32),
        atol=1e-5,
    ),
]


# Convolutions -----------------------------------------------------------------------------


def _taps(k: tuple, start: tuple, step: tuple, dilation: tuple, count: tuple):
    """For each kernel tap: the strided window of positions it touches, one slice per
    spatial axis (``count`` positions from ``start + tap * dilation``, ``step`` apart)."""
    for kk in np.ndindex(*k):
        yield (
            kk,
            tuple(
                slice(a + t * d, a + t * d + (c - 1) * s + 1, s)
                for a, t, d, c, s in zip(start, kk, dilation, count, step)
            ),
        )


def _conv_ref(x, w, stride, pads, dilation=None, groups=1):
    """The convolution as a sum over kernel taps of strided windows times weights, in
    float64 (a tap's window of every output position at once)."""
    n = x.ndim - 2
    dilation = dilation or (1,) * n
    xp = np.pad(x.astype(np.float64), [(0, 0)] * 2 + [(pads[i], pads[n + i]) for i in range(n)])
    cg, mg, k = x.shape[1] // groups, w.shape[0] // groups, w.shape[2:]
    out_sp = [(xp.shape[2 + i] - (k[i] - 1) * dilation[i] - 1) // stride[i] + 1 for i in range(n)]
    out = np.zeros((x.shape[0], w.shape[0], *out_sp))
    for g in range(groups):
        ins, outs = slice(g * cg, (g + 1) * cg), slice(g * mg, (g + 1) * mg)
        for kk, window in _taps(k, (0,) * n, stride, dilation, out_sp):
            patch = xp[(slice(None), ins, *window)]  # (N, cg, *out_sp)
            out[:, outs] += np.einsum("nc...,mc->nm...", patch, w[(outs, slice(None), *kk)])
    return out


def _conv_transpose_ref(x, w, stride, pads, dilation=None, groups=1, output_padding=None):
    """The transposed convolution: each input position scatters its weighted kernel into
    the output, one kernel tap (for every input position at once) at a time, in float64."""
    n = x.ndim - 2
    dilation = dilation or (1,) * n
    output_padding = output_padding or (0,) * n
    cg, mg, k, sp = x.shape[1] // groups, w.shape[1], w.shape[2:], x.shape[2:]
    full = [
        stride[i] * (sp[i] - 1) + output_padding[i] + (k[i] - 1) * dilation[i] + 1 for i in range(n)
    ]
    margin = max(0, -min(pads))  # negative pads grow the output
    buf = np.zeros((x.shape[0], mg * groups, *[f + 2 * margin for f in full]))
    x64 = x.astype(np.float64)
    for g in range(groups):
        ins, outs = slice(g * cg, (g + 1) * cg), slice(g * mg, (g + 1) * mg)
        for kk, window in _taps(k, (margin,) * n, stride, dilation, sp):
            part = np.einsum("nc...,cm->nm...", x64[:, ins], w[(ins, slice(None), *kk)])
            buf[(slice(None), outs, *window)] += part
    crop = [slice(margin + pads[d], margin + full[d] - pads[n + d]) for d in range(n)]
    return buf[(slice(None), slice(None), *crop)]


def _as(dtype, fn):
    return lambda *xs: fn(*xs).astype(dtype)


X2 = f32(2, 4, 5, 6, seed=10)
W2 = f32(3, 4, 2, 3, seed=11)
W2G = f32(4, 2, 3, 3, seed=12)  # groups=2: 4 outputs from 2 channels per group
X1 = f32(2, 3, 7, seed=13)
W1 = f32(2, 3, 3, seed=14)
X3 = f32(1, 2, 4, 3, 4, seed=15)
W3 = f32(2, 2, 2, 2, 3, seed=16)

CONV_CASES = [
    OpCase(
        "conv_2d",
        lambda t, w: ops.conv(t, w),
        [X2, W2],
        _as(np.float32, lambda x, w: _conv_ref(x, w, (1, 1), (0,) * 4)),
        atol=1e-5,
    ),
    OpCase(
        "conv_2d_stride_pad_dilation",
        lambda t, w: ops.conv(t, w, stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2)),
        [X2, W2],
        _as(np.float32, lambda x, w: _conv_ref(x, w, (2, 1), (1, 0, 2, 1), (1, 2))),
        atol=1e-5,
    ),
    OpCase(
        "conv_2d_groups",
        lambda t, w: ops.conv(t, w, padding=(1, 1, 1, 1), groups=2),
        [X2, W2G],
        _as(np.float32, lambda x, w: _conv_ref(x, w, (1, 1), (1, 1, 1, 1), groups=2)),
        atol=1e-5,
    ),
    OpCase(
        "conv_1d",
        lambda t, w: ops.conv(t, w, stride=(2,), padding=(1, 2), dilation=(1,)),
        [X1, W1],
        _as(np.float32, lambda x, w: _conv_ref(x, w, (2,), (1, 2))),
        atol=1e-5,
    ),
    OpCase(
        "conv_3d",
        lambda t, w: ops.conv(
            t, w, stride=(1, 1, 2), padding=(0, 1, 1, 1, 0, 1), dilation=(1, 1, 1)
        ),
        [X3, W3],
        _as(np.float32, lambda x, w: _conv_ref(x, w, (1, 1, 2), (0, 1, 1, 1, 0, 1))),
        atol=1e-5,
    ),
    # in (5, 6), kernel (2, 3), stride (1, 2): out (5, 3), total padding 1 on each axis.
    OpCase(
        "conv_same_upper",
        lambda t, w: ops.conv(t, w, stride=(1, 2), pad_type="same_upper"),
        [X2, f32(3, 4, 2, 3, seed=17)],
        _as(np.float32, lambda x, w: _conv_ref(x, w, (1, 2), (0, 0, 1, 1))),
        atol=1e-5,
    ),
    OpCase(
        "conv_same_lower",
        lambda t, w: ops.conv(t, w, stride=(1, 2), pad_type="same_lower"),
        [X2, f32(3, 4, 2, 3, seed=17)],
        _as(np.float32, lambda x, w: _conv_ref(x, w, (1, 2), (1, 1, 0, 0))),
        atol=1e-5,
    ),
    OpCase(
        "conv_valid_ignores_padding",
        lambda t, w: ops.conv(t, w, padding=(3, 3, 3, 3), pad_type="valid"),
        [X2, W2],
        _as(np.float32, lambda x, w: _conv_ref(x, w, (1, 1), (0,) * 4)),
        atol=1e-5,
    ),
    OpCase(
        "conv_fp16",
        lambda t, w: ops.conv(
            t, w, padding=(1, 1, 1, 1), partials_types=["half"], available_memory_proportions=[0.5]
        ),
        [X2.astype(np.float16), W2.astype(np.float16)],
        _as(
            np.float16,
            lambda x, w: _conv_ref(
                x.astype(np.float32), w.astype(np.float32), (1, 1), (1, 1, 1, 1)
            ),
        ),
        rtol=1e-2,
        atol=1e-2,
        grad=False,
    ),
]

XT = f32(2, 4, 3, 2, seed=20)
WT = f32(4, 3, 3, 2, seed=21)  # (C, M/groups, k): 3 outputs
WTG = f32(4, 2, 2, 3, seed=22)  # groups=2: 4 outputs
XT1 = f32(1, 2, 3, seed=23)
WT1 = f32(2, 2, 3, seed=24)

CONV_TRANSPOSE_CASES = [
    OpCase(
        "conv_transpose_2d",
        lambda t, w: ops.conv_transpose(t, w),
        [XT, WT],
        _as(np.float32, lambda x, w: _conv_transpose_ref(x, w, (1, 1), (0,) * 4)),
        atol=1e-5,
    ),
    OpCase(
        "conv_transpose_stride_pads_output_padding",
        lambda t, w: ops.conv_transpose(
            t, w, stride=(2, 3), padding=(1, 0, 0, 1), output_padding=(1, 2)
        ),
        [XT, WT],
        _as(
            np.float32,
            lambda x, w: _conv_transpose_ref(x, w, (2, 3), (1, 0, 0, 1), output_padding=(1, 2)),
        ),
        atol=1e-5,
    ),
    OpCase(
        "conv_transpose_groups_dilation",
        lambda t, w: ops.conv_transpose(
            t, w, stride=(2, 1), padding=(0, 1, 1, 0), dilation=(2, 1), groups=2
        ),
        [XT, WTG],
        _as(
            np.float32,
            lambda x, w: _conv_transpose_ref(x, w, (2, 1), (0, 1, 1, 0), (2, 1), groups=2),
        ),
        atol=1e-5,
    ),
    OpCase(
        "conv_transpose_1d",
        lambda t, w: ops.conv_transpose(t, w, stride=(2,), padding=(1, 0), dilation=(1,)),
        [XT1, WT1],
        _as(np.float32, lambda x, w: _conv_transpose_ref(x, w, (2,), (1, 0))),
        atol=1e-5,
    ),
    # spatial (3, 2), kernel (3, 2), stride 2: natural sizes (7, 4). Target (6, 5): totals 1, -1.
    OpCase(
        "conv_transpose_output_shape",
        lambda t, w: ops.conv_transpose(
            t, w, stride=(2, 2), padding=(5, 5, 5, 5), output_shape=(6, 5)
        ),
        [XT, WT],
        _as(np.float32, lambda x, w: _conv_transpose_ref(x, w, (2, 2), (1, 0, 0, -1))),
        atol=1e-5,
    ),
    OpCase(
        "conv_transpose_full_output_shape_same_upper",
        lambda t, w: ops.conv_transpose(
            t, w, stride=(2, 2), pad_type="same_upper", output_shape=(2, 3, 6, 5)
        ),
        [XT, WT],
        _as(np.float32, lambda x, w: _conv_transpose_ref(x, w, (2, 2), (0, -1, 1, 0))),
        atol=1e-5,
    ),
    # length 3, kernel 3, stride 2: natural 7, same_* target 6, total 1.
    OpCase(
        "conv_transpose_same_lower",
        lambda t, w: ops.conv_transpose(t, w, stride=(2,), pad_type="same_lower"),
        [XT1, WT1],
        _as(np.float32, lambda x, w: _conv_transpose_ref(x, w, (2,), (1, 0))),
        atol=1e-5,
    ),
    OpCase(
        "conv_transpose_same_upper",
        lambda t, w: ops.conv_transpose(t, w, stride=(2,), pad_type="same_upper"),
        [XT1, WT1],
        _as(np.float32, lambda x, w: _conv_transpose_ref(x, w, (2,), (0, 1))),
        atol=1e-5,
    ),
]

# Float8 operands: small multiples of 1/8 are exact in float8_143.
XF8 = (np.round(f32(1, 2, 4, 4, seed=30) * 4) / 8).astype(FP8)
WF8 = (np.round(f32(3, 2, 2, 2, seed=31) * 4) / 8).astype(FP8)
WTF8 = (np.round(f32(2, 3, 2, 2, seed=32) * 4) / 8).astype(FP8)


def _f64(x):
    return x.astype(np.float64)


POW2_CASES = [
    OpCase(
        "conv_pow2scaled",
        lambda t, w, s: ops.conv_pow2scaled(t, w, s, padding=(1, 0, 0, 1)),
        [XF8, WF8, np.array(3, np.int32)],
        lambda x, w, s: (_conv_ref(_f64(x), _f64(w), (1, 1), (1, 0, 0, 1)) * 2.0**s).astype(
            np.float16
        ),
        rtol=1e-3,
        grad=False,
    ),
    OpCase(
        "conv_pow2scaled_negative_scale",
        lambda t, w, s: ops.conv_pow2scaled(t, w, s, stride=(2, 2)),
        [XF8, WF8, np.array(-2, np.int32)],
        lambda x, w, s: (_conv_ref(_f64(x), _f64(w), (2, 2), (0,) * 4) * 2.0**s).astype(np.float16),
        rtol=1e-3,
        grad=False,
    ),
    OpCase(
        "conv_transpose_pow2scaled",
        lambda t, w, s: ops.conv_transpose_pow2scaled(t, w, s, stride=(2, 2)),
        [XF8, WTF8, np.array(1, np.int32)],
        lambda x, w, s: (_conv_transpose_ref(_f64(x), _f64(w), (2, 2), (0,) * 4) * 2.0**s).astype(
            np.float16
        ),
        rtol=1e-3,
        grad=False,
    ),
]


# Pooling ---------------------------------------------------------------------------------


def _pool_ref(
    x, kind, kernel, stride=None, pads=None, dilation=None, in_dil=None, ceil=False, out_pads=None
):
    n = x.ndim - 2
    stride, dilation, in_dil = stride or (1,) * n, dilation or (1,) * n, in_dil or (1,) * n
    pads = pads or (0,) * 2 * n
    d_eff = [(x.shape[2 + i] - 1) * in_dil[i] + 1 for i in range(n)]
    out_sp = []
    for i in range(n):
        span = d_eff[i] + pads[i] + pads[n + i] - (kernel[i] - 1) * dilation[i] - 1
        o = (math.ceil(span / stride[i]) if ceil else span // stride[i]) + 1
        if ceil and (o - 1) * stride[i] >= d_eff[i] + pads[i]:
            o -= 1
        out_sp.append(o)
    out = np.zeros((*x.shape[:2], *out_sp))
    for o in np.ndindex(*out_sp):
        vals = []
        for kk in np.ndindex(*kernel):
            p = [o[i] * stride[i] - pads[i] + kk[i] * dilation[i] for i in range(n)]
            if all(0 <= p[i] < d_eff[i] and p[i] % in_dil[i] == 0 for i in range(n)):
                vals.append(x[(slice(None), slice(None), *(p[i] // in_dil[i] for i in range(n)))])
        if kind == "max":
            out[(slice(None), slice(None), *o)] = np.max(vals, axis=0)
        else:
            out[(slice(None), slice(None), *o)] = np.mean(vals, axis=0)
    if out_pads:
        out = np.pad(out, [(0, 0)] * 2 + [(out_pads[i], out_pads[n + i]) for i in range(n)])
    return out.astype(x.dtype)


XP = f32(2, 3, 5, 6, seed=40)
XP1 = f32(2, 2, 7, seed=41)
XP3 = f32(1, 2, 4, 5, 3, seed=42)

POOL_CASES = [
    OpCase(
        "average_pool_2x2",
        lambda t: ops.average_pool(t, (2, 2), stride=(2, 2)),
        [XP],
        lambda x: _pool_ref(x, "avg", (2, 2), (2, 2)),
    ),
    OpCase(
        "average_pool_padding_excluded",
        lambda t: ops.average_pool(t, (3, 3), padding=(1, 1, 1, 1)),
        [XP],
        lambda x: _pool_ref(x, "avg", (3, 3), pads=(1, 1, 1, 1)),
    ),
    OpCase(
        "average_pool_ceil_mode",
        lambda t: ops.average_pool(t, (2, 3), stride=(2, 2), padding=(1, 0, 0, 1), ceil_mode=True),
        [XP],
        lambda x: _pool_ref(x, "avg", (2, 3), (2, 2), (1, 0, 0, 1), ceil=True),
    ),
    # in (5, 6), kernel 2, stride 2: out (3, 3), totals (1, 0).
    OpCase(
        "average_pool_same_upper",
        lambda t: ops.average_pool(t, (2, 2), stride=(2, 2), auto_pad="same_upper"),
        [XP],
        lambda x: _pool_ref(x, "avg", (2, 2), (2, 2), (0, 0, 1, 0)),
    ),
    OpCase(
        "average_pool_same_lower",
        lambda t: ops.average_pool(t, (2, 2), stride=(2, 2), auto_pad="same_lower"),
        [XP],
        lambda x: _pool_ref(x, "avg", (2, 2), (2, 2), (1, 0, 0, 0)),
    ),
    OpCase(
        "average_pool_1d_valid",
        lambda t: ops.average_pool(t, (3,), stride=(2,), padding=(2, 2), auto_pad="valid"),
        [XP1],
        lambda x: _pool_ref(x, "avg", (3,), (2,)),
    ),
    OpCase(
        "average_pool_3d",
        lambda t: ops.average_pool(t, (2, 2, 2), padding=(1, 0, 1, 0, 1, 1)),
        [XP3],
        lambda x: _pool_ref(x, "avg", (2, 2, 2), pads=(1, 0, 1, 0, 1, 1)),
    ),
    OpCase(
        "average_pool_dilations_and_out_pads",
        lambda t: ops.average_pool(
            t,
            (2, 2),
            padding=(1, 1, 1, 1),
            dilation=(2, 1),
            in_dilations=(1, 2),
            out_pads=(1, 0, 0, 1),
        ),
        [XP],
        lambda x: _pool_ref(
            x,
            "avg",
            (2, 2),
            pads=(1, 1, 1, 1),
            dilation=(2, 1),
            in_dil=(1, 2),
            out_pads=(1, 0, 0, 1),
        ),
    ),
    OpCase(
        "max_pool_2x2",
        lambda t: ops.max_pool(t, (2, 2), stride=(2, 2)),
        [XP],
        lambda x: _pool_ref(x, "max", (2, 2), (2, 2)),
    ),
    OpCase(
        "max_pool_padding",
        lambda t: ops.max_pool(t, (3, 2), stride=(2, 1), padding=(1, 1, 1, 0)),
        [XP],
        lambda x: _pool_ref(x, "max", (3, 2), (2, 1), (1, 1, 1, 0)),
    ),
    # Ceil mode would start a last window in the end padding of axis 2: it is dropped.
    OpCase(
        "max_pool_ceil_mode_drops_padding_window",
        lambda t: ops.max_pool(t, (2,), stride=(2,), padding=(1, 1), ceil_mode=True),
        [f32(2, 2, 6, seed=43)],
        lambda x: _pool_ref(x, "max", (2,), (2,), (1, 1), ceil=True),
    ),
    OpCase(
        "max_pool_dilation_3d",
        lambda t: ops.max_pool(t, (2, 2, 2), dilation=(2, 1, 1), storage_order="column"),
        [XP3],
        lambda x: _pool_ref(x, "max", (2, 2, 2), dilation=(2, 1, 1)),
    ),
    OpCase(
        "max_pool_same_upper_in_dilations",
        lambda t: ops.max_pool(
            t, (3, 2), stride=(2, 2), in_dilations=(1, 2), auto_pad="same_upper"
        ),
        # in (5, 6) dilated to (5, 11): out (3, 6), totals (2, 1).
        [XP],
        lambda x: _pool_ref(x, "max", (3, 2), (2, 2), (1, 0, 1, 1), in_dil=(1, 2)),
    ),
]


# Normalisation ---------------------------------------------------------------------------


def _bn_ref(x, scale, bias, mean, var, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


def _group_norm_ref(x, weight, bias, groups, eps=1e-5):
    x64 = x.astype(np.float64)
    y = np.empty_like(x64)
    cg = x.shape[1] // groups
    for n in range(x.shape[0]):
        for g in range(groups):
            block = x64[n, g * cg : (g + 1) * cg]
            y[n, g * cg : (g + 1) * cg] = (block - block.mean()) / np.sqrt(block.var() + eps)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (y * weight.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


def _layer_norm_ref(x, weight, bias, eps=1e-5):
    axes = tuple(range(1, x.ndim))
    x64 = x.astype(np.float64)
    y = (x64 - x64.mean(axes, keepdims=True)) / np.sqrt(x64.var(axes, keepdims=True) + eps)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (y * weight.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


XN = f32(2, 4, 3, 2, seed=50)
C4 = [f32(4, seed=s) for s in (51, 52, 53)]
VAR4 = f32(4, seed=54, low=0.5, high=2.0)

NORM_CASES = [
    OpCase(
        "batch_norm_inference",
        lambda *ts: ops.batch_norm_inference(*ts, epsilon=1e-3),
        [XN, *C4, VAR4],
        lambda *xs: _bn_ref(*xs, eps=1e-3),
        atol=1e-5,
    ),
    OpCase(
        "batch_norm_inference_2d",
        ops.batch_norm_inference,
        [f32(3, 4, seed=55), *C4, VAR4],
        _bn_ref,
        atol=1e-5,
    ),
    OpCase(
        "group_norm_2_groups",
        lambda t, w, b: ops.group_norm(t, w, b, 2),
        [XN, C4[0], C4[1]],
        lambda x, w, b: _group_norm_ref(x, w, b, 2),
        atol=1e-5,
    ),
    OpCase(
        "group_norm_instance",
        lambda t, w, b: ops.group_norm(t, w, b, num_groups=4, eps=1e-2),
        [f32(2, 4, 5, seed=56), C4[0], C4[1]],
        lambda x, w, b: _group_norm_ref(x, w, b, 4, eps=1e-2),
        atol=1e-5,
    ),
    OpCase(
        "layer_norm_2d",
        ops.layer_norm,
        [f32(3, 4, seed=57), C4[0], C4[1]],
        _layer_norm_ref,
        atol=1e-5,
    ),
    OpCase(
        "layer_norm_4d_per_channel_affine",
        ops.layer_norm,
        [XN, C4[0], C4[1]],
        _layer_norm_ref,
        atol=1e-5,
    ),
]


# Resize ----------------------------------------------------------------------------------


def _coordinate(j, in_len, scale, ctm):
    size = in_len * scale  # unrounded output length
    if ctm == "half_pixel":
        return (j + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (j + 0.5) / scale - 0.5 if size > 1 else 0.0
    if ctm == "align_corners":
        return 0.0 if size == 1 else j * (in_len - 1) / (size - 1)
    if ctm == "asymmetric":
        return j / scale
    # tf_crop_and_resize with roi start 0, end 1
    return j * (in_len - 1) / (size - 1) if size != 1 else 0.5 * (in_len - 1)


def _nearest(c, mode):
    low = math.floor(c)
    r = c - low
    if mode == "floor":
        return low
    if mode == "ceil":
        return math.ceil(c)
    if r == 0.5:
        return low if mode == "round_prefer_floor" else low + 1
    return low if r < 0.5 else low + 1


def _cubic_coeffs(r, a=-0.75):
    return [
        ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
        ((a + 2) * r - (a + 3)) * r * r + 1,
        ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
        ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a,
    ]


def _at(y, i, axis):
    return np.take(y, min(max(i, 0), y.shape[axis] - 1), axis=axis)  # edges repeat


def _resize_ref(x, scales, mode="nearest", nearest_mode="round_prefer_floor", ctm="half_pixel"):
    y = x.astype(np.float64)
    for axis, scale in enumerate(scales):
        in_len = y.shape[axis]
        out_len = int(math.floor(in_len * scale))
        rows = []
        for j in range(out_len):
            c = _coordinate(j, in_len, scale, ctm)
            if mode == "nearest":
                rows.append(_at(y, _nearest(c, nearest_mode), axis))
            elif mode == "linear":
                low = math.floor(c)
                rows.append((1 - (c - low)) * _at(y, low, axis) + (c - low) * _at(y, low + 1, axis))
            else:
                low = math.floor(c)
                rows.append(
                    sum(w * _at(y, low - 1 + k, axis) for k, w in enumerate(_cubic_coeffs(c - low)))
                )
        y = np.stack(rows, axis=axis)
    return y.astype(x.dtype)


XR = f32(1, 2, 3, 4, seed=60)
XR3 = f32(2, 5, 6, seed=61)


def _resize_case(
    name, x, scales, mode="nearest", nearest_mode="round_prefer_floor", ctm="half_pixel", **kw
):
    return OpCase(
        name,
        lambda t: ops.interpolate(t, scales, mode, nearest_mode, ctm),
        [x],
        lambda a: _resize_ref(a, scales, mode, nearest_mode, ctm),
        atol=1e-5,
        **kw,
    )


RESIZE_CASES = [
    OpCase("interpolate_default_identity", ops.interpolate, [XR], lambda x: x),
    _resize_case("interpolate_nearest_2x", XR, (1.0, 1.0, 2.0, 2.0)),
    _resize_case(
        "interpolate_nearest_round_prefer_ceil_asymmetric",
        XR3,
        (1.0, 1.6, 1.5),
        nearest_mode="round_prefer_ceil",
        ctm="asymmetric",
    ),
    _resize_case(
        "interpolate_nearest_round_prefer_floor_asymmetric", XR3, (1.0, 1.6, 1.5), ctm="asymmetric"
    ),
    _resize_case(
        "interpolate_nearest_floor_align_corners",
        XR3,
        (1.0, 1.4, 0.5),
        nearest_mode="floor",
        ctm="align_corners",
    ),
    _resize_case("interpolate_nearest_ceil_downsample", XR3, (1.0, 0.6, 0.5), nearest_mode="ceil"),
    _resize_case("interpolate_linear_half_pixel", XR, (1.0, 1.0, 2.0, 1.5), mode="linear"),
    _resize_case(
        "interpolate_linear_align_corners",
        XR,
        (1.0, 1.0, 1.7, 2.0),
        mode="linear",
        ctm="align_corners",
    ),
    _resize_case(
        "interpolate_linear_pytorch_half_pixel_downsample",
        XR3,
        (1.0, 0.2, 0.5),
        mode="linear",
        ctm="pytorch_half_pixel",
    ),
    _resize_case(
        "interpolate_linear_asymmetric_batch_axis",
        XR3,
        (2.0, 1.0, 1.5),
        mode="linear",
        ctm="asymmetric",
    ),
    _resize_case(
        "interpolate_linear_tf_crop_and_resize",
        XR3,
        (1.0, 1.4, 0.34),
        mode="linear",
        ctm="tf_crop_and_resize",
    ),
    _resize_case("interpolate_cubic_half_pixel", XR, (1.0, 1.0, 2.0, 1.75), mode="cubic"),
    _resize_case(
        "interpolate_cubic_align_corners_downsample",
        XR3,
        (1.0, 0.6, 0.67),
        mode="cubic",
        ctm="align_corners",
    ),
]


# RoIAlign --------------------------------------------------------------------------------


def _bilinear(img, y, x):
    h, w = img.shape[-2:]
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return np.zeros(img.shape[:-2])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return (
        (1 - ly) * (1 - lx) * img[..., y0, x0]
        + (1 - ly) * lx * img[..., y0, x1]
        + ly * (1 - lx) * img[..., y1, x0]
        + ly * lx * img[..., y1, x1]
    )


def _roi_align_ref(x, rois, batch_index, out_size, scale, ratio):
    oh, ow = out_size
    out = np.zeros((len(rois), x.shape[1], oh, ow))
    for r, (x1, y1, x2, y2) in enumerate(rois.astype(np.float64) * scale):
        img = x[batch_index[r]].astype(np.float64)
        rh, rw = max(y2 - y1, 1.0), max(x2 - x1, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio if ratio > 0 else math.ceil(rh / oh)
        gw = ratio if ratio > 0 else math.ceil(rw / ow)
        for ph in range(oh):
            for pw in range(ow):
                acc = np.zeros(x.shape[1])
                for iy in range(gh):
                    for ix in range(gw):
                        yy = y1 + ph * bh + (iy + 0.5) * bh / gh
                        xx = x1 + pw * bw + (ix + 0.5) * bw / gw
                        acc += _bilinear(img, yy, xx)
                out[r, :, ph, pw] = acc / (gh * gw)
    return out.astype(x.dtype)


XROI = f32(2, 3, 6, 7, seed=70)
ROIS = np.array(
    [[0.5, 1.0, 4.0, 5.5], [-1.5, 0.0, 3.0, 2.0], [2.0, 2.0, 2.2, 2.1], [5.0, 3.0, 9.5, 8.0]],
    np.float32,
)
BATCH = np.array([0, 1, 1, 0], np.int32)

ROI_CASES = [
    OpCase(
        "roi_align",
        lambda t, r, b: ops.roi_align(t, r, b, (2, 3), 1.0, 2),
        [XROI, ROIS, BATCH],
        lambda x, r, b: _roi_align_ref(x, r, b, (2, 3), 1.0, 2),
        atol=1e-5,
        grad=[0],
    ),
    OpCase(
        "roi_align_spatial_scale",
        lambda t, r, b: ops.roi_align(t, r, b, (3, 2), 0.5, 1),
        [XROI, ROIS * 2, BATCH],
        lambda x, r, b: _roi_align_ref(x, r, b, (3, 2), 0.5, 1),
        atol=1e-5,
        grad=[0],
    ),
    OpCase(
        "roi_align_adaptive_sampling",
        lambda t, r, b: ops.roi_align(t, r, b, (2, 2), 1.0, 0),
        [XROI, ROIS * 1.5, BATCH],
        lambda x, r, b: _roi_align_ref(x, r, b, (2, 2), 1.0, 0),
        atol=1e-5,
        grad=[0],
    ),
]

CASES = [
    *MATMUL_CASES,
    *CONV_CASES,
    *CONV_TRANSPOSE_CASES,
    *POW2_CASES,
    *POOL_CASES,
    *NORM_CASES,
    *RESIZE_CASES,
    *ROI_CASES,
]
