"""Shrink a failing program to a small one that still fails, and print it.

Steps, repeated until none applies: replace an op by constants of its output specs (the
program stays valid: later ops read the same value ids), lower repeat counts, fill a
leaf's data with one repeated value, drop outputs, then remove ops and leaves whose values
nobody reads. Shapes are not reduced: a shape flows through reshape, slice and concat
attributes and constants, so changing one needs the generator's bookkeeping.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from .build import build_programs
from .program import EFFECTFUL, Node, Program, Spec, all_blocks, count_nodes, format_program
from .runner import Outcome

Check = Callable[[Program], "Outcome | None"]


def _filler(spec: object) -> np.ndarray:
    shape, dtype = spec.shape, spec.dtype  # type: ignore[attr-defined]
    if dtype == "bool":
        return np.ones(shape, bool)
    return np.full(shape, 1 if dtype == "int32" else 0.5, dtype)


def _filled(data: np.ndarray) -> np.ndarray:
    """``data`` with every element replaced by the filler of its dtype."""
    return _filler(Spec(data.shape, str(data.dtype)))


def _used(program: Program) -> set[int]:
    used = set(program.main.outputs) | {
        leaf.vid for leaf in program.leaves if leaf.kind != "stream"
    }
    for block in all_blocks(program.main):
        used |= set(block.outputs) | set(block.inputs)
        for node in block.nodes:
            used |= set(node.args)
    return used


def _dead_code(program: Program) -> Program:
    """Remove ops nobody reads (keeping effects) and unused leaves."""
    changed = True
    while changed:
        changed = False
        used = _used(program)
        for block in all_blocks(program.main):
            keep = []
            for node in block.nodes:
                effect = node.op in EFFECTFUL and (
                    node.op not in ("call", "repeat") or node.attrs["body"].by_ref
                )
                if effect or any(v in used for v in node.outs):
                    keep.append(node)
                else:
                    changed = True
            block.nodes = keep
    used = _used(program)
    program.leaves = [leaf for leaf in program.leaves if leaf.vid in used]
    return program


def _variants(program: Program) -> list[Callable[[Program], None]]:
    """Edits to try, biggest first; each applies to a deep copy of ``program``."""
    edits: list[Callable[[Program], None]] = []
    blocks = all_blocks(program.main)
    for b, block in enumerate(blocks):
        for i, node in reversed(list(enumerate(block.nodes))):
            if node.op == "const":
                continue

            def replace(p: Program, b: int = b, i: int = i) -> None:
                blk = all_blocks(p.main)[b]
                old = blk.nodes[i]
                placed = {"ipu": old.attrs["ipu"]} if "ipu" in old.attrs else {}
                consts = [
                    Node("const", (), (v,), {"data": _filler(p.specs[v]), **placed})
                    for v in old.outs
                ]
                blk.nodes[i : i + 1] = consts

            edits.append(replace)
            if node.op == "repeat" and node.attrs["count"] > 0:

                def fewer(p: Program, b: int = b, i: int = i) -> None:
                    all_blocks(p.main)[b].nodes[i].attrs["count"] -= 1

                edits.append(fewer)
    for k, leaf in enumerate(program.leaves):
        plain = _filled(leaf.data)
        if not np.array_equal(leaf.data, plain):

            def simpler(p: Program, k: int = k) -> None:
                p.leaves[k].data = _filled(p.leaves[k].data)

            edits.append(simpler)
    for k in range(len(program.main.outputs)):
        if len(program.main.outputs) > 1:

            def drop_output(p: Program, k: int = k) -> None:
                del p.main.outputs[k]

            edits.append(drop_output)
    return edits


def _builds(program: Program) -> bool:
    """Whether PopXL accepts ``program`` (an edit can make an invalid one: a constant where
    an in-place op needs a variable's storage, a value on no IPU)."""
    try:
        build_programs([program])
    except Exception:  # noqa: BLE001 (any refusal: the candidate is not a reproduction)
        return False
    return True


def _kind(message: str) -> str:
    """A failure's kind: the exception's type for a crash, else the disagreement's first
    words (``output values``, ``final shape``)."""
    if message.startswith("session failed"):
        last = message.rstrip().splitlines()[-1]
        return "crash " + last.split(":", 1)[0]
    where, what = message.split(":", 2)[:2]
    return f"{where.split()[0]} {what.split()[0]}"


def greedy(
    start: Outcome,
    edits: Callable[[Any], list[Callable[[Any], None]]],
    attempt: Callable[[Any], Outcome | None],
    budget: int = 300,
) -> Outcome:
    """Greedy shrinking, for any program representation: apply each of ``edits(program)``
    (biggest first) to a deep copy of the best program so far, and keep the first
    candidate ``attempt`` says still fails; repeat until no edit is kept or ``budget``
    candidates have been tried."""
    best = start
    tries = 0
    progress = True
    while progress and tries < budget:
        progress = False
        for edit in edits(best.program):
            candidate = copy.deepcopy(best.program)
            edit(candidate)
            tries += 1
            result = attempt(candidate)
            if result is not None:
                best, progress = result, True
                break
            if tries >= budget:
                break
    return best


def shrink(outcome: Outcome, check: Check, budget: int = 300) -> Outcome:
    """A smaller program that still fails ``check`` the same way: a candidate PopXL refuses
    to build, or that fails otherwise (a crash for a wrong value), is not a reproduction."""
    kind = _kind(outcome.message)

    def attempt(candidate: Program) -> Outcome | None:
        candidate = _dead_code(candidate)
        if not _builds(candidate):
            return None
        result = check(candidate)
        return result if result is not None and _kind(result.message) == kind else None

    return greedy(outcome, _variants, attempt, budget)


def describe(outcome: Outcome) -> str:
    """The program in the generator's notation, its PopXL schedules and the failure."""
    program = outcome.program
    lines = [format_program(program), f"({count_nodes(program)} ops)"]
    try:
        ir, _ = build_programs([program])
        graphs = [ir.main_graph, *(g for g in ir._graphs.values() if g is not ir.main_graph)]
        lines += [g.print_schedule() for g in graphs]
    except Exception as e:  # noqa: BLE001 (the schedule is a courtesy; the failure is the point)
        lines.append(f"(could not build the IR to print it: {e!r})")
    lines.append(outcome.message)
    return "\n".join(lines)
