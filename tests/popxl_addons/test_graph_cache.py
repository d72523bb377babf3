"""GraphCache and the ``function`` decorator (reference 1.6)."""

import numpy as np

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.graph_cache import (
    GraphCache,
    argument_hash,
    bound_arguments,
    function,
    tensor_hash,
)

F32 = popxl.float32


def double(x):
    return x + x


class Scale(addons.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def build(self, x):
        return x * self.factor


class HashedScale(Scale):
    """Instances with the same factor hash equal, so they may share a graph."""

    def __hash__(self):
        return hash(("HashedScale", self.factor))

    def __eq__(self, other):
        return isinstance(other, HashedScale) and other.factor == self.factor


def _spec(shape=(2,), dtype=F32):
    return popxl.TensorSpec(shape, dtype)


def test_same_function_and_spec_give_the_same_graph():
    cache = GraphCache()
    ir = popxl.Ir()
    with ir.main_graph:
        g0 = cache.create_graph(double, _spec())
        g1 = cache.create_graph(double, _spec())
        x = popxl.variable(np.zeros(2, np.float32))
        g2 = cache.create_graph(double, x)  # a tensor with the same spec
    assert g0 is g1 is g2


def test_same_module_instance_and_spec_give_the_same_graph():
    cache = GraphCache()
    scale = Scale(2.0)
    with popxl.Ir().main_graph:
        assert cache.create_graph(scale, _spec()) is cache.create_graph(scale, _spec())
        assert cache.create_graph(Scale(2.0), _spec()) is not cache.create_graph(
            Scale(2.0), _spec()
        )


def test_lambdas_with_the_same_body_give_different_graphs():
    cache = GraphCache()
    with popxl.Ir().main_graph:
        g0 = cache.create_graph(lambda x: x + x, _spec())
        g1 = cache.create_graph(lambda x: x + x, _spec())
    assert g0 is not g1


def test_instances_with_equal_hash_share_a_graph():
    cache = GraphCache()
    with popxl.Ir().main_graph:
        g0 = cache.create_graph(HashedScale(3.0), _spec())
        g1 = cache.create_graph(HashedScale(3.0), _spec())
        g2 = cache.create_graph(HashedScale(4.0), _spec())
    assert g0 is g1 and g2 is not g0


def test_different_dtype_shape_or_ipu_give_different_graphs():
    cache = GraphCache()
    with popxl.Ir().main_graph:
        base = cache.create_graph(double, _spec())
        assert cache.create_graph(double, _spec(dtype=popxl.float16)) is not base
        assert cache.create_graph(double, _spec(shape=(3,))) is not base
        with popxl.ipu(1):
            on_ipu1 = cache.create_graph(double, _spec())
            assert on_ipu1 is not base
            assert cache.create_graph(double, _spec()) is on_ipu1
        with popxl.io_tiles():
            assert cache.create_graph(double, _spec()) is not base


def test_python_arguments_are_part_of_the_key():
    def scaled(x, factor):
        return x * factor

    cache = GraphCache()
    with popxl.Ir().main_graph:
        g2 = cache.create_graph(scaled, _spec(), 2.0)
        assert (
            cache.create_graph(scaled, _spec(), factor=2.0) is g2
        )  # defaults and keywords bind alike
        assert cache.create_graph(scaled, _spec(), 3.0) is not g2


def test_graphs_are_cached_per_ir():
    cache = GraphCache()
    with popxl.Ir().main_graph:
        g0 = cache.create_graph(double, _spec())
    with popxl.Ir().main_graph:
        g1 = cache.create_graph(double, _spec())
    assert g0 is not g1 and g0.ir is not g1.ir


def test_cached_graph_computes():
    cache = GraphCache()
    ir = popxl.Ir()
    with ir.main_graph:
        g = cache.create_graph(HashedScale(3.0), _spec())
        (y,) = ops.call(
            cache.create_graph(HashedScale(3.0), _spec()),
            popxl.variable(np.array([1.0, 2.0], np.float32)),
        )
        s = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(s, y)
    assert len(ir._call_sites_of(g)) == 1
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_allclose(session.run()[s], [3.0, 6.0])


def test_function_decorator_reuses_a_graph_per_spec_and_computes():
    @function
    def affine(x, y):
        return x * 2.0 + y

    assert affine.__wrapped__ is not None and affine.__name__ == "affine"
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.array([1.0, 2.0], np.float32))
        b = popxl.variable(np.array([10.0, 20.0], np.float32))
        c = popxl.variable(np.array([1.0, 2.0, 3.0], np.float32))
        (r0,) = affine(a, b)
        (r1,) = affine(b, a)
        (r2,) = affine(c, c)
        streams = []
        for t in (r0, r1, r2):
            streams.append(popxl.d2h_stream(t.shape, t.dtype))
            ops.host_store(streams[-1], t)
    calls = [op for op in ir.main_graph.ops if op.type == "Call"]
    assert calls[0].called_graphs == calls[1].called_graphs != calls[2].called_graphs
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    np.testing.assert_allclose(out[streams[0]], [12.0, 24.0])
    np.testing.assert_allclose(out[streams[1]], [21.0, 42.0])
    np.testing.assert_allclose(out[streams[2]], [3.0, 6.0, 9.0])


def test_function_decorator_passes_list_and_keyword_tensors():
    @function
    def combine(xs, *, scale, factor=2.0):
        return (xs[0] + xs[1]) * scale * factor

    ir = popxl.Ir()
    with ir.main_graph:
        a, b, s = (
            popxl.variable(np.array(v, np.float32)) for v in ([1.0, 2.0], [3.0, 4.0], [1.0, -1.0])
        )
        (r,) = combine([a, b], scale=s)
        stream = popxl.d2h_stream(r.shape, r.dtype)
        ops.host_store(stream, r)
    with popxl.Session(ir, "ipu_model") as session:
        np.testing.assert_allclose(session.run()[stream], [8.0, -12.0])


def test_a_dead_function_never_hands_its_graph_to_a_new_one():
    cache = GraphCache()
    with popxl.Ir().main_graph:
        graphs = [cache.create_graph(Scale(float(i)), _spec()) for i in range(20)]
    assert len(set(graphs)) == 20


def test_tensor_hash_agrees_for_tensors_and_specs():
    with popxl.Ir().main_graph:
        t = popxl.variable(np.zeros((2, 3), np.float32))
    assert tensor_hash(t) == tensor_hash(popxl.TensorSpec((2, 3), F32))
    assert tensor_hash(t) != tensor_hash(popxl.TensorSpec((3, 2), F32))


def test_argument_hash_recurses_with_order_significant_dicts():
    spec = _spec()
    assert argument_hash([spec, 1]) == argument_hash((spec, 1))
    assert argument_hash({"a": 1, "b": 2}) != argument_hash({"b": 2, "a": 1})
    assert argument_hash(1) == argument_hash(1.0) == argument_hash(True)
    assert argument_hash([spec]) == argument_hash([popxl.TensorSpec((2,), F32)])


def test_bound_arguments_applies_defaults():
    def fn(x, y=3, *, z=4):
        return x

    bound = bound_arguments(fn, 1, z=5)
    assert dict(bound.arguments) == {"x": 1, "y": 3, "z": 5}
    scale = Scale(1.0)
    assert dict(bound_arguments(scale, 1, k=2).arguments) == {"args": (1,), "kwargs": {"k": 2}}
