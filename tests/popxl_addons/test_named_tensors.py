"""NamedTensors: tensor ordering by name, remapping and printing (reference 1.2)."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.named_tensors import NamedTensorData, NamedTensors, print_named_tensors

F32 = popxl.float32


def _store(t):
    stream = popxl.d2h_stream(t.shape, t.dtype)
    ops.host_store(stream, t)
    return stream


def test_tensors_are_sorted_by_tensor_name_not_by_key():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros(1, np.float32), name="zzz")
        b = popxl.variable(np.zeros(2, np.float32), name="aaa")
        c = popxl.variable(np.zeros(3, np.float32), name="mmm")
    nt = NamedTensors.from_dict({"first": a, "second.x": b, "third": c})
    assert nt.tensors == (b, c, a)
    assert list(nt.named_tensors.items()) == [("first", a), ("second.x", b), ("third", c)]
    assert type(nt.named_tensors) is dict


def test_module_args_tensors_order_follows_scoped_names():
    class Inner(addons.Module):
        def build(self, x):
            return x * self.add_variable_input("w", lambda: np.ones(2, np.float32))

    class Outer(addons.Module):
        def __init__(self):
            super().__init__()
            self.zeta = Inner()
            self.alpha = Inner()

        def build(self, x):
            b = self.add_variable_input("b", lambda: np.ones(2, np.float32))
            return self.alpha(self.zeta(x)) + b

    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = Outer().create_graph(popxl.TensorSpec((2,), F32))
    args = graph.args
    assert args.keys_flat() == ["zeta.w", "alpha.w", "b"]
    assert [t.name for t in args.tensors] == ["alpha/w", "b", "zeta/w"]


def test_remap_replaces_every_leaf_recursively_and_keeps_keys():
    ir = popxl.Ir()
    with ir.main_graph:
        olds = [popxl.variable(np.full(2, i, np.float32), name=f"old{i}") for i in range(3)]
        news = [popxl.variable(np.full(2, 10 + i, np.float32), name=f"new{i}") for i in range(3)]
    nt = NamedTensors.from_dict({"a.b": olds[0], "a.c": olds[1], "d": olds[2]})
    remapped = nt.remap(dict(zip(olds, news)))
    assert type(remapped) is NamedTensors and type(remapped.a) is NamedTensors
    assert list(remapped.to_dict().items()) == [("a.b", news[0]), ("a.c", news[1]), ("d", news[2])]
    assert nt.to_dict()["a.b"] is olds[0]


def test_remap_with_a_missing_tensor_raises_key_error():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros(1, np.float32), name="a")
        b = popxl.variable(np.zeros(1, np.float32), name="b")
    with pytest.raises(KeyError):
        NamedTensors(a=a, b=b).remap({a: b})


def test_print_named_tensors_prints_each_tensor_titled_by_key_at_run_time(capfd):
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.array([1.5, 2.5], np.float32), name="w")
        b = popxl.variable(np.array([-3.0], np.float32), name="b")
        printed = print_named_tensors(NamedTensors.from_dict({"layer.w": w, "b": b}))
        streams = {k: _store(t) for k, t in printed.to_dict().items()}
    assert type(printed) is NamedTensors
    assert printed.keys_flat() == ["layer.w", "b"]
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    np.testing.assert_array_equal(out[streams["layer.w"]], [1.5, 2.5])
    np.testing.assert_array_equal(out[streams["b"]], [-3.0])
    err = capfd.readouterr().err
    assert "layer.w: [1.5 2.5]" in err
    assert "b: [-3.]" in err


def test_named_tensor_data_is_a_dot_tree_of_arrays():
    data = NamedTensorData.from_dict({"fc.w": np.ones(2), "fc.b": np.zeros(1)})
    assert type(data.fc) is NamedTensorData
    np.testing.assert_array_equal(data.fc.w, np.ones(2))
    assert data.map(lambda a: a.sum()).to_dict() == {"fc.w": 2.0, "fc.b": 0.0}
