"""Run-time checks: the log2 scale of pow2-scaled float8 ops (throwIfLog2ScaleTensorNotInRange)."""

import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import Error


def _message(value):
    return (
        "Log2 scale is not in the range [-32, 32). A pow2-scaled float8 op "
        "(pow2scale_cast_to_fp8, pow2scale_cast_from_fp8, matmul_pow2scaled, conv_pow2scaled "
        f"or conv_transpose_pow2scaled) read log2_scale = {value} at run time. Keep the scale "
        "in [-32, 32), or set ir._pb_ir.getSessionOptions().throwIfLog2ScaleTensorNotInRange "
        "= False before creating the Session to apply any scale unchecked. The run was undone: "
        "variables, remote buffers and outputs are as before it."
    )


def _cast_program(replication=1):
    """counter += 1 (in place), then y = cast_from_fp8(x, scale) for a streamed scale."""
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        counter = popxl.variable(np.zeros((), np.float32), name="counter")
        ops.var_updates.accumulate_(counter, popxl.constant(1.0))
        x = popxl.variable(np.array([1.5, -2.0], np.float32), popxl.float8_143, name="x")
        s_h2d = popxl.h2d_stream((), popxl.int32, "scale")
        y = ops.pow2scale_cast_from_fp8(x, ops.host_load(s_h2d), popxl.float32)
        y_d2h = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(y_d2h, y)
    return ir, counter, s_h2d, y_d2h


@pytest.mark.parametrize("scale", [-32, 0, 31])
def test_scales_in_range_run(scale):
    ir, counter, s_h2d, y_d2h = _cast_program()
    with popxl.Session(ir) as session:
        out = session.run({s_h2d: np.int32(scale)})[y_d2h]
    np.testing.assert_array_equal(out, np.ldexp(np.array([1.5, -2.0], np.float32), scale))
    assert session.get_tensor_data(counter) == 1.0


@pytest.mark.parametrize("scale", [-33, 32, 100])
def test_scale_out_of_range_raises_and_the_run_is_undone(scale):
    ir, counter, s_h2d, y_d2h = _cast_program()
    assert ir._pb_ir.getSessionOptions().throwIfLog2ScaleTensorNotInRange  # PopART's default
    with popxl.Session(ir) as session:
        session.run({s_h2d: np.int32(0)})
        with pytest.raises(Error, match=re.escape(_message(scale))):
            session.run({s_h2d: np.int32(scale)})
        assert session.get_tensor_data(counter) == 1.0
        session.run({s_h2d: np.int32(1)})  # the session stays usable
        assert session.get_tensor_data(counter) == 2.0


def test_option_off_applies_any_scale():
    ir, counter, s_h2d, y_d2h = _cast_program()
    ir._pb_ir.getSessionOptions().throwIfLog2ScaleTensorNotInRange = False
    with popxl.Session(ir) as session:
        out = session.run({s_h2d: np.int32(40)})[y_d2h]
    np.testing.assert_array_equal(out, np.ldexp(np.array([1.5, -2.0], np.float32), 40))
    assert session.get_tensor_data(counter) == 1.0


def test_option_is_read_when_the_session_is_made():
    ir, _, s_h2d, _ = _cast_program()
    opts = ir._pb_ir.getSessionOptions()
    opts.throwIfLog2ScaleTensorNotInRange = False
    with popxl.Session(ir) as session:
        session.run({s_h2d: np.int32(-50)})
    opts.throwIfLog2ScaleTensorNotInRange = True
    with popxl.Session(ir) as session, pytest.raises(Error, match="read log2_scale = -50 "):
        session.run({s_h2d: np.int32(-50)})


def test_one_bad_replica_fails_the_run_for_all():
    ir, counter, s_h2d, _ = _cast_program(replication=2)
    with popxl.Session(ir) as session:
        with pytest.raises(Error, match="read log2_scale = 40 "):
            session.run({s_h2d: np.array([3, 40], np.int32)})
        np.testing.assert_array_equal(session.get_tensor_data(counter), 0.0)
        session.run({s_h2d: np.array([3, 4], np.int32)})
        np.testing.assert_array_equal(session.get_tensor_data(counter), 1.0)


def test_a_bad_scale_inside_a_loop_and_a_branch_is_found():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 2), np.float32), popxl.float8_152, name="x")
        scale = popxl.variable(np.int32(28), name="scale")
        flag_h2d = popxl.h2d_stream((), popxl.bool, "flag")
        flag = ops.host_load(flag_h2d)

        def scaled(x, s):
            return ops.matmul_pow2scaled(x, x, s)

        def unscaled(x, s):
            return ops.matmul_pow2scaled(x, x, popxl.constant(0, popxl.int32))

        then_graph = ir.create_graph(scaled, x, scale)
        else_graph = ir.create_graph(unscaled, x, scale)

        def body(flag, x, scale: popxl.TensorByRef):
            ops.var_updates.accumulate_(scale, popxl.constant(1, popxl.int32))
            ops.conditional(flag, then_graph, else_graph, [x, scale], [x, scale])

        ops.repeat(ir.create_graph(body, flag, x, scale), 4, flag, x, scale)
    with popxl.Session(ir) as session:
        session.run({flag_h2d: np.bool_(False)})  # the bad scales are in the branch not taken
        assert session.get_tensor_data(scale) == 32
        session.write_variable_data(scale, np.int32(28))
        with pytest.raises(Error, match="read log2_scale = 32 "):
            session.run({flag_h2d: np.bool_(True)})
        assert session.get_tensor_data(scale) == 28


def test_matmul_and_conv_are_checked():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((1, 1, 3, 3), np.float32), popxl.float8_143, name="a")
        s = popxl.variable(np.int32(-40), name="s")
        ops.print_tensor(ops.conv_pow2scaled(a, a, s))
    with popxl.Session(ir) as session, pytest.raises(Error, match="read log2_scale = -40 "):
        session.run()
