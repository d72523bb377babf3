"""Every entry point that takes host data converts it with ``popxl.utils.to_numpy``.

Application code hands torch parameters (which require grad), transposed views, bfloat16 and
int64 tensors straight to ``host_load``, ``write_variable(s)_data``, variable factories and
``WeightsDict``; each must give the same values as the tensor's NumPy copy.
"""

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.task_session import TaskSession
from popxl_addons.utils import WeightsDict

torch = pytest.importorskip("torch")


def _param(shape=(2, 3), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*shape, generator=gen))  # requires grad


def _numpy(t):
    return t.detach().float().numpy()


def test_to_numpy_takes_torch_tensors_of_every_kind():
    p = _param()
    np.testing.assert_array_equal(popxl.utils.to_numpy(p), _numpy(p))
    np.testing.assert_array_equal(popxl.utils.to_numpy(p.T), _numpy(p).T)
    bf16 = p.to(torch.bfloat16)
    np.testing.assert_array_equal(popxl.utils.to_numpy(bf16, popxl.float32), _numpy(bf16))
    assert popxl.utils.to_numpy(torch.arange(4)).dtype == np.int32
    assert popxl.utils.to_numpy(torch.arange(4), downcast=False).dtype == np.int64


def test_host_load_takes_a_tensor_that_requires_grad():
    p = _param()
    ir = popxl.Ir()
    with ir.main_graph:
        data, stream, x = addons.host_load(p, popxl.float16, "x")
        out = addons.host_store(x + 1)
    assert data.dtype == np.float16 and stream.shape == (2, 3)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run({stream: data})[out]
    np.testing.assert_allclose(result, _numpy(p).astype(np.float16) + 1, rtol=1e-3)


def test_write_variable_data_takes_torch_tensors():
    p, q = _param(seed=1), _param((3, 2), seed=2)
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros((2, 3), np.float32), name="w")
        v = popxl.variable(np.zeros((3, 2), np.float32), name="v")
        c = popxl.variable(np.zeros(4, np.int32), name="c")
        for t in (w, v, c):
            addons.host_store(t + 0)
    session = popxl.Session(ir, "ipu_model")
    session.write_variable_data(w, p)
    session.write_variables_data({v: q.T.T, c: torch.arange(4, dtype=torch.int32)})
    np.testing.assert_array_equal(session.get_tensor_data(w), _numpy(p))
    np.testing.assert_array_equal(session.get_tensor_data(v), _numpy(q))
    np.testing.assert_array_equal(session.get_tensor_data(c), np.arange(4))
    session.write_variable_data(w, p.T.contiguous().T)  # non-contiguous in memory order
    np.testing.assert_array_equal(session.get_tensor_data(w), _numpy(p))


def test_write_variable_data_still_refuses_the_wrong_dtype():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros((2, 3), np.float32), name="w")
        addons.host_store(w + 0)
    session = popxl.Session(ir, "ipu_model")
    with pytest.raises(TypeError, match="float64"):
        session.write_variable_data(w, _param().double())
    np.testing.assert_array_equal(session.get_tensor_data(w), np.zeros((2, 3)))


def test_remote_variable_write_takes_torch_tensors():
    p = _param(seed=3)
    ir = popxl.Ir()
    with ir.main_graph:
        buffer = popxl.remote_buffer((2, 3), popxl.float32, 1)
        w = popxl.remote_variable(np.zeros((2, 3), np.float32), buffer, 0, name="w")
        out = addons.host_store(ops.remote_load(buffer, 0) * 2)
    session = popxl.Session(ir, "ipu_model")
    session.write_variable_data(w, p)
    with session:
        result = session.run()[out]
    np.testing.assert_allclose(result, 2 * _numpy(p))


class _Scale(addons.Module):
    def __init__(self, init):
        super().__init__()
        self.init = init

    def build(self, x):
        w = self.add_variable_input("w", lambda: self.init, popxl.float32)
        return x * w


def test_variable_factory_takes_a_torch_parameter():
    p = _param((3,), seed=4)
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = _Scale(p).create_graph(popxl.TensorSpec((3,), popxl.float32))
        variables = facts.init()
        x = popxl.variable(np.ones(3, np.float32), name="x")
        (y,) = graph.bind(variables).call(x)
        out = addons.host_store(y)
    with popxl.Session(ir, "ipu_model") as session:
        result = session.run()[out]
    np.testing.assert_array_equal(result, _numpy(p))


def test_weights_dict_and_task_session_loads_take_torch_tensors():
    p = _param((2,), seed=5)
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros(2, np.float32), name="w")
        out = addons.host_store(w + 0.0)
    weights = WeightsDict({w: p})
    np.testing.assert_array_equal(weights[w], _numpy(p))
    session = TaskSession([], [out], addons.NamedTensors(w=w), 1, ir, "ipu_model")
    session.write_variables_data(weights)
    np.testing.assert_array_equal(session.get_tensor_data(w), _numpy(p))
