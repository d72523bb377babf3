"""autodiff: gradient graphs checked numerically against jax.grad of reference functions."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl import transforms
from popxl.errors import PopXLException
from popxl.transforms import ExpectedConnectionType

F32 = popxl.float32


def _run_grads(build, inputs, seeds=None, grads_required_idx=None):
    """Differentiate ``build`` as a subgraph; returns (outputs, grads of the inputs)."""
    ir = popxl.Ir()
    with ir.main_graph:
        specs = [popxl.TensorSpec(x.shape, F32) for x in inputs]
        graph = ir.create_graph(build, *specs)
        required = (
            None if grads_required_idx is None else [graph.inputs[i] for i in grads_required_idx]
        )
        info = transforms.autodiff(graph, grads_required=required)
        args = [popxl.variable(x, F32, f"in{i}") for i, x in enumerate(inputs)]
        fwd = ops.call_with_info(graph, *args)
        n_user_outputs = len(seeds) if seeds is not None else 1
        seed_t = [
            popxl.constant(s) for s in (seeds or [np.ones(graph.outputs[0].shape, np.float32)])
        ]
        grads = ops.call(info.graph, *seed_t, inputs_dict=info.inputs_dict(fwd))
        streams = []
        for t in list(fwd.outputs[:n_user_outputs]) + list(grads):
            s = popxl.d2h_stream(t.shape, t.dtype)
            ops.host_store(s, t)
            streams.append(s)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()
    values = [result[s] for s in streams]
    return values[:n_user_outputs], values[n_user_outputs:]


def _jax_grads(fn, inputs, seeds):
    def loss(*xs):
        outs = fn(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(jnp.sum(o * s) for o, s in zip(outs, seeds))

    return jax.grad(loss, argnums=tuple(range(len(inputs))))(*inputs)


def _check(build, reference, inputs, n_outputs=1, rtol=1e-4, atol=1e-5):
    rng = np.random.default_rng(3)
    outs_ref = reference(*inputs)
    outs_ref = outs_ref if isinstance(outs_ref, tuple) else (outs_ref,)
    seeds = [rng.uniform(0.5, 1.5, np.shape(o)).astype(np.float32) for o in outs_ref[:n_outputs]]
    outs, grads = _run_grads(build, inputs, seeds)
    expected = _jax_grads(reference, inputs, seeds)
    for o, r in zip(outs, outs_ref):
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_linear_bias_activation():
    x, w, b = _rand(4, 3), _rand(3, 5, seed=1), _rand(5, seed=2)
    _check(
        lambda x, w, b: ops.gelu(x @ w + b),
        lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=True),
        [x, w, b],
    )


def test_shared_inputs_and_broadcasting_sum_gradients():
    x, y = _rand(3, 4), _rand(4, seed=1)
    _check(
        lambda x, y: x * y + ops.sin(x) * x - y,
        lambda x, y: x * y + jnp.sin(x) * x - y,
        [x, y],
    )


def test_view_chain():
    x = _rand(2, 3, 4)
    _check(
        lambda x: ops.concat(
            [ops.transpose(x.reshape((6, 4)), (1, 0))[1:3], x.reshape((4, 6))[0:2] * 2.0], axis=1
        ),
        lambda x: jnp.concatenate([x.reshape(6, 4).T[1:3], x.reshape(4, 6)[0:2] * 2.0], axis=1),
        [x],
    )


def test_softmax_and_multiple_outputs():
    x = _rand(3, 5)
    _check(
        lambda x: (ops.softmax(x, axis=1), ops.exp(x) * 0.5),
        lambda x: (jax.nn.softmax(x, axis=1), jnp.exp(x) * 0.5),
        [x],
        n_outputs=2,
    )


def test_inplace_ops_on_intermediates():
    x, y = _rand(3, 4), _rand(3, 4, seed=1)

    def build(x, y):
        h = x * y
        h += y  # add_ on an intermediate
        r = ops.relu_(h)  # in-place activation; h and r share storage
        v = ops.reshape_(h, (12,))  # a view, then write through it
        ops.scaled_add_(v, ops.flatten(x), 1.0, 0.5)
        return ops.tanh(r) * 1.0

    def reference(x, y):
        h = jax.nn.relu(x * y + y)
        h = h + 0.5 * x
        return jnp.tanh(h)

    _check(build, reference, [x, y])


def test_nested_calls_two_levels():
    x, w = _rand(2, 3), _rand(3, 3, seed=1)

    def build(x, w):
        ir = popxl.gir()
        inner = ir.create_graph(lambda a, b: ops.tanh(a @ b), x, w)
        middle = ir.create_graph(lambda a, b: ops.call(inner, a, b)[0] * a, x, w)
        (y,) = ops.call(middle, x, w)
        (z,) = ops.call(middle, y, w)
        return z

    def reference(x, w):
        mid = lambda a, b: jnp.tanh(a @ b) * a  # noqa: E731
        return mid(mid(x, w), w)

    _check(build, reference, [x, w])


def test_unused_input_gets_zero_gradient_and_detach_blocks():
    x, y = _rand(3), _rand(3, seed=1)
    _, grads = _run_grads(
        lambda x, y: ops.detach(y) * x + 0.0 * ops.detach(x), [x, y], [np.ones(3, np.float32)]
    )
    np.testing.assert_allclose(grads[0], y)
    np.testing.assert_allclose(grads[1], np.zeros(3))


def test_detach_inplace_blocks_only_later_uses():
    def build(x):
        y = x * 2.0
        before = y * 5.0  # read before detach_: gradient flows (10 per element)
        handle = ops.detach_(y)
        return y * 3.0 + handle * 7.0 + before + x  # later reads: no gradient

    x = _rand(3)
    outs, grads = _run_grads(build, [x], [np.ones(3, np.float32)])
    np.testing.assert_allclose(outs[0], x * 2 * 3 + x * 2 * 7 + x * 10 + x, rtol=1e-6)
    np.testing.assert_allclose(grads[0], np.full(3, 11.0))


@pytest.mark.parametrize("update", ["accumulate_", "copy_var_update_"])
def test_variable_update_through_a_view_blocks_only_the_written_part(update):
    """A variable-update op has no gradient: where it writes a slice of an intermediate,
    the rest of that intermediate still passes its gradient on (differential campaign,
    seed 302004027: the whole concat lost its gradient)."""
    x = np.array([-0.375, 0.875], np.float32)
    c = np.array([-1.875], np.float32)

    def build(x):
        y = ops.concat([x, x * 1.0], 0)
        s = ops.slice_(y, [2], [3], axis=[0])
        getattr(ops.var_updates, update)(s, popxl.constant(c))
        return ops.relu(y), s

    def reference(x):
        y = jnp.concatenate([x, x])
        new = y[2:3] + c if update == "accumulate_" else jnp.asarray(c)
        y = y.at[2:3].set(jax.lax.stop_gradient(new))
        return jax.nn.relu(y), y[2:3]

    seeds = [np.array([-1.625, -0.625, 1.0, 0.25], np.float32), np.array([-0.625], np.float32)]
    outs, grads = _run_grads(build, [x], seeds)
    want = _jax_grads(reference, [x], seeds)[0]
    np.testing.assert_allclose(outs[0], reference(x)[0])
    np.testing.assert_allclose(grads[0], want)
    assert np.any(want != 0)


@pytest.mark.parametrize("update", ["accumulate_", "detach_"])
def test_op_without_gradient_inside_a_repeat_passes_none(update):
    """A loop body is differentiated as a whole (``jax.vjp`` of the body): an op without a
    gradient there stops it as it does outside a loop (differential campaign, seed
    821006298: ``accumulate_`` in a repeated body passed the gradient of what it wrote)."""
    x = _rand(4)

    def body(a):
        m = a * a
        if update == "accumulate_":
            ops.var_updates.accumulate_(m, m)
        else:
            ops.detach_(m)
        return ops.tanh(m) + a

    def build(x):
        (r,) = ops.repeat(popxl.gcg().ir.create_graph(body, x), 1, x)
        return r

    def reference(x):
        m = x * x
        m = jax.lax.stop_gradient(m + m if update == "accumulate_" else m)
        return jnp.tanh(m) + x

    seeds = [np.ones(4, np.float32)]
    outs, grads = _run_grads(build, [x], seeds)
    np.testing.assert_allclose(outs[0], reference(x), rtol=1e-6)
    np.testing.assert_allclose(grads[0], _jax_grads(reference, [x], seeds)[0], rtol=1e-6)
    np.testing.assert_allclose(grads[0], np.ones(4))


def test_expected_connections_for_custom_grads():
    ir = popxl.Ir()
    with ir.main_graph:

        def build(x, w, b):
            h = x @ w
            return h + b, ops.relu(h)

        g = ir.create_graph(
            build,
            popxl.TensorSpec((2, 3), F32),
            popxl.TensorSpec((3, 4), F32),
            popxl.TensorSpec((4,), F32),
        )
        x, w, b = g.inputs
        y0, y1 = g.outputs
        info = transforms.autodiff(g, grads_provided=[y1, y0], grads_required=[b, x])
    kinds = [ec.connection_type for ec in info.expected_inputs]
    assert kinds[:2] == [ExpectedConnectionType.FwdGrad] * 2
    assert set(kinds[2:]) == {ExpectedConnectionType.Fwd}
    assert [ec.fwd_tensor for ec in info.expected_inputs[:2]] == [y1, y0]
    assert [ec.fwd_tensor for ec in info.expected_outputs] == [b, x]
    assert info.outputs == (b, x)
    assert len(info.graph.inputs) == len(info.expected_inputs)
    assert len(info.graph.outputs) == 2
    assert info.graph.id == f"{g.id}_bwd"
    assert info.forward_graph is g
    assert "GradGraphInfo[" in repr(info) and "FwdGrad" in repr(info)


def _fwd_expected(info):
    return [
        ec.fwd_tensor
        for ec in info.expected_inputs
        if ec.connection_type is ExpectedConnectionType.Fwd
    ]


def test_layout_changes_of_inputs_are_recomputed_not_kept():
    """A weight's transpose (and a reshape of it) is read again from the weight by the
    gradient graph: the forward graph gains no output for it, and the gradients agree."""
    rng = np.random.default_rng(5)
    xv = rng.normal(size=(4, 6)).astype(np.float32)
    wv = rng.normal(size=(3, 2, 6)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:

        def build(x, w):
            wt = ops.transpose(ops.reshape(w, (6, 6)), (1, 0))
            return ops.gelu(ops.matmul(x, wt))

        g = ir.create_graph(build, popxl.TensorSpec(xv.shape, F32), popxl.TensorSpec(wv.shape, F32))
        info = transforms.autodiff(g)
        assert set(_fwd_expected(info)) == {*g.inputs, g._ops[2].outputs[0]}
        assert len(g.outputs) == 2  # the gelu's input is kept; the transpose is not
        keys = [op.opdef.key for op in info.graph._ops]
        assert keys.index("reshape") < keys.index("transpose")
        args = [popxl.variable(xv, F32), popxl.variable(wv, F32)]
        site = ops.call_with_info(g, *args)
        seed = popxl.constant(np.ones((4, 6), np.float32))
        grads = ops.call(info.graph, seed, inputs_dict=info.inputs_dict(site))
        streams = []
        for t in grads:
            streams.append(popxl.d2h_stream(t.shape, t.dtype))
            ops.host_store(streams[-1], t)
    with popxl.Session(ir) as s:
        out = s.run()
    ref = jax.grad(
        lambda x, w: jnp.sum(jax.nn.gelu(x @ w.reshape(6, 6).T, approximate=True)), (0, 1)
    )(xv, wv)
    for stream, r in zip(streams, ref):
        np.testing.assert_allclose(out[stream], r, rtol=1e-5, atol=1e-6)


def test_layout_changes_of_intermediates_are_kept():
    ir = popxl.Ir()
    with ir.main_graph:

        def build(x, w):
            return ops.matmul(x, ops.transpose(ops.exp(w), (1, 0)))

        g = ir.create_graph(build, popxl.TensorSpec((4, 6), F32), popxl.TensorSpec((5, 6), F32))
        info = transforms.autodiff(g)
        transposed = g._ops[1].outputs[0]
        assert transposed in _fwd_expected(info) and transposed in g.outputs
        assert "transpose" not in [op.opdef.key for op in info.graph._ops]


def test_a_product_keeps_only_what_the_wanted_gradients_read():
    """Each operand's gradient of a product reads only the other operand: a product by a
    constant keeps nothing, and a matmul whose weight gradient is not wanted keeps only the
    weight (PopART's MulArg0Grad / MatMulLhsGrad take the same)."""
    xv, wv = _rand(4, 6, seed=1), _rand(6, 3, seed=2)

    def build(x, w):
        return ops.matmul(x, w) * 2.0

    ir = popxl.Ir()
    with ir.main_graph:
        specs = (popxl.TensorSpec(xv.shape, F32), popxl.TensorSpec(wv.shape, F32))
        g = ir.create_graph(build, *specs)
        info = transforms.autodiff(g)
        assert set(_fwd_expected(info)) == set(g.inputs)
        assert len(g.outputs) == 1  # the matmul's result is not kept for the scaling's gradient
        only_x = ir.create_graph(build, *specs)
        info_x = transforms.autodiff(only_x, grads_required=[only_x.inputs[0]])
        assert _fwd_expected(info_x) == [only_x.inputs[1]]
    seed = np.ones((4, 3), np.float32)
    expected = _jax_grads(lambda x, w: (x @ w) * 2.0, (xv, wv), [seed])
    _, grads = _run_grads(build, [xv, wv], [seed])
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    _, (dx,) = _run_grads(build, [xv, wv], [seed], grads_required_idx=[0])
    np.testing.assert_allclose(dx, expected[0], rtol=1e-5, atol=1e-6)


def test_relu_and_softmax_gradients_read_their_outputs():
    """Relu's and softmax's gradients are computed from their outputs, which are kept in
    place of their inputs; a reshape of a kept value is computed again from it rather than
    kept as well, so relu's output serves both its own gradient and the next matmul's."""
    xv, wv, vv = _rand(4, 6, seed=3), _rand(6, 8, seed=4), _rand(16, 5, seed=5)

    def build(x, w, v):
        h = ops.relu(ops.matmul(x, w))
        return ops.softmax(ops.matmul(ops.reshape(h, (2, 16)), v), 1)

    def reference(x, w, v):
        h = jax.nn.relu(x @ w)
        return jax.nn.softmax(h.reshape(2, 16) @ v, axis=1)

    ir = popxl.Ir()
    with ir.main_graph:
        specs = [popxl.TensorSpec(a.shape, F32) for a in (xv, wv, vv)]
        g = ir.create_graph(build, *specs)
        info = transforms.autodiff(g)
        relu_out = next(op for op in g._ops if op.opdef.key == "relu").outputs[0]
        assert set(_fwd_expected(info)) == {*g.inputs, relu_out, g.outputs[0]}
        assert len(g.outputs) == 2  # the softmax's output, and relu's (nothing else kept)
        types = [op.type for op in info.graph._ops]
        assert "ReluGrad" in types and "SoftmaxGrad" in types
    _check(build, reference, [xv, wv, vv])


def test_gradients_of_inputs_not_required_are_not_computed():
    """Only values that depend on a required input get gradients: with only ``b``
    required, ``sin(x)`` is not differentiated and ``x`` is not kept for it."""
    xv, bv = _rand(5, seed=6), _rand(5, seed=7)

    def build(x, b):
        return ops.sin(x) * ops.sin(b)

    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(build, popxl.TensorSpec((5,), F32), popxl.TensorSpec((5,), F32))
        info = transforms.autodiff(g, grads_required=[g.inputs[1]])
        sin_x = g._ops[0].outputs[0]
        assert set(_fwd_expected(info)) == {sin_x, g.inputs[1]}
        assert [op.type for op in info.graph._ops].count("SinGrad") == 1
    seed = np.linspace(0.5, 1.5, 5).astype(np.float32)
    _, (db,) = _run_grads(build, [xv, bv], [seed], grads_required_idx=[1])
    np.testing.assert_allclose(db, seed * np.sin(xv) * np.cos(bv), rtol=1e-5, atol=1e-6)


def test_slices_that_tile_a_value_get_one_concat_as_its_gradient():
    """The gradients of slices that cut a value into parts along one axis (a fused q/k/v
    projection split three ways) are joined by one concat, not padded and summed; slices
    that leave a gap keep their padded gradients. Values against ``jax.grad`` either way."""
    xv = _rand(3, 2, 4, seed=8)

    def tiled(x):
        q, k, v = (ops.slice(x, start=[i], stop=[i + 1], axis=[0]) for i in (2, 0, 1))
        return ops.sin(q) * ops.cos(k) + ops.exp(v)

    def tiled_ref(x):
        return jnp.sin(x[2:3]) * jnp.cos(x[0:1]) + jnp.exp(x[1:2])

    def gapped(x):
        return ops.sin(ops.slice(x, start=[0], stop=[1], axis=[0])) * ops.slice(
            x, start=[2], stop=[3], axis=[0]
        )

    def gapped_ref(x):
        return jnp.sin(x[0:1]) * x[2:3]

    for build, reference, joined in ((tiled, tiled_ref, True), (gapped, gapped_ref, False)):
        ir = popxl.Ir()
        with ir.main_graph:
            g = ir.create_graph(build, popxl.TensorSpec(xv.shape, F32))
            types = [op.type for op in transforms.autodiff(g).graph._ops]
        assert types.count("Concat") == int(joined)
        assert types.count("SliceGrad") == (0 if joined else 2)
        _check(build, reference, [xv])


def test_added_forward_outputs_appear_at_existing_call_sites():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x: ops.gelu(ops.exp(x)), popxl.TensorSpec((3,), F32))
        v = popxl.variable(np.ones(3, np.float32))
        site = ops.call_with_info(g, v)
        assert len(site.outputs) == 1
        info = transforms.autodiff(g)
        added = len(g.outputs) - 1
        assert added >= 1
        assert len(site.outputs) == 1 + added
        assert all(t.name.startswith("autodiff_output__t") for t in site.outputs[1:])
        # inputs_dict connects every Fwd activation through the (extended) call site
        mapping = info.inputs_dict(site)
        fwd_inputs = [
            i
            for i, ec in enumerate(info.expected_inputs)
            if ec.connection_type is ExpectedConnectionType.Fwd
        ]
        assert set(mapping) == {info.graph.inputs[i] for i in fwd_inputs}
        (grad,) = ops.call(info.graph, popxl.constant(np.ones(3, np.float32)), inputs_dict=mapping)
        d = popxl.d2h_stream((3,), F32)
        ops.host_store(d, grad)
    with popxl.Session(ir) as s:
        out = s.run()[d]
    expected = jax.grad(lambda x: jnp.sum(jax.nn.gelu(jnp.exp(x), approximate=True)))(
        np.ones(3, np.float32)
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_modifying_graph_input_is_rejected():
    ir = popxl.Ir()
    with ir.main_graph:

        def build(a, b):
            a += b
            return a

        g = ir.create_graph(build, popxl.TensorSpec((2,), F32), popxl.TensorSpec((2,), F32))
        with pytest.raises(
            PopXLException, match=re.escape(f"The graph {g.id} contains a modifying op")
        ):
            transforms.autodiff(g)
        g2 = ir.create_graph(
            lambda a: ops.gelu_(ops.reshape_(a, (2, 1))), popxl.TensorSpec((2,), F32)
        )
        with pytest.raises(PopXLException, match="modifying op"):
            transforms.autodiff(g2)


def test_non_float_grads_required_is_rejected():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(
            lambda x, i: x * ops.cast(i, F32),
            popxl.TensorSpec((2,), F32),
            popxl.TensorSpec((2,), popxl.int32),
        )
        with pytest.raises(ValueError, match="not a floating point type"):
            transforms.autodiff(g, grads_required=g.inputs)
        info = transforms.autodiff(g, grads_required=g.inputs[:1])
        assert len(info.graph.outputs) == 1


def test_inputs_dict_rejects_call_site_of_another_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x: x * 2.0, popxl.TensorSpec((2,), F32))
        other = ir.create_graph(lambda x: x * 3.0, popxl.TensorSpec((2,), F32))
        info = transforms.autodiff(g)
        site = ops.call_with_info(other, popxl.variable(np.ones(2, np.float32)))
        with pytest.raises(TypeError, match="does not match the graph that was differentiated"):
            info.inputs_dict(site)


