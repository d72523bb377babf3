"""Module: naming and ordering (reference 6.1/6.2), outlining, call_module, custom gradients (1.4)."""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.named_tensors import NamedTensors
from popxl_addons.variable_factory import NamedVariableFactories, VariableFactory

F32 = popxl.float32


class Linear(addons.Module):
    def __init__(self, out_features, bias=True, seed=0):
        super().__init__()
        self.out_features = out_features
        self.bias = bias
        self.rng = np.random.default_rng(seed)

    def build(self, x):
        w = self.add_variable_input(
            "weight",
            lambda: self.rng.normal(0, 1, (x.shape[-1], self.out_features)).astype(np.float32),
        )
        y = x @ w
        if self.bias:
            y = y + self.add_variable_input(
                "bias", lambda: np.full(self.out_features, 0.5, np.float32)
            )
        return y


class TwoLayers(addons.Module):
    """Assigns fc_b first but calls fc_a first: keys follow assignment order."""

    def __init__(self):
        super().__init__()
        self.fc_b = Linear(3, seed=1)
        self.fc_a = Linear(4, seed=2)

    def build(self, x):
        scale = self.add_variable_input("scale", lambda: np.full((), 2.0, np.float32))
        return self.fc_b(self.fc_a(x)) * scale


def _stores(*tensors):
    streams = []
    for t in tensors:
        s = popxl.d2h_stream(t.shape, t.dtype)
        ops.host_store(s, t)
        streams.append(s)
    return streams


def _run(ir, streams, variables=()):
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
        data = session.get_tensors_data(list(variables)) if variables else {}
    return [out[s] for s in streams], data


# Naming and ordering -----------------------------------------------------------------------


def test_factory_keys_follow_attribute_assignment_then_build_order():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = TwoLayers().create_graph(popxl.TensorSpec((2, 5), F32))
    order = ["fc_b.weight", "fc_b.bias", "fc_a.weight", "fc_a.bias", "scale"]
    assert facts.keys_flat() == order
    assert graph.args.keys_flat() == order


def test_graph_inputs_are_tensor_params_then_variables_in_execution_order():
    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = TwoLayers().create_graph(popxl.TensorSpec((2, 5), F32))
    names = [t.name for t in graph.graph.inputs]
    assert names == ["x", "scale", "fc_a/weight", "fc_a/bias", "fc_b/weight", "fc_b/bias"]
    assert graph.graph.id == "TwoLayers_subgraph(0)"


def test_inlined_module_numbers_match_numpy():
    ir = popxl.Ir()
    x_data = np.random.default_rng(5).normal(size=(2, 5)).astype(np.float32)
    with ir.main_graph:
        facts, graph = TwoLayers().create_graph(popxl.TensorSpec((2, 5), F32))
        variables = facts.init()
        x = popxl.variable(x_data, name="x")
        (y,) = graph.bind(variables).call(x)
        streams = _stores(y)
    (out,), data = _run(ir, streams, variables.tensors)
    v = {k: data[t] for k, t in variables.to_dict().items()}
    h = x_data @ v["fc_a.weight"] + v["fc_a.bias"]
    expected = (h @ v["fc_b.weight"] + v["fc_b.bias"]) * v["scale"]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_nested_name_scopes_join_attribute_names():
    class Attention(addons.Module):
        def __init__(self):
            super().__init__()
            self.qkv = Linear(2, bias=False)

        def build(self, x):
            return self.qkv(x)

    class Block(addons.Module):
        def __init__(self):
            super().__init__()
            self.heads = Attention()

        def build(self, x):
            return self.heads(x)

    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Block().create_graph(popxl.TensorSpec((1, 2), F32))
    assert facts.keys_flat() == ["heads.qkv.weight"]
    assert [t.name for t in graph.graph.inputs] == ["x", "heads/qkv/weight"]
    assert graph.args.heads.qkv.weight is graph.graph.inputs[1]


def test_dotted_variable_names_need_overwrite_to_merge_and_duplicates_raise():
    class Merging(addons.Module):
        def build(self, x):
            a = self.add_variable_input("fwd.scale", lambda: np.full((), 3.0, np.float32))
            b = self.add_variable_input(
                "fwd.offset", lambda: np.full((), 1.0, np.float32), overwrite=True
            )
            return x * a + b

    class Duplicate(addons.Module):
        def build(self, x):
            self.add_variable_input("w", lambda: np.zeros((), np.float32))
            self.add_variable_input("w", lambda: np.zeros((), np.float32))
            return x

    class DottedWithoutOverwrite(addons.Module):
        def build(self, x):
            self.add_variable_input("fwd.scale", lambda: np.zeros((), np.float32))
            self.add_variable_input("fwd.offset", lambda: np.zeros((), np.float32))
            return x

    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Merging().create_graph(popxl.TensorSpec((2,), F32))
        assert facts.keys_flat() == ["fwd.scale", "fwd.offset"]
        assert [t.name for t in graph.graph.inputs] == ["x", "fwd.scale", "fwd.offset"]
        with pytest.raises(ValueError, match="'w' already exists"):
            Duplicate().create_graph(popxl.TensorSpec((2,), F32))
        with pytest.raises(ValueError, match="'fwd' already exists"):
            DottedWithoutOverwrite().create_graph(popxl.TensorSpec((2,), F32))
        variables = facts.init()
        x = popxl.variable(np.array([1.0, 2.0], np.float32))
        streams = _stores(*graph.bind(variables).call(x))
    (out,), _ = _run(ir, streams)
    np.testing.assert_allclose(out, [4.0, 7.0])


