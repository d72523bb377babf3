"""Session construction, run results and compilation caching."""

import contextlib
import itertools

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

import popxl
import popxl.ops as ops
from runtime.session import program

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# Constants unique to one test keep its programs out of the steps other tests compiled.
_fresh = itertools.count(1000)


def _add_program(nht=1, replication=1, constant=1.0, stream_name="x"):
    """out = x + w + constant, with a variable w = [1, 2]."""
    ir = popxl.Ir(replication=replication)
    ir.num_host_transfers = nht
    with ir.main_graph:
        w = popxl.variable(np.array([1.0, 2.0], np.float32), name="w")
        x_h2d = popxl.h2d_stream((2,), popxl.float32, stream_name)
        out_d2h = popxl.d2h_stream((2,), popxl.float32, "out")

        def body(w):
            ops.host_store(out_d2h, ops.host_load(x_h2d) + w + constant)

        ops.repeat(ir.create_graph(body, w), nht, w)
    return ir, w, x_h2d, out_d2h


@contextlib.contextmanager
def _count_compiles():
    events = []

    def listener(event, duration, **kwargs):
        if event == BACKEND_COMPILE_EVENT:
            events.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


# Constructor --------------------------------------------------------------------------------


@pytest.mark.parametrize("device_desc", ["ipu", "gpu", "IPU_MODEL", None, 1])
def test_bad_device_desc(device_desc):
    ir, *_ = _add_program()
    with pytest.raises(
        ValueError, match="Incorrect device type provided: .*must be one of: ipu_hw, ipu_model, cpu"
    ):
        popxl.Session(ir, device_desc)


@pytest.mark.parametrize("device_desc", ["cpu", "ipu_model", "ipu_hw"])
def test_every_device_desc_runs(device_desc):
    ir, w, x_h2d, out_d2h = _add_program()
    session = popxl.Session(ir, device_desc)
    assert session.ir is ir
    assert session.weights_to_host_on_exit
    with session:
        out = session.run({x_h2d: np.array([10.0, 20.0], np.float32)})[out_d2h]
    np.testing.assert_array_equal(out, [12.0, 23.0])


@pytest.mark.parametrize("device_desc", ["cpu", "ipu_model", "ipu_hw"])
def test_every_device_desc_picks_jaxs_default_device(monkeypatch, device_desc):
    """A GPU, when JAX has one, is its default device: ``ipu_hw`` (and the others) use it."""
    from runtime.devices import device

    gpu = object()
    monkeypatch.setattr(jax, "devices", lambda *backend: [gpu])
    assert device.select_device(device_desc) is gpu


def test_session_state_lives_on_the_selected_device():
    ir, w, x_h2d, out_d2h = _add_program()
    with popxl.Session(ir, "ipu_hw") as session:
        session.run({x_h2d: np.array([10.0, 20.0], np.float32)})
        assert session._state
        assert all(leaf.devices() == {jax.devices()[0]} for leaf in session._state)


def test_ir_without_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(np.zeros(2, np.float32))
        popxl.d2h_stream((2,), popxl.float32)
    with pytest.raises(RuntimeError, match=f"The Ir {ir.id} has no graphs"):
        popxl.Session(ir)


def test_replication_factor_is_fixed_once_a_session_exists():
    ir, *_ = _add_program(replication=2)
    ir.replication_factor = 2
    popxl.Session(ir)
    with pytest.raises(RuntimeError, match="replication factor cannot change"):
        ir.replication_factor = 4
    assert ir.replication_factor == 2


def test_num_host_transfers_is_fixed_at_construction():
    ir, w, x_h2d, out_d2h = _add_program(nht=2)
    session = popxl.Session(ir)
    ir.num_host_transfers = 3
    x = np.zeros((2, 2), np.float32)
    with session:
        out = session.run({x_h2d: x})[out_d2h]
        assert session.create_host_outputs()[out_d2h].shape == (2, 2)
    np.testing.assert_array_equal(out, np.tile([2.0, 3.0], (2, 1)))


def test_expected_inputs_is_a_set_of_loaded_streams():
    ir, w, x_h2d, out_d2h = _add_program()
    with ir.main_graph:
        popxl.h2d_stream((2,), popxl.float32, "never_loaded")
    session = popxl.Session(ir)
    inputs = session.expected_inputs()
    assert isinstance(inputs, set)
    assert inputs == {x_h2d}


