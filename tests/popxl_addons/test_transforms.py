"""addons transforms: autodiff, autodiff_with_accumulation, recompute_graph, repeat_graph
(reference 1.8.1, 1.8.4, 1.8.5), each checked against NumPy through popxl.Session."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl.transforms import ExpectedConnectionType
from popxl_addons.named_replica_grouping import NamedReplicaGrouping
from popxl_addons.transforms.recomputation import recompute_graph
from popxl_addons.transforms.repeat_graph import repeat_graph
from popxl_addons.variable_factory import NamedVariableFactories

F32 = popxl.float32
Fwd, FwdGrad = ExpectedConnectionType.Fwd, ExpectedConnectionType.FwdGrad

W0 = np.array([[0.5, -1.0, 0.25], [1.5, 0.5, -0.5]], np.float32)  # (2, 3)
B0 = np.array([0.1, -0.2, 0.3], np.float32)


class Dense(addons.Module):
    """y = tanh(x @ w + b): the gradient needs forward intermediates."""

    def build(self, x):
        w = self.add_variable_input("weight", lambda: W0.copy())
        b = self.add_variable_input("bias", lambda: B0.copy())
        return ops.tanh(x @ w + b)


class TwoDense(addons.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = Dense()
        self.fc2 = Dense()

    def build(self, x):
        return self.fc2(self.fc1(x)[:, :2])


def _dense_ref(x, w, b, dy):
    """NumPy forward and gradients (dx, dw, db) of tanh(x @ w + b)."""
    y = np.tanh(x @ w + b)
    dz = dy * (1 - y**2)
    return y, dz @ w.T, x.T @ dz, dz.sum(0)


def _stores(*tensors):
    streams = []
    for t in tensors:
        s = popxl.d2h_stream(t.shape, t.dtype)
        ops.host_store(s, t)
        streams.append(s)
    return streams


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


X = _rand(4, 2, seed=1)
DY = _rand(4, 3, seed=2)


# autodiff ----------------------------------------------------------------------------------


def test_autodiff_of_a_module_graph_matches_numpy():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(popxl.variable(X, name="x"))
        grad = addons.autodiff(fwd)
        assert isinstance(grad, addons.GraphWithNamedArgs)
        assert grad.args.to_dict() == {}
        assert grad.grad_graph_info.outputs == fwd.graph.inputs  # (dx, dw, db)
        grads = grad.call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
        streams = _stores(info.outputs[0], *grads)
    ir.main_graph.verify()
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    y, dx, dw, db = _dense_ref(X, W0, B0, DY)
    for s, expected in zip(streams, (y, dx, dw, db)):
        np.testing.assert_allclose(out[s], expected, rtol=1e-5, atol=1e-6)


def test_grad_info_maps_variables_to_their_gradients():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
        variables = facts.init()
        fwd_info = fwd.bind(variables).call_with_info(popxl.variable(X, name="x"))
        grad = addons.autodiff(fwd, grads_required=fwd.args.tensors)
        grad_info = grad.call_with_info(
            popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(fwd_info)
        )
        by_variable = grad.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(fwd_info, grad_info)
        assert set(by_variable) == {variables.weight, variables.bias}
        streams = _stores(by_variable[variables.weight], by_variable[variables.bias])
    ir.main_graph.verify()
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    _, _, dw, db = _dense_ref(X, W0, B0, DY)
    np.testing.assert_allclose(out[streams[0]], dw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[streams[1]], db, rtol=1e-5, atol=1e-6)


def test_autodiff_accepts_a_bare_graph_and_a_subset_of_grads():
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_graph(
            lambda x, w: ops.tanh(x @ w),
            popxl.TensorSpec((4, 2), F32),
            popxl.TensorSpec((2, 3), F32),
        )
        grad = addons.autodiff(graph, grads_required=[graph.inputs[1]])
        assert grad.grad_graph_info.forward_graph is graph
        assert grad.grad_graph_info.outputs == (graph.inputs[1],)
        info = ops.call_with_info(graph, popxl.variable(X), popxl.variable(W0))
        (dw,) = grad.call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
        streams = _stores(dw)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()[streams[0]]
    _, _, expected, _ = _dense_ref(X, W0, np.zeros(3, np.float32), DY)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_autodiff_called_graphs_grad_info_argument_wins():
    class Custom(addons.Module):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def build(self, x):
            return x * 3.0

        def build_grad(self, dy):
            return dy * self.factor

    ir = popxl.Ir()
    with ir.main_graph:
        _, inner = Custom(1.0).create_graph(popxl.TensorSpec((2,), F32))
        custom = inner.autodiff()
        _, other = Custom(7.0).create_graph(popxl.TensorSpec((2,), F32))
        other_grad = other.from_module.create_grad_graph(
            addons.GraphWithNamedArgs(inner.graph, inner.args)
        )
        outer = addons.GraphWithNamedArgs(
            ir.create_graph(lambda x: ops.call(inner.graph, x)[0], popxl.TensorSpec((2,), F32)),
            called_graphs_grad_info={inner.graph: custom.grad_graph_info},
        )
        g_default = addons.autodiff(outer)
        g_override = addons.autodiff(outer, called_graphs_grad_info={inner: other_grad})
        x = popxl.variable(np.ones(2, np.float32))
        outs = []
        for g in (g_default, g_override):
            info = outer.call_with_info(x)
            outs += g.call(
                popxl.constant(np.ones(2, np.float32)), args=g.grad_graph_info.inputs_dict(info)
            )
        streams = _stores(*outs)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    np.testing.assert_allclose(out[streams[0]], [1.0, 1.0])
    np.testing.assert_allclose(out[streams[1]], [7.0, 7.0])


# autodiff_with_accumulation ----------------------------------------------------------------


def _accumulation_program(module=Dense, steps_per_run=1, grads_required_x=True):
    """Main graph: x, dy from streams; forward; gradient graph accumulating every variable."""
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = module().create_graph(popxl.TensorSpec((4, 2), F32))
        x_input = fwd.graph.inputs[0]
        accum_facts, grad = addons.autodiff_with_accumulation(
            fwd, fwd.args.tensors, grads_required=[x_input] if grads_required_x else None
        )
        variables = facts.init()
        accum = accum_facts.init()
        x_stream = popxl.h2d_stream((4, 2), F32, "x")
        dy_stream = popxl.h2d_stream(fwd.graph.outputs[0].shape, F32, "dy")
        info = fwd.bind(variables).call_with_info(ops.host_load(x_stream))
        outs = grad.bind(accum).call(
            ops.host_load(dy_stream), args=grad.grad_graph_info.inputs_dict(info)
        )
        streams = _stores(*outs)
    ir.main_graph.verify()
    return ir, fwd, grad, accum_facts, accum, variables, x_stream, dy_stream, streams


def test_accumulator_keys_names_and_order():
    ir, fwd, grad, facts, accum, *_ = _accumulation_program()
    # fwd.args.tensors is sorted by tensor name: bias, weight
    assert facts.keys_flat() == ["mean_accum_counter", "accum.bias", "accum.weight"]
    assert grad.args.keys_flat() == facts.keys_flat()
    assert [t.name for t in grad.args.values_flat()] == [
        "mean_accum_counter",
        "accum.bias",
        "accum.weight",
    ]
    assert all(t in grad.graph._by_ref_inputs for t in grad.args.values_flat())
    assert [t.name for t in accum.tensors] == ["accum.bias", "accum.weight", "mean_accum_counter"]
    assert accum.tensors[:-1] == (accum.accum.bias, accum.accum.weight)
    assert facts.mean_accum_counter.dtype == F32 and facts.mean_accum_counter.shape == ()
    assert facts.accum.weight.shape == (2, 3) and facts.accum.weight.by_ref


def test_accumulated_gradients_are_removed_from_the_outputs():
    ir, fwd, grad, *_ = _accumulation_program()
    info = grad.grad_graph_info
    assert len(grad.graph.outputs) == 1
    assert info.outputs == (fwd.graph.inputs[0],)  # only dx is left
    assert all(ec.connection_type is FwdGrad for ec in info.expected_outputs)


def test_running_mean_over_several_runs_equals_the_mean_of_step_gradients():
    ir, fwd, grad, facts, accum, variables, x_stream, dy_stream, streams = _accumulation_program()
    xs = [_rand(4, 2, seed=10 + i) for i in range(3)]
    dys = [_rand(4, 3, seed=20 + i) for i in range(3)]
    with popxl.Session(ir, "ipu_model") as session:
        dxs = [session.run({x_stream: x, dy_stream: dy})[streams[0]] for x, dy in zip(xs, dys)]
        data = session.get_tensors_data(accum.tensors)
    refs = [_dense_ref(x, W0, B0, dy) for x, dy in zip(xs, dys)]
    for dx, ref in zip(dxs, refs):
        np.testing.assert_allclose(dx, ref[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        data[accum.accum.weight], np.mean([r[2] for r in refs], 0), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        data[accum.accum.bias], np.mean([r[3] for r in refs], 0), rtol=1e-5, atol=1e-6
    )
    assert data[accum.mean_accum_counter] == 3.0


def test_resetting_the_counter_restarts_the_mean():
    ir = popxl.Ir()
    xs = [_rand(4, 2, seed=30 + i) for i in range(3)]
    with ir.main_graph:
        facts, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
        accum_facts, grad = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        assert len(grad.graph.outputs) == 0
        variables = facts.init()
        accum = accum_facts.init()
        dy = popxl.constant(DY)
        for i, x in enumerate(xs):
            if i == 2:
                ops.var_updates.accumulator_scale_(accum.mean_accum_counter, 0.0)
            info = fwd.bind(variables).call_with_info(popxl.constant(x))
            grad.bind(accum).call(dy, args=grad.grad_graph_info.inputs_dict(info))
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
        data = session.get_tensors_data(accum.tensors)
    _, _, dw, db = _dense_ref(xs[2], W0, B0, DY)
    np.testing.assert_allclose(data[accum.accum.weight], dw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(data[accum.accum.bias], db, rtol=1e-5, atol=1e-6)
    assert data[accum.mean_accum_counter] == 1.0


def test_nested_args_give_nested_accumulator_keys():
    ir = popxl.Ir()
    with ir.main_graph:
        _, fwd = TwoDense().create_graph(popxl.TensorSpec((4, 2), F32))
        facts, grad = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
    assert facts.keys_flat() == [
        "mean_accum_counter",
        "accum.fc1.bias",
        "accum.fc1.weight",
        "accum.fc2.bias",
        "accum.fc2.weight",
    ]  # fwd.args.tensors is sorted by tensor name (fc1/bias, fc1/weight, ...)
    assert grad.args.accum.fc1.weight.shape == (2, 3)


def test_accumulating_a_tensor_that_is_not_an_arg_uses_its_sanitised_name():
    ir = popxl.Ir()
    with ir.main_graph:
        _, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
        x_input = fwd.graph.inputs[0]
        facts, grad = addons.autodiff_with_accumulation(fwd, [x_input, fwd.args.weight])
    assert facts.keys_flat() == ["mean_accum_counter", "accum.x", "accum.weight"]
    assert facts.accum.x.shape == (4, 2)


def test_accumulator_replica_groupings_come_from_the_named_groupings():
    ir = popxl.Ir(replication=2)
    xs = np.stack([_rand(4, 2, seed=80), _rand(4, 2, seed=81)])  # one batch per replica
    with ir.main_graph:
        facts, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
        per_replica = ir.replica_grouping(group_size=1)
        groupings = NamedReplicaGrouping.from_dict({"weight": per_replica})
        accum_facts, grad = addons.autodiff_with_accumulation(
            fwd, fwd.args.tensors, replica_groupings=groupings
        )
        assert accum_facts.accum.weight.replica_grouping == per_replica
        assert accum_facts.accum.bias.replica_grouping == ir.replica_grouping()
        variables = facts.init()
        accum = accum_facts.init()
        x_stream = popxl.h2d_stream((4, 2), F32, "x")
        info = fwd.bind(variables).call_with_info(ops.host_load(x_stream))
        grad.bind(accum).call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
    with popxl.Session(ir, "ipu_model") as session:
        session.run({x_stream: xs})
        weight = session.get_tensor_data(accum.accum.weight)
    assert weight.shape == (2, 2, 3)  # one accumulator per replica
    for r in range(2):
        np.testing.assert_allclose(
            weight[r], _dense_ref(xs[r], W0, B0, DY)[2], rtol=1e-5, atol=1e-6
        )


def test_accumulation_returns_factories():
    ir = popxl.Ir()
    with ir.main_graph:
        _, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
        result = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
    assert len(result) == 2 and isinstance(result[0], NamedVariableFactories)


# recompute_graph ---------------------------------------------------------------------------


def _grads_with_and_without_recompute(build, x, dy, input_shape):
    """Gradients of ``build``'s graph through the plain and the recomputed gradient graph."""
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = build().create_graph(popxl.TensorSpec(input_shape, F32))
        grad = addons.autodiff(fwd)
        recomp = recompute_graph(grad)
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(popxl.constant(x))
        plain = grad.call(popxl.constant(dy), args=grad.grad_graph_info.inputs_dict(info))
        again = recomp.call(popxl.constant(dy), args=recomp.grad_graph_info.inputs_dict(info))
        streams = _stores(*plain, *again)
    ir.main_graph.verify()
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    values = [out[s] for s in streams]
    n = len(plain)
    return fwd, grad, recomp, values[:n], values[n:]


