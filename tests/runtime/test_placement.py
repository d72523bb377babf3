"""Placement of virtual IPUs on devices: same numbers placed and unplaced, real transfers."""

import jax
import numpy as np
import pytest

import popxl
from popxl import ops
from runtime.session.program import build_program


def _serial_four_ipus(rng):
    """matmul+bias on IPU 0, gelu on 1, matmul on 2, softmax on 3, weights on their IPUs."""
    w1 = rng.normal(0, 0.3, (4, 16)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (16, 2)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((3, 4), popxl.float32)
        y_out = popxl.d2h_stream((3, 2), popxl.float32)
        with popxl.ipu(0):
            a = popxl.variable(w1, name="w1")
            h = ops.matmul(ops.host_load(x_in), a)
            h = ops.ipu_copy(h, 1)
        with popxl.ipu(1):
            h = ops.gelu(h).copy_to_ipu(2)
        with popxl.ipu(2):
            b = popxl.variable(w2, name="w2")
            b += 0.5  # written on IPU 2: its value lives in device 2's slot
            z = ops.ipu_copy(ops.matmul(h, b), 3)
        with popxl.ipu(3):
            ops.host_store(y_out, ops.softmax(z, axis=1))
    return ir, x_in, y_out, b, (w1, w2)


def _reference(x, w1, w2):

    h = np.asarray(jax.nn.gelu(x @ w1, approximate=True))
    z = h @ w2
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("placement", ["off", "on"])
def test_four_ipu_program_gives_the_same_numbers_placed_or_not(monkeypatch, rng, placement):
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    ir, x_in, y_out, b, (w1, w2) = _serial_four_ipus(rng)
    x = rng.normal(0, 1, (3, 4)).astype(np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        y1 = session.run({x_in: x})[y_out]
        y2 = session.run({x_in: x})[y_out]
        assert session._program.ipus == (4 if placement == "on" else 0)
    np.testing.assert_allclose(y1, _reference(x, w1, w2 + 0.5), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y2, _reference(x, w1, w2 + 1.0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(session.get_tensor_data(b), w2 + 1.0)


def test_placed_program_transfers_between_devices_and_skips_foreign_ops(monkeypatch, rng):
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir, *_ = _serial_four_ipus(rng)
    program = build_program(ir)
    assert program.ipus == 4
    # w1 is only read, by IPU 0: IPU 0 owns it; w2 is written on IPU 2. Their sizes differ,
    # so each has a slot of its own (padding on the other devices).
    names = [v.name for v in program.variables]
    assert dict(zip(names, program.homes)) == {"w1": 0, "w2": 2}
    assert program.slots is not None and len(program.slots.slots) == 2
    session = popxl.Session(ir, "ipu_model")
    hlo = session._lowered().as_text()
    assert hlo.count("collective_permute") >= 3  # the three ipu_copy transfers
    assert "stablehlo.case" in hlo or "stablehlo.if" in hlo  # ops run on their device only
    with session:
        devices = {d.id for d in session._state[0].sharding.device_set}
    assert len(devices) == 4


def test_implicit_read_across_ipus_is_moved(monkeypatch):
    """A host store placed on another IPU than its value's producer still stores the value."""
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir = popxl.Ir()
    with ir.main_graph:
        out = popxl.d2h_stream((2,), popxl.float32)
        with popxl.ipu(1):
            v = popxl.variable(np.array([1.0, 2.0], np.float32))
            y = v * 3.0
        with popxl.ipu(0):
            ops.host_store(out, y)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[out], [3.0, 6.0])


@pytest.mark.parametrize("placement", ["off", "on"])
def test_print_runs_once_on_its_ipu(monkeypatch, capfd, placement):
    """A print on IPU 1 prints its value once, placed or not (not once per device)."""
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    ir = popxl.Ir()
    with ir.main_graph:
        out = popxl.d2h_stream((2,), popxl.float32)
        with popxl.ipu(0):
            v = popxl.variable(np.array([1.0, 2.0], np.float32))
        with popxl.ipu(1):
            y = ops.print_tensor(v.copy_to_ipu(1, 0) * 3.0, "y")
        with popxl.ipu(0):
            ops.host_store(out, y.copy_to_ipu(0))
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_array_equal(session.run()[out], [3.0, 6.0])
    printed = [line for line in capfd.readouterr().err.splitlines() if line.startswith("y:")]
    assert printed == ["y: [3. 6.]"]


def test_placement_on_with_too_few_devices_is_an_error(monkeypatch):
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir = popxl.Ir()
    with ir.main_graph, popxl.ipu(0):
        x = popxl.variable(1.0)
        x.copy_to_ipu(9, 0)
    with pytest.raises(ValueError, match="uses 10 IPUs but JAX has 8 devices"):
        build_program(ir)


def test_bad_placement_setting_is_an_error(monkeypatch):
    monkeypatch.setenv("POPXL_PLACEMENT", "sometimes")
    ir = popxl.Ir()
    with ir.main_graph, popxl.ipu(0):
        popxl.variable(1.0).copy_to_ipu(1, 0)
    with pytest.raises(ValueError, match="POPXL_PLACEMENT must be auto, off or on"):
        build_program(ir)


def _replicated_two_ipus():
    """2 replicas x 2 IPUs: w (on IPU 0) times each replica's input, summed over replicas on
    IPU 1."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x_in = popxl.h2d_stream((3,), popxl.float32)
        out = popxl.d2h_stream((3,), popxl.float32)
        with popxl.ipu(0):
            w = popxl.variable(np.array([1.0, 2.0, 3.0], np.float32), name="w")
            y = (ops.host_load(x_in) * w).copy_to_ipu(1)
        with popxl.ipu(1):
            ops.host_store(out, ops.collectives.replicated_all_reduce(y))
    return ir, x_in, out


@pytest.mark.parametrize(("replication", "placement"), [("vmap", "auto"), ("shard_map", "off")])
def test_replicated_programs_unplaced_are_mapped_over_replicas(monkeypatch, replication, placement):
    """vmap (replicas on one device) and POPXL_PLACEMENT=off leave each replica's IPUs on
    one device; runtime/test_placement_replicated.py covers placed replicas."""
    monkeypatch.setenv("POPXL_REPLICATION", replication)
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    ir, x_in, out = _replicated_two_ipus()
    x = np.array([[1.0, 1.0, 1.0], [2.0, 0.0, -1.0]], np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run({x_in: x})[out]
        assert (session._program.ipus, session._program.mode) == (0, replication)
        report = session.memory_report()
    np.testing.assert_allclose(got, np.broadcast_to([3.0, 2.0, 0.0], (2, 3)))
    assert report.devices == 1 and [m.resident for m in report.ipus] == [12, 12]


def test_placement_on_with_vmap_replication_is_an_error(monkeypatch):
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    monkeypatch.setenv("POPXL_REPLICATION", "vmap")
    ir, *_ = _replicated_two_ipus()
    with pytest.raises(ValueError, match="vmap runs the 2 replicas on one device"):
        build_program(ir)


def test_copies_of_one_call_travel_in_one_transfer(monkeypatch):
    """A call of two opposite IPU copies of one shape (a pipeline cycle's activation and
    gradient) is one collective-permute, and each copy arrives on its destination."""
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        out0 = popxl.d2h_stream((2,), popxl.float32)
        out1 = popxl.d2h_stream((2,), popxl.float32)
        with popxl.ipu(0):
            a = popxl.variable(np.array([1.0, 2.0], np.float32), name="a") * 10.0
        with popxl.ipu(1):
            b = popxl.variable(np.array([3.0, 4.0], np.float32), name="b") * 100.0
        copies = ir.create_empty_graph("copies")
        with copies:
            xa = popxl.graph_input((2,), popxl.float32, "xa")
            xb = popxl.graph_input((2,), popxl.float32, "xb")
            with popxl.ipu(0):
                ya = ops.ipu_copy(xa, 1, 0)
            with popxl.ipu(1):
                yb = ops.ipu_copy(xb, 0, 1)
            popxl.graph_output(ya)
            popxl.graph_output(yb)
        with popxl.ipu(0):
            on1, on0 = ops.call(copies, a, b)
        with popxl.ipu(1):
            ops.host_store(out1, on1 + 1.0)
        with popxl.ipu(0):
            ops.host_store(out0, on0 + 1.0)
    session = popxl.Session(ir, "ipu_model")
    hlo = session._lowered().as_text()
    assert hlo.count("collective_permute") == 1
    with session:
        got = session.run()
    np.testing.assert_array_equal(got[out1], [11.0, 21.0])
    np.testing.assert_array_equal(got[out0], [301.0, 401.0])


@pytest.mark.parametrize("placement", ["off", "on"])
@pytest.mark.parametrize("flag", [True, False])
def test_conditional_writing_a_by_ref_input_on_another_ipu(monkeypatch, placement, flag):
    """A branch that updates a variable of IPU 1 by reference, placed or not."""
    monkeypatch.setenv("POPXL_PLACEMENT", placement)

    def bump(t: popxl.TensorByRef, k: popxl.Tensor):
        ops.var_updates.accumulate_(t, k)
        return t * 2.0

    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.h2d_stream((), popxl.bool, "flag")
        with popxl.ipu(0):
            k = popxl.variable(np.array([10.0, 20.0], np.float32), name="k") * 1.0
            cond = ops.host_load(h)
            k = k.copy_to_ipu(1)
        with popxl.ipu(1):
            w = popxl.variable(np.array([1.0, 2.0], np.float32), name="w")
            then_g = ir.create_graph(bump, w, k)
            else_g = ir.create_graph(lambda t, _: t + 0.5, w, k)
            (out,) = ops.conditional(cond, then_g, else_g, [w, k], [w, k])
        d = popxl.d2h_stream((2,), popxl.float32, "out")
        ops.host_store(d, out)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run({h: np.array(flag)})[d]
        final = session.get_tensor_data(w)
    np.testing.assert_allclose(got, [22.0, 44.0] if flag else [1.5, 2.5])
    np.testing.assert_allclose(final, [11.0, 22.0] if flag else [1.0, 2.0])


@pytest.mark.parametrize("placement", ["off", "on"])
def test_view_returned_by_a_call_lowered_op_by_op_keeps_its_device(monkeypatch, placement):
    """Campaign seed 702010505: a call's output that is a view of its input, read at the
    call's end, is valid only on the call's device; it was taken as valid everywhere and
    the host store read another device's zeros."""
    monkeypatch.setenv("POPXL_PLACEMENT", placement)

    def tail(t: popxl.Tensor):
        ops.collectives.replicated_reduce_scatter(t, op="mean")
        return ops.slice_(t, start=[2], stop=[4])

    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x_in = popxl.h2d_stream((4,), popxl.float32, "x")
        with popxl.ipu(1):
            x = ops.maximum(ops.host_load(x_in), popxl.constant(0.0)).copy_to_ipu(0)
        with popxl.ipu(0):
            (y,) = ops.call(ir.create_graph(tail, x), x)
        out = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(out, y)
    x = np.array([[1, -2, 3, 4], [5, 6, -7, 8]], np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run({x_in: x})[out]
    np.testing.assert_array_equal(got, [[3.0, 4.0], [0.0, 8.0]])


@pytest.mark.parametrize("placement", ["off", "on"])
def test_by_ref_view_written_by_a_call_lowered_op_by_op(monkeypatch, placement):
    """A call on IPU 0 holding a collective writes, by reference, a slice of a variable of
    IPU 0 with a value computed on IPU 1; the variable keeps the write on its device."""
    monkeypatch.setenv("POPXL_PLACEMENT", placement)

    def add_summed(t: popxl.TensorByRef, k: popxl.Tensor):
        ops.var_updates.accumulate_(t, ops.collectives.replicated_all_reduce(k))

    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        x_in = popxl.h2d_stream((4,), popxl.float32, "x")
        with popxl.ipu(1):
            k = (ops.host_load(x_in) * 2.0).copy_to_ipu(0)
        with popxl.ipu(0):
            w = popxl.variable(np.zeros(6, np.float32), name="w")
            part = ops.slice_(w, start=[1], stop=[5])
            ops.call(ir.create_graph(add_summed, part, k), part, k)
        out = popxl.d2h_stream((6,), popxl.float32, "w")
        ops.host_store(out, w)
    x = np.array([[1, 2, 3, 4], [10, 20, 30, 40]], np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run({x_in: x})[out]
        final = session.get_tensor_data(w)
    want = np.array([0, 22, 44, 66, 88, 0], np.float32)
    np.testing.assert_array_equal(got, [want, want])
    np.testing.assert_array_equal(final, want)


def test_a_placed_step_is_traced_once_when_its_owners_are_found_at_once(monkeypatch, rng):
    """The probe that finds each variable's owning IPU traces the jitted step itself, so
    compiling it reuses that trace; when the first guess of the owners needs correcting,
    one more probe traces it (never a separate trace for lowering)."""
    import runtime.session.program as program_module

    traces = []
    placed_step = program_module.placed_step

    def counting(step, *args, **kwargs):
        def counted(*a, **k):
            traces.append(1)
            return step(*a, **k)

        return placed_step(counted, *args, **kwargs)

    monkeypatch.setattr(program_module, "placed_step", counting)
    monkeypatch.setattr(program_module, "_STEP_CACHE", type(program_module._STEP_CACHE)())
    monkeypatch.setenv("POPXL_PLACEMENT", "on")
    ir, x_in, y_out, b, (w1, w2) = _serial_four_ipus(rng)
    x = rng.normal(0, 1, (3, 4)).astype(np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        y = session.run({x_in: x})[y_out]
    assert len(traces) == 1
    np.testing.assert_allclose(y, _reference(x, w1, w2 + 0.5), rtol=1e-5, atol=1e-6)
