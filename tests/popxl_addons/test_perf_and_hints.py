"""performance_utils (FLOP counting) and the planning-hint transforms
(available memory proportion, fully-connected pass)."""

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.performance_utils import (
    evaluate_FLOPs,
    evaluate_ir_FLOPs,
    format_flops_scientific,
    print_FLOPs,
    total_FLOPs,
)
from popxl_addons.transforms.available_memory_proportion import AMP_HINT, CONV_AMP_HINT
from popxl_addons.transforms.use_fc_pass import FC_PASS_HINT

F32 = popxl.float32


def _const(shape):
    return popxl.constant(np.ones(shape, np.float32))


def test_matmul_flops_are_two_per_multiply_add():
    ir = popxl.Ir()
    with ir.main_graph:
        a = _const((3, 5, 10, 9)) @ _const((3, 5, 9, 3))
        v = _const((4,)) @ _const((4, 8))
        _ = a + a
    b = evaluate_FLOPs(ir.main_graph)
    mm = sorted(b["MatMul"].values())
    assert mm == [2 * 4 * 8, 2 * 9 * 3 * 5 * 10 * 3]
    assert b["Add"] == {max(op.id for op in ir.main_graph._ops): 3 * 5 * 10 * 3}
    assert b["TOT"] == sum(mm) + 450
    assert v.shape == (8,)


def test_called_and_repeated_graphs_count_per_call_and_iteration():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 4), np.float32))
        g = ir.create_graph(lambda t: t @ _const((4, 4)), x)
        ops.call(g, x)
        ops.call(g, x)
        ops.repeat(g, 5, x)
    b = evaluate_FLOPs(ir.main_graph)
    per_call = 2 * 4 * 2 * 4
    assert b["TOT"] == 7 * per_call
    calls = b["MatMul"]
    assert sorted(sum(v.values()) for v in calls.values()) == [per_call, per_call, 5 * per_call]
    assert all(k.endswith("iteration.<lambda>)") for k in calls)
    assert {k.split("_")[0] for k in calls} == {"Call", "Loop"}


def test_ir_flops_count_every_replica():
    ir = popxl.Ir(4)
    with ir.main_graph:
        _ = _const((2, 3)) * _const((2, 3))
    (mul,) = [op for op in ir.main_graph._ops if op.type == "Mul"]
    assert evaluate_ir_FLOPs(ir)["Mul"] == {mul.id: 4 * 6}
    assert total_FLOPs(ir) == 24


def test_group_norm_flops_follow_the_formula():
    ir = popxl.Ir()
    n, c, h, w, groups = 2, 6, 4, 5, 3
    with ir.main_graph:
        x = _const((n, c, h, w))
        ops.group_norm(x, _const((c,)), _const((c,)), groups)
    per_group = w * h // groups
    expected = per_group + (2 * per_group + 2 * n * groups) + 4 * n * c * h * w
    assert evaluate_FLOPs(ir.main_graph)["TOT"] == expected


def test_format_flops_scientific():
    assert format_flops_scientific(9072) == "9.072E+03"
    assert format_flops_scientific(64) == "64.000E+00"
    assert format_flops_scientific(123456) == "0.123E+06"
    assert format_flops_scientific(0) == "0.000E+00"
    assert format_flops_scientific(2.5e9, "M") == "2500.000E+06"
    with pytest.raises(ValueError, match="Unknown format 'X'"):
        format_flops_scientific(1, "X")


def test_print_flops_tables(capsys):
    ir = popxl.Ir()
    with ir.main_graph:
        y = _const((2, 3)) @ _const((3, 4))
        _ = y + y
    b = evaluate_FLOPs(ir.main_graph)
    print_FLOPs(b)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["Op", "Type", "|", "FLOPs", "|", "%"]
    assert [line.split("|")[0].strip() for line in lines[2:5]] == ["TOT", "MatMul", "Add"]
    assert lines[3].split("|")[2].strip() == "85.7"  # 48 of 56
    print_FLOPs(b, mode="flat")
    flat = [line for line in capsys.readouterr().out.splitlines() if line]
    assert flat[-1].split("|")[0].strip() == "TOT" and "56.000E+00" in flat[-1]
    with pytest.raises(ValueError, match="Unknown mode 'tree'"):
        print_FLOPs(b, mode="tree")


# Available memory proportion ------------------------------------------------------------


def _two_ipu_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        with popxl.ipu(0):
            a = popxl.variable(np.arange(4, dtype=np.float32).reshape(2, 2))
            g = ir.create_graph(lambda t: t @ t, a)
            (c,) = ops.call(g, a)
            c = c @ a
        c1 = c.copy_to_ipu(1)
        with popxl.ipu(1):
            d = c1 @ c1
            e = ops.gather(d, popxl.constant(np.array([1, 0], np.uint32)))
        out = addons.host_store(e)
    return ir, g, out


def _hint_values(ir, hint):
    return {op.id: op.hints.get(hint) for g in ir._graphs.values() for op in g._ops}


def test_available_memory_proportion_is_recorded_per_ipu():
    ir, g, _ = _two_ipu_ir()
    addons.set_available_memory_proportion_by_ipu(ir, [0.1, 0.2])
    recorded = {
        (op.type, op.ipu): op.hints[AMP_HINT]
        for graph in ir._graphs.values()
        for op in graph._ops
        if AMP_HINT in op.hints
    }
    assert recorded == {("MatMul", 0): 0.1, ("MatMul", 1): 0.2, ("Gather", 1): 0.2}
    assert all(AMP_HINT not in op.hints for op in ir.main_graph._ops if op.type == "Call")


