"""The programs the generator writes: plain data that both the builder and the reference read.

A program is a tree of blocks. A block has inputs (value ids), a list of nodes and outputs;
a node applies one op to value ids and defines new value ids. Every value id is unique in
the program and has one ``Spec``. Subgraph-carrying nodes (``call``, ``repeat``, ``cond``,
``grad``) hold their bodies as blocks in ``attrs``; one block may be called by several nodes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FLOATS = ("float32", "float16")

# Ops whose output 0 is a handle on input 0's storage after writing the result into it.
INPLACE = frozenset(
    {"add_", "relu_", "exp_", "sigmoid_", "scaled_add_", "accumulate_", "all_reduce_"}
)
# Ops whose output is a view of input 0: writes through it reach the base.
VIEWS = frozenset({"reshape_", "transpose_", "slice_"})
# Ops whose effect must be kept even when no output is used.
EFFECTFUL = INPLACE | {"call", "repeat", "remote_store", "rts_store"}
BODY_KEYS = ("body", "then", "else")


@dataclass(frozen=True)
class Spec:
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


@dataclass
class Node:
    op: str
    args: tuple[int, ...]
    outs: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict)

    def bodies(self) -> list[Block]:
        return [self.attrs[k] for k in BODY_KEYS if k in self.attrs]


@dataclass
class Block:
    inputs: list[int]
    nodes: list[Node]
    outputs: list[int]
    by_ref: frozenset[int] = frozenset()  # input positions passed by reference
    name: str = "g"


@dataclass
class Leaf:
    """A main-graph input: a variable (``var``), a host stream (``stream``) or a remote
    variable (``remote``, ``rts``).

    ``data`` has a leading replica axis for streams of replicated programs and a leading
    group axis for variables with more than one replica group.
    """

    vid: int
    kind: str
    data: np.ndarray
    grouping: tuple[int, int] | None = None  # (stride, group_size) of a variable
    slot: tuple[int, int, int] | None = None  # (buffer, offset, entries) of a remote leaf
    ipu: int = 0


@dataclass
class Program:
    specs: dict[int, Spec]
    leaves: list[Leaf]
    main: Block
    replicas: int = 1
    features: tuple[str, ...] = ()
    seed: int = 0
    ipus: int = 1
    steps: int = 1  # micro-batches of a pipelined program (the Ir's num_host_transfers)

    def spec(self, vid: int) -> Spec:
        return self.specs[vid]


def all_blocks(block: Block) -> list[Block]:
    """``block`` and every block it calls, each once, callers first."""
    seen: dict[int, Block] = {}
    todo = [block]
    while todo:
        b = todo.pop(0)
        if id(b) in seen:
            continue
        seen[id(b)] = b
        for node in b.nodes:
            todo.extend(node.bodies())
    return list(seen.values())


def count_nodes(program: Program) -> int:
    return sum(len(b.nodes) for b in all_blocks(program.main))


def _attr_text(node: Node, names: dict[int, str]) -> str:
    parts = []
    for k, v in node.attrs.items():
        if k in BODY_KEYS:
            parts.append(f"{k}={names[id(v)]}")
        elif k == "data":
            parts.append(f"data={np.asarray(v).ravel()[:4].tolist()}...")
        else:
            parts.append(f"{k}={v}")
    return ", ".join(parts)


def format_program(program: Program) -> str:
    """The program in the generator's own notation (the IR's schedule is printed by ``build``)."""
    blocks = all_blocks(program.main)
    names = {id(b): ("main" if i == 0 else f"{b.name}{i}") for i, b in enumerate(blocks)}
    lines = [
        f"program seed={program.seed} replicas={program.replicas} ipus={program.ipus} "
        f"steps={program.steps} features={program.features}"
    ]
    for leaf in program.leaves:
        extra = f" grouping={leaf.grouping}" if leaf.grouping else ""
        extra += f" slot={leaf.slot}" if leaf.slot else ""
        extra += f" ipu={leaf.ipu}" if program.ipus > 1 else ""
        lines.append(f"  leaf v{leaf.vid} {leaf.kind} {program.specs[leaf.vid]}{extra}")
    for b in blocks:
        ins = ", ".join(
            f"{'&' if i in b.by_ref else ''}v{v}:{program.specs[v]}" for i, v in enumerate(b.inputs)
        )
        lines.append(f"  block {names[id(b)]}({ins}) -> ({', '.join(f'v{v}' for v in b.outputs)})")
        for n in b.nodes:
            outs = ", ".join(f"v{v}:{program.specs[v]}" for v in n.outs)
            args = ", ".join(f"v{v}" for v in n.args)
            lines.append(f"    {outs} = {n.op}({args}) {_attr_text(n, names)}")
    return "\n".join(lines)


class Ids:
    """Fresh value ids."""

    def __init__(self, start: int = 0) -> None:
        self._counter = itertools.count(start)

    def __call__(self) -> int:
        return next(self._counter)