def test_same_instance_called_twice_inline_raises():
    class Twice(addons.Module):
        def __init__(self):
            super().__init__()
            self.fc = Linear(2)

        def build(self, x):
            return self.fc(self.fc(x))

    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="'weight' already exists"):
            Twice().create_graph(popxl.TensorSpec((1, 2), F32))


def test_same_instance_assigned_to_two_attributes_shares_one_subtree():
    class Shared(addons.Module):
        def __init__(self):
            super().__init__()
            fc = Linear(2)
            self.first = fc
            self.second = fc

        def build(self, x):
            return self.first(x)

    ir = popxl.Ir()
    with ir.main_graph:
        facts, _ = Shared().create_graph(popxl.TensorSpec((1, 2), F32))
    assert facts.keys_flat() == ["first.weight", "first.bias", "second.weight", "second.bias"]
    assert facts.first.weight is facts.second.weight


def test_assigning_a_module_to_the_same_attribute_twice_raises():
    class Reassign(addons.Module):
        def __init__(self):
            super().__init__()
            self.fc = Linear(2)
            self.fc = Linear(2)

    with pytest.raises(ValueError, match="'fc' already exists"):
        Reassign()


def test_assigning_a_submodule_before_super_init_explains_the_fix():
    class Early(addons.Module):
        def __init__(self):
            self.fc = Linear(2)
            super().__init__()

    with pytest.raises(AttributeError, match=r"call(ed)? super\(\).__init__\(\)"):
        Early()


def test_same_class_twice_gives_independent_subtrees_and_inline_code():
    class Pair(addons.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = Linear(2, seed=1)
            self.fc2 = Linear(2, seed=2)

        def build(self, x):
            return self.fc2(self.fc1(x))

    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Pair().create_graph(popxl.TensorSpec((1, 2), F32))
    assert facts.fc1.weight is not facts.fc2.weight
    assert [t.name for t in graph.graph.inputs[1:]] == [
        "fc1/weight",
        "fc1/bias",
        "fc2/weight",
        "fc2/bias",
    ]
    assert [op.type for op in graph.graph.ops] == ["MatMul", "Add", "MatMul", "Add"]


def test_from_list_names_tensors_without_the_container_scope():
    class Stack(addons.Module):
        def __init__(self):
            super().__init__()
            self.layers = addons.Module.from_list([Linear(2, seed=i) for i in range(3)])

        def build(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    ir = popxl.Ir()
    x_data = np.array([[1.0, -1.0]], np.float32)
    with ir.main_graph:
        stack = Stack()
        assert stack.layers[0] is stack.layers.get("0") is stack.layers._sub_modules[0]
        facts, graph = stack.create_graph(popxl.TensorSpec((1, 2), F32))
        assert facts.keys_flat() == [
            f"layers.{i}.{n}" for i in range(3) for n in ("weight", "bias")
        ]
        assert [t.name for t in graph.graph.inputs[1:3]] == ["0/weight", "0/bias"]
        variables = facts.init()
        streams = _stores(*graph.bind(variables).call(popxl.variable(x_data)))
    (out,), data = _run(ir, streams, variables.tensors)
    expected = x_data
    for i in range(3):
        expected = expected @ data[variables.layers[i].weight] + data[variables.layers[i].bias]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_iterating_a_module_that_is_not_a_container_raises():
    with pytest.raises(AttributeError, match="from_list"):
        iter(Linear(2))


def test_from_variable_factories_registers_numbered_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        factories = [
            VariableFactory(lambda i=i: np.full(2, float(i), np.float32), name=f"v{i}")
            for i in range(2)
        ]

        class Multi(addons.Module):
            def build(self, x):
                self.weights = addons.Module.from_variable_factories(factories)
                return x + self.weights[0] + self.weights[1]

        facts, graph = Multi().create_graph(popxl.TensorSpec((2,), F32))
        assert facts.keys_flat() == ["weights.0", "weights.1"]
        variables = facts.init()
        streams = _stores(*graph.bind(variables).call(popxl.variable(np.ones(2, np.float32))))
    (out,), _ = _run(ir, streams)
    np.testing.assert_allclose(out, [2.0, 2.0])  # 1 + 0 + 1


def test_create_graph_twice_gives_new_graphs_and_fresh_factories():
    ir = popxl.Ir()
    linear = Linear(3)
    with ir.main_graph:
        facts0, g0 = linear.create_graph(popxl.TensorSpec((2, 4), F32))
        facts1, g1 = linear.create_graph(popxl.TensorSpec((2, 4), F32))
    assert g0.graph.id == "Linear_subgraph(0)" and g1.graph.id == "Linear_subgraph(1)"
    assert facts0.weight is not facts1.weight
    assert g0.args.weight is not g1.args.weight
    assert facts1.keys_flat() == ["weight", "bias"]
    assert linear._variable_factories.to_dict() == {} and linear._named_inputs.to_dict() == {}


def test_create_graph_twice_on_a_parent_keeps_its_submodules():
    ir = popxl.Ir()
    two = TwoLayers()
    with ir.main_graph:
        a, ga = two.create_graph(popxl.TensorSpec((2, 5), F32))
        b, gb = two.create_graph(popxl.TensorSpec((2, 5), F32))
    assert a.keys_flat() == b.keys_flat()
    assert ga.graph is not gb.graph


def test_a_submodule_assigned_in_build_fails_on_the_second_create_graph():
    class LateChild(addons.Module):
        def build(self, x):
            self.fc = Linear(2)
            return self.fc(x)

    late = LateChild()
    with popxl.Ir().main_graph:
        late.create_graph(popxl.TensorSpec((1, 2), F32))
        with pytest.raises(ValueError, match="'fc' already exists"):
            late.create_graph(popxl.TensorSpec((1, 2), F32))


def test_a_failed_build_leaves_the_module_ready_to_build_again():
    linear = Linear(2)
    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="incompatible types"):
            linear.create_graph(popxl.TensorSpec((2,), popxl.int32))  # matmul of int with float
        facts, _ = linear.create_graph(popxl.TensorSpec((1, 3), F32))
    assert facts.keys_flat() == ["weight", "bias"]


def test_non_tensor_arguments_are_baked_into_the_graph():
    class Scaled(addons.Module):
        def build(self, x, factor: float, dtype=popxl.float32):
            return ops.cast(x * factor, dtype)

    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = Scaled().create_graph(popxl.TensorSpec((2,), F32), 3.0, dtype=popxl.float16)
        assert len(graph.graph.inputs) == 1
        streams = _stores(*graph.call(popxl.variable(np.array([1.0, 2.0], np.float32))))
    (out,), _ = _run(ir, streams)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, [3.0, 6.0])


