"""State kept between steps in the layout the step's kernels read and write, not torch's.

On XLA:CPU a convolution's weight is read channels-last (``*IO``, ``runtime/conv_forms``)
while the program names it ``(O, I, *kernel)``. Kept in the program's layout, every training
step transposed each weight on the way in, once more for the input gradient, and the
update came back from the weight gradient's layout in two passes (the update, then a
copy into the donated buffer): four passes over every weight. ResNet-18's SGD step at
224x224, batch 1, spent 110 of its 170 ms there (``bench/kernel_profile.py``, 2026-11-29),
which put it at 0.75x eager torch's step.

``choose`` finds, for a step traced in the program's layout, the state arguments worth
storing transposed, and how:

* an entry the step transposes (a convolution's weight, read by the forward's kernel; a
  gradient accumulator carried by a loop in the weight gradient's layout) is kept as
  that transpose makes it, so the step reads it as it is;
* else, an entry the step writes whose new value is left pending a transpose when the
  step's transposes are sunk (``runtime.transpose_sinking``; an SGD momentum, made in the
  weight gradient's layout) is kept as that transpose's operand, so the update needs none.

``sink_laid_out`` is then ``transpose_sinking.sink_transposes`` for those arguments in
their stored layout: each enters pending the transpose back to the program's layout, each
written one leaves transposed to its stored layout, and the sinking cancels these against
the kernels' own; an elementwise op whose operands pend different transposes, one of them
a stored entry's, is made in that entry's layout (``w - lr * v``: one strided read of
``v``, no copy). The program keeps a layout per state entry
(``runtime.session.program``); the session transposes at the host boundary (packing,
unpacking and writing state).

ResNet-18 at 224x224, batch 1, 2 cores, ms per SGD step: 171 -> 152 (eager torch 115-128);
inference 32.9 -> 30.3 with its first call 4.2 -> 3.2 s (the weights' layout no longer
hoisted into a program of its own). At the zoo bench's batch 8, 64x64 (one run each,
2026-11-29): training steps ResNet-18 70.5 -> 63.9, MobileNetV2 71.4 -> 59.9,
EfficientNet-B0 85.3 -> 81.5; inference unchanged.

Imported lazily by the runtime's program builder: this module imports JAX.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax

from . import transpose_sinking as ts

Layout = tuple[int, ...]  # stored = lax.transpose(logical, layout)


def choose(closed: Any, updated: Mapping[int, int], read_only: Sequence[int]) -> dict[int, Layout]:
    """Per flat argument of ``closed`` (a step in the program's layout) worth storing
    transposed, its layout. ``updated``: flat output index -> the flat argument it is the
    new value of; ``read_only``: flat arguments the step only reads."""
    chosen: dict[int, Layout] = {}
    candidates = set(updated.values()) | set(read_only)

    def probe(*args: Any) -> list[Any]:
        sinker = _FirstTransposes({id(args[i]): i for i in candidates})
        outs = sinker.evaluate(closed.jaxpr, closed.consts, list(args))
        chosen.update(sinker.first)  # the layout the step reads it in
        for j, i in updated.items():  # else the layout its update is made in
            if isinstance(outs[j], ts.Pending) and i not in chosen:
                chosen[i] = ts.inverse(outs[j].perm)
        return [sinker.value(o) for o in outs]

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals]
    jax.make_jaxpr(probe)(*specs)
    return {i: p for i, p in chosen.items() if i in candidates and not ts.is_identity(p)}


class _FirstTransposes(ts.Sinker):
    """A sinking evaluation that notes the first transpose of each watched argument."""

    def __init__(
        self,
        watched: dict[int, int],
        first: dict[int, Layout] | None = None,
        stored: Sequence[Any] = (),
    ) -> None:
        super().__init__(stored)
        self._watched = watched
        self.first: dict[int, Layout] = {} if first is None else first

    def child(self, inner: Sequence[tuple[Any, Any]], stored: Sequence[Any]) -> ts.Sinker:
        """A loop body's evaluation, watching the body's arguments that watched values
        become (a weight read inside a gradient-accumulation loop)."""
        watched = {
            id(arg): self._watched[id(outer)] for outer, arg in inner if id(outer) in self._watched
        }
        return _FirstTransposes(watched, self.first, stored)

    def note_transpose(self, x: Any, perm: tuple[int, ...]) -> None:
        i = self._watched.get(id(x))
        if i is not None:
            self.first.setdefault(i, perm)


def logical_specs(args: tuple, layouts: Mapping[int, Layout]) -> tuple:
    """The abstract arguments in the program's layout of stored-layout ``args``."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    specs = []
    for i, a in enumerate(leaves):
        shape = tuple(a.shape)
        if i in layouts:
            back = ts.inverse(layouts[i])
            shape = tuple(shape[p] for p in back)
        specs.append(jax.ShapeDtypeStruct(shape, a.dtype))
    return jax.tree_util.tree_unflatten(tree, specs)


def sink_laid_out(
    fn: Any, traced: dict, arg_layouts: Mapping[int, Layout], out_layouts: Mapping[int, Layout]
) -> Any:
    """``fn`` (written for the program's layout) taking its flat arguments ``arg_layouts``
    stored transposed and giving its flat outputs ``out_layouts`` so, transposes sunk."""

    def sunk(*args: Any) -> Any:
        logical = logical_specs(args, arg_layouts)
        found = traced.pop(ts.abstract_key(logical), None)
        closed, out_shape = found or jax.make_jaxpr(fn, return_shape=True)(*logical)
        flat = jax.tree_util.tree_leaves(args)
        ins = [
            ts.Pending(a, ts.inverse(arg_layouts[i])) if i in arg_layouts else a
            for i, a in enumerate(flat)
        ]
        sinker = ts.Sinker([flat[i] for i in arg_layouts])
        outs = sinker.evaluate(closed.jaxpr, closed.consts, ins)
        for j, layout in out_layouts.items():
            outs[j] = ts.transpose_of(outs[j], layout)
        values = [sinker.value(o) for o in outs]
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), values)

    return sunk