def test_recomputed_gradients_equal_the_plain_ones_and_numpy():
    fwd, grad, recomp, plain, again = _grads_with_and_without_recompute(Dense, X, DY, (4, 2))
    _, dx, dw, db = _dense_ref(X, W0, B0, DY)
    for p, a, e in zip(plain, again, (dx, dw, db)):
        np.testing.assert_allclose(p, e, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, p, rtol=1e-6, atol=1e-7)
    assert "_recomp" in recomp.graph.name
    assert recomp.grad_graph_info.outputs == grad.grad_graph_info.outputs


def test_recomputed_fwd_inputs_are_only_forward_inputs():
    fwd, grad, recomp, *_ = _grads_with_and_without_recompute(Dense, X, DY, (4, 2))
    plain_fwd = [
        ec.fwd_tensor for ec in grad.grad_graph_info.expected_inputs if ec.connection_type is Fwd
    ]
    assert any(t not in fwd.graph.inputs for t in plain_fwd)  # the plain graph takes intermediates
    info = recomp.grad_graph_info
    kinds = [ec.connection_type for ec in info.expected_inputs]
    assert kinds == [FwdGrad, Fwd, Fwd, Fwd]
    assert set(info.inputs[1:]) == set(fwd.graph.inputs)
    assert info.forward_graph is fwd.graph
    assert len(recomp.graph.inputs) == len(info.expected_inputs)


