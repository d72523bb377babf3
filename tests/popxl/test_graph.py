"""``Graph``: properties, membership, equality, tensor counts and ``print_schedule``."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import InternalError

F32 = popxl.TensorSpec((2,), popxl.float32)


def test_graph_cannot_be_constructed():
    with pytest.raises(TypeError, match="cannot be constructed directly"):
        popxl.Graph()


def test_graph_repr_id_name():
    ir = popxl.Ir()
    g = ir.create_empty_graph("body")
    assert repr(ir.main_graph) == "Graph[id= name=]"
    assert repr(g) == "Graph[id=body_subgraph(0) name=body_subgraph(0)]"
    assert g.name == g.id == "body_subgraph(0)"
    assert g.ir is ir and g.main_graph is ir.main_graph


def test_graph_equality_and_hash():
    ir = popxl.Ir()
    g1, g2 = ir.create_empty_graph(), ir.create_empty_graph()
    assert g1 == g1 and g1 != g2
    assert len({g1, g2, g1}) == 2
    with pytest.raises(TypeError):
        _ = g1 == None  # noqa: E711
    with pytest.raises(TypeError):
        _ = g1 == "graph"


def test_inputs_outputs_and_inputs_by_name():
    ir = popxl.Ir()

    def fn(x, y):
        popxl.graph_input((3,), popxl.int32, "extra")
        return x + y, x

    g = ir.create_graph(fn, F32, F32)
    x, y, extra = g.inputs
    assert isinstance(g.inputs, tuple) and isinstance(g.outputs, tuple)
    assert g.inputs_by_name == {"x": x, "y": y, "extra": extra}
    assert g.outputs[1] is x
    assert g.outputs[0].name == "add_out"


def test_tensors_variables_constants_in_main():
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        v = popxl.variable(np.ones(2, np.float32), name="v")
        c = popxl.constant(np.ones(2, np.float32), name="c")
        h = popxl.h2d_stream((2,), popxl.float32, "h")
        out = v + c
    assert set(main.tensors) == {v, c, main.get_tensor("h"), out}
    assert main.variables == (v,)
    assert main.constants == (c,)
    assert isinstance(main.variables[0], popxl.Variable)
    assert isinstance(main.constants[0], popxl.Constant)
    assert main.get_tensor(h.tensor_id).shape == (2,)  # the stream handle is a main tensor


def test_get_tensor_and_contains():
    ir = popxl.Ir()
    g = ir.create_graph(lambda x: x + 1, F32)
    with ir.main_graph:
        v = popxl.variable(1, name="v")
    x = g.inputs[0]
    assert g.get_tensor(x.id) is x
    with pytest.raises(KeyError):
        g.get_tensor("x")  # ids are fully qualified
    assert x in g and v not in g
    assert v in ir.main_graph
    for bad in ("x", 1, None, x.id):
        with pytest.raises(TypeError):
            _ = bad in g


def test_called_graphs():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        a = ir.create_graph(lambda x: x + 1, v)
        b = ir.create_graph(lambda x: x * 2, v)
        assert ir.main_graph.called_graphs == ()
        ops.call(a, v)
        ops.call(b, v)
        ops.call(a, v)
        ops.repeat(b, 2, v)
    assert ir.main_graph.called_graphs == (a, b)
    assert a.called_graphs == ()


def test_nested_called_graphs():
    ir = popxl.Ir()
    inner = ir.create_graph(lambda x: x + 1, F32)
    outer = ir.create_graph(lambda x: ops.call(inner, x)[0], F32)
    assert outer.called_graphs == (inner,)


def test_ops_in_creation_order():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        y = ops.relu(v)
        z = ops.exp(y)
    assert [op.type for op in ir.main_graph.ops] == ["Relu", "Exp"]
    assert ir.main_graph.ops[1].outputs == (z,)


# Counting conventions (reference 2.3) -----------------------------------------------------------


def test_counts_for_variables_constants_inputs_and_binary_ops():
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        a = popxl.variable(1)
        assert len(main.tensors) == 1
        popxl.constant(2)
        assert len(main.tensors) == 2
        _ = a + 2  # a scalar operand becomes a constant: const + out
        assert len(main.tensors) == 4
    g = ir.create_empty_graph()
    with g:
        x = popxl.graph_input((2,), popxl.float32)
        ops.init((2,), popxl.float32)
        assert len(g.tensors) == 2
        _ = x + x
        assert len(g.tensors) == 3


def test_counts_for_streams():
    ir = popxl.Ir()
    main = ir.main_graph
    g = ir.create_empty_graph()
    with main:
        h = popxl.h2d_stream((2,), popxl.float32, "h")
        assert len(main.tensors) == 1
        popxl.d2h_stream((2,), popxl.float32)
        assert len(main.tensors) == 2
        ops.host_load(h)
        assert len(main.tensors) == 4
        names = sorted(t.id for t in main.tensors)
    assert names == ["d2h_stream", "h", "h_hostload", "h_init"]
    with g:
        popxl.d2h_stream((2,), popxl.float32, "from_sub")  # handle lives in main
        x = ops.host_load(h, "x")
    assert len(main.tensors) == 5
    assert sorted(t.name for t in g.tensors) == ["x_hostload", "x_init"]
    assert x.name == "x_hostload"


def test_count_for_repeat_of_identity_and_split_random_seed():
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        a = popxl.variable(np.ones(2, np.float32))
        identity = ir.create_graph(lambda x: x, a)
        ops.repeat(identity, 2, a)
        assert len(main.tensors) == 2
        seed = popxl.variable(np.array([1, 2], np.uint32))
        before = len(main.tensors)
        ops.split_random_seed(seed)
        assert len(main.tensors) - before == 4


# print_schedule -------------------------------------------------------------------------------


class Linear(popxl.Module):
    def __init__(self, out_features, prefix=""):
        self.out_features = out_features
        self.prefix = prefix

    def build(self, x):
        w = popxl.graph_input((x.shape[-1], self.out_features), x.dtype, self.prefix + "weight")
        y = x @ w
        b = popxl.graph_input((self.out_features,), x.dtype, self.prefix + "bias")
        return y + b


def _arg_names(graph, start=1):
    return {t: t.name for t in graph.inputs[start:]}


SEED_LINEAR = """\
Graph : Linear_subgraph(0)
  (%1, weight=%2, bias=%3) -> (%5) {
    MatMul.100 (%1 [(2, 4) float32], %2 [(4, 32) float32]) -> (%4 [(2, 32) float32])
    Add.101 (%4 [(2, 32) float32], %3 [(32,) float32]) -> (%5 [(2, 32) float32])
  }"""


def test_print_schedule_matches_the_seed_tutorial():
    ir = popxl.Ir()
    with ir.main_graph:
        graph = ir.create_graph(Linear(32), popxl.TensorSpec((2, 4), popxl.float32))
    assert graph.print_schedule(_arg_names(graph)) == SEED_LINEAR
    assert graph.print_schedule().splitlines()[1] == "  (%1, %2, %3) -> (%5) {"


SEED_OUTLINED = """\
Graph : NetOutlined_subgraph(0)
  (%1, fc1.weight=%2, fc1.bias=%3, fc2.weight=%4, fc2.bias=%5, fc3.weight=%6, fc3.bias=%7, fc4.weight=%8, fc4.bias=%9) -> (%19) {
    Reshape.100 (%1 [(28, 28) float32]) -> (%10 [(1, 784) float32])
    MatMul.101 (%10 [(1, 784) float32], %2 [(784, 512) float32]) -> (%11 [(1, 512) float32])
    Add.102 (%11 [(1, 512) float32], %3 [(512,) float32]) -> (%12 [(1, 512) float32])
    Gelu.103 (%12 [(1, 512) float32]) -> (%13 [(1, 512) float32])
    Call.106(Linear_subgraph(1)) (%13 [(1, 512) float32], %4 [(512, 512) float32], %5 [(512,) float32]) -> (%14 [(1, 512) float32])
    Gelu.107 (%14 [(1, 512) float32]) -> (%15 [(1, 512) float32])
    Call.108(Linear_subgraph(1)) (%15 [(1, 512) float32], %6 [(512, 512) float32], %7 [(512,) float32]) -> (%16 [(1, 512) float32])
    Gelu.109 (%16 [(1, 512) float32]) -> (%17 [(1, 512) float32])
    MatMul.110 (%17 [(1, 512) float32], %8 [(512, 10) float32]) -> (%18 [(1, 10) float32])
    Add.111 (%18 [(1, 10) float32], %9 [(10,) float32]) -> (%19 [(1, 10) float32])
  }"""


class NetOutlined(popxl.Module):
    def build(self, x):
        x = x.reshape((-1, 28 * 28))
        x = ops.gelu(Linear(512, "fc1.")(x))
        shared = popxl.gir().create_graph(Linear(512), x)
        for name in ("fc2", "fc3"):
            w = popxl.graph_input((512, 512), popxl.float32, f"{name}.weight")
            b = popxl.graph_input((512,), popxl.float32, f"{name}.bias")
            (x,) = ops.call(shared, x, w, b)
            x = ops.gelu(x)
        return Linear(10, "fc4.")(x)


def test_print_schedule_of_an_outlined_net_matches_the_seed_tutorial():
    ir = popxl.Ir()
    with ir.main_graph:
        net = ir.create_graph(NetOutlined(), popxl.TensorSpec((28, 28), popxl.float32))
    assert net.print_schedule(_arg_names(net)) == SEED_OUTLINED
    assert net.called_graphs[0].id == "Linear_subgraph(1)"


def test_print_schedule_numbers_tensors_on_first_appearance():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        y = v + 1
        _ = y * v
    text = ir.main_graph.print_schedule()
    assert text.splitlines() == [
        "Graph : ",
        "  () -> () {",
        "    Add.100 (%1 [(2,) float32], %2 [() float32]) -> (%3 [(2,) float32])",
        "    Mul.101 (%3 [(2,) float32], %1 [(2,) float32]) -> (%4 [(2,) float32])",
        "  }",
    ]


def test_print_schedule_of_repeat_and_empty_graph():
    ir = popxl.Ir()
    empty = ir.create_empty_graph("nothing")
    assert empty.print_schedule() == "Graph : nothing_subgraph(0)\n  () -> () {\n  }"
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        body = ir.create_graph(lambda x: x + 1, v)
        ops.repeat(body, 3, v)
    last = ir.main_graph.print_schedule().splitlines()[-2]
    assert last.startswith(f"    Loop.101({body.id}) (%1 [(2,) float32]) -> (%2 [(2,) float32])")


# verify -----------------------------------------------------------------------------------------


def test_verify_accepts_built_graphs():
    ir = popxl.Ir()
    with ir.main_graph:
        net = ir.create_graph(NetOutlined(), popxl.TensorSpec((28, 28), popxl.float32))
        x = popxl.variable(np.ones((28, 28), np.float32))
        weights = [popxl.variable(np.ones(t.shape, np.float32)) for t in net.inputs[1:]]
        ops.call(net, x, *weights)
    ir.main_graph.verify()


def test_verify_reports_broken_invariants():
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        v = popxl.variable(np.ones(2, np.float32))
        y = v + 1
        _ = ops.relu(y)
    main.verify()
    y._spec = popxl.TensorSpec((3,), popxl.float32)
    with pytest.raises(InternalError, match="inference says"):
        main.verify()
    y._spec = popxl.TensorSpec((2,), popxl.float32)
    main._ops.reverse()  # Relu now reads y before Add produces it
    with pytest.raises(InternalError, match="before it is produced"):
        main.verify()


def test_op_ids_count_from_100_across_the_whole_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        a = v + 1
        g = ir.create_graph(lambda x: ops.relu(x), v)
        b = ops.call(g, a)[0]
    assert [op.id for op in ir.main_graph.ops] == [100, 102]
    assert [op.id for op in g.ops] == [101]
    assert repr(b._producer) == "Call.102"
    with popxl.Ir().main_graph:
        assert (popxl.variable(1) + 1)._producer.id == 100
