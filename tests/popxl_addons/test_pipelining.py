"""Pipelined execution: results equal the unpipelined program's, schedule and errors."""

from functools import partial

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.transforms.autodiff import autodiff_with_accumulation


def _chain(stages: int, steps: int) -> np.ndarray:
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((), popxl.uint32)
        y_out = popxl.d2h_stream((), popxl.uint32)
        with addons.pipelined_execution(steps) as p:
            with p.stage(0), popxl.ipu(0):
                x = (ops.host_load(x_in) * 3).copy_to_ipu(1)
            for s in range(1, stages):
                with p.stage(s), popxl.ipu(s):
                    x = x + s
                    if s < stages - 1:
                        x = x.copy_to_ipu(s + 1)
            with p.stage(stages - 1), popxl.ipu(stages - 1):
                ops.host_store(y_out, x)
    ir.num_host_transfers = steps
    with popxl.Session(ir, "ipu_model") as session:
        return session.run({x_in: np.arange(steps, dtype=np.uint32)})[y_out]


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_each_micro_batch_passes_every_stage_once(stages):
    steps = 2 * stages + 1
    expected = np.arange(steps) * 3 + sum(range(stages))
    np.testing.assert_array_equal(_chain(stages, steps), expected)


class Scale(addons.Module):
    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("w", partial(np.random.normal, 0, 0.5, (4, 4)), x.dtype)
        return ops.gelu(x @ w)