@pytest.mark.parametrize(
    "nht, replication, shape",
    [
        (1, 1, (2,)),
        (3, 1, (3, 2)),
        (1, 2, (2, 2)),
        (3, 2, (3, 2, 2)),
        (1, 4, (4, 2)),
        (2, 4, (2, 4, 2)),
    ],
)
def test_create_host_outputs_shapes(nht, replication, shape):
    ir, w, x_h2d, out_d2h = _add_program(nht=nht, replication=replication)
    with ir.main_graph:
        flag_d2h = popxl.d2h_stream((), popxl.int32, "flag")
        popxl.d2h_stream((5,), popxl.float32, "never_stored")
        ops.host_store(flag_d2h, popxl.constant(7))
    outputs = popxl.Session(ir).create_host_outputs()
    assert set(outputs) == {out_d2h, flag_d2h}
    assert outputs[out_d2h].shape == shape and outputs[out_d2h].dtype == np.float32
    assert outputs[flag_d2h].shape == shape[:-1] and outputs[flag_d2h].dtype == np.int32


def test_run_returns_a_new_dict_keyed_by_streams():
    ir, w, x_h2d, out_d2h = _add_program()
    x = np.array([1.0, 1.0], np.float32)
    with popxl.Session(ir) as session:
        first = session.run({x_h2d: x})
        second = session.run({x_h2d: x})
    assert first is not second
    assert list(first) == [out_d2h]
    assert isinstance(next(iter(first)), popxl.DeviceToHostStream)
    assert first[out_d2h] is not second[out_d2h]
    first[out_d2h][...] = 0.0  # results belong to the caller
    np.testing.assert_array_equal(second[out_d2h], [3.0, 4.0])


@pytest.mark.parametrize("nht", [1, 3])
def test_large_results_are_each_run_s_own_buffers(monkeypatch, nht):
    from runtime.session import stream_io

    monkeypatch.setattr(stream_io, "TAKEN_OVER_BYTES", 0)  # every result taken over
    constant = next(_fresh)
    ir, w, x_h2d, out_d2h = _add_program(nht=nht, constant=constant)
    x = np.ones((nht, 2) if nht > 1 else (2,), np.float32)
    expected = np.broadcast_to(np.array([2.0, 3.0], np.float32) + constant, x.shape)
    with popxl.Session(ir) as session:
        first = session.run({x_h2d: x})[out_d2h]
        second = session.run({x_h2d: x})[out_d2h]
        state = {a.unsafe_buffer_pointer() for a in jax.tree.leaves(session._state)}
        first[...] = -1.0  # the caller's: the next run and the other result do not see it
        third = session.run({x_h2d: x})[out_d2h]
    assert first.flags.writeable and not first.flags.owndata  # the buffer, not a copy
    pointers = {a.__array_interface__["data"][0] for a in (first, second, third)}
    assert len(pointers) == 3 and not pointers & state
    np.testing.assert_array_equal(second, expected)
    np.testing.assert_array_equal(third, expected)


def test_run_without_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.array(3, np.int32), name="a")
        d2h = popxl.d2h_stream((), popxl.int32, "out")
        ops.host_store(d2h, a + 1)
    with popxl.Session(ir) as session:
        assert session.expected_inputs() == set()
        assert session.run()[d2h] == 4
        assert session.run({})[d2h] == 4
        assert session.run(None)[d2h] == 4


def test_run_without_outputs_returns_empty_dict():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.array([3], np.int32), name="a")
        ops.var_updates.accumulate_(a, popxl.constant(np.array([2], np.int32)))
    with popxl.Session(ir) as session:
        assert session.run() == {}
        assert session.run() == {}
    np.testing.assert_array_equal(session.get_tensor_data(a), [7])


# Compilation --------------------------------------------------------------------------------------