def test_recompute_when_the_gradient_does_not_need_the_input():
    class AddTwo(addons.Module):
        def build(self, x):
            return x + 2.0

    x = np.array([1.0, 2.0], np.float32)
    dy = np.array([3.0, -4.0], np.float32)
    fwd, grad, recomp, plain, again = _grads_with_and_without_recompute(AddTwo, x, dy, (2,))
    assert not any(ec.connection_type is Fwd for ec in grad.grad_graph_info.expected_inputs)
    assert [ec.fwd_tensor for ec in recomp.grad_graph_info.expected_inputs] == [
        fwd.graph.outputs[0],
        fwd.graph.inputs[0],
    ]
    np.testing.assert_allclose(plain[0], dy)
    np.testing.assert_allclose(again[0], dy)


def test_recompute_input_order():
    class Order(addons.Module):
        """The gradient needs b (an input: sin(b)'s gradient reads it) and sin(x) (an
        intermediate), never z_off or a."""

        def build(self, x):
            z_off = self.add_variable_input("z_off", lambda: np.ones(2, np.float32))
            a = self.add_variable_input("a", lambda: np.ones(2, np.float32))
            b = self.add_variable_input("b", lambda: np.full(2, 2.0, np.float32))
            return ops.sin(x) * ops.sin(b) + a + z_off

    ir = popxl.Ir()
    with ir.main_graph:
        _, fwd = Order().create_graph(popxl.TensorSpec((2,), F32))
        _, grad = addons.autodiff_with_accumulation(
            fwd, [fwd.args.z_off], grads_required=[fwd.args.b]
        )
        recomp = recompute_graph(grad)
    plain = grad.grad_graph_info
    plain_fwd = [ec.fwd_tensor for ec in plain.expected_inputs if ec.connection_type is Fwd]
    assert any(t not in fwd.graph.inputs for t in plain_fwd)  # sin(x)
    assert (
        fwd.args.b in plain_fwd and fwd.args.a not in plain_fwd and fwd.args.z_off not in plain_fwd
    )
    info = recomp.grad_graph_info
    # 1. FwdGrad inputs; 2. Fwd inputs that are forward inputs, in the plain order; 3. the
    # other forward inputs sorted by name; 4. other gradient-graph inputs sorted by name.
    first = [t for t in plain_fwd if t in fwd.graph.inputs]
    assert first == [fwd.args.b]  # x's gradient is not required: sin(x)'s is not computed
    x = fwd.graph.inputs[0]
    assert info.inputs == (fwd.graph.outputs[0], *first, fwd.args.a, x, fwd.args.z_off)
    assert [ec.connection_type for ec in info.expected_inputs] == [FwdGrad] + [Fwd] * (
        len(first) + 3
    )
    n = len(info.expected_inputs)
    assert [t.name for t in recomp.graph.inputs[n:]] == ["accum.z_off", "mean_accum_counter"]
    assert all(t in recomp.graph._by_ref_inputs for t in recomp.graph.inputs[n:])
    assert recomp.args.keys_flat() == ["mean_accum_counter", "accum.z_off"]
    assert set(recomp.args.values_flat()) == set(recomp.graph.inputs[n:])


