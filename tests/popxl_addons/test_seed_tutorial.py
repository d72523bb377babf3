"""The seed tutorial's user code runs unchanged and prints what the tutorial shows."""

import re

import numpy as np

from tutorials import mnist_data
from tutorials.mnist_data import get_mnist_data as bundled_mnist

from . import seed_code

ADDRESS = re.compile(r" at 0x[0-9a-f]+>")

LINEAR_SCHEDULE = """\
Graph : Linear_subgraph(0)
  (%1, weight=%2, bias=%3) -> (%5) {
    MatMul.100 (%1 [(2, 4) float32], %2 [(4, 32) float32]) -> (%4 [(2, 32) float32])
    Add.101 (%4 [(2, 32) float32], %3 [(32,) float32]) -> (%5 [(2, 32) float32])
  }"""

NET_SCHEDULE = """\
Graph : Net_subgraph(0)
  (%1, fc1.weight=%2, fc1.bias=%3, fc2.weight=%4, fc2.bias=%5, fc3.weight=%6, fc3.bias=%7, fc4.weight=%8, fc4.bias=%9) -> (%21) {
    Reshape.100 (%1 [(28, 28) float32]) -> (%10 [(1, 784) float32])
    MatMul.101 (%10 [(1, 784) float32], %2 [(784, 512) float32]) -> (%11 [(1, 512) float32])
    Add.102 (%11 [(1, 512) float32], %3 [(512,) float32]) -> (%12 [(1, 512) float32])
    Gelu.103 (%12 [(1, 512) float32]) -> (%13 [(1, 512) float32])
    MatMul.104 (%13 [(1, 512) float32], %4 [(512, 512) float32]) -> (%14 [(1, 512) float32])
    Add.105 (%14 [(1, 512) float32], %5 [(512,) float32]) -> (%15 [(1, 512) float32])
    Gelu.106 (%15 [(1, 512) float32]) -> (%16 [(1, 512) float32])
    MatMul.107 (%16 [(1, 512) float32], %6 [(512, 512) float32]) -> (%17 [(1, 512) float32])
    Add.108 (%17 [(1, 512) float32], %7 [(512,) float32]) -> (%18 [(1, 512) float32])
    Gelu.109 (%18 [(1, 512) float32]) -> (%19 [(1, 512) float32])
    MatMul.110 (%19 [(1, 512) float32], %8 [(512, 10) float32]) -> (%20 [(1, 10) float32])
    Add.111 (%20 [(1, 10) float32], %9 [(10,) float32]) -> (%21 [(1, 10) float32])
  }"""

OUTLINED_SCHEDULE = """\
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

COLLECTION = (
    "{'layer1.bias': Tensor[bias popxl.dtypes.float32 (32,)], 'layer1.weight': "
    "Tensor[weight popxl.dtypes.float32 (4, 32)], 'layer2.bias': Tensor[bias__t0 "
    "popxl.dtypes.float32 (32,)], 'layer2.weight': Tensor[weight__t1 popxl.dtypes.float32 (4, 32)]}"
)


def test_simple_example_prints_factories_schedule_and_variables(capsys):
    session, variables, x, (out,) = seed_code.simple_example()
    printed = ADDRESS.sub(" at ADDR>", capsys.readouterr().out)
    assert (
        "{'weight': <popxl_addons.variable_factory.VariableFactory object at ADDR>, "
        "'bias': <popxl_addons.variable_factory.VariableFactory object at ADDR>}"
    ) in printed
    assert LINEAR_SCHEDULE in printed
    assert (
        "{'bias': Tensor[bias popxl.dtypes.float32 (32,)], 'weight': Tensor[weight "
        "popxl.dtypes.float32 (4, 32)]}"
    ) in printed
    assert out.shape == (2, 32)
    weights = session.get_tensor_data(variables.weight)
    assert weights.shape == (4, 32) and 0.005 < weights.std() < 0.05


def test_bound_graphs_have_default_reprs(capsys):
    seed_code.multiple_bound_graphs()
    printed = capsys.readouterr().out
    assert printed.count("<popxl_addons.graph.BoundGraph object at 0x") == 2


def test_nested_module_keys_and_inlined_schedule(capsys):
    seed_code.nested_modules()
    printed = capsys.readouterr().out
    keys = [
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
        "fc3.weight",
        "fc3.bias",
        "fc4.weight",
        "fc4.bias",
    ]
    assert f"dict_keys({keys})" in printed
    assert NET_SCHEDULE in printed


def test_outlined_module_keys_and_schedule(capsys):
    seed_code.outlined()
    printed = capsys.readouterr().out
    keys = [
        "fc1.weight",
        "fc1.bias",
        "fc4.weight",
        "fc4.bias",
        "fc2.weight",
        "fc2.bias",
        "fc3.weight",
        "fc3.bias",
    ]
    assert f"dict_keys({keys})" in printed
    assert OUTLINED_SCHEDULE in printed


def test_dot_tree_walkthrough(capsys):
    nt, packed, names, tensors, flat = seed_code.dot_tree_example(np.zeros((2, 4), np.float32))
    printed = capsys.readouterr().out
    assert f"{COLLECTION} \n" in printed
    assert (
        "Each leaf can be accessed with dot syntax: collection.layer1\n"
        "{'bias': Tensor[bias popxl.dtypes.float32 (32,)], 'weight': Tensor[weight popxl.dtypes.float32 (4, 32)]}"
    ) in printed
    assert printed.count(COLLECTION) == 2
    assert (
        "(Tensor[bias popxl.dtypes.float32 (32,)], Tensor[bias__t0 popxl.dtypes.float32 (32,)], "
        "Tensor[weight popxl.dtypes.float32 (4, 32)], Tensor[weight__t1 popxl.dtypes.float32 (4, 32)])"
    ) in printed
    assert list(nt.to_dict()) == ["x", "b"]
    assert names == ("new_bias_name", "new_weight_name")
    assert [t.name for t in tensors] == ["bias", "weight"]
    assert list(flat) == ["layer1.bias", "layer1.weight", "layer2.bias", "layer2.weight"]


class _TorchLike:
    """Just enough of a torch tensor for the seed's data handling."""

    def __init__(self, array):
        self._array = np.asarray(array)

    def squeeze(self):
        return _TorchLike(self._array.squeeze())

    def float(self):
        return self._array.astype(np.float32)

    def int(self):
        return self._array.astype(np.int32)

    def detach(self):
        return self

    def numpy(self):
        return self._array


def _seed_style_loaders(test_batch_size, batch_size):
    train, test = bundled_mnist(test_batch_size, batch_size)

    class Loader:
        def __init__(self, batches):
            self.batches = batches

        def __len__(self):
            return len(self.batches)

        def __iter__(self):
            for data, labels in self.batches:
                yield _TorchLike(data[:, None]), _TorchLike(labels)

    return Loader(train), Loader(test)


def test_mnist_training_and_test_programs(capsys, monkeypatch):
    # The bundled digits, whatever MNIST files the machine has (as the tutorials' tests do):
    # three epochs of them take seconds, where a full MNIST found on the machine took 80 s.
    monkeypatch.delenv("MNIST_DIR", raising=False)
    monkeypatch.setattr(mnist_data, "SEARCH_DIRS", ())
    accuracy = seed_code.run_mnist(_seed_style_loaders, epochs=3)
    printed = capsys.readouterr().out
    assert "Epoch 3/3" in printed
    assert f"Accuracy on test set: {accuracy:0.2f}%" in printed
    assert accuracy > 85.0
