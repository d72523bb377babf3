"""Batch serialisation: per-step loads and stores, every io_mode, rows, seeds, gradients."""

from contextlib import nullcontext
from functools import partial

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl.transforms import ExpectedConnectionType
from popxl_addons.ops.replicated_all_reduce_TP import (
    replicated_all_reduce_identical_grad_inputs,
    replicated_all_reduce_identical_inputs,
)
from popxl_addons.patterns import apply_pre_alias_patterns
from popxl_addons.transforms.batch_serialisation import (
    RemoteHandle,
    batch_serial_buffer,
    batch_serialise,
    batch_serialise_fwd_and_grad,
)

IO_MODES = ["compute", "io", "io_overlapped"]


class AddBias(addons.Module):
    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        b = self.add_variable_input("b", partial(np.arange, 3, dtype=np.float32), x.dtype)
        return x * 2.0 + b


def _ir() -> popxl.Ir:
    ir = popxl.Ir()
    ir._pb_ir.getSessionOptions().numIOTiles = 32
    return ir


@pytest.mark.parametrize("io_mode", IO_MODES)
@pytest.mark.parametrize("steps", [1, 2, 5])
def test_stream_in_buffer_out_then_buffer_in_stream_out(io_mode, steps):
    """Step i loads x[i], stores 2 x[i] + b into entry i; a second loop reads them back."""
    ir = _ir()
    x = np.arange(steps * 3, dtype=np.float32).reshape(steps, 3)
    with ir.main_graph:
        x_in = popxl.h2d_stream((3,), popxl.float32, "x")
        y_out = popxl.d2h_stream((3,), popxl.float32, "y")
        facts, graph = AddBias().create_graph(popxl.TensorSpec((3,), popxl.float32))
        buffer = batch_serial_buffer(graph.graph.outputs[0], steps=steps)
        first = batch_serialise(
            graph,
            steps,
            {graph.graph.inputs[0]: x_in},
            {},
            {graph.graph.outputs[0]: (buffer, 0)},
            io_mode=io_mode,
        )
        identity = addons.GraphWithNamedArgs(
            ir.create_graph(lambda t: t * 1.0, graph.graph.outputs[0])
        )
        second = batch_serialise(
            identity,
            steps,
            {identity.graph.inputs[0]: RemoteHandle(buffer, 0)},
            {identity.graph.outputs[0]: y_out},
            {},
            io_mode=io_mode,
        )
        variables = facts.init()
        first.graph.bind(variables).call(0)
        second.graph.call(0)
    assert buffer.entries == steps
    ir.num_host_transfers = steps
    with popxl.Session(ir, "ipu_model") as session:
        y = session.run({x_in: x if steps > 1 else x[0]})[y_out]
    np.testing.assert_array_equal(y.reshape(steps, 3), x * 2.0 + np.arange(3))


