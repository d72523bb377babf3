"""Custom ops written in Python (``popxl.custom_ops``): recorded, printed, differentiated,
cached, replicated and placed like built-in ops; errors at build time."""

import jax.numpy as jnp
import numpy as np
import pytest

import popxl
from popxl import custom_ops, ops, transforms

DOMAIN = "test.custom_ops"


def _leaky(x, *, alpha):
    return jnp.where(x >= 0, x, alpha * x)


def _cube(x, bias):
    cubed = x * x * x
    return cubed + bias, cubed


def _cube_vjp(inputs, outputs, grads):
    (x, _), (g_sum, g_cube) = inputs, grads
    return 3 * x * x * (g_sum + g_cube), g_sum


@pytest.fixture
def leaky():
    op = custom_ops.register("LeakyRelu", _leaky, domain=DOMAIN, attributes={"alpha": 0.01})
    yield op
    custom_ops.unregister("LeakyRelu", DOMAIN)


@pytest.fixture
def cube():
    op = custom_ops.register("Cube", _cube, domain=DOMAIN, vjp=_cube_vjp)
    yield op
    custom_ops.unregister("Cube", DOMAIN)


def _run(ir, *tensors, feeds=None):
    streams = []
    with ir.main_graph:
        for t in tensors:
            s = popxl.d2h_stream(t.shape, t.dtype)
            ops.host_store(s, t)
            streams.append(s)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run(feeds or {})
    return [out[s] for s in streams]


def _finite_difference(fn, x, eps=1e-3):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (fn(up) - fn(down)) / (2 * eps)
    return grad