def test_recomputed_accumulation_graph_accumulates_like_the_plain_one():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
        accum_facts, grad = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        recomp = recompute_graph(grad)
        variables = facts.init()
        plain_accum = accum_facts.init("plain")
        recomp_accum = accum_facts.init("recomp")
        for i in range(2):
            info = fwd.bind(variables).call_with_info(popxl.constant(_rand(4, 2, seed=40 + i)))
            dy = popxl.constant(_rand(4, 3, seed=50 + i))
            grad.bind(plain_accum).call(dy, args=grad.grad_graph_info.inputs_dict(info))
            recomp.bind(recomp_accum).call(dy, args=recomp.grad_graph_info.inputs_dict(info))
    ir.main_graph.verify()
    with popxl.Session(ir, "ipu_model") as session:
        session.run()
        data = session.get_tensors_data(plain_accum.tensors + recomp_accum.tensors)
    refs = [
        _dense_ref(_rand(4, 2, seed=40 + i), W0, B0, _rand(4, 3, seed=50 + i)) for i in range(2)
    ]
    np.testing.assert_allclose(
        data[plain_accum.accum.weight], np.mean([r[2] for r in refs], 0), rtol=1e-5, atol=1e-6
    )
    for key in ("accum.weight", "accum.bias", "mean_accum_counter"):
        np.testing.assert_allclose(
            data[recomp_accum[key]], data[plain_accum[key]], rtol=1e-6, atol=1e-7
        )