def test_called_graphs_grad_info_is_reused_and_all_graphs_returned():
    ir = popxl.Ir()
    with ir.main_graph:
        inner = ir.create_graph(lambda a: ops.exp(a), popxl.TensorSpec((2,), F32))
        outer = ir.create_graph(lambda a: ops.call(inner, a)[0] * a, popxl.TensorSpec((2,), F32))
        inner_info = transforms.autodiff(inner)
        infos = transforms.autodiff(
            outer, called_graphs_grad_info={inner: inner_info}, return_all_grad_graphs=True
        )
        assert set(infos) == {outer}
        calls = [op for op in infos[outer].graph.ops if op.type == "Call"]
        assert [op.called_graphs[0] for op in calls] == [inner_info.graph]
        fresh = transforms.autodiff(
            ir.create_graph(lambda a: ops.call(inner, a)[0], popxl.TensorSpec((2,), F32)),
            return_all_grad_graphs=True,
        )
        assert len(fresh) == 2


def test_gradient_ops_are_printed_one_per_forward_op():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(
            lambda x, w: ops.gelu(x @ w),
            popxl.TensorSpec((2, 3), F32),
            popxl.TensorSpec((3, 3), F32),
        )
        info = transforms.autodiff(g)
    text = info.graph.print_schedule()
    assert [line.split(".")[0].strip() for line in text.splitlines()[2:-1]] == [
        "GeluGrad",
        "MatMulGrad",
    ]