def _train(pipelined: bool, steps: int = 6, recompute: bool = False) -> list[np.ndarray]:
    """Forward on IPU 0 then 1, loss gradient on IPU 1, backward of IPU 0's layer in
    stage 2 with its activations stashed; weight gradients are averaged over ``steps``."""
    np.random.seed(3)
    data = np.random.normal(0, 1, (steps, 2, 4)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((2, 4), popxl.float32, "x")
        with popxl.ipu(0):
            facts0, g0 = Scale().create_graph(popxl.TensorSpec((2, 4), popxl.float32))
            dfacts0, dg0 = autodiff_with_accumulation(g0, [g0.args.w])
        with popxl.ipu(1):
            facts1, g1 = Scale().create_graph(popxl.TensorSpec((2, 4), popxl.float32))
            dfacts1, dg1 = autodiff_with_accumulation(
                g1, [g1.args.w], grads_required=[g1.graph.inputs[0]]
            )
        if recompute:
            dg0 = addons.recompute_graph(dg0)
        v0, d0, v1, d1 = facts0.init(), dfacts0.init(), facts1.init(), dfacts1.init()
        accums = [d0.accum.w, d1.accum.w]

        def stage0(p=None):
            with popxl.ipu(0):
                x = ops.host_load(x_in)
                info0 = g0.bind(v0).call_with_info(x)
                return info0, info0.outputs[0].copy_to_ipu(1)

        def stage1(h):
            with popxl.ipu(1):
                info1 = g1.bind(v1).call_with_info(h)
                seed = info1.outputs[0] * 2.0  # d(sum y^2)/dy
                (dh,) = dg1.bind(d1).call(seed, args=dg1.grad_graph_info.inputs_dict(info1))
                return dh.copy_to_ipu(0)

        if pipelined:
            with addons.pipelined_execution(steps) as p:
                with p.stage(0):
                    info0, h = stage0()
                with p.stage(1):
                    dh = stage1(h)
                with p.stage(2), popxl.ipu(0):
                    acts = p.stash_and_restore_activations(info0, dg0.grad_graph_info)
                    dg0.bind(d0).call(dh, args=acts)
            ir.num_host_transfers = steps
        else:
            info0, h = stage0()
            dh = stage1(h)
            with popxl.ipu(0):
                dg0.bind(d0).call(dh, args=dg0.grad_graph_info.inputs_dict(info0))
            ir.num_host_transfers = 1
    with popxl.Session(ir, "ipu_model") as session:
        if pipelined:
            session.run({x_in: data})
        else:
            for n in range(steps):
                session.run({x_in: data[n]})
        weights = [session.get_tensor_data(v.w).copy() for v in (v0, v1)]
        return [session.get_tensor_data(a).copy() for a in accums] + weights


def _reference_grads(w0: np.ndarray, w1: np.ndarray, steps: int = 6) -> list[np.ndarray]:
    """The same mean gradients from jax.grad."""
    import jax
    import jax.numpy as jnp

    np.random.seed(3)
    data = np.random.normal(0, 1, (steps, 2, 4)).astype(np.float32)

    def loss(w0, w1, x):
        y = jax.nn.gelu(jax.nn.gelu(x @ w0, approximate=True) @ w1, approximate=True)
        return jnp.sum(y**2)

    grads = [jax.grad(loss, argnums=(0, 1))(w0, w1, x) for x in data]
    return [np.mean([g[k] for g in grads], axis=0) for k in range(2)]


@pytest.mark.parametrize("placement", ["off", "on"])
def test_pipelined_training_accumulates_the_same_gradients_as_unpipelined(monkeypatch, placement):
    """Placed ("on": each IPU on its own CPU device) or on one device, the same numbers."""
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    plain = _train(pipelined=False)
    pipelined = _train(pipelined=True)
    for a, b in zip(plain, pipelined):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(plain, _reference_grads(*plain[2:])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_recomputation_inside_a_pipeline_gives_the_same_gradients():
    plain = _train(pipelined=False)
    recomputed = _train(pipelined=True, recompute=True)
    for a, b in zip(plain, recomputed):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_print_schedule_shows_fill_main_and_flush():
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((), popxl.float32)
        with addons.pipelined_execution(6) as p:
            with p.stage(0), popxl.ipu(0):
                x = ops.host_load(x_in).copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                x = x + 1.0
    text = p.print_schedule()
    lines = text.splitlines()
    assert lines[0].startswith(
        "Pipeline: 2 stages over 6 steps: 1 fill, 5 main, 1 flush cycles, all one repeated cycle"
    )
    assert lines[2].split() == ["0", "fill", "mb", "0", "."]
    assert lines[3].split() == ["1..5", "main", "mb", "c", "mb", "c-1"]
    assert lines[4].split() == ["6", "flush", ".", "mb", "5"]
    assert "Loop." in text and "IpuCopy." in text


def test_op_outside_a_stage_is_an_error():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(1.0)
        with pytest.raises(RuntimeError, match="outside a stage context"):
            with addons.pipelined_execution(4) as p:
                with p.stage(0):
                    x = x + 1.0
                x = x * 2.0


def test_too_few_steps_is_an_error():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(1.0)
        with pytest.raises(ValueError, match=r"steps=3 stages=2"):
            with addons.pipelined_execution(3) as p:
                with p.stage(0), popxl.ipu(0):
                    y = (x + 1.0).copy_to_ipu(1)
                with p.stage(1), popxl.ipu(1):
                    y + 1.0


def test_stash_needs_a_stage_context():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        with addons.pipelined_execution(4) as p:
            with p.stage(0):
                y = x + 1.0
            with pytest.raises(RuntimeError, match="must be called in a stage context"):
                p.stash_and_restore_tensor(y)
            with p.stage(1):
                p.stash_and_restore_tensor(y)


def test_stash_of_a_tensor_made_outside_the_stages_asks_for_from_stage():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        y = x + 1.0  # made before the pipeline, in no stage
        with addons.pipelined_execution(4) as p:
            with p.stage(0):
                z = x * 2.0
            with p.stage(1):
                with pytest.raises(RuntimeError, match="in no pipeline stage.*pass `from_stage`"):
                    p.stash_and_restore_tensor(y)
                z + 1.0


def _stashing(steps: int = 6):
    """Three activations of one shape stashed from stage 0 to stage 2; returns the IR, the
    streams, the pipeline context and the expected output for ``data``."""
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((2,), popxl.float32)
        y_out = popxl.d2h_stream((2,), popxl.float32)
        with addons.pipelined_execution(steps) as p:
            with p.stage(0), popxl.ipu(0):
                x = ops.host_load(x_in)
                made = [x * float(k + 1) for k in range(3)]
                h = x.copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                h = (h + 1.0).copy_to_ipu(0)
            with p.stage(2), popxl.ipu(0):
                restored = [p.stash_and_restore_tensor(t) for t in made]
                ops.host_store(y_out, h + restored[0] + restored[1] * restored[2])
    ir.num_host_transfers = steps
    return ir, x_in, y_out, p


def _stash_data(steps: int = 6) -> tuple[np.ndarray, np.ndarray]:
    data = np.arange(2 * steps, dtype=np.float32).reshape(steps, 2)
    return data, data + 1.0 + data + 6.0 * data**2


def test_stashes_of_one_spec_share_one_stash_graph_and_one_restore_graph():
    """One stash and one restore graph serve the three stashes (a graph per tensor made the
    IR build and the lowering of deep pipelines slow), and each stage still reads its own
    micro-batch's values."""
    ir, x_in, y_out, _ = _stashing()
    graph_ids = list(ir._graphs)
    assert [g for g in graph_ids if g.startswith("Stash")] == ["Stash_subgraph(0)"]
    assert sum(g.startswith("Restore") for g in graph_ids) == 1
    data, expected = _stash_data()
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run({x_in: data})[y_out]
    np.testing.assert_allclose(out, expected)


def test_on_one_device_restores_pass_the_stashed_value_and_leave_the_same_state(monkeypatch):
    """Stages in turn: each restore's consumers read the value stashed earlier in the same
    micro-batch (the restore's read is unused), and every stash buffer and counter ends
    as the cycles placed on two devices leave it, over two steps."""
    finals = {}
    for placement in ("on", "off"):
        monkeypatch.setenv("POPXL_PLACEMENT", placement)
        ir, x_in, y_out, _ = _stashing()
        data, _ = _stash_data()
        with popxl.Session(ir, "ipu_model") as session:
            for step in range(2):
                out = session.run({x_in: data + step})[y_out]
                fed = data + step
                np.testing.assert_allclose(out, 2 * fed + 1.0 + 6.0 * fed**2)
            finals[placement] = [session.get_tensor_data(v).copy() for v in ir._variables]
    (micro,) = [g for gid, g in ir._graphs.items() if gid.startswith("pipeline_micro_batch")]
    restores = [
        op for op in micro._ops if op.called_graphs and op.called_graphs[0].id.startswith("Restore")
    ]
    assert len(restores) == 3
    assert all(not t._consumers for op in restores for t in op.outputs)
    assert len(finals["on"]) == len(finals["off"]) > 3
    for on, off in zip(finals["on"], finals["off"]):
        np.testing.assert_array_equal(on, off)


@pytest.mark.parametrize("placement", ["off", "on"])
def test_a_stashed_scalar_is_restored_as_a_scalar(monkeypatch, placement):
    """A scalar takes one element of its stash and comes back with shape ``()``, carried
    from stage 0 to stage 2 on IPU 0 while stage 1 runs on IPU 1."""
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    steps = 6
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((), popxl.float32, "x")
        y_out = popxl.d2h_stream((), popxl.float32, "y")
        with addons.pipelined_execution(steps) as p:
            with p.stage(0), popxl.ipu(0):
                x = ops.host_load(x_in)
                doubled = x * 2.0
                x = x.copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                x = (x + 1.0).copy_to_ipu(0)
            with p.stage(2), popxl.ipu(0):
                restored = p.stash_and_restore_tensor(doubled)
                ops.host_store(y_out, x + restored)
    assert restored.shape == ()
    ir.num_host_transfers = steps
    data = np.arange(steps, dtype=np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run({x_in: data})[y_out]
    np.testing.assert_allclose(out, 3 * data + 1.0)


class Relu(addons.Module):
    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("w", partial(np.random.normal, 0, 0.5, (4, 4)), x.dtype)
        return ops.relu(x @ w)


def _layers_over_two_stages(steps: int = 4):
    """Two calls of one layer graph on IPU 0, two on IPU 1, and between them stage 0 also
    stores its output plus one; returns the IR, streams, pipeline context and the four
    weight variables."""
    np.random.seed(5)
    ir = popxl.Ir()
    with ir.main_graph:
        x_in = popxl.h2d_stream((2, 4), popxl.float32, "x")
        y_out = popxl.d2h_stream((2, 4), popxl.float32, "y")
        z_out = popxl.d2h_stream((2, 4), popxl.float32, "z")
        facts, layer = Relu().create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        weights = [facts.init(f"l{i}") for i in range(4)]
        with addons.pipelined_execution(steps) as p:
            with p.stage(0), popxl.ipu(0):
                x = ops.host_load(x_in)
                for w in weights[:2]:
                    (x,) = layer.bind(w).call(x)
                ops.host_store(z_out, x + 1.0)
                x = x.copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                for w in weights[2:]:
                    (x,) = layer.bind(w).call(x)
                ops.host_store(y_out, x)
    ir.num_host_transfers = steps
    return ir, x_in, (y_out, z_out), p, [w.w for w in weights]


@pytest.mark.parametrize("placement", ["off", "on"])
def test_on_one_device_the_stages_run_in_turn_and_the_layer_compiles_once(monkeypatch, placement):
    """Unplaced, the micro-batches run through the stages in turn: the four layer calls are
    one scan (placed, each stage has its own), with the same numbers."""
    monkeypatch.setenv("POPXL_PLACEMENT", placement)
    ir, x_in, (y_out, z_out), p, weights = _layers_over_two_stages()
    data = np.random.normal(0, 1, (4, 2, 4)).astype(np.float32)
    with popxl.Session(ir, "ipu_model") as session:
        outs = session.run({x_in: data})
        ws = [session.get_tensor_data(w) for w in weights]
        lowered = session._lowered().as_text()
    expected = [data]
    for w in ws:
        expected.append(np.maximum(expected[-1] @ w, 0))
    np.testing.assert_allclose(outs[y_out], expected[4], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[z_out], expected[2] + 1.0, rtol=1e-5, atol=1e-6)
    one_device = placement == "off"
    assert ("on one device" in p.print_schedule().splitlines()[0]) == one_device
    if one_device:  # the micro-batch loop and one scan of the layer
        assert lowered.count("stablehlo.while") == 2


def test_stages_that_share_written_state_keep_the_cycles(monkeypatch):
    """Stage 1 updates a variable that stage 0 reads: in turn, stage 0 would see the update
    of the micro-batch before, in cycles that of two before; the cycles are kept."""
    monkeypatch.setenv("POPXL_PLACEMENT", "off")
    steps = 4
    ir = popxl.Ir()
    with ir.main_graph:
        y_out = popxl.d2h_stream((), popxl.float32)
        v = popxl.variable(np.float32(1.0))
        with addons.pipelined_execution(steps) as p:
            with p.stage(0), popxl.ipu(0):
                x = (v * 1.0).copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                ops.host_store(y_out, x)
                ops.var_updates.accumulate_(v, popxl.constant(1.0))
    ir.num_host_transfers = steps
    assert "all one repeated cycle" in p.print_schedule().splitlines()[0]
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()[y_out]
    # Cycle c: stage 0 reads v for micro-batch c, stage 1 adds 1 for micro-batch c-1.
    np.testing.assert_array_equal(out, [1.0, 1.0, 2.0, 3.0])
