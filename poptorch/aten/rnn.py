"""Recurrent layers (``nn.RNN``, ``nn.LSTM``, ``nn.GRU``) as device-side loops.

The capture keeps ``aten.lstm`` / ``aten.gru`` / ``aten.rnn_tanh`` / ``aten.rnn_relu`` whole
(torch would unroll them into one cell per time step), and each becomes one op running
``jax.lax.scan`` over time, for every layer and direction: the program's size does not grow
with the sequence length, and the gradient is the scan's. The input projections of all time
steps are one matmul before the loop.

Supported: several layers, bidirectional, ``batch_first``, with or without biases, LSTM
projections (``proj_size``), and dropout between layers (in training models only, as
PopTorch). Packed sequences (``PackedSequence`` inputs) are not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from torch.ops import aten

import popxl
from popxl.ops.random_seed import key

from .registry import NodeContext, lowering

# Cells: (x projection at step t, hidden state, weights) -> new state -----------------------


def _linear(x: Any, w: Any, b: Any | None) -> Any:
    y = x @ w.T
    return y if b is None else y + b


def _lstm_cell(xp: Any, state: tuple, w_hh: Any, b_hh: Any, w_hr: Any) -> tuple:
    h, c = state
    i, f, g, o = jnp.split(xp + _linear(h, w_hh, b_hh), 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h if w_hr is None else h @ w_hr.T, c)


def _gru_cell(xp: Any, state: tuple, w_hh: Any, b_hh: Any, w_hr: Any) -> tuple:
    (h,) = state
    x_r, x_z, x_n = jnp.split(xp, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(_linear(h, w_hh, b_hh), 3, axis=-1)
    r = jax.nn.sigmoid(x_r + h_r)
    z = jax.nn.sigmoid(x_z + h_z)
    n = jnp.tanh(x_n + r * h_n)
    return ((1 - z) * n + z * h,)


def _simple_cell(act: Callable[[Any], Any]) -> Callable[..., tuple]:
    def cell(xp: Any, state: tuple, w_hh: Any, b_hh: Any, w_hr: Any) -> tuple:
        return (act(xp + _linear(state[0], w_hh, b_hh)),)

    return cell


# mode -> (cell, number of state tensors)
_CELLS: dict[str, tuple[Callable[..., tuple], int]] = {
    "lstm": (_lstm_cell, 2),
    "gru": (_gru_cell, 1),
    "rnn_tanh": (_simple_cell(jnp.tanh), 1),
    "rnn_relu": (_simple_cell(jax.nn.relu), 1),
}


def _direction(
    cell: Callable[..., tuple], seq: Any, state: tuple, weights: list, reverse: bool
) -> tuple[Any, tuple]:
    """One layer in one direction over ``seq`` (T, B, F): the outputs (T, B, H) and the
    final state."""
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    projected = _linear(seq, w_ih, b_ih)  # every time step at once

    def step(carry: tuple, xp: Any) -> tuple[tuple, Any]:
        new = cell(xp, carry, w_hh, b_hh, w_hr)
        return new, new[0]

    final, outs = jax.lax.scan(step, state, projected, reverse=reverse)
    return outs, final


def _split_weights(params: list, biases: bool, proj: bool) -> list:
    """Per (layer, direction): [w_ih, w_hh, b_ih, b_hh, w_hr], None where absent (torch's
    flat weight order: w_ih, w_hh, then the biases, then the projection)."""
    per = 2 + 2 * biases + proj
    groups = []
    for k in range(0, len(params), per):
        g = list(params[k : k + per])
        b_ih, b_hh = (g[2], g[3]) if biases else (None, None)
        groups.append([g[0], g[1], b_ih, b_hh, g[-1] if proj else None])
    return groups


def _recurrent(mode: str) -> Callable[..., tuple]:
    cell, n_state = _CELLS[mode]

    def fn(
        x: Any,
        *rest: Any,
        layers: int,
        directions: int,
        batch_first: bool,
        biases: bool,
        proj: bool,
        dropout: float,
    ) -> tuple:
        dtype = x.dtype
        wide = jnp.float32 if dtype == jnp.float16 else dtype
        arrays = [r if r.dtype == jnp.uint32 else r.astype(wide) for r in rest]
        hx, params = arrays[:n_state], arrays[n_state:]
        seed = params.pop() if dropout else None
        weights = _split_weights(params, biases, proj)
        seq = jnp.swapaxes(x, 0, 1) if batch_first else x
        seq = seq.astype(wide)
        finals: list[list[Any]] = [[] for _ in range(n_state)]
        for layer in range(layers):
            outs = []
            for d in range(directions):
                k = layer * directions + d
                state = tuple(h[k] for h in hx)
                out, final = _direction(cell, seq, state, weights[k], reverse=d == 1)
                outs.append(out)
                for s, f in zip(finals, final):
                    s.append(f)
            seq = jnp.concatenate(outs, axis=-1) if directions > 1 else outs[0]
            if seed is not None and layer < layers - 1:
                keep = jax.random.bernoulli(
                    jax.random.fold_in(key(seed), layer), 1 - dropout, seq.shape
                )
                seq = jnp.where(keep, seq / (1 - dropout), 0)
        out = jnp.swapaxes(seq, 0, 1) if batch_first else seq
        return (out.astype(dtype), *(jnp.stack(s).astype(dtype) for s in finals))

    fn.__doc__ = f"aten.{mode}: a multi-layer recurrent net, one lax.scan per layer and direction."
    return fn


_FNS = {mode: _recurrent(mode) for mode in _CELLS}


def _lower(mode: str) -> Callable[..., Any]:
    n_state = _CELLS[mode][1]

    def lower(
        ctx: NodeContext,
        x: popxl.Tensor,
        hx: Any,
        params: list,
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> Any:
        if not isinstance(x, popxl.Tensor):
            raise NotImplementedError(f"aten.{mode} with packed sequences is not supported.")
        hx = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        directions = 2 if bidirectional else 1
        per = len(params) // (num_layers * directions)
        proj = per == 2 + 2 * bool(has_biases) + 1
        inputs = [x, *hx[:n_state], *params]
        active = bool(train) and ctx.training and float(dropout) > 0 and num_layers > 1
        if active:
            inputs.append(ctx.seed())
        return ctx.jax(
            mode,
            _FNS[mode],
            *inputs,
            nondiff=(len(inputs) - 1,) if active else (),
            layers=int(num_layers),
            directions=directions,
            batch_first=bool(batch_first),
            biases=bool(has_biases),
            proj=proj,
            dropout=float(dropout) if active else 0.0,
        )

    return lower


lowering(aten.lstm.input, preserve=True)(_lower("lstm"))
lowering(aten.gru.input, preserve=True)(_lower("gru"))
lowering(aten.rnn_tanh.input, preserve=True)(_lower("rnn_tanh"))
lowering(aten.rnn_relu.input, preserve=True)(_lower("rnn_relu"))