def test_repeat_inside_differentiated_graph():
    x = _rand(3)

    def build(x):
        body = popxl.gir().create_graph(lambda a: ops.sin(a) * 1.5, x)
        (y,) = ops.repeat(body, 3, x)
        return y

    def reference(x):
        for _ in range(3):
            x = jnp.sin(x) * 1.5
        return x

    _check(build, reference, [x])


def test_mnist_style_training_reduces_loss():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 8)).astype(np.float32) * 3
    labels = rng.integers(0, 3, 96).astype(np.int32)
    data = (centers[labels] + rng.normal(size=(96, 8))).astype(np.float32)
    batch = 32

    ir = popxl.Ir()
    with ir.main_graph:
        img_stream = popxl.h2d_stream((batch, 8), F32, "x")
        lbl_stream = popxl.h2d_stream((batch,), popxl.int32, "y")
        xt = ops.host_load(img_stream)
        yt = ops.host_load(lbl_stream)

        def net(x, w1, b1, w2, b2):
            return ops.gelu(x @ w1 + b1) @ w2 + b2

        shapes = [(8, 16), (16,), (16, 3), (3,)]
        graph = ir.create_graph(net, xt, *[popxl.TensorSpec(s, F32) for s in shapes])
        info = transforms.autodiff(graph, grads_required=graph.inputs[1:])
        weights = [
            popxl.variable(rng.normal(0, 0.3, s).astype(np.float32), name=f"w{i}")
            for i, s in enumerate(shapes)
        ]
        fwd = ops.call_with_info(graph, xt, *weights)
        logits = fwd.outputs[0]
        probs = ops.softmax(logits, axis=1)
        onehot = ops.cast(
            ops.equal(ops.reshape(yt, (batch, 1)), popxl.constant(np.arange(3, dtype=np.int32))),
            F32,
        )
        loss = ops.mean(ops.negate(ops.log(ops.sum(probs * onehot, axis=1))))
        dlogits = (probs - onehot) * (1.0 / batch)
        bwd = ops.call_with_info(info.graph, dlogits, inputs_dict=info.inputs_dict(fwd))
        grads = info.fwd_parent_ins_to_grad_parent_outs(fwd, bwd)
        for w in weights:
            ops.scaled_add_(w, grads[w], b=-0.5)
        loss_stream = popxl.d2h_stream((), F32, "loss")
        ops.host_store(loss_stream, loss)
    losses = []
    with popxl.Session(ir) as session:
        for _ in range(10):
            for i in range(0, 96, batch):
                out = session.run(
                    {img_stream: data[i : i + batch], lbl_stream: labels[i : i + batch]}
                )
                losses.append(float(out[loss_stream]))
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])