@pytest.mark.parametrize("io_mode", IO_MODES)
def test_rows_and_row_offsets_address_entry_row_times_steps_plus_step(io_mode):
    """Calling the result with row r writes entries r*steps .. r*steps+steps-1; an int row
    offset shifts rows, a function maps them, None pins row 0."""
    steps, rows = 2, 3
    ir = _ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((1,), popxl.float32, "x")
        graph = addons.GraphWithNamedArgs(
            ir.create_graph(lambda t: t + 0.0, popxl.TensorSpec((1,), popxl.float32))
        )
        out = graph.graph.outputs[0]
        plain = popxl.remote_buffer((1,), popxl.float32, 1)
        shifted = popxl.remote_buffer((1,), popxl.float32, 1)
        mapped = popxl.remote_buffer((1,), popxl.float32, 1)
        pinned = popxl.remote_buffer((1,), popxl.float32, 1)
        handles = {
            plain: RemoteHandle(plain, 0),
            shifted: RemoteHandle(shifted, 1),
            mapped: RemoteHandle(mapped, lambda n: (n + 1) % rows),
            pinned: RemoteHandle(pinned, None),
        }
        for handle in handles.values():
            result = batch_serialise(
                graph,
                steps,
                {graph.graph.inputs[0]: x_in},
                {},
                {out: handle},
                rows=rows,
                io_mode=io_mode,
            )
            for row in range(rows):
                result.graph.call(row)
        loads = {b: [ops.remote_load(b, i) for i in range(b.entries)] for b in handles}
        streams = {}
        for b, ts in loads.items():
            streams[b] = popxl.d2h_stream((b.entries,), popxl.float32)
            ops.host_store(streams[b], ops.concat(ts, 0))
    assert (plain.entries, shifted.entries, mapped.entries, pinned.entries) == (6, 8, 6, 2)
    ir.num_host_transfers = 4 * steps * rows
    data = np.arange(4 * steps * rows, dtype=np.float32).reshape(-1, 1)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run({x_in: data})
    per_buffer = data.reshape(4, rows, steps)  # loads in call order: buffer, row, step
    np.testing.assert_array_equal(got[streams[plain]].reshape(-1)[:6], per_buffer[0].reshape(-1))
    np.testing.assert_array_equal(got[streams[shifted]].reshape(-1)[2:8], per_buffer[1].reshape(-1))
    expected_mapped = np.zeros((rows, steps), np.float32)
    for row in range(rows):
        expected_mapped[(row + 1) % rows] = per_buffer[2][row]
    np.testing.assert_array_equal(got[streams[mapped]].reshape(-1)[:6], expected_mapped.reshape(-1))
    np.testing.assert_array_equal(got[streams[pinned]].reshape(-1)[:2], per_buffer[3][-1])


def test_each_step_gets_its_own_seed():
    steps = 3
    ir = _ir()
    with ir.main_graph:
        y_out = popxl.d2h_stream((4,), popxl.float32)
        seed_spec = popxl.TensorSpec((2,), popxl.uint32)

        def noisy(seed):
            return ops.random_uniform(seed, (4,))

        graph = addons.GraphWithNamedArgs(ir.create_graph(noisy, seed_spec))
        result = batch_serialise(
            graph,
            steps,
            {},
            {graph.graph.outputs[0]: y_out},
            {},
            seed_input=graph.graph.inputs[0],
            io_mode="compute",
        )
        seed = popxl.variable(np.array([7, 11], np.uint32))
        result.graph.call(0, seed)
    ir.num_host_transfers = steps
    with popxl.Session(ir, "ipu_model") as session:
        y = session.run()[y_out]
    assert len({tuple(row) for row in y}) == steps
    assert np.all((y >= 0) & (y < 1))


