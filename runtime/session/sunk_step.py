"""The jitted step of a program with convolutions on XLA:CPU (``runtime.session.program``
makes it): transposes sunk, state kept in its kernels' layouts, weights updated in place.

Imported by the program builder; imports JAX.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from ..backend import stored_layouts, transpose_sinking, xla_options
from ..lowering import hoisting


class SunkStep:
    """The jitted step of a program with convolutions on the CPU: its transposes sunk
    (``runtime.transpose_sinking``), the state entries worth it kept in the layout its
    kernels use (``runtime.backend.stored_layouts``; ``choose_layouts`` picks them, before
    the session lays out any state) and, where the traced step neither loops nor branches,
    its weights updated in place (``xla_options.in_place_options``). The step is traced
    once, in the program's layout, and that trace serves the choices and the sinking.

    ``candidates``: per state entry (written entries first in the step's arguments, then
    the scratch buffers, then the read-only entries), whether it may be stored transposed.
    """

    def __init__(
        self, fn: Any, written: tuple[bool, ...], candidates: tuple[bool, ...], n_stash: int
    ) -> None:
        self._fn = fn
        self._traced: dict = {}
        self._jit: Any = None
        self._written = written
        self._candidates = candidates
        self._n_stash = n_stash
        self.layouts: tuple[tuple[int, ...] | None, ...] | None = None
        self._arg_layouts: dict[int, tuple[int, ...]] = {}
        self._out_layouts: dict[int, tuple[int, ...]] = {}

    def choose_layouts(self, args: tuple) -> tuple[tuple[int, ...] | None, ...]:
        """Per state entry, the layout the state keeps it in (None: the program's), for the
        step's arguments ``args`` (abstract, in the program's layout)."""
        if self.layouts is None:
            closed = self._trace(args)
            mutable = [i for i, w in enumerate(self._written) if w]
            const = [i for i, w in enumerate(self._written) if not w]
            position = {i: k for k, i in enumerate(mutable)}
            position.update({i: len(mutable) + self._n_stash + k for k, i in enumerate(const)})
            wanted = [i for i, c in enumerate(self._candidates) if c]
            updated = {position[i]: position[i] for i in wanted if self._written[i]}
            read_only = [position[i] for i in wanted if not self._written[i]]
            chosen = stored_layouts.choose(closed, updated, read_only)
            self._arg_layouts = chosen
            self._out_layouts = {k: p for k, p in chosen.items() if k in updated}
            self.layouts = tuple(chosen.get(position[i]) for i in range(len(self._written)))
        return self.layouts

    def _trace(self, logical: tuple) -> Any:
        found = self._traced.get(transpose_sinking.abstract_key(logical))
        if found is not None:
            return found[0]
        return transpose_sinking.trace(self._fn, logical, self._traced)

    def _jitted(self, args: tuple) -> Any:
        if self._jit is None:
            logical = stored_layouts.logical_specs(args, self._arg_layouts)
            closed = self._trace(logical)
            jit = functools.partial(
                xla_options.jit, in_place=not transpose_sinking.has_loops(closed.jaxpr)
            )
            if self._arg_layouts:
                sunk = stored_layouts.sink_laid_out(
                    self._fn, self._traced, self._arg_layouts, self._out_layouts
                )
            else:
                sunk = transpose_sinking.sink_transposes(self._fn, self._traced)
            hoist = hoisting.worth_hoisting(closed, args, 1)
            if hoist:
                closed, out_shape = jax.make_jaxpr(sunk, return_shape=True)(*args)
                # what the stored layouts left to do on read-only state
                hoist = hoisting.worth_hoisting(closed, args, 1)
            if not hoist:
                self._jit = jit(sunk, donate_argnums=(0,))
            else:  # the work on read-only state (weights' layouts) kept between runs
                self._jit = hoisting.Hoisted(
                    closed, jax.tree_util.tree_structure(out_shape), args, 1, jit
                )
        return self._jit

    def __call__(self, *args: Any) -> Any:
        return self._jitted(args)(*args)

    def lower(self, *args: Any) -> Any:
        return self._jitted(args).lower(*args)

    def compiled(self, executable: Any) -> Any:
        """The callable that runs ``executable`` (compiled from ``lower``) as this step is
        called."""

        def run(*args: Any) -> Any:
            if getattr(executable, "in_tree", None) == jax.tree_util.tree_structure((args, {})):
                return executable(*args)  # the step's own arguments: nothing was hoisted
            jitted = self._jitted(args)  # traced here when the executable was loaded
            if isinstance(jitted, hoisting.Hoisted):
                return jitted.call_compiled(executable, *args)
            return executable(*args)

        return run

    def trace(self, *args: Any) -> Any:
        return self._jitted(args).trace(*args)
