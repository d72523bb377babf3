"""print_tensor prints to stderr at run time, honouring its formatting arguments."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def _run(build, x):
    ir = popxl.Ir()
    with ir.main_graph:
        stream = popxl.h2d_stream(x.shape, popxl.dtype.as_dtype(x.dtype), "x")
        out = build(ops.host_load(stream, "x"))
        out_stream = popxl.d2h_stream(out.shape, out.dtype, "out")
        ops.host_store(out_stream, out)
    with popxl.Session(ir, "ipu_model") as session:
        return session.run({stream: x})[out_stream]


X = np.array([[1.5, -2.0, 3.25], [0.0, 4.0, 5.5]], np.float32)


def test_prints_title_and_values_at_run_time(capfd):
    ir = popxl.Ir()
    with ir.main_graph:
        x = ops.host_load(popxl.h2d_stream((2, 3), popxl.float32, "x"), "x")
        p = ops.print_tensor(x)
    assert p.name == "print_out" and p._producer.type == "PrintTensor"
    assert capfd.readouterr().err == ""  # nothing is printed while building

    out = _run(lambda t: ops.print_tensor(t), X)
    np.testing.assert_array_equal(out, X)
    err = capfd.readouterr().err
    assert "print_x_hostload: [[ 1.5  -2.    3.25]" in err
    assert "[ 0.    4.    5.5 ]]" in err


def test_custom_title_and_formatting(capfd):
    _run(
        lambda t: ops.print_tensor(
            t,
            "mine",
            separator=",",
            open_bracket="(",
            close_bracket=")",
            float_format="fixed",
            digits=2,
        ),
        X,
    )
    err = capfd.readouterr().err
    assert err.startswith("mine: ((")
    assert "1.50,-2.00, 3.25)" in err
    assert "[" not in err


def test_scientific_and_summarised(capfd):
    x = np.arange(20, dtype=np.float32)
    _run(
        lambda t: ops.print_tensor(
            t, "big", summarise_threshold=10, edge_items=2, float_format="scientific", digits=1
        ),
        x,
    )
    err = capfd.readouterr().err
    assert "big: [0.0e+00 1.0e+00 ... 1.8e+01 1.9e+01]" in err


def test_print_self_false_prints_nothing(capfd):
    out = _run(lambda t: ops.print_tensor(t, print_self=False) + 1.0, X)
    np.testing.assert_array_equal(out, X + 1)
    assert "print_" not in capfd.readouterr().err


def test_print_is_not_dropped_when_unused(capfd):
    def build(t):
        ops.print_tensor(t, "unused")
        return t

    _run(build, X)
    assert "unused: " in capfd.readouterr().err


def test_prints_every_execution(capfd):
    def build(t):
        ir = popxl.gcg().ir
        body = ir.create_graph(lambda v: ops.print_tensor(v, "loop") + 1.0, t)
        (out,) = ops.repeat(body, 3, t)
        return out

    out = _run(build, X)
    np.testing.assert_array_equal(out, X + 3)
    assert capfd.readouterr().err.count("loop: ") == 3


def test_gradient_print_flag_is_recorded():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(X, name="x")
        p = ops.print_tensor(x, print_gradient=True)
    assert p._producer.attrs["title"] == "print_x"
    assert p._producer.attrs["print_gradient"] is True


@pytest.mark.parametrize(
    "kwargs", [{"separator": ", "}, {"open_bracket": ""}, {"close_bracket": "]]"}]
)
def test_bad_characters_raise(kwargs):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(X)
        with pytest.raises(ValueError, match="exactly one character"):
            ops.print_tensor(x, **kwargs)


def test_unknown_float_format_raises():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(X)
        with pytest.raises(KeyError, match="float_format"):
            ops.print_tensor(x, float_format="hex")


def test_gradient_is_printed_with_gradient_suffix(capfd):
    def build(t):
        ir = popxl.gcg().ir

        def fwd(x):
            return ops.print_tensor(x, print_gradient=True) * 3.0

        graph = ir.create_graph(fwd, t)
        grad_info = popxl.transforms.autodiff(graph)
        call_info = ops.call_with_info(graph, t)
        seed = popxl.constant(np.ones(t.shape, np.float32))
        activations = grad_info.inputs_dict(call_info)
        (dx,) = ops.call(grad_info.graph, seed, inputs_dict=activations)
        return dx

    dx = _run(build, X)
    np.testing.assert_array_equal(dx, np.full_like(X, 3.0))
    err = capfd.readouterr().err
    assert err.count("print_x: ") == 1
    assert "print_x_gradient: [[3. 3. 3.]" in err


@pytest.mark.parametrize("replication", ["vmap", "shard_map"])
def test_each_replica_prints_its_value(capfd, monkeypatch, replication):
    """On one device (vmap) and with a device per replica (shard_map, where XLA cannot order
    callbacks across devices) every replica prints its own value."""
    import jax

    if len(jax.devices()) < 2 and replication == "shard_map":
        pytest.skip("needs 2 devices")
    monkeypatch.setenv("POPXL_REPLICATION", replication)
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x = ops.host_load(popxl.h2d_stream((2,), popxl.float32, "x"), "x")
        ops.print_tensor(x * 2, "twice")
        out = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(out, x + 1)
    data = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        (stream,) = session.expected_inputs()
        result = session.run({stream: data})
    np.testing.assert_array_equal(result[out], data + 1)
    lines = sorted(line for line in capfd.readouterr().err.splitlines() if line.startswith("twice"))
    assert lines == ["twice: [2. 4.]", "twice: [6. 8.]"]
