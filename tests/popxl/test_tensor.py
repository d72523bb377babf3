"""``Tensor``, ``Variable``, ``Constant``: naming, reprs, properties, operators, indexing."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import PopXLException
from popxl.tensor import variable_sharing_memory


def _run(ir, *tensors):
    """Values of main-graph ``tensors`` after one run of ``ir``."""
    with ir.main_graph:
        streams = []
        for t in tensors:
            d = popxl.d2h_stream(t.shape, t.dtype)
            ops.host_store(d, t)
            streams.append(d)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    return [out[d] for d in streams]


def test_tensor_cannot_be_constructed():
    with pytest.raises(RuntimeError, match="cannot be constructed directly"):
        popxl.Tensor()


# Naming and ids ------------------------------------------------------------------------------


def test_dedup_with_an_ir_wide_counter():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(1, name="tensor")
        b = popxl.variable(1, name="tensor")
        c = popxl.constant(1, name="tensor")
        d = popxl.variable(1, name="other")
    assert (a.id, b.id, c.id, d.id) == ("tensor", "tensor__t0", "tensor__t1", "other")
    g = ir.create_empty_graph()
    with g:
        x = popxl.graph_input((), popxl.int32, "x")
        y = popxl.graph_input((), popxl.int32, "x")
    assert x.name == "x" and y.name == "x__t2"  # the counter is shared by every graph


def test_default_names():
    ir = popxl.Ir()
    with ir.main_graph:
        v, c = popxl.variable(1), popxl.constant(1)
        out = v + c
    assert (v.id, c.id, out.id) == ("t", "t__t0", "add_out")


def test_dedup_never_reuses_an_existing_id():
    # Deliberate difference: the original did not re-check the suffixed id.
    ir = popxl.Ir()
    with ir.main_graph:
        first = popxl.variable(1, name="a__t0")
        popxl.variable(1, name="a")
        second = popxl.variable(1, name="a")
    assert second.id != first.id
    assert ir.main_graph.get_tensor(first.id) is first
    assert len(ir.main_graph.tensors) == 3


def test_subgraph_ids_names_and_scope():
    ir = popxl.Ir()
    g = ir.create_empty_graph("g")
    with g, popxl.name_scope("s"):
        x = popxl.graph_input((1,), popxl.int32, "a")
    assert x.id == "g_subgraph(0)/s/a"
    assert x.name == "s/a"
    assert x.scope == "g_subgraph(0)"
    assert x.graph is g and x.ir is ir


def test_reprs():
    ir = popxl.Ir()
    with ir.main_graph:
        bias = popxl.variable(np.zeros(32, np.float32), name="bias")
        c = popxl.constant(np.zeros((1,), np.int32), name="bob")
        out = bias + 1
    g = ir.create_empty_graph("sub")
    with g:
        a = popxl.graph_input((1,), popxl.int32, "a")
    # Variables and constants print as Tensor[...], as in the seed tutorial.
    assert repr(bias) == "Tensor[bias popxl.dtypes.float32 (32,)]"
    assert repr(c) == "Tensor[bob popxl.dtypes.int32 (1,)]"
    assert repr(out) == "Tensor[add_out popxl.dtypes.float32 (32,)]"
    assert repr(a) == "Tensor[sub_subgraph(0)/a popxl.dtypes.int32 (1,)]"
    assert str(popxl.TensorSpec((1, 2), popxl.int32)) == (
        "TensorSpec(shape=(1, 2), dtype=popxl.dtypes.int32, meta_shape=())"
    )


# Properties ------------------------------------------------------------------------------------


def test_properties():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.ones((2, 3, 4), np.float16))
        s = popxl.constant(5)
    assert t.shape == (2, 3, 4) and t.rank == 3 and t.nelms == 24
    assert t.dtype is popxl.float16 and t.meta_shape == ()
    assert t.spec == popxl.TensorSpec((2, 3, 4), popxl.float16)
    assert s.shape == () and s.rank == 0 and s.nelms == 1
    assert t.strides() == np.ones((2, 3, 4), np.float16).strides
    assert t.strides((5, 6)) == np.ones((5, 6), np.float16).strides
    assert isinstance(t, popxl.Variable) and isinstance(s, popxl.Constant)
    assert not isinstance(t, popxl.Constant)


def test_transpose_properties_and_methods():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="t")
        tt = t.T
        assert tt.shape == (3, 2) and tt.name == "t_T"
        assert t.transpose((1, 0)).shape == (3, 2)
        assert t.reshape((3, 2)).shape == (3, 2)
        assert t.flatten().shape == (6,)
        assert t.detach().shape == (2, 3)
        view = t.T_
    assert view._producer.opdef.is_view


def test_diag_equals_numpy_for_square_and_non_square():
    # Deliberate difference: the original's flatten()[::cols+1] was wrong for non-square.
    data = {
        shape: np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        for shape in [(3, 3), (2, 4), (4, 2)]
    }
    ir = popxl.Ir()
    with ir.main_graph:
        diags = [popxl.variable(x).diag() for x in data.values()]
        with pytest.raises(ValueError, match="Diag expected a 2d tensor"):
            popxl.variable(np.ones(3, np.float32)).diag()
        with pytest.raises(ValueError, match="Diag expected a 2d tensor"):
            popxl.variable(np.ones((2, 2, 2), np.float32)).diag()
    for got, x in zip(_run(ir, *diags), data.values()):
        np.testing.assert_array_equal(got, np.diag(x))


# Creation functions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,kwargs,dtype",
    [
        (1, {}, popxl.int32),
        (1.5, {}, popxl.float32),
        (True, {}, popxl.bool),
        ([1, 2], {}, popxl.int32),
        ([1.0, 2.0], {}, popxl.float32),
        (np.ones(2, np.int64), {}, popxl.int32),
        (np.ones(2, np.float64), {}, popxl.float32),
        (np.ones(2, np.int64), {"downcast": False}, popxl.int64),
        (np.ones(2, np.uint64), {"downcast": False}, popxl.uint64),
        (np.ones(2, np.float16), {}, popxl.float16),
        (3.7, {"dtype": popxl.int32}, popxl.int32),
        (np.ones(2, np.float64), {"dtype": popxl.float64}, popxl.float64),
    ],
)
def test_host_data_dtype_inference(data, kwargs, dtype):
    ir = popxl.Ir()
    with ir.main_graph:
        assert popxl.constant(data, **kwargs).dtype is dtype
        assert popxl.variable(data, **kwargs).dtype is dtype


def test_constant_data_is_read_only_copy():
    src = np.ones(3, np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        c = popxl.constant(src)
    src[0] = 5
    assert c.data[0] == 1
    with pytest.raises(ValueError):
        c.data[0] = 2


def test_float8_host_data_gives_its_format_as_the_dtype():
    ir = popxl.Ir()
    f8 = popxl.fp8_utils.host_pow2scale_cast_to_fp8(np.array([1.0, -3.0]), popxl.float8_152)
    with ir.main_graph:
        c = popxl.constant(f8)
        v = popxl.variable(np.ones(2, popxl.float8_143._np_device), name="v")  # ml_dtypes form
        assert c.dtype is popxl.float8_152 and v.dtype is popxl.float8_143
        assert popxl.constant(f8, popxl.float8_152).dtype is popxl.float8_152
        assert popxl.variable(np.ones(2, np.float32), popxl.float8_152).dtype is popxl.float8_152
        out = popxl.d2h_stream((2,), popxl.float8_152, "out")
        ops.host_store(out, c)
    with popxl.Session(ir) as session:
        from_fp8 = popxl.fp8_utils.host_pow2scale_cast_from_fp8
        result = session.run()[out]
        assert result.dtype == popxl.dtypes.np_dtype_float8_152
        np.testing.assert_array_equal(from_fp8(result), [1.0, -3.0])
        data = session.get_tensor_data(v)
        assert data.dtype == popxl.dtypes.np_dtype_float8_143
        np.testing.assert_array_equal(from_fp8(data), [1.0, 1.0])


def test_variable_extras():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        v = popxl.variable(np.ones((3, 3), np.float32))
        grouped = popxl.variable(
            np.ones((2, 3, 3), np.float32),
            replica_grouping=ir.replica_grouping(group_size=2),
            retrieval_mode="all_replicas",
        )
        with pytest.raises(ValueError, match="retrieval_mode"):
            popxl.variable(1, retrieval_mode="some")
        with pytest.raises(ValueError, match="leading axis of size 2"):
            popxl.variable(np.ones((3, 3)), replica_grouping=ir.replica_grouping(group_size=2))
    assert v.replica_grouping == ir.replica_grouping()
    assert v.retrieval_mode == "one_per_group"
    assert v.shape_on_host == v.shape_on_replica == (3, 3)
    assert grouped.shape == (3, 3) and grouped.shape_on_host == (2, 3, 3)
    assert grouped.retrieval_mode == "all_replicas"


def test_a_variable_sharing_memory_views_its_data_and_runs_like_a_copy():
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    ir = popxl.Ir()
    with ir.main_graph:
        v = variable_sharing_memory(data, popxl.float32, "w")
        out = popxl.d2h_stream(v.shape, v.dtype, "out")
        popxl.ops.host_store(out, v + 1.0)
        with pytest.raises(TypeError, match="NumPy array of .*float32"):
            variable_sharing_memory(data.astype(np.float16), popxl.float32)
    assert np.shares_memory(v._host_data, data) and not v._host_data.flags.writeable
    data[0, 0] = 10.0  # the owner's later value is the one the session uploads
    with popxl.Session(ir) as session:
        np.testing.assert_array_equal(session.run()[out], data + 1.0)
    assert data[0, 0] == 10.0


def test_graph_output_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(1)
    g = ir.create_empty_graph()
    with g:
        with pytest.raises(TypeError):
            popxl.graph_output(1)
        with pytest.raises(ValueError, match="not in the current graph"):
            popxl.graph_output(v)
        x = popxl.graph_input((), popxl.int32)
        popxl.graph_output(x)
        popxl.graph_output(x)
    assert g.outputs == (x, x)


def test_graph_input_by_ref_and_meta_shape():
    ir = popxl.Ir()
    g = ir.create_empty_graph()
    spec = popxl.TensorSpec((2,), popxl.float32, (4,))
    with g:
        a = popxl.graph_input(**spec, name="a", by_ref=True)
        b = popxl.graph_input([3], popxl.int8)
    assert a.meta_shape == (4,) and a.shape == (2,) and a in g._by_ref_inputs
    assert b.shape == (3,) and b.name == "t" and b not in g._by_ref_inputs


# Operators ------------------------------------------------------------------------------------

BINARY = [
    (lambda a, b: a + b, "Add", np.add),
    (lambda a, b: a - b, "Sub", np.subtract),
    (lambda a, b: a * b, "Mul", np.multiply),
    (lambda a, b: a / b, "Div", np.divide),
    (lambda a, b: a % b, "Fmod", np.fmod),
    (lambda a, b: a**b, "Pow", np.power),
]


@pytest.mark.parametrize("fn,op_type,reference", BINARY, ids=[b[1] for b in BINARY])
def test_binary_dunders_and_reflections(fn, op_type, reference):
    x = np.array([1.5, 2.0, 3.0], np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(x)
        forward, reflected, with_tensor = fn(t, 2.0), fn(2.0, t), fn(t, t)
    assert forward._producer.type == op_type
    assert forward._producer.inputs[0] is t
    assert reflected._producer.inputs[1] is t
    assert reflected._producer.inputs[0].dtype is popxl.float32
    got = _run(ir, forward, reflected, with_tensor)
    np.testing.assert_allclose(got[0], reference(x, np.float32(2)), rtol=1e-6)
    np.testing.assert_allclose(got[1], reference(np.float32(2), x), rtol=1e-6)
    np.testing.assert_allclose(got[2], reference(x, x), rtol=1e-6)


def test_scalars_take_the_tensors_dtype():
    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.variable(np.ones(2, np.float16))
        i = popxl.variable(np.array([4, 6], np.int32))
        half_sum = h + 1.5
        int_product = i * 0.5  # 0.5 becomes int32(0), as in PopXL
        seed = popxl.variable(np.array([1, 2], np.uint32))
        seed_plus = seed + 1
    assert half_sum.dtype is popxl.float16
    assert half_sum._producer.inputs[1].dtype is popxl.float16
    assert seed_plus.dtype is popxl.uint32
    got = _run(ir, half_sum, int_product)
    np.testing.assert_array_equal(got[0], [2.5, 2.5])
    np.testing.assert_array_equal(got[1], [0, 0])


def test_unary_matmul_and_logical_dunders():
    ir = popxl.Ir()
    with ir.main_graph:
        m = popxl.variable(np.arange(4, dtype=np.float32).reshape(2, 2))
        b = popxl.variable(np.array([True, False]))
        neg, mm, rmm = -m, m @ m, np.eye(2, dtype=np.float32) @ m
        land, lor, lnot, rand = b & True, b | False, ~b, True & b
    assert [t._producer.type for t in (neg, mm, land, lor, lnot)] == [
        "Neg",
        "MatMul",
        "And",
        "Or",
        "Not",
    ]
    assert rmm._producer.inputs[1] is m and rand._producer.inputs[1] is b
    got = _run(ir, neg, mm, rmm, land, lor, lnot)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    np.testing.assert_array_equal(got[0], -x)
    np.testing.assert_array_equal(got[1], x @ x)
    np.testing.assert_array_equal(got[2], x)
    np.testing.assert_array_equal(got[3], [True, False])
    np.testing.assert_array_equal(got[4], [True, False])
    np.testing.assert_array_equal(got[5], [False, True])


def test_numpy_array_on_the_left_uses_the_reflected_dunder():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.ones(2, np.float16))
        out = np.array([1.0, 2.0]) + t
        prod = np.array([2.0, 2.0]) * t
    assert isinstance(out, popxl.Tensor) and out.dtype is popxl.float16
    assert out._producer.inputs[1] is t
    np.testing.assert_array_equal(_run(ir, out, prod)[0], [2.0, 3.0])


def test_iadd_is_in_place_and_returns_the_same_object():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, np.float32), name="v")
        alias = v
        alias += 1
        assert alias is v
        assert ir.main_graph.ops[-1].type == "AddLhsInplace"
        w = popxl.variable(np.zeros(2, np.float32), name="w")
        before = w
        w -= 1  # not in place: rebinds
        assert w is not before and w._producer.type == "Sub"
    got = _run(ir, v, before)
    np.testing.assert_array_equal(got[0], [1, 1])
    np.testing.assert_array_equal(got[1], [0, 0])


def test_dtype_mismatch_is_a_core_error():
    ir = popxl.Ir()
    with ir.main_graph:
        f = popxl.variable(np.ones(3, np.float32))
        i = popxl.variable(np.ones(3, np.int32))
        with pytest.raises(PopXLException, match="float32.*int32"):
            _ = f + i
        with pytest.raises(PopXLException, match="broadcasting"):
            _ = f + popxl.variable(np.ones(2, np.float32))
        with pytest.raises(ValueError, match="0 elements"):
            _ = f + []
        with pytest.raises(TypeError, match="None cannot be used"):
            _ = f + None  # NumPy would have made it NaN


def test_equality_is_identity_and_comparisons_are_type_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32))
        b = popxl.variable(np.ones(2, np.float32))
    assert a == a and a != b and not (a == b)
    assert (a == 1) is False
    assert len({a, b, a}) == 2
    for compare in (lambda: a < b, lambda: a <= b, lambda: a > 1, lambda: a >= 1):
        with pytest.raises(TypeError):
            compare()


def test_iteration_membership_and_len():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((4, 2), np.float32))
        s = popxl.variable(1.0)
    assert len(a) == 4
    with pytest.raises(ValueError, match="scalar and doesn't have a length"):
        len(s)
    with pytest.raises(TypeError):
        iter(a)
    with pytest.raises(TypeError):
        list(a)
    with pytest.raises(TypeError):
        _ = 1 in a


# Indexing ---------------------------------------------------------------------------------------

X = np.arange(100, dtype=np.float32).reshape(10, 10)
BASIC_KEYS = [
    1, -1, -2, -10, (1, 2), (-1, -1), slice(1, 3), (slice(1, 5, 2), 1), slice(9, 4, -2),
    (slice(None, None, 5), slice(None, None, 2)), slice(None, None, -1), (slice(-3, None), -4),
    (slice(None), 3), slice(20, 30), slice(5, 2),
]  # fmt: skip


@pytest.mark.parametrize("key", BASIC_KEYS, ids=[repr(k) for k in BASIC_KEYS])
def test_basic_indexing_matches_numpy(key):
    ir = popxl.Ir()
    with ir.main_graph:
        out = popxl.variable(X)[key]
    assert out.shape == X[key].shape
    if out.nelms:
        np.testing.assert_array_equal(_run(ir, out)[0], X[key])


def test_negative_one_index_works():
    # Deliberate difference: upstream `x[-1]` produced an invalid slice.
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.arange(5, dtype=np.int32))
        last = v[-1]
    assert last.shape == ()
    assert _run(ir, last)[0] == 4


def test_full_slice_returns_the_input():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(X)
        assert v[:] is v
        assert v[:, :] is v


def test_integer_tensor_and_list_indexing_gathers_on_axis_0():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(X)
        by_list = v[[[0, 1], [1, 1]]]
        by_array = v[np.array([3, 0])]
        by_tensor = v[popxl.constant(np.array([2], np.int32))]
    assert by_list.shape == (2, 2, 10)
    assert by_list._producer.type == "Gather"
    got = _run(ir, by_list, by_array, by_tensor)
    np.testing.assert_array_equal(got[0], X[[[0, 1], [1, 1]]])
    np.testing.assert_array_equal(got[1], X[[3, 0]])
    np.testing.assert_array_equal(got[2], X[[2]])


def test_bool_indexing_is_a_mask():
    data = np.arange(8, dtype=np.float32).reshape(4, 2)
    mask = np.array([[True], [False], [True], [False]])
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(data)
        masked = v[mask]
        masked_t = v[popxl.constant(np.array([True, False]))]
    assert masked.shape == (4, 2)
    got = _run(ir, masked, masked_t)
    np.testing.assert_array_equal(got[0], np.where(mask, data, 0))
    np.testing.assert_array_equal(got[1], np.where([True, False], data, 0))


@pytest.mark.parametrize("key", [True, False, "a", 1.0, None, (1, "a"), [1.5, 2.5], (Ellipsis, 1)])
def test_bad_index_types(key):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(X)
        with pytest.raises(TypeError, match="Only integers, slices"):
            v[key]


def test_index_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(X)
        with pytest.raises(IndexError):
            v[10]
        with pytest.raises(IndexError):
            v[-11]
        with pytest.raises(IndexError):
            v[1, 2, 3]
