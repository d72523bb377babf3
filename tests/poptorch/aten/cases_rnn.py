"""Cases for ``poptorch/aten/rnn.py``: the layers' outputs and final states, and the
gradients with respect to the input and initial states."""

from __future__ import annotations

import warnings

import torch
from torch.ops import aten

from .harness import Case

# The layers' weights are float32: each case's float16 variant is a separate case on a
# float16 copy of a layer (half=False everywhere, the harness casts only the inputs).


def _layer(cls: type, *args, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(*args, **kw).eval()


def _randn(*shapes: tuple) -> tuple:
    return lambda: tuple(torch.randn(*s) for s in shapes)


def _quiet(fn: object) -> object:
    """``fn`` without torch's warnings (e.g. oneDNN has no LSTM with projections)."""

    def run(*xs: torch.Tensor) -> object:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return fn(*xs)

    return run


def _case(name: str, fn: object, inputs: object, op: object, **kw) -> Case:
    kw.setdefault("atol", 1e-4)
    return Case(name, _quiet(fn), inputs, [op], half=False, **kw)


_LSTM = _layer(torch.nn.LSTM, 3, 4)
_LSTM_DEEP = _layer(torch.nn.LSTM, 3, 4, num_layers=2, bidirectional=True, batch_first=True)
_LSTM_PROJ = _layer(torch.nn.LSTM, 3, 5, proj_size=2, bias=False)
_GRU = _layer(torch.nn.GRU, 3, 4, batch_first=True)
_GRU_DEEP = _layer(torch.nn.GRU, 3, 4, num_layers=3, bidirectional=True, bias=False)
_RNN = _layer(torch.nn.RNN, 3, 4, num_layers=2)
_GRU_HALF = _layer(torch.nn.GRU, 3, 4).half()
_LSTM_HALF = _layer(torch.nn.LSTM, 3, 4, num_layers=2, batch_first=True).half()
_RNN_RELU = _layer(torch.nn.RNN, 3, 4, nonlinearity="relu", bidirectional=True, batch_first=True)

def _weights_as_inputs(layer: torch.nn.Module) -> tuple:
    """(fn, inputs): ``layer`` called with its weights passed in as inputs, so the harness
    checks their gradients too."""
    names = [n for n, _ in layer.named_parameters()]

    def fn(x: torch.Tensor, *weights: torch.Tensor) -> object:
        return torch.func.functional_call(layer, dict(zip(names, weights)), (x,))

    def inputs() -> tuple:
        return (torch.randn(4, 2, 3), *(p.detach().clone() for p in layer.parameters()))

    return fn, inputs


_LSTM_W = _weights_as_inputs(_layer(torch.nn.LSTM, 3, 4, num_layers=2, bidirectional=True))
_GRU_W = _weights_as_inputs(_layer(torch.nn.GRU, 3, 4, num_layers=2))

CASES = [
    _case("lstm", lambda x, h, c: _LSTM(x, (h, c)), _randn((5, 2, 3), (1, 2, 4), (1, 2, 4)), aten.lstm.input),
    _case("lstm_zero_state", lambda x: _LSTM(x), _randn((6, 3)), aten.lstm.input),
    _case("lstm_deep_bidirectional", lambda x: _LSTM_DEEP(x), _randn((2, 5, 3)), aten.lstm.input),
    _case("lstm_proj_no_bias", lambda x, h, c: _LSTM_PROJ(x, (h, c)), _randn((4, 2, 3), (1, 2, 2), (1, 2, 5)), aten.lstm.input),
    _case("gru", lambda x, h: _GRU(x, h), _randn((2, 5, 3), (1, 2, 4)), aten.gru.input),
    _case("gru_deep_bidirectional", lambda x: _GRU_DEEP(x), _randn((5, 2, 3)), aten.gru.input),
    _case("rnn_tanh", lambda x, h: _RNN(x, h), _randn((5, 2, 3), (2, 2, 4)), aten.rnn_tanh.input),
    _case("rnn_relu", lambda x: _RNN_RELU(x), _randn((2, 5, 3)), aten.rnn_relu.input),
    _case("lstm_weight_grads", *_LSTM_W, aten.lstm.input),
    _case("gru_weight_grads", *_GRU_W, aten.gru.input),
    _case("gru_half", lambda x: [t.float() for t in _GRU_HALF(x.half())], _randn((5, 2, 3)), aten.gru.input, atol=1e-2, rtol=1e-2, grad=False),
    _case("lstm_half", lambda x: _LSTM_HALF(x.half())[0].float(), _randn((2, 5, 3)), aten.lstm.input, atol=1e-2, rtol=1e-2, grad=False),
]