def test_structurally_equal_irs_share_the_compiled_step():
    constant = float(next(_fresh))
    first, _, x1, out1 = _add_program(nht=2, constant=constant)
    session1 = popxl.Session(first)
    second, _, x2, out2 = _add_program(nht=2, constant=constant)
    with _count_compiles() as compiles:
        session2 = popxl.Session(second)
        x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
        with session1:
            a = session1.run({x1: x})[out1]
        with session2:
            b = session2.run({x2: x})[out2]
    assert session2._program.step is session1._program.step
    assert compiles == []
    np.testing.assert_array_equal(a, x + [1.0 + constant, 2.0 + constant])
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("change", ["constant", "nht", "replication", "stream"])
def test_different_programs_do_not_share(change):
    base = dict(nht=1, replication=1, constant=float(next(_fresh)), stream_name="x")
    other = dict(
        base,
        **{
            "constant": {"constant": base["constant"] + 0.25},
            "nht": {"nht": 2},
            "replication": {"replication": 2},
            "stream": {"stream_name": "z"},
        }[change],
    )
    ir1, _, x1, out1 = _add_program(**base)
    ir2, _, x2, out2 = _add_program(**other)
    session1 = popxl.Session(ir1)
    session2 = popxl.Session(ir2)
    assert session1._program.key != session2._program.key
    assert session1._program.step is not session2._program.step
    if change == "constant":
        x = np.zeros(2, np.float32)
        with session1, session2:
            c = base["constant"]
            np.testing.assert_array_equal(session1.run({x1: x})[out1], [1.0 + c, 2.0 + c])
            np.testing.assert_array_equal(session2.run({x2: x})[out2], [1.25 + c, 2.25 + c])


def test_large_constants_differing_in_the_middle_do_not_share():
    def build(middle):
        data = np.zeros(5000, np.float32)
        data[2500] = middle
        ir = popxl.Ir()
        with ir.main_graph:
            d2h = popxl.d2h_stream((), popxl.float32, "out")
            ops.host_store(d2h, ops.sum(popxl.constant(data)))
        return ir, d2h

    (ir1, out1), (ir2, out2) = build(1.0), build(2.0)
    with popxl.Session(ir1) as s1, popxl.Session(ir2) as s2:
        assert s1.run()[out1] == 1.0
        assert s2.run()[out2] == 2.0


def test_session_compiles_once_at_construction():
    ir, w, x_h2d, out_d2h = _add_program(constant=float(next(_fresh)))
    with _count_compiles() as compiles:
        session = popxl.Session(ir)
        assert len(compiles) == 1
        with session:
            session.run({x_h2d: np.zeros(2, np.float32)})
            session.run({x_h2d: np.ones(2, np.float32)})
        with session:
            session.run({x_h2d: np.zeros(2, np.float32)})
    assert len(compiles) == 1


def test_popxl_cache_dir_enables_the_persistent_cache(tmp_path, monkeypatch):
    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    saved = {name: getattr(jax.config, name) for name in names}
    monkeypatch.setenv("POPXL_CACHE_DIR", str(tmp_path))
    try:
        # A program no earlier test compiled, so this Session really compiles.
        ir, w, x_h2d, out_d2h = _add_program(constant=float(next(_fresh)) + 0.5)
        session = popxl.Session(ir)
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
        with session:
            session.run({x_h2d: np.zeros(2, np.float32)})
        assert any(tmp_path.iterdir()), "the compiled step was written to the cache directory"
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def test_step_cache_is_bounded_and_keeps_recent_programs(monkeypatch):
    monkeypatch.setattr(program, "STEP_CACHE_SIZE", 2)
    sessions = [
        popxl.Session(_add_program(nht=1, constant=float(next(_fresh)))[0]) for _ in range(3)
    ]
    assert len(program._STEP_CACHE) <= 2
    assert sessions[-1]._program.key in program._STEP_CACHE
    assert sessions[0]._program.key not in program._STEP_CACHE


def test_step_cache_keeps_no_more_than_its_budget_of_other_programs_weights(monkeypatch):
    """Each w is 8 bytes: with a budget of 12, the newest step and one older one stay."""
    monkeypatch.setattr(program, "STEP_CACHE_BYTES", 12)
    sessions = [
        popxl.Session(_add_program(nht=1, constant=float(next(_fresh)))[0]) for _ in range(3)
    ]
    keys = [s._program.key for s in sessions]
    assert keys[0] not in program._STEP_CACHE
    assert keys[1] in program._STEP_CACHE and keys[2] in program._STEP_CACHE
    assert list(program._STEP_CACHE)[-1] == keys[2]  # the newest is the most recent