def test_ipus_without_a_proportion_take_ipu_zeros():
    ir, _, _ = _two_ipu_ir()
    addons.set_available_memory_proportion_by_ipu(ir, [0.3])
    values = {v for v in _hint_values(ir, AMP_HINT).values() if v is not None}
    assert values == {0.3}


def test_graph_variant_reaches_called_graphs_only():
    ir, g, _ = _two_ipu_ir()
    with ir.main_graph:
        unused = ir.create_graph(lambda t: t @ t, popxl.TensorSpec((2, 2), F32))
    addons.set_graph_available_memory_proportion_by_ipu(ir.main_graph, [0.4, 0.5])
    assert [op.hints[AMP_HINT] for op in g._ops if op.type == "MatMul"] == [0.4]
    assert all(AMP_HINT not in op.hints for op in unused._ops)


def test_conv_records_a_list_of_proportions():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((1, 2, 4, 4), np.float32))
        w = popxl.variable(np.ones((3, 2, 2, 2), np.float32))
        ops.conv(x, w)
    addons.set_available_memory_proportion_by_ipu(ir, [0.25])
    (conv,) = [op for op in ir.main_graph._ops if op.type == "Conv"]
    assert conv.hints == {CONV_AMP_HINT: [0.25]}


@pytest.mark.parametrize(
    "props, match",
    [
        ([], "proportions is empty"),
        ([0.5, 0.0], r"for IPU 1 must be in \(0, 1\], got 0.0"),
        ([1.5], r"for IPU 0 must be in \(0, 1\], got 1.5"),
    ],
)
def test_bad_proportions_are_rejected(props, match):
    ir, _, _ = _two_ipu_ir()
    with pytest.raises(ValueError, match=match):
        addons.set_available_memory_proportion_by_ipu(ir, props)


def _run(ir, out):
    with popxl.Session(ir, "ipu_hw") as s:
        return s.run()[out]


def test_hints_do_not_change_results():
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    c = (a @ a) @ a
    expected = (c @ c)[[1, 0]]
    ir, _, out = _two_ipu_ir()
    addons.set_available_memory_proportion_by_ipu(ir, [0.1, 0.2])
    addons.disable_fc_pass(ir)
    np.testing.assert_allclose(_run(ir, out), expected)


# Fully connected pass --------------------------------------------------------------------


def test_fc_pass_is_recorded_on_every_matmul():
    ir, g, _ = _two_ipu_ir()
    addons.disable_fc_pass(ir)
    matmuls = [op for graph in ir._graphs.values() for op in graph._ops if op.type == "MatMul"]
    assert len(matmuls) == 3 and all(op.hints[FC_PASS_HINT] is False for op in matmuls)
    addons.enable_fc_pass(ir)
    assert all(op.hints[FC_PASS_HINT] is True for op in matmuls)
    others = [op for op in ir.main_graph._ops if op.type != "MatMul"]
    assert all(FC_PASS_HINT not in op.hints for op in others)


# The PopART-style views real code uses to read and set the hints ---------------------------


def test_pb_op_views_read_and_set_the_hints():
    ir, g, _ = _two_ipu_ir()
    pb_graphs = ir._pb_ir.getAllGraphs()
    assert len(pb_graphs) == 2
    pb_ops = [op for pg in pb_graphs for op in pg.getOps()]
    matmuls = [op for op in pb_ops if op.opType() == "MatMul"]
    assert [op.useFullyConnectedPass() for op in matmuls] == [True] * 3  # PopART's default
    addons.disable_fc_pass(ir)
    assert [op.useFullyConnectedPass() for op in matmuls] == [False] * 3
    matmuls[0].setUseFullyConnectedPass(True)
    assert matmuls[0]._op.hints[FC_PASS_HINT] is True
    addons.set_available_memory_proportion_by_ipu(ir, [0.1, 0.2])
    assert sorted(op.getAvailableMemoryProportion() for op in matmuls) == [0.1, 0.1, 0.2]
    assert [
        op.getVirtualGraphId() for op in matmuls if op.getAvailableMemoryProportion() == 0.2
    ] == [1]
    gather = next(op for op in pb_ops if op.opType() == "Gather")
    gather.setAvailableMemoryProportion(0.7)
    assert gather._op.hints[AMP_HINT] == 0.7
    assert not hasattr(gather, "useFullyConnectedPass")
    call = next(op for op in pb_ops if op.opType() == "Call")
    assert call.getCalledGraph() == g._pb_graph and not hasattr(call, "getTripCountValue")
    assert [t.info.shape() for t in call.getInputTensors()] == [[2, 2]]
    assert not any(hasattr(op, "getCalledGraph") for op in pb_ops if op.opType() != "Call")


def test_pb_loop_view_has_the_trip_count():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        g = ir.create_graph(lambda t: t + 1.0, x)
        ops.repeat(g, 4, x)
    (loop,) = ir.main_graph._pb_graph.getOps()
    assert loop.opType() == "Loop" and loop.getTripCountValue() == 4
    assert loop.getCalledGraph() == g._pb_graph


def test_matmul_argument_records_the_proportion_and_the_transform_overrides_it():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.eye(2, dtype=np.float32))
        y = ops.matmul(a, a, available_memory_proportion=0.6)
        z = ops.matmul(a, a)
        out = addons.host_store(y + z)
    assert y._producer.hints == {AMP_HINT: 0.6} and z._producer.hints == {}
    addons.set_available_memory_proportion_by_ipu(ir, [0.2])
    assert y._producer.hints == {AMP_HINT: 0.2} == z._producer.hints
    np.testing.assert_array_equal(_run(ir, out), 2 * np.eye(2))