@pytest.mark.parametrize("io_mode", IO_MODES)
def test_fwd_and_grad_match_jax_grad(io_mode, rng):
    """The gradient loop reloads the forward loop's stored activations: the accumulated
    weight gradient is the mean over steps of jax.grad's, and dx is exact per step."""
    import jax

    steps = 4
    x = rng.normal(0, 1, (steps, 2, 3)).astype(np.float32)
    dy = rng.normal(0, 1, (steps, 2, 5)).astype(np.float32)
    w0 = rng.normal(0, 1, (3, 5)).astype(np.float32)

    class Lin(addons.Module):
        def build(self, t: popxl.Tensor) -> popxl.Tensor:
            w = self.add_variable_input("w", lambda: w0, t.dtype)
            return ops.gelu(t @ w)

    ir = _ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((2, 3), popxl.float32, "x")
        dy_in = popxl.h2d_stream((2, 5), popxl.float32, "dy")
        dx_out = popxl.d2h_stream((2, 3), popxl.float32, "dx")
        facts, fwd = Lin().create_graph(popxl.TensorSpec((2, 3), popxl.float32))
        dfacts, bwd = addons.autodiff_with_accumulation(
            fwd, [fwd.args.w], grads_required=fwd.graph.inputs[:1]
        )
        fwd_res, bwd_res = batch_serialise_fwd_and_grad(
            fwd, bwd, fwd.args, steps,
            load_handles={fwd.graph.inputs[0]: x_in, bwd.graph.inputs[0]: dy_in},
            store_streams={bwd.graph.outputs[0]: dx_out}, store_buffers={}, io_mode=io_mode,
        )  # fmt: skip
        variables = facts.init()
        grad_vars = dfacts.init()
        grad_vars.update(variables)
        fwd_res.graph.bind(variables).call(0)
        bwd_res.graph.bind(grad_vars).call(0)
    assert bwd_res.graph.grad_graph_info.forward_graph is fwd.graph
    ir.num_host_transfers = steps
    with popxl.Session(ir, "ipu_model") as session:
        dx = session.run({x_in: x, dy_in: dy})[dx_out]
        dw = session.get_tensor_data(grad_vars.accum.w)

    def f(w, x):
        return jax.nn.gelu(x @ w, approximate=True)

    for i in range(steps):
        _, pullback = jax.vjp(f, w0, x[i])
        gw, gx = pullback(dy[i])
        np.testing.assert_allclose(dx[i], gx, rtol=1e-5, atol=1e-5)
    grads = [jax.vjp(f, w0, x[i])[1](dy[i])[0] for i in range(steps)]
    np.testing.assert_allclose(dw, np.mean(grads, axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("io_mode", IO_MODES)
def test_an_output_that_is_a_loaded_input_is_stored_to_its_own_buffer(io_mode):
    """A graph returning a loaded input unchanged stores it into the output's buffer (was
    skipped as "already in a buffer": the outputs read zeros); found by differential testing."""
    steps = 3
    ir = _ir()
    with ir.main_graph, popxl.in_sequence(True):
        x = popxl.variable(np.array([1.0, 2.0, 3.0], np.float32))
        graph = ir.create_graph(lambda t: t, x)
        into = batch_serial_buffer(x, steps=steps)
        for j in range(steps):
            ops.remote_store(into, j, x + float(j))
        out = batch_serial_buffer(graph.outputs[0], steps=steps)
        handles = {graph.inputs[0]: RemoteHandle(into, 0)}
        stores = {graph.outputs[0]: RemoteHandle(out, 0)}
        wrapped = addons.GraphWithNamedArgs(graph)
        batch_serialise(wrapped, steps, handles, {}, stores, io_mode=io_mode).graph.call(0)
        y_out = popxl.d2h_stream((steps * 3,), popxl.float32, "y")
        ops.host_store(y_out, ops.concat([ops.remote_load(out, j) for j in range(steps)], 0))
    with popxl.Session(ir, "ipu_model") as session:
        y = session.run()[y_out]
    np.testing.assert_array_equal(y, (np.arange(1.0, 4.0) + np.arange(steps)[:, None]).ravel())


def test_io_modes_need_io_tiles():
    ir = popxl.Ir()
    with ir.main_graph:
        graph = addons.GraphWithNamedArgs(
            ir.create_graph(lambda t: t + 0.0, popxl.TensorSpec((1,), popxl.float32))
        )
        with pytest.raises(ValueError, match="IR must have IO tiles"):
            batch_serialise(graph, 2, {}, {}, {}, io_mode="io")
        with pytest.raises(ValueError, match="Unknown 'io_mode' fast"):
            batch_serialise(graph, 2, {}, {}, {}, io_mode="fast")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="rows must be >0"):
            batch_serialise(graph, 2, {}, {}, {}, rows=0, io_mode="compute")


class ShardedFeedForward(addons.Module):
    """Megatron feed-forward on ``tp`` shards: f, a column-sharded linear, gelu, g, a
    shared bias and gelu."""

    def __init__(self, tp: int, dp: int, width: int):
        super().__init__()
        ir = popxl.gcg().ir
        self.shards = ir.replica_grouping(stride=tp, group_size=dp)  # same weight within dp
        self.tp_group = self.shards.transpose()
        self.width = width

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input(
            "w", lambda: np.zeros((x.shape[-1], self.width)), x.dtype, replica_grouping=self.shards
        )
        b = self.add_variable_input(
            "b", lambda: np.ones(self.width), x.dtype, replica_grouping=self.shards
        )
        shared = self.add_variable_input("shared", lambda: np.full(self.width, 2.0), x.dtype)
        h = replicated_all_reduce_identical_inputs(x, group=self.tp_group)
        h = ops.gelu(h @ w + b)
        h = replicated_all_reduce_identical_grad_inputs(h, group=self.tp_group)
        return ops.gelu(h + shared)


@pytest.mark.parametrize("io_mode", IO_MODES)
def test_sharded_activations_give_the_unserialised_gradient_bit_for_bit(io_mode, rng):
    """A tensor-parallel block whose saved activation is sharded over the tp group: the
    serialised input gradient equals the whole-batch one exactly (as on the IPU)."""
    tp, dp, steps, rows, width = 4, 2, 4, 3, 16
    x = rng.normal(0, 1, (tp * dp, steps, rows, 8)).astype(np.float32)
    dy = rng.normal(0, 1, (steps, rows, width)).astype(np.float32)
    w = rng.normal(0, 1, (tp, 8, width)).astype(np.float32)

    def whole_batch() -> np.ndarray:
        ir = popxl.Ir(replication=tp * dp)
        with ir.main_graph:
            x_in = popxl.h2d_stream((steps, rows, 8), popxl.float32, "x")
            facts, fwd = ShardedFeedForward(tp, dp, width).create_graph(x_in.spec)
            dfacts, bwd = addons.autodiff_with_accumulation(
                fwd, fwd.args.tensors, grads_required=fwd.graph.inputs[:1]
            )
            variables = facts.init()
            with popxl.in_sequence():
                info = fwd.bind(variables).call_with_info(ops.host_load(x_in))
                inputs = bwd.grad_graph_info.inputs_dict(info)
                (dx,) = bwd.bind(dfacts.init()).call(popxl.constant(dy), args=inputs)
                dx_out = addons.host_store(dx)
        apply_pre_alias_patterns(ir)
        with popxl.Session(ir, "ipu_model") as session:
            session.write_variables_data({variables.w: w})
            return session.run({x_in: x})[dx_out]

    def serialised() -> np.ndarray:
        ir = _ir()
        ir.replication_factor = tp * dp
        tp_group = ir.replica_grouping(group_size=tp)
        with ir.main_graph:
            x_in = popxl.h2d_stream((rows, 8), popxl.float32, "x")
            dx_out = popxl.d2h_stream((rows, 8), popxl.float32, "dx")
            facts, fwd = ShardedFeedForward(tp, dp, width).create_graph(x_in.spec)
            dfacts, bwd = addons.autodiff_with_accumulation(
                fwd, fwd.args.tensors, grads_required=fwd.graph.inputs[:1]
            )
            saved = [
                c.fwd_tensor
                for c in bwd.grad_graph_info.expected_inputs
                if c.connection_type == ExpectedConnectionType.Fwd
                and c.fwd_tensor not in fwd.args.tensors
            ]
            dy_buffer = batch_serial_buffer(bwd.graph.inputs[0], steps=steps, shard_group=tp_group)
            fwd_res, bwd_res = batch_serialise_fwd_and_grad(
                fwd, bwd, fwd.args, steps,
                load_handles={fwd.graph.inputs[0]: x_in, bwd.graph.inputs[0]: (dy_buffer, 0, tp_group)},
                store_streams={bwd.graph.outputs[0]: dx_out},
                store_buffers={saved[0]: tp_group}, io_mode=io_mode,
            )  # fmt: skip
            variables = facts.init()
            grad_vars = dfacts.init()
            grad_vars.update(variables)
            tiles = popxl.io_tiles if io_mode != "compute" else nullcontext
            with popxl.in_sequence():
                for i in range(steps):
                    shard = ops.collectives.replica_sharded_slice(
                        popxl.constant(dy[i]), group=tp_group
                    )
                    if io_mode != "compute":
                        shard = ops.io_tile_copy(shard)
                    with tiles():
                        ops.remote_store(dy_buffer, i, shard)
                fwd_res.graph.bind(variables).call(popxl.constant(0))
                bwd_res.graph.bind(grad_vars).call(popxl.constant(0))
        ir.num_host_transfers = steps
        apply_pre_alias_patterns(ir)
        with popxl.Session(ir, "ipu_model") as session:
            session.write_variables_data({variables.w: w})
            out = session.run({x_in: np.swapaxes(x, 0, 1)})[dx_out]
        return np.swapaxes(out, 0, 1)

    expected = whole_batch()
    assert expected.shape == x.shape and np.abs(expected).max() > 0.1
    np.testing.assert_array_equal(serialised(), expected)