# Outlining ---------------------------------------------------------------------------------


class Outlined(addons.Module):
    def build(self, x):
        facts, subgraph = Linear(2, seed=7).create_graph(x)
        first = self.add_variable_inputs("fc2", facts)
        second = self.add_variable_inputs("fc3", facts)
        (x,) = subgraph.bind(first).call(x)
        (x,) = subgraph.bind(second).call(x)
        return x


def test_add_variable_inputs_registers_a_copy_under_the_name_with_leaf_named_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Outlined().create_graph(popxl.TensorSpec((1, 2), F32))
    assert facts.keys_flat() == ["fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    assert facts.fc2.weight is facts.fc3.weight  # the copies share the factory objects
    names = [t.name for t in graph.graph.inputs]
    assert names[0] == "x"
    assert names[1:3] == ["weight", "bias"]
    assert names[3].startswith("weight__t") and names[4].startswith("bias__t")
    calls = [op for op in graph.graph.ops if op.type == "Call"]
    assert len(calls) == 2 and calls[0].called_graphs == calls[1].called_graphs


def test_outlined_calls_use_their_own_variables():
    ir = popxl.Ir()
    x_data = np.array([[1.0, 2.0]], np.float32)
    with ir.main_graph:
        facts, graph = Outlined().create_graph(popxl.TensorSpec((1, 2), F32))
        variables = facts.init()
        streams = _stores(*graph.bind(variables).call(popxl.variable(x_data)))
    (out,), data = _run(ir, streams, variables.tensors)
    w2, b2 = data[variables.fc2.weight], data[variables.fc2.bias]
    w3, b3 = data[variables.fc3.weight], data[variables.fc3.bias]
    assert not np.allclose(w2, w3)  # two draws from the shared factory
    np.testing.assert_allclose(out, (x_data @ w2 + b2) @ w3 + b3, rtol=1e-5)


def test_create_graph_twice_on_an_outlining_module_works():
    outlined = Outlined()
    with popxl.Ir().main_graph:
        first, g0 = outlined.create_graph(popxl.TensorSpec((1, 2), F32))
        second, g1 = outlined.create_graph(popxl.TensorSpec((1, 2), F32))
    assert (
        first.keys_flat()
        == second.keys_flat()
        == ["fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    )
    assert g0.graph is not g1.graph


def test_add_variable_inputs_accepts_non_negative_ints_only():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, _ = Linear(2).create_graph(popxl.TensorSpec((1, 2), F32))

        class ByIndex(addons.Module):
            def build(self, x):
                self.add_variable_inputs(0, facts)
                with pytest.raises(ValueError, match="-1"):
                    self.add_variable_inputs(-1, facts)
                return x

        numbered, _ = ByIndex().create_graph(popxl.TensorSpec((1, 2), F32))
    assert numbered.keys_flat() == ["0.weight", "0.bias"]


# call_module -------------------------------------------------------------------------------


def test_call_module_outlines_under_the_class_name_and_returns_only_forward_outputs():
    class Caller(addons.Module):
        def build(self, x):
            (y,) = self.call_module(Linear(2, seed=3))(x)
            return y

    ir = popxl.Ir()
    x_data = np.array([[1.0, -2.0]], np.float32)
    with ir.main_graph:
        facts, graph = Caller().create_graph(popxl.TensorSpec((1, 2), F32))
        assert facts.keys_flat() == ["Linear.weight", "Linear.bias"]
        assert [op.type for op in graph.graph.ops] == ["Call"]
        variables = facts.init()
        streams = _stores(*graph.bind(variables).call(popxl.variable(x_data)))
    (out,), data = _run(ir, streams, variables.tensors)
    np.testing.assert_allclose(
        out, x_data @ data[variables.Linear.weight] + data[variables.Linear.bias], rtol=1e-5
    )


def test_call_module_twice_with_the_same_class_needs_names():
    class Collide(addons.Module):
        def build(self, x):
            (x,) = self.call_module(Linear(2))(x)
            (x,) = self.call_module(Linear(2))(x)
            return x

    class Named(addons.Module):
        def build(self, x):
            (x,) = self.call_module(Linear(2), name="first")(x)
            (x,) = self.call_module(Linear(2), name="second")(x)
            return x

    with popxl.Ir().main_graph:
        with pytest.raises(ValueError, match="'Linear' already exists"):
            Collide().create_graph(popxl.TensorSpec((1, 2), F32))
        facts, graph = Named().create_graph(popxl.TensorSpec((1, 2), F32))
    assert facts.keys() == ["first", "second"]
    calls = [op for op in graph.graph.ops if op.type == "Call"]
    assert calls[0].called_graphs != calls[1].called_graphs  # a new subgraph per call


def test_call_module_passes_keyword_and_list_tensor_arguments():
    class Masked(addons.Module):
        def build(self, xs, mask=None, scale: float = 1.0):
            offset = self.add_variable_input("offset", lambda: np.full(2, 0.5, np.float32))
            return (xs[0] - xs[1]) * mask * scale + offset

    class Caller(addons.Module):
        def build(self, a, b, m):
            (y,) = self.call_module(Masked())([a, b], mask=m, scale=2.0)
            return y

    ir = popxl.Ir()
    spec = popxl.TensorSpec((2,), F32)
    with ir.main_graph:
        facts, graph = Caller().create_graph(spec, spec, spec)
        variables = facts.init()
        a, b, m = (
            popxl.variable(np.array(v, np.float32)) for v in ([5.0, 7.0], [1.0, 2.0], [1.0, 0.0])
        )
        streams = _stores(*graph.bind(variables).call(a, b, m))
    (out,), _ = _run(ir, streams)
    np.testing.assert_allclose(out, [8.5, 0.5])


def test_call_module_object_keeps_factories_graph_and_output_count():
    captured = {}

    class Caller(addons.Module):
        def build(self, x):
            cm = self.call_module(Scale(), name="s")
            (y,) = cm(x)
            captured["cm"] = cm
            return y

    with popxl.Ir().main_graph:
        Caller().create_graph(popxl.TensorSpec((3,), F32))
    cm = captured["cm"]
    assert cm.n_outputs_pre_autodiff == 1
    assert cm.var_factories.keys_flat() == ["w"]
    assert len(cm.graph.graph.outputs) == 3  # y, then the aux tensors x and w (forward inputs)


# Custom gradients --------------------------------------------------------------------------


class Scale(addons.Module):
    """y = x * w, with a hand-written gradient (optionally scaled to tell it apart)."""

    def __init__(self, grad_factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.grad_factor = grad_factor

    def build(self, x):
        w = self.add_variable_input("w", lambda: np.array([1.0, 2.0, 3.0], np.float32))
        self.aux["x"] = x
        self.aux["w"] = w
        self.aux["factor"] = self.grad_factor
        return x * w

    def build_grad(self, dy):
        factor = self.aux["factor"]
        assert self.aux["x"] is self.aux["x"]  # a second read is the same input
        self.var_grad["w"] = dy * self.aux["x"] * factor
        return dy * self.aux["w"] * factor


X = np.array([0.5, -1.0, 2.0], np.float32)
DY = np.array([1.0, 2.0, -1.0], np.float32)
W = np.array([1.0, 2.0, 3.0], np.float32)


def _custom_grad_session(module, grads_required=None, call_before_autodiff=True, direct=False):
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = module.create_graph(popxl.TensorSpec((3,), F32))
        variables = facts.init()
        x = popxl.variable(X, name="x")
        if call_before_autodiff:
            info = fwd.bind(variables).call_with_info(x)
        required = grads_required(fwd) if grads_required else None
        if direct:
            grad = module.create_grad_graph(fwd, grads_required=required)
        else:
            grad = fwd.autodiff(grads_required=required)
        if not call_before_autodiff:
            info = fwd.bind(variables).call_with_info(x)
        grads = grad.call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
        streams = _stores(info.outputs[0], *grads)
    outs, _ = _run(ir, streams)
    return fwd, grad, outs


@pytest.mark.parametrize("call_before_autodiff", [True, False])
@pytest.mark.parametrize("direct", [False, True])
def test_build_grad_gradients_match_numpy(call_before_autodiff, direct):
    scale = Scale()
    fwd, grad, (y, dx, dw) = _custom_grad_session(
        scale, call_before_autodiff=call_before_autodiff, direct=direct
    )
    np.testing.assert_allclose(y, X * W)
    np.testing.assert_allclose(dx, DY * W)
    np.testing.assert_allclose(dw, DY * X)


def test_build_grad_graph_info_connections():
    fwd, grad, _ = _custom_grad_session(Scale())
    info = grad.grad_graph_info
    Fwd, FwdGrad = (
        popxl.transforms.ExpectedConnectionType.Fwd,
        popxl.transforms.ExpectedConnectionType.FwdGrad,
    )
    y, x, w = fwd.graph.outputs[0], fwd.graph.inputs[0], fwd.args.w
    assert [(ec.fwd_tensor, ec.connection_type) for ec in info.expected_inputs] == [
        (y, FwdGrad),
        (x, Fwd),
        (w, Fwd),
    ]  # grads_provided, then aux reads in first-read order
    assert info.outputs == (x, w)
    assert [t.name for t in grad.graph.inputs] == ["dy", "x", "w"]
    # Every aux tensor becomes a forward output, as in the original (inputs pass through), so
    # the gradient graph has one input per forward output.
    assert fwd.graph.outputs == (y, x, w)
    assert len(grad.graph.inputs) == len(fwd.graph.outputs)
    assert fwd.autodiff_applied


def test_aux_outputs_reach_existing_call_sites_and_hold_the_inputs_values():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Scale().create_graph(popxl.TensorSpec((3,), F32))
        info = fwd.bind(facts.init()).call_with_info(popxl.variable(X, name="x"))
        fwd.autodiff()
        assert len(info.outputs) == 3
        streams = _stores(*info.outputs)
    (y, x_out, w_out), _ = _run(ir, streams)
    np.testing.assert_allclose(y, X * W)
    np.testing.assert_array_equal(x_out, X)
    np.testing.assert_array_equal(w_out, W)


def test_var_grad_supports_in_and_is_closed_outside_build_grad():
    seen = {}

    class Probe(Scale):
        def build_grad(self, dy):
            self.var_grad["w"] = dy * self.aux["x"]
            seen["in"] = ("w" in self.var_grad, "b" in self.var_grad)
            seen["w"] = self.var_grad["w"]
            return dy * self.aux["w"]

    module = Probe()
    fwd = _fwd_graph(module)
    with fwd.graph.ir.main_graph:
        fwd.autodiff()
        with pytest.raises(RuntimeError, match="You can only use `var_grad` within the"):
            _ = module.var_grad["w"]
    assert seen["in"] == (True, False) and isinstance(seen["w"], popxl.Tensor)


def test_create_grad_graph_info_marks_activations_as_fwd():
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((3,), F32)
        fwd = ir.create_graph(lambda a: a * a, spec)
        (y,) = fwd.outputs
        (x,) = fwd.inputs
        with fwd:
            popxl.graph_output(x)
        grad = ir.create_graph(lambda dy, a: dy * a * 2.0, spec, spec)
        dy_in, a_in = grad.inputs
        info = addons.create_grad_graph_info(
            ir, fwd, grad, {dy_in: y, a_in: x}, {grad.outputs[0]: x}, [x]
        )
        Fwd = popxl.transforms.ExpectedConnectionType.Fwd
        FwdGrad = popxl.transforms.ExpectedConnectionType.FwdGrad
        assert [(c.fwd_tensor, c.connection_type) for c in info.expected_inputs] == [
            (y, FwdGrad),
            (x, Fwd),
        ]
        assert info.outputs == (x,) and info.graph is grad and info.forward_graph is fwd
        call = ops.call_with_info(fwd, popxl.variable(X, name="x"))
        (dx,) = ops.call(grad, popxl.constant(DY), inputs_dict=info.inputs_dict(call))
        streams = _stores(dx)
    (dx_value,), _ = _run(ir, streams)
    np.testing.assert_allclose(dx_value, DY * X * 2.0)
    other = popxl.Ir()
    with pytest.raises(ValueError, match="belongs to another IR"):
        addons.create_grad_graph_info(other, fwd, grad, {}, {}, [])


def test_build_grad_with_a_variable_listed_before_the_input_maps_outputs_correctly():
    fwd, grad, (y, *grads) = _custom_grad_session(
        Scale(), grads_required=lambda g: [g.args.w, g.graph.inputs[0]]
    )
    by_fwd = dict(zip(grad.grad_graph_info.outputs, grads))
    np.testing.assert_allclose(by_fwd[fwd.args.w], DY * X)
    np.testing.assert_allclose(by_fwd[fwd.graph.inputs[0]], DY * W)


def test_aux_intermediates_become_forward_outputs_and_feed_the_gradient():
    class Square(addons.Module):
        def build(self, x):
            h = x * 3.0
            self.aux["h"] = h
            return h * h

        def build_grad(self, dy):
            return dy * 2.0 * self.aux["h"] * 3.0

    ir = popxl.Ir()
    with ir.main_graph:
        _, fwd = Square().create_graph(popxl.TensorSpec((3,), F32))
        x = popxl.variable(X)
        info = fwd.call_with_info(x)
        grad = fwd.autodiff()
        assert len(fwd.graph.outputs) == 2 and len(info.outputs) == 2
        (dx,) = grad.call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
        streams = _stores(dx)
    (out,), _ = _run(ir, streams)
    np.testing.assert_allclose(out, DY * 18.0 * X, rtol=1e-6)


def test_parent_autodiff_uses_the_custom_gradient_of_a_call_module():
    class Parent(addons.Module):
        def build(self, x):
            (y,) = self.call_module(Scale(grad_factor=10.0), name="scale")(x)
            return y + x

    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = Parent().create_graph(popxl.TensorSpec((3,), F32))
        assert len(fwd.called_graphs_grad_info) == 1
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(popxl.variable(X))
        grad = addons.autodiff(fwd)
        grads = grad.call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
        streams = _stores(*grads)
    (dx, dw), _ = _run(ir, streams)
    np.testing.assert_allclose(dx, 10.0 * DY * W + DY)  # the custom (scaled) gradient was used
    np.testing.assert_allclose(dw, 10.0 * DY * X)


def test_grad_infos_of_inlined_children_survive_a_second_create_graph():
    class Child(addons.Module):
        def build(self, x):
            (y,) = self.call_module(Scale(grad_factor=10.0), name="scale")(x)
            return y

    class Parent(addons.Module):
        def __init__(self):
            super().__init__()
            self.child = Child()

        def build(self, x):
            return self.child(x)

    parent = Parent()
    ir = popxl.Ir()
    with ir.main_graph:
        _, first = parent.create_graph(popxl.TensorSpec((3,), F32))
        facts, second = parent.create_graph(popxl.TensorSpec((3,), F32))
        assert len(first.called_graphs_grad_info) == 1
        assert len(second.called_graphs_grad_info) == 1
        assert set(first.called_graphs_grad_info).isdisjoint(second.called_graphs_grad_info)
        variables = facts.init()
        info = second.bind(variables).call_with_info(popxl.variable(X))
        grad = addons.autodiff(second)
        grads = grad.call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
        streams = _stores(*grads)
    (dx, dw), _ = _run(ir, streams)
    np.testing.assert_allclose(dx, 10.0 * DY * W)
    np.testing.assert_allclose(dw, 10.0 * DY * X)


def test_autodiff_of_a_graph_calling_a_custom_gradient_graph_without_its_info_raises():
    ir = popxl.Ir()
    with ir.main_graph:
        _, scale = Scale().create_graph(popxl.TensorSpec((3,), F32))

        def outer(x, w):
            return ops.call(scale.graph, x, inputs_dict={scale.args.w: w})

        graph = ir.create_graph(outer, popxl.TensorSpec((3,), F32), popxl.TensorSpec((3,), F32))
        with pytest.raises(ValueError, match="marked as unsafe to autodiff"):
            addons.autodiff(graph)


def test_call_module_autodiff_mode_differentiates_before_the_call_site():
    captured = {}

    class Caller(addons.Module):
        def build(self, x):
            cm = self.call_module(Linear(3, bias=False), name="fc", autodiff="autodiff")
            (y,) = cm(x)
            captured["graph"] = cm.graph
            return y

    with popxl.Ir().main_graph:
        _, fwd = Caller().create_graph(popxl.TensorSpec((2, 3), F32))
    inner = captured["graph"]
    assert inner.autodiff_applied
    assert inner.graph in fwd.called_graphs_grad_info


def test_call_module_passes_grads_required_callables():
    captured = {}

    class Caller(addons.Module):
        def build(self, x):
            cm = self.call_module(Scale(), name="s", grads_required=lambda g: [g.graph.inputs[0]])
            (y,) = cm(x)
            captured["cm"] = cm
            return y

    with popxl.Ir().main_graph:
        _, fwd = Caller().create_graph(popxl.TensorSpec((3,), F32))
    info = fwd.called_graphs_grad_info[captured["cm"].graph.graph]
    assert info.outputs == (captured["cm"].graph.graph.inputs[0],)


# Custom gradient errors ----------------------------------------------------------------------


def _fwd_graph(module):
    ir = popxl.Ir()
    with ir.main_graph:
        return module.create_graph(popxl.TensorSpec((3,), F32))[1]


def _grad_error(build_grad, match, error=ValueError, **kwargs):
    class Custom(Scale):
        pass

    Custom.build_grad = build_grad
    fwd = _fwd_graph(Custom())
    with fwd.graph.ir.main_graph, pytest.raises(error, match=match):
        fwd.autodiff(**kwargs)


def test_build_grad_missing_variable_gradient():
    _grad_error(lambda self, dy: dy, "Not all variable gradients have been specified")


def test_build_grad_too_many_outputs():
    def too_many(self, dy):
        self.var_grad["w"] = dy
        return dy, dy

    _grad_error(too_many, "Too many outputs")


def test_build_grad_too_few_outputs():
    def too_few(self, dy):
        self.var_grad["w"] = dy

    _grad_error(too_few, "Not all forward graph inputs have been specified")


def test_build_grad_output_shape_mismatch():
    def wrong_shape(self, dy):
        self.var_grad["w"] = dy
        return ops.sum(dy, keepdims=True)

    _grad_error(wrong_shape, "Shape or meta-shape of output Tensor at position 0")


def test_build_grad_arity_mismatch():
    _grad_error(lambda self, dy, extra: dy, "do not match the signature")


def test_var_grad_errors():
    def not_tensor(self, dy):
        self.var_grad["w"] = 1.0

    def unknown(self, dy):
        self.var_grad["nope"] = dy

    def bad_shape(self, dy):
        self.var_grad["w"] = ops.sum(dy, keepdims=True)

    def subtree(self, dy):
        self.var_grad["inner"] = dy

    _grad_error(not_tensor, "Not a tensor", TypeError)
    _grad_error(unknown, "Not a variable", KeyError)
    _grad_error(bad_shape, "shape", ValueError)

    class WithSubtree(Scale):
        def build(self, x):
            self.add_variable_input("inner.v", lambda: np.ones(3, np.float32))
            return super().build(x)

    WithSubtree.build_grad = subtree
    fwd = _fwd_graph(WithSubtree())
    with fwd.graph.ir.main_graph, pytest.raises(KeyError, match="Not a variable"):
        fwd.autodiff()


def test_var_grad_outside_build_grad_raises():
    class Early(addons.Module):
        def build(self, x):
            self.var_grad["w"] = x
            return x

    with (
        popxl.Ir().main_graph,
        pytest.raises(
            RuntimeError, match="You can only use `var_grad` within the `build_graph` method"
        ),
    ):
        Early().create_graph(popxl.TensorSpec((3,), F32))


def test_aux_cannot_be_read_in_build():
    class Reader(addons.Module):
        def build(self, x):
            self.aux["x"] = x
            return self.aux["x"]

    with (
        popxl.Ir().main_graph,
        pytest.raises(
            RuntimeError,
            match=r"aux\['x'\]: you can only get items within the `build_graph` method",
        ),
    ):
        Reader().create_graph(popxl.TensorSpec((3,), F32))


def test_aux_contains_and_non_tensor_values():
    seen = {}

    class Aux(Scale):
        def build_grad(self, dy):
            seen["in"] = ("x" in self.aux, "nope" in self.aux)
            seen["factor"] = self.aux["factor"]
            return super().build_grad(dy)

    fwd = _fwd_graph(Aux(grad_factor=4.0))
    with fwd.graph.ir.main_graph:
        fwd.autodiff()
    assert seen == {"in": (True, False), "factor": 4.0}


def test_grads_provided_and_required_are_validated():
    fwd = _fwd_graph(Scale())
    x = fwd.graph.inputs[0]
    y = fwd.graph.outputs[0]
    with fwd.graph.ir.main_graph:
        with pytest.raises(ValueError, match="grads_provided"):
            fwd.from_module.create_grad_graph(fwd, grads_provided=[x])
        with pytest.raises(ValueError, match="grads_required"):
            fwd.from_module.create_grad_graph(fwd, grads_required=[y])
        with pytest.raises(ValueError, match="duplicate"):
            fwd.from_module.create_grad_graph(fwd, grads_required=[x, x])


def test_build_grad_with_var_args_is_rejected():
    class VarArgs(Scale):
        def build_grad(self, *grads):
            return grads

    fwd = _fwd_graph(VarArgs())
    with fwd.graph.ir.main_graph, pytest.raises(TypeError):
        fwd.autodiff()


def test_build_grad_method_without_a_module_raises():
    fwd = _fwd_graph(Scale())
    bare = addons.GraphWithNamedArgs(fwd.graph, fwd.args)
    with fwd.graph.ir.main_graph, pytest.raises(ValueError, match="from_module"):
        bare.autodiff(method="build_grad")


# Construction options ----------------------------------------------------------------------


def test_implements_grad_graph():
    assert Scale().implements_grad_graph
    assert not Linear(2).implements_grad_graph


def test_cache_with_build_grad_is_rejected():
    with pytest.raises(
        ValueError, match="You cannot use graph caching if you have implemented `build_grad`"
    ):
        Scale(cache=True)


def test_invalid_grad_inlining_error_is_rejected():
    with pytest.raises(
        ValueError,
        match="grad_inlining_error should be one of 'error', 'warning', 'none'. Not: 'loud'",
    ):
        Linear.__mro__[1].__init__(Linear.__new__(Linear), grad_inlining_error="loud")


class InlineParent(addons.Module):
    def __init__(self, mode):
        super().__init__()
        self.scale = Scale(grad_inlining_error=mode)

    def build(self, x):
        return self.scale(x)


def test_inlining_a_module_with_build_grad_raises_by_default():
    with (
        popxl.Ir().main_graph,
        pytest.raises(Exception, match="Scale: `build_grad` has been implemented"),
    ):
        InlineParent("error").create_graph(popxl.TensorSpec((3,), F32))


def test_inlining_a_module_with_build_grad_warns_in_warning_mode():
    with (
        popxl.Ir().main_graph,
        pytest.warns(UserWarning, match="Scale: `build_grad` has been implemented"),
    ):
        InlineParent("warning").create_graph(popxl.TensorSpec((3,), F32))


def test_inlining_a_module_with_build_grad_is_silent_in_none_mode_and_uses_autodiff():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, fwd = InlineParent("none").create_graph(popxl.TensorSpec((3,), F32))
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(popxl.variable(X))
        grad = fwd.autodiff()
        grads = grad.call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
        streams = _stores(*grads)
    (dx, dw), _ = _run(ir, streams)
    np.testing.assert_allclose(dx, DY * W)
    np.testing.assert_allclose(dw, DY * X)


def test_cache_true_reuses_the_graph_and_the_first_factories():
    class Cached(addons.Module):
        def __init__(self):
            super().__init__(cache=True)

        def build(self, x, factor: float):
            return x * self.add_variable_input("w", lambda: np.ones(x.shape, np.float32)) * factor

    cached = Cached()
    ir = popxl.Ir()
    with ir.main_graph:
        f0, g0 = cached.create_graph(popxl.TensorSpec((2,), F32), 2.0)
        f1, g1 = cached.create_graph(popxl.TensorSpec((2,), F32), 2.0)
        f2, g2 = cached.create_graph(popxl.TensorSpec((3,), F32), 2.0)
        f3, g3 = cached.create_graph(popxl.TensorSpec((2,), F32), 3.0)
    assert g0.graph is g1.graph
    assert g2.graph is not g0.graph and g3.graph is not g0.graph
    assert f0.w is f1.w and f0 is not f1
    assert g0.args.w is g1.args.w
    assert f2.w.shape == (3,)


def test_cached_module_keeps_the_custom_gradients_of_its_call_modules():
    class CachedParent(addons.Module):
        def __init__(self):
            super().__init__(cache=True)

        def build(self, x):
            (y,) = self.call_module(Scale(grad_factor=10.0), name="scale")(x)
            return y

    parent = CachedParent()
    ir = popxl.Ir()
    with ir.main_graph:
        _, first = parent.create_graph(popxl.TensorSpec((3,), F32))
        facts, fwd = parent.create_graph(popxl.TensorSpec((3,), F32))
        assert fwd.graph is first.graph and len(fwd.called_graphs_grad_info) == 1
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(popxl.variable(X))
        grad = addons.autodiff(fwd)
        streams = _stores(
            *grad.call(popxl.constant(DY), args=grad.grad_graph_info.inputs_dict(info))
        )
    (dx, dw), _ = _run(ir, streams)
    np.testing.assert_allclose(dx, 10.0 * DY * W)
    np.testing.assert_allclose(dw, 10.0 * DY * X)


def test_falsy_cache_means_no_cache():
    class NoCache(Linear):
        def __init__(self):
            addons.Module.__init__(self, cache=None)
            self.out_features, self.bias, self.rng = 2, True, np.random.default_rng(0)

    m = NoCache()
    with popxl.Ir().main_graph:
        _, g0 = m.create_graph(popxl.TensorSpec((1, 2), F32))
        _, g1 = m.create_graph(popxl.TensorSpec((1, 2), F32))
    assert g0.graph is not g1.graph


def test_module_holds_no_state_after_create_graph():
    m = Scale()
    with popxl.Ir().main_graph:
        _, fwd = m.create_graph(popxl.TensorSpec((3,), F32))
        fwd.autodiff()
    assert m._variable_factories.to_dict() == {}
    assert m.aux.store == {} and m.var_grad.grads == {}


def test_module_factories_are_named_variable_factories():
    with popxl.Ir().main_graph:
        facts, graph = Linear(2).create_graph(popxl.TensorSpec((1, 2), F32))
    assert isinstance(facts, NamedVariableFactories)
    assert isinstance(graph.args, NamedTensors)
    assert graph.from_module is not None
