"""Convolution, pooling, normalisation, resize and RoIAlign: argument errors, names, op types."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException


def _var(*shape, dtype=popxl.float32, name="x"):
    return popxl.variable(np.ones(shape, np.float32), dtype, name=name)


def _scale(value=0, dtype=popxl.int32, shape=()):
    return popxl.variable(np.full(shape, value), dtype, name="log2_scale")


def _op_types(graph):
    return [op.type for op in graph.ops]


# Matmul dtypes ---------------------------------------------------------------------------


def test_matmul_float_mix_takes_the_left_dtype_and_other_mixes_are_refused():
    with popxl.Ir().main_graph:
        a32, b16 = _var(2, 3), _var(3, 4, dtype=popxl.float16, name="w")
        assert ops.matmul(a32, b16).dtype == popxl.float32
        assert ops.matmul(b16.T, a32.T).dtype == popxl.float16
        assert ops.matmul(a32, b16, output_type=popxl.float16).dtype == popxl.float16
        ints = popxl.variable(np.ones((3, 4), np.int32), popxl.int32, name="i")
        with pytest.raises(
            PopXLException,
            match="MatMul: np broadcasting failed, incompatible types float32 and int32",
        ):
            ops.matmul(a32, ints)


# Convolutions ----------------------------------------------------------------------------


def test_conv_names_type_and_shape():
    ir = popxl.Ir()
    with ir.main_graph:
        y = ops.conv(
            _var(2, 4, 5, 6), _var(3, 4, 3, 3, name="w"), stride=(2, 1), padding=(1, 1, 1, 1)
        )
        z = ops.conv_transpose(_var(2, 4, 3, 3), _var(4, 2, 2, 2, name="w"), stride=(2, 2))
    assert (y.name, y.shape) == ("conv_out", (2, 3, 3, 6))
    assert (z.name, z.shape) == ("convtranspose_out", (2, 2, 6, 6))
    assert _op_types(ir.main_graph)[-2:] == ["Conv", "ConvTranspose"]


def test_conv_default_arguments_apply_to_any_rank():
    with popxl.Ir().main_graph:
        assert ops.conv(_var(1, 2, 7), _var(3, 2, 3, name="w")).shape == (1, 3, 5)
        assert ops.conv(_var(1, 2, 4, 4, 4), _var(3, 2, 2, 2, 2, name="w")).shape == (1, 3, 3, 3, 3)


def test_conv_bad_pad_type():
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="pad type 'same' is not valid, must be not_set"):
            ops.conv(_var(1, 2, 4, 4), _var(3, 2, 2, 2, name="w"), pad_type="same")


def test_conv_argument_lengths_must_match_spatial_axes():
    with popxl.Ir().main_graph:
        x, w = _var(1, 2, 7), _var(3, 2, 3, name="w")
        with pytest.raises(PopXLException, match=r"`stride` needs 1 values .* got \(2, 2\)"):
            ops.conv(x, w, stride=(2, 2))
        with pytest.raises(
            PopXLException, match=r"`padding` needs 2 values .*begins then all ends"
        ):
            ops.conv(x, w, padding=(1,))


def test_conv_negative_padding_and_bad_stride():
    with popxl.Ir().main_graph:
        x, w = _var(1, 2, 4, 4), _var(3, 2, 2, 2, name="w")
        with pytest.raises(ValueError, match="`padding` value must be >= 0"):
            ops.conv(x, w, padding=(1, -1, 0, 0))
        with pytest.raises(ValueError, match="`stride` value must be >= 1"):
            ops.conv(x, w, stride=(0, 1))
        with pytest.raises(ValueError, match="groups must be >= 1"):
            ops.conv(x, w, groups=0)


def test_conv_channel_and_group_mismatches():
    with popxl.Ir().main_graph:
        with pytest.raises(PopXLException, match=r"expected a weight \(M, C/groups=4"):
            ops.conv(_var(1, 4, 5, 5), _var(3, 2, 3, 3, name="w"))
        with pytest.raises(PopXLException, match="with groups=2"):
            ops.conv(_var(1, 4, 5, 5), _var(3, 2, 3, 3, name="w"), groups=2)  # 3 outputs, 2 groups
        with pytest.raises(PopXLException, match="rank >= 3 and a weight of the same rank"):
            ops.conv(_var(1, 4, 5, 5), _var(3, 4, 3, name="w"))
        with pytest.raises(PopXLException, match=r"expected a weight \(C=4, M/groups"):
            ops.conv_transpose(_var(1, 4, 5, 5), _var(3, 2, 3, 3, name="w"))


def test_conv_kernel_larger_than_input():
    with popxl.Ir().main_graph:
        with pytest.raises(PopXLException, match="the output would be empty"):
            ops.conv(_var(1, 2, 2, 2), _var(3, 2, 3, 3, name="w"))


def test_conv_dtypes():
    with popxl.Ir().main_graph:
        with pytest.raises(PopXLException, match="incompatible types float32 and float16"):
            ops.conv(_var(1, 2, 4, 4), _var(3, 2, 2, 2, dtype=popxl.float16, name="w"))
        with pytest.raises(PopXLException, match="float16 or float32, got int32"):
            ops.conv(
                _var(1, 2, 4, 4, dtype=popxl.int32), _var(3, 2, 2, 2, dtype=popxl.int32, name="w")
            )


def test_conv_ipu_options_are_validated():
    with popxl.Ir().main_graph:
        x, w = _var(1, 2, 4, 4), _var(3, 2, 2, 2, name="w")
        with pytest.raises(ValueError, match=r"available_memory_proportions must be in \(0, 1\]"):
            ops.conv(x, w, available_memory_proportions=[1.5])
        with pytest.raises(ValueError, match="Bad partials type 'double'"):
            ops.conv_transpose(
                _var(1, 2, 4, 4), _var(2, 3, 2, 2, name="w"), partials_types=["double"]
            )
        assert ops.conv(x, w, partials_types=["HALF"], enable_conv_dithering=[1]).shape == (
            1,
            3,
            3,
            3,
        )


def test_conv_inputs_must_be_tensors():
    with popxl.Ir().main_graph:
        with pytest.raises(TypeError, match="The input `weight` is not a Tensor"):
            ops.conv(_var(1, 2, 4, 4), np.ones((3, 2, 2, 2), np.float32))


def test_conv_transpose_output_shape_checks():
    with popxl.Ir().main_graph:
        x, w = _var(2, 4, 3, 3), _var(4, 2, 2, 2, name="w")
        with pytest.raises(ValueError, match="'valid' cannot be used if output_shape is also set"):
            ops.conv_transpose(x, w, pad_type="valid", output_shape=(6, 6))
        with pytest.raises(ValueError, match="output_shape needs one size per spatial axis"):
            ops.conv_transpose(x, w, output_shape=(6,))
        with pytest.raises(ValueError, match=r"does not start with \(N, M\) = \(2, 2\)"):
            ops.conv_transpose(x, w, output_shape=(2, 3, 6, 6))
        assert ops.conv_transpose(x, w, stride=(2, 2), output_shape=(2, 2, 5, 7)).shape == (
            2,
            2,
            5,
            7,
        )


@pytest.mark.parametrize("fn", [ops.conv_pow2scaled, ops.conv_transpose_pow2scaled])
def test_pow2scaled_checks(fn):
    with popxl.Ir().main_graph:
        x8 = _var(1, 2, 4, 4, dtype=popxl.float8_143)
        w8 = _var(2, 2, 2, 2, dtype=popxl.float8_152, name="w")
        with pytest.raises(
            TypeError, match="`t` is float16. Convert it with ops.pow2scale_cast_to_fp8"
        ):
            fn(_var(1, 2, 4, 4, dtype=popxl.float16), w8, _scale())
        with pytest.raises(TypeError, match="`weight` is float32"):
            fn(x8, _var(2, 2, 2, 2, name="w"), _scale())
        with pytest.raises(ValueError, match="^Log2 scale argument must be a scalar tensor: "):
            fn(x8, w8, _scale(shape=(1,)))
        with pytest.raises(TypeError, match="^Log2 scale tensor must be of type popxl.int32: "):
            fn(x8, w8, _scale(dtype=popxl.int8))
        y = fn(x8, w8, _scale())
    assert y.dtype == popxl.float16
    assert y.name == ("conv_out" if fn is ops.conv_pow2scaled else "convtranspose_out")


# Pooling ---------------------------------------------------------------------------------


def test_pool_names_and_types():
    ir = popxl.Ir()
    with ir.main_graph:
        a = ops.average_pool(_var(1, 2, 4, 4), (2, 2), stride=(2, 2))
        m = ops.max_pool(_var(1, 2, 4, 4), (3, 3), padding=(1, 1, 1, 1), out_pads=(0, 0, 1, 1))
    assert (a.name, a.shape) == ("averagepool_out", (1, 2, 2, 2))
    assert (m.name, m.shape) == ("maxpool_out", (1, 2, 5, 5))
    assert _op_types(ir.main_graph)[-2:] == ["AveragePool", "MaxPool"]


@pytest.mark.parametrize("fn", [ops.average_pool, ops.max_pool])
def test_pool_argument_errors(fn):
    with popxl.Ir().main_graph:
        x = _var(1, 2, 5, 5)
        with pytest.raises(ValueError, match="pad type 'SAME' is not valid"):
            fn(x, (2, 2), auto_pad="SAME")
        with pytest.raises(PopXLException, match=r"`kernel_size` needs 2 values .* got \(2,\)"):
            fn(x, (2,))
        with pytest.raises(ValueError, match="kernel_size is required"):
            fn(x, ())
        with pytest.raises(PopXLException, match="the output would be empty"):
            fn(x, (6, 6))
        with pytest.raises(PopXLException, match="rank >= 3"):
            fn(_var(2, 5), (2,))


def test_max_pool_storage_order():
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="storage_order 'diagonal' is not valid"):
            ops.max_pool(_var(1, 2, 4, 4), (2, 2), storage_order="diagonal")


# Normalisation ---------------------------------------------------------------------------


def test_norm_names_types_and_statistics_outputs():
    ir = popxl.Ir()
    with ir.main_graph:
        x = _var(2, 4, 3)
        c = [_var(4, name=n) for n in ("a", "b", "m", "v")]
        bn = ops.batch_norm_inference(x, *c)
        gn = ops.group_norm(x, c[0], c[1], 2)
        ln = ops.layer_norm(x, c[0], c[1])
    assert (bn.name, gn.name) == ("batch_norm_out", "group_norm_out")
    assert ln.name.startswith("group_norm_out") and ln.shape == x.shape
    assert _op_types(ir.main_graph)[-3:] == [
        "BatchNormalization",
        "GroupNormalization",
        "GroupNormalization",
    ]
    stats = ir.main_graph.ops[-2].outputs[1:]
    assert [(t.name, t.shape) for t in stats] == [
        ("group_norm_mean", (4,)),
        ("group_norm_inv_std_dev", (4,)),
    ]


def test_norm_errors():
    with popxl.Ir().main_graph:
        x = _var(2, 4, 3)
        w, b = _var(4, name="w"), _var(4, name="b")
        with pytest.raises(PopXLException, match=r"do not split into num_groups=3"):
            ops.group_norm(x, w, b, 3)
        with pytest.raises(ValueError, match="num_groups must be >= 1"):
            ops.group_norm(x, w, b, 0)
        with pytest.raises(PopXLException, match=r"must have shape \(4,\) .* got \(3,\)"):
            ops.layer_norm(x, _var(3, name="w3"), b)
        with pytest.raises(PopXLException, match="rank >= 2"):
            ops.layer_norm(_var(4), w, b)
        with pytest.raises(PopXLException, match=r"must have shape \(4,\) .* got \(1, 4\)"):
            ops.batch_norm_inference(x, w, b, _var(1, 4, name="m"), _var(4, name="v"))
        with pytest.raises(PopXLException, match="incompatible types float32 and float16"):
            ops.batch_norm_inference(
                x, w, b, _var(4, name="m"), _var(4, dtype=popxl.float16, name="v")
            )


# Resize ----------------------------------------------------------------------------------


def test_interpolate_name_type_and_shape():
    ir = popxl.Ir()
    with ir.main_graph:
        y = ops.interpolate(_var(1, 2, 5, 4), (1.0, 1.0, 1.4, 0.5), mode="linear")
    assert (y.name, y.shape) == ("interpolate_out", (1, 2, 7, 2))
    assert _op_types(ir.main_graph)[-1] == "Resize"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "bilinear"}, "interpolate type 'bilinear' is not valid"),
        ({"nearest_mode": "round"}, "nearest mode 'round' is not valid"),
        (
            {"coordinate_transformation_mode": "half_pixel_symmetric"},
            "coordinate transformation mode",
        ),
        ({"scale_factor": (1.0, 1.0, 0.0, 1.0)}, "scale factors must be positive"),
    ],
)
def test_interpolate_bad_arguments(kwargs, message):
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match=message):
            ops.interpolate(_var(1, 2, 4, 4), **kwargs)


def test_interpolate_shape_errors():
    with popxl.Ir().main_graph:
        with pytest.raises(PopXLException, match="one value per axis of the input"):
            ops.interpolate(_var(2, 4, 4))
        with pytest.raises(PopXLException, match="to the empty shape"):
            ops.interpolate(_var(1, 2, 4, 4), (1.0, 1.0, 0.2, 1.0))


# RoIAlign --------------------------------------------------------------------------------


def test_roi_align_name_type_and_shape():
    ir = popxl.Ir()
    with ir.main_graph:
        y = ops.roi_align(
            _var(2, 3, 6, 6),
            _var(5, 4, name="rois"),
            _var(5, dtype=popxl.int32, name="b"),
            (2, 3),
            0.5,
            2,
        )
    assert (y.name, y.shape) == ("roi_align_out", (5, 3, 2, 3))
    assert _op_types(ir.main_graph)[-1] == "RoiAlign"


def test_roi_align_errors():
    with popxl.Ir().main_graph:
        x, rois, b = _var(2, 3, 6, 6), _var(5, 4, name="rois"), _var(5, dtype=popxl.int32, name="b")
        with pytest.raises(ValueError, match="output_size must be two positive ints"):
            ops.roi_align(x, rois, b, (2,), 1.0, 2)
        with pytest.raises(PopXLException, match=r"input must be \(N, C, H, W\)"):
            ops.roi_align(_var(3, 6, 6), rois, b, (2, 2), 1.0, 2)
        with pytest.raises(PopXLException, match=r"rois must be \(num_rois, 4\)"):
            ops.roi_align(x, _var(5, 5, name="r5"), b, (2, 2), 1.0, 2)
        with pytest.raises(PopXLException, match=r"batch_index must be \(5,\)"):
            ops.roi_align(x, rois, _var(4, dtype=popxl.int32, name="b4"), (2, 2), 1.0, 2)
        with pytest.raises(PopXLException, match="batch_index must be int32, got float32"):
            ops.roi_align(x, rois, _var(5, name="bf"), (2, 2), 1.0, 2)


def test_pad_type_is_exported():
    assert ops.PadType.__args__ == ("not_set", "same_upper", "same_lower", "valid")