def test_recompute_needs_a_gradient_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        _, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
    with pytest.raises(AttributeError, match="Not a gradient graph"):
        recompute_graph(fwd)


# repeat_graph ------------------------------------------------------------------------------

LR = 0.1


def _training_program(steps):
    """One SGD step of Dense on (x, dy) from streams; repeated ``steps`` times per run."""
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Dense().create_graph(popxl.TensorSpec((4, 2), F32))
        grad = addons.autodiff(fwd, grads_required=[fwd.args.weight, fwd.args.bias])
        variables = facts.init()
        x_stream = popxl.h2d_stream((4, 2), F32, "x")
        dy_stream = popxl.h2d_stream((4, 3), F32, "dy")
        y_stream = popxl.d2h_stream((4, 3), F32, "y")
        info = fwd.bind(variables).call_with_info(ops.host_load(x_stream))
        ops.host_store(y_stream, info.outputs[0])
        dw, db = grad.call(ops.host_load(dy_stream), args=grad.grad_graph_info.inputs_dict(info))
        ops.scaled_add_(variables.weight, dw, b=-LR)
        ops.scaled_add_(variables.bias, db, b=-LR)
    body = repeat_graph(ir.main_graph, steps)
    ir.main_graph.verify()
    ir.num_host_transfers = steps
    return ir, body, variables, x_stream, dy_stream, y_stream


def test_repeat_graph_runs_n_training_steps_per_run():
    steps = 3
    xs = np.stack([_rand(4, 2, seed=60 + i) for i in range(2 * steps)])
    dys = np.stack([_rand(4, 3, seed=70 + i) for i in range(2 * steps)])

    ir, body, variables, x_stream, dy_stream, y_stream = _training_program(steps)
    assert body is not ir.main_graph and "repeat_graph" in body.name
    assert len(ir.main_graph.ops) == 1 and ir.main_graph.ops[0].called_graphs == (body,)
    with popxl.Session(ir, "ipu_model") as session:
        ys = [
            session.run({x_stream: xs[i : i + steps], dy_stream: dys[i : i + steps]})[y_stream]
            for i in (0, steps)
        ]
        repeated = session.get_tensors_data([variables.weight, variables.bias])
    assert ys[0].shape == (steps, 4, 3)

    ir1, body1, variables1, x1, dy1, y1 = _training_program(1)
    assert body1 is ir1.main_graph
    with popxl.Session(ir1, "ipu_model") as session:
        single_ys = [session.run({x1: xs[i], dy1: dys[i]})[y1] for i in range(2 * steps)]
        single = session.get_tensors_data([variables1.weight, variables1.bias])

    np.testing.assert_allclose(np.concatenate(ys), np.stack(single_ys), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        repeated[variables.weight], single[variables1.weight], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        repeated[variables.bias], single[variables1.bias], rtol=1e-5, atol=1e-6
    )

    w, b = W0.copy(), B0.copy()
    for x, dy in zip(xs, dys):
        _, _, dw, db = _dense_ref(x, w, b, dy)
        w, b = w - LR * dw, b - LR * db
    np.testing.assert_allclose(repeated[variables.weight], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(repeated[variables.bias], b, rtol=1e-5, atol=1e-6)


def test_repeat_graph_of_a_graph_with_outputs_is_rejected():
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_graph(lambda x: x + 1.0, popxl.TensorSpec((2,), F32))
    with pytest.raises(ValueError, match="outputs"):
        repeat_graph(graph, 2)
