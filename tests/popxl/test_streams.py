"""Host streams: handles in the main graph, names, equality and string form."""

import numpy as np
import pytest

import popxl
from popxl.streams import Stream


def test_streams_cannot_be_constructed():
    for cls in (Stream, popxl.HostToDeviceStream, popxl.DeviceToHostStream):
        with pytest.raises(NotImplementedError):
            cls()


def test_stream_properties_and_names():
    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.h2d_stream([2, 3], popxl.float16)
        h2 = popxl.h2d_stream((2,), popxl.int32)
        d = popxl.d2h_stream((), popxl.float32, "out")
    assert isinstance(h, popxl.HostToDeviceStream) and isinstance(d, popxl.DeviceToHostStream)
    assert (h.shape, h.dtype, h.spec) == (
        (2, 3),
        popxl.float16,
        popxl.TensorSpec((2, 3), popxl.float16),
    )
    assert (h.tensor_id, h2.tensor_id, d.tensor_id) == ("h2d_stream", "h2d_stream__t0", "out")
    assert str(h) == "HostToDeviceStream Tensor[h2d_stream popxl.dtypes.float16 (2, 3)]"
    assert str(d) == "DeviceToHostStream Tensor[out popxl.dtypes.float32 ()]"
    assert h == h and h != h2 and len({h, h2, h}) == 2


def test_streams_created_in_a_subgraph_live_in_main():
    ir = popxl.Ir()
    g = ir.create_empty_graph()
    with g, popxl.name_scope("scope"):
        h = popxl.h2d_stream((2,), popxl.float32, "x")
    assert h.tensor_id == "scope/x"
    assert ir.main_graph.get_tensor("scope/x").shape == (2,)
    assert g.tensors == ()


@pytest.mark.parametrize(
    "make, dtype, message",
    [
        (
            popxl.h2d_stream,
            "float32x",
            "h2d_stream: dtype must be a popxl dtype (e.g. popxl.float32), got 'float32x' of "
            "type str. Did you mean popxl.float32?",
        ),
        (
            popxl.d2h_stream,
            "int32",
            "d2h_stream: dtype must be a popxl dtype (e.g. popxl.float32), got 'int32' of type "
            "str. Did you mean popxl.int32?",
        ),
        (
            popxl.h2d_stream,
            np.float32,
            "h2d_stream: dtype must be a popxl dtype (e.g. popxl.float32), got <class "
            "'numpy.float32'> of type type.",
        ),
    ],
)
def test_stream_dtype_must_be_a_popxl_dtype(make, dtype, message):
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(TypeError) as info:
            make((2,), dtype)
        assert str(info.value) == message
        assert not ir._streams