def test_forward_matches_numpy_and_prints_under_its_name(leaky):
    x = np.array([-2.0, -0.5, 0.0, 1.5], np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        y = leaky(popxl.variable(x, name="x"), alpha=0.2)
    (out,) = _run(ir, y)
    np.testing.assert_allclose(out, np.where(x >= 0, x, 0.2 * x))
    text = ir.main_graph.print_schedule()
    assert "LeakyRelu.100 (%1 [(4,) float32]) -> (%2 [(4,) float32])" in text
    assert ir.main_graph._ops[0].attrs == {"alpha": float(np.float32(0.2))}


def test_default_attribute_and_call_by_identity(leaky):
    x = np.array([-1.0, 3.0], np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(x)
        (a,) = custom_ops.call("LeakyRelu", [v], domain=DOMAIN)
        b = leaky(v)
    out_a, out_b = _run(ir, a, b)
    np.testing.assert_allclose(out_a, [-0.01, 3.0], rtol=1e-6)
    np.testing.assert_allclose(out_b, out_a)


def test_dot_output_names_the_op(leaky, tmp_path):
    ir = popxl.Ir()
    with ir.main_graph:
        leaky(popxl.variable(np.ones(3, np.float32)))
        ir.dot_checkpoint("Custom", str(tmp_path))
    text = (tmp_path / "Custom.dot").read_text()
    assert "LeakyRelu.100" in text


def test_two_outputs_and_registered_gradient(cube):
    x = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    bias = np.full((2, 2), 4.0, np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        xv, bv = popxl.variable(x, name="x"), popxl.variable(bias, name="bias")
        graph = ir.create_graph(lambda a, b: cube(a, b), xv, bv)
        info = ops.call_with_info(graph, xv, bv)
        grad = transforms.autodiff(graph)
        seeds = [popxl.constant(np.ones((2, 2), np.float32)) for _ in range(2)]
        dx, dbias = ops.call(grad.graph, *seeds, inputs_dict=grad.inputs_dict(info))
    total, cubed, gx, gb = _run(ir, *info.outputs, dx, dbias)
    np.testing.assert_allclose(cubed, x**3)
    np.testing.assert_allclose(total, x**3 + bias)
    np.testing.assert_allclose(gx, 6 * x * x, rtol=1e-6)  # two outputs, each x**3
    np.testing.assert_allclose(gb, np.ones((2, 2)))
    assert "Cube" in graph.print_schedule()


def test_jax_derived_gradient_matches_finite_differences(leaky):
    x = np.array([-1.5, -0.25, 0.75, 2.0], np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        xv = popxl.variable(x, name="x")
        graph = ir.create_graph(lambda a: ops.sum(leaky(a, alpha=0.3) ** 2), xv)
        info = ops.call_with_info(graph, xv)
        grad = transforms.autodiff(graph)
        seed = popxl.constant(np.float32(1.0))
        (dx,) = ops.call(grad.graph, seed, inputs_dict=grad.inputs_dict(info))
    (gx,) = _run(ir, dx)

    def loss(v):
        y = np.where(v >= 0, v, 0.3 * v)
        return float(np.sum(y.astype(np.float64) ** 2))

    np.testing.assert_allclose(gx, _finite_difference(loss, x.astype(np.float64)), rtol=1e-4)


def test_replicated_and_placed(leaky):
    data = np.array([[-1.0, 1.0], [2.0, -4.0]], np.float32)  # one row per replica
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        stream = popxl.h2d_stream((2,), popxl.float32, "x")
        with popxl.ipu(0):
            y = leaky(ops.host_load(stream), alpha=0.5)
    (out,) = _run(ir, y, feeds={stream: data})
    np.testing.assert_allclose(out, np.where(data >= 0, data, 0.5 * data))
    assert y.ipu == 0


def test_identical_programs_share_one_compiled_step(leaky):
    from runtime.session.program import structural_key

    def build(alpha):
        ir = popxl.Ir()
        with ir.main_graph:
            leaky(popxl.constant(np.ones(2, np.float32)), alpha=alpha)
        return structural_key(ir, [ir.main_graph], [])

    assert build(0.1) == build(0.1)
    assert build(0.1) != build(0.2)


def test_custom_shape_inference_is_used():
    op = custom_ops.register(
        "Sum0",
        lambda x: x.sum(0),
        domain=DOMAIN,
        infer=lambda s: popxl.TensorSpec(s.shape[1:], s.dtype),
    )
    try:
        ir = popxl.Ir()
        with ir.main_graph:
            y = op(popxl.constant(np.ones((3, 2), np.float32)))
        assert y.shape == (2,)
        (out,) = _run(ir, y)
        np.testing.assert_allclose(out, [3.0, 3.0])
    finally:
        custom_ops.unregister("Sum0", DOMAIN)


def test_many_attribute_kinds_are_typed():
    attrs = {
        "f": float,
        "fs": [float],
        "i": "Int",
        "is_": custom_ops.Attribute("Ints", (1, 2)),
        "s": str,
        "ss": [str],
    }
    seen = {}

    def impl(x, **kw):
        seen.update(kw)
        return x + 1

    op = custom_ops.register("Many", impl, domain=DOMAIN, attributes=attrs)
    try:
        given = {"f": 1, "fs": [1.0, -2.5], "i": -5, "s": "a \" ' \\ b", "ss": ("x", "y")}
        ir = popxl.Ir()
        with ir.main_graph:
            y = op(popxl.constant(np.zeros(2, np.float32)), **given)
        _run(ir, y)
        assert seen == {
            "f": 1.0, "fs": (1.0, -2.5), "i": -5, "is_": (1, 2), "s": "a \" ' \\ b",
            "ss": ("x", "y"),
        }  # fmt: skip
        with ir.main_graph:
            x = popxl.constant(np.zeros(2, np.float32))
            for name, bad in [("f", "1"), ("i", 1.5), ("fs", 1.0), ("ss", [1]), ("s", 3)]:
                with pytest.raises(TypeError, match=f"attribute '{name}'"):
                    op(x, **{**given, name: bad})
            with pytest.raises(ValueError, match="non-ASCII"):
                op(x, **{**given, "s": "café"})
            with pytest.raises(ValueError, match="unknown attribute 'g'"):
                op(x, g=1.0, **given)
            with pytest.raises(ValueError, match="attribute 'f' .* has no default"):
                op(x, **{k: v for k, v in given.items() if k != "f"})
    finally:
        custom_ops.unregister("Many", DOMAIN)


def test_registry_errors(leaky):
    with pytest.raises(ValueError, match=r"registered.*test\.custom_ops::LeakyRelu:1"):
        custom_ops.get("LeakyRelu", DOMAIN, version=2)
    with pytest.raises(ValueError, match="already registered"):
        custom_ops.register("LeakyRelu", _leaky, domain=DOMAIN)
    assert (DOMAIN, "LeakyRelu", 1) in custom_ops.registered()
    with pytest.raises(NotImplementedError, match="Graph"):
        custom_ops.register("G", _leaky, domain=DOMAIN, attributes={"body": "Graph"})
    replaced = custom_ops.register("LeakyRelu", _leaky, domain=DOMAIN, replace=True)
    assert custom_ops.get("LeakyRelu", DOMAIN) is replaced


def test_vjp_gradient_of_a_broadcast_input_is_summed_to_its_shape():
    def add_bias(x, b):
        return x + b

    def add_bias_vjp(inputs, output, grad):  # the output-shaped gradient for the bias too
        return grad, grad

    op = custom_ops.register("AddBias", add_bias, domain=DOMAIN, vjp=add_bias_vjp)
    try:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        b = np.array([1.0, 2.0, 3.0], np.float32)
        ir = popxl.Ir()
        with ir.main_graph:
            xv, bv = popxl.variable(x, name="x"), popxl.variable(b, name="b")
            graph = ir.create_graph(lambda a, c: op(a, c), xv, bv)
            info = ops.call_with_info(graph, xv, bv)
            grad = transforms.autodiff(graph)
            seed = popxl.constant(np.full((2, 3), 2.0, np.float32))
            dx, db = ops.call(grad.graph, seed, inputs_dict=grad.inputs_dict(info))
        y, gx, gb = _run(ir, *info.outputs, dx, db)
        np.testing.assert_allclose(y, x + b)
        np.testing.assert_allclose(gx, np.full((2, 3), 2.0))
        np.testing.assert_allclose(gb, np.full(3, 4.0))  # summed over the broadcast rows
    finally:
        custom_ops.unregister("AddBias", DOMAIN)