def test_call_of_a_graph_whose_output_is_a_view():
    """Found by tests/differential: the callee's seed went to a copy of its view output, and
    the caller's gradient rule looked that copy up among the callee's outputs."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.arange(4, dtype=np.float32))
        inner = ir.create_graph(lambda a: ops.reshape_(ops.sin(a), (2, 2)), x.spec)
        fwd = ir.create_graph(lambda a: ops.call(inner, a)[0] * 2, x.spec)
        info = transforms.autodiff(fwd)
        inner_info = transforms.autodiff(inner)
        assert inner_info.expected_inputs[0].fwd_tensor is inner.outputs[0]
        site = ops.call_with_info(fwd, x)
        seed = popxl.constant(np.ones((2, 2), np.float32))
        (grad,) = ops.call(info.graph, seed, inputs_dict=info.inputs_dict(site))
        d2h = popxl.d2h_stream(grad.shape, grad.dtype)
        ops.host_store(d2h, grad)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run()[d2h]
    np.testing.assert_allclose(got, 2 * np.cos(np.arange(4)), rtol=1e-6)


@pytest.mark.parametrize("kind", ["view", "inplace"])
def test_call_reading_a_view_or_an_inplace_alias(kind):
    """Found by tests/differential: a call whose input was a view (or an in-place op's
    output) got a copy that the call did not read, and autodiff stopped on an assertion."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.arange(4, dtype=np.float32))
        inner = ir.create_graph(lambda a: ops.sin(a), x.spec)

        def f(a):
            s = ops.tanh(a)
            h = ops.sigmoid_(s) if kind == "inplace" else ops.reshape_(s, (4,))
            return ops.call(inner, h)[0] * 2

        fwd = ir.create_graph(f, x.spec)
        info = transforms.autodiff(fwd)
        fwd.verify()
        site = ops.call_with_info(fwd, x)
        seed = popxl.constant(np.ones((4,), np.float32))
        (grad,) = ops.call(info.graph, seed, inputs_dict=info.inputs_dict(site))
        d2h = popxl.d2h_stream(grad.shape, grad.dtype)
        ops.host_store(d2h, grad)
    with popxl.Session(ir, "ipu_model") as session:
        got = session.run()[d2h]

    def reference(a):
        s = jnp.tanh(a)
        return jnp.sum(2 * jnp.sin(jax.nn.sigmoid(s) if kind == "inplace" else s))

    np.testing.assert_allclose(got, jax.grad(reference)(jnp.arange(4.0)), rtol=1e-5)


def test_seed_of_an_inplace_op_on_a_view_reaches_only_the_view():
    """The seed of an output that an in-place op made from a slice belongs to the slice's
    part of the root (differential campaign, seed 401003470: the session failed on a
    (1, 1) gradient added to the (3, 2) root's)."""
    x = _rand(3, 2)

    def build(x):
        y = x * 2.0
        s = ops.slice_(y, [2, 1], [3, 2])
        return ops.add_(s, s), ops.tanh(y)

    def reference(x):
        y = jnp.asarray(x) * 2.0
        s = y[2:3, 1:2] * 2
        return s, jnp.tanh(y.at[2:3, 1:2].set(s))

    _check(build, reference, [x], n_outputs=2)
