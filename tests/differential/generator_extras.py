"""Generator features beyond the core language: remote and replica-sharded variables, popxl-
addons autodiff (with accumulators and recomputation), and placement on several IPUs.

remote: ``popxl.remote_variable`` leaves (buffers of one or two slots, sometimes shared by
    two variables), ``ops.remote_load`` and ``ops.remote_store`` in the main graph.
rts: ``remote_replica_sharded_variable`` leaves sharded over their replica group, loaded
    shards, ``replicated_all_gather`` of a shard to the full tensor, ``replica_sharded_slice``
    and ``replicated_reduce_scatter`` of a full tensor over the group, and stores of shards.
addons: ``popxl_addons.autodiff`` / ``autodiff_with_accumulation`` over 1-3 steps whose
    first input is shifted by ``step / 8``, optionally through ``recompute_graph``.
placement: every main-graph op on a random one of two IPUs, ``ops.ipu_copy`` where an op
    reads a value from the other IPU; the result must equal the unplaced program.
batchser: ``popxl_addons.transforms.batch_serialisation.batch_serialise`` of a block over
    1-3 steps: step ``j`` loads its first inputs plus ``j * BATCH_SHIFT`` (floats) or ``j``
    (int32) from remote buffers filled in the main graph, passes the other inputs through,
    and stores its outputs to remote buffers that the main graph reads back and stacks.
pipeline: ``popxl_addons.pipelined_execution`` of 4-6 micro-batches over two stages (stage
    ``k`` on IPU ``k``, each op in the stage of its latest argument or the next); alone, or
    in 15% of the programs of a mixed feature set. Its programs use the core ops and
    out-of-place views; the result must equal the program run once per micro-batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .program import INPLACE, VIEWS, Block, Leaf, Node, Spec

if TYPE_CHECKING:
    from .generator import Generator, Scope

ADDONS_SHIFT = 0.125  # step s reads its first input plus s * ADDONS_SHIFT
BATCH_SHIFT = 0.125
IO_MODES = ("compute", "io", "io_overlapped")
# Ops of these features whose results are made program outputs (up to two per program).
WATCHED = frozenset({"addons_grad", "remote_load", "rts_load", "rts_gather", "rts_slice",
                     "batch_serial"})  # fmt: skip


def shard_spec(spec: Spec, group_size: int) -> Spec:
    """The flat, zero-padded shard of ``spec`` sharded over ``group_size`` replicas."""
    return Spec((-(-math.prod(spec.shape) // group_size),), spec.dtype)


class ExtraFeatures:
    """Mixed into ``Generator``: op families of the extra features."""

    def watched(self: Generator, nodes: list[Node], outputs: list[int]) -> list[int]:
        """Up to two more outputs: results of the extra features' ops."""
        cands = [v for n in nodes if n.op in WATCHED for v in n.outs if v not in outputs]
        k = min(2, len(cands))
        return [int(v) for v in self.rng.choice(cands, k, replace=False)] if k else []

    def changed(self: Generator, scope: Scope, v: int) -> int:
        """A new value of ``v``'s spec that (usually) differs from ``v``."""
        if self.specs[v].dtype == "bool":
            return self.emit(scope, "logical_not", (v,), [self.specs[v]], [1], [0])[0]
        v = self.tame(scope, v)
        w = self.tame(scope, self.broadcast_partner(scope, v))
        sv, sw = self.st(v), self.st(w)
        bits = None if None in (sv.bits, sw.bits) else max(sv.bits, sw.bits)
        return self.emit(scope, "add", (v, w), [self.specs[v]], [sv.bound + sw.bound], [bits])[0]

    # Remote variables -------------------------------------------------------------------------

    def remote_leaf(self: Generator, kind: str) -> Leaf:
        spec = Spec(self.shape(), str(self.choice(["float32"] * 3 + ["float16", "int32"])))
        if kind == "rts" and not spec.shape:
            spec = Spec((int(self.rng.integers(1, 6)),), spec.dtype)
        r = self.replicas
        grouping = self.grouping() if r > 1 and self.rng.random() < 0.5 else None
        groups = r // grouping[1] if grouping else 1
        data = self.data(Spec((groups, *spec.shape), spec.dtype) if groups > 1 else spec)
        vid = self.value(spec, 4 if spec.dtype == "int32" else 2, 3, modifiable=False)
        slot = None
        if kind == "remote":
            slot = self.remote_slot(spec, grouping)
        leaf = Leaf(vid, kind, data, grouping, slot)
        self.leaves.append(leaf)
        return leaf

    def remote_slot(self: Generator, spec: Spec, grouping: tuple | None) -> tuple[int, int, int]:
        """A free slot of an existing buffer of this layout, or the first slot of a new one."""
        taken = {leaf.slot[:2] for leaf in self.leaves if leaf.slot}
        for leaf in self.leaves:
            if leaf.kind != "remote" or self.specs[leaf.vid] != spec or leaf.grouping != grouping:
                continue
            key, _, entries = leaf.slot
            free = [o for o in range(entries) if (key, o) not in taken]
            if free and self.rng.random() < 0.7:
                return key, free[0], entries
        key = len({leaf.slot[0] for leaf in self.leaves if leaf.slot})
        entries = int(self.choice([1, 2]))
        return key, int(self.rng.integers(entries)), entries

    def remote_leaves(self: Generator, kind: str) -> list[Leaf]:
        return [leaf for leaf in self.leaves if leaf.kind == kind]

    def remote(self: Generator, scope: Scope) -> bool:
        leaves = self.remote_leaves("remote")
        if not leaves or self.rng.random() < 0.3:
            leaves = [self.remote_leaf("remote")]
        leaf = leaves[int(self.rng.integers(len(leaves)))]
        spec = self.specs[leaf.vid]
        if self.rng.random() < 0.5:
            v = self.pick(scope, lambda u: self.specs[u] == spec)
            if v is None:
                s = self.st(leaf.vid)
                (v,) = self.emit(scope, "remote_load", (leaf.vid,), [spec], [s.bound], [s.bits])
            self.store_to(scope, leaf.vid, self.tame(scope, self.changed(scope, v)), "remote_store")
            return True
        s = self.st(leaf.vid)
        self.emit(scope, "remote_load", (leaf.vid,), [spec], [s.bound], [s.bits])
        return True

    def store_to(self: Generator, scope: Scope, target: int, v: int, op: str) -> None:
        st, sv = self.st(target), self.st(v)
        st.bound = max(st.bound, sv.bound)
        st.bits = None if None in (st.bits, sv.bits) else max(st.bits, sv.bits)
        scope.nodes.append(Node(op, (target, v), ()))

    def rts_group(self: Generator, leaf: Leaf) -> tuple[int, int]:
        return leaf.grouping or (1, self.replicas)

    def rts(self: Generator, scope: Scope) -> bool:
        leaves = self.remote_leaves("rts")
        if not leaves or self.rng.random() < 0.3:
            leaves = [self.remote_leaf("rts")]
        leaf = leaves[int(self.rng.integers(len(leaves)))]
        full = self.specs[leaf.vid]
        group = self.rts_group(leaf)
        shard = shard_spec(full, group[1])
        s = self.st(leaf.vid)
        kind = self.rng.random()
        if kind < 0.35:
            v = self.pick(scope, lambda u: self.specs[u] == shard)
            x = self.pick(scope, lambda u: self.specs[u] == full)
            if x is None and self.rng.random() < 0.6:
                (x,) = self.emit(scope, "rts_load", (leaf.vid,), [shard], [s.bound], [s.bits],
                                 group=group)  # fmt: skip
                (x,) = self.emit(scope, "rts_gather", (x,), [full], [s.bound], [s.bits],
                                 group=group)  # fmt: skip
                x = self.changed(scope, x)
            if x is not None and (v is None or self.rng.random() < 0.6):
                x = self.tame(scope, x)
                sx = self.st(x)
                if self.rng.random() < 0.5 or full.dtype not in ("float32", "float16"):
                    (v,) = self.emit(scope, "rts_slice", (x,), [shard], [sx.bound], [sx.bits],
                                     group=group)  # fmt: skip
                else:  # the sharded gradient's pattern: reduce over the group, keep one shard
                    op = str(self.choice(["add", "mean"]))
                    bound, bits = (
                        (sx.bound * group[1], sx.bits) if op == "add" else (sx.bound, None)
                    )
                    (v,) = self.emit(scope, "reduce_scatter", (x,), [shard], [bound], [bits],
                                     op=op, group=group)  # fmt: skip
            elif v is None:
                (v,) = self.emit(scope, "rts_load", (leaf.vid,), [shard], [s.bound], [s.bits],
                                 group=group)  # fmt: skip
            self.store_to(scope, leaf.vid, self.tame(scope, self.changed(scope, v)), "rts_store")
            return True
        (loaded,) = self.emit(scope, "rts_load", (leaf.vid,), [shard], [s.bound], [s.bits],
                              group=group)  # fmt: skip
        if kind < 0.75:
            self.emit(scope, "rts_gather", (loaded,), [full], [s.bound], [s.bits], group=group)
        return True

    # popxl-addons autodiff ------------------------------------------------------------------

    def addons_grad(self: Generator, scope: Scope) -> bool:
        made = self.grad_body(scope)
        if made is None:
            return False
        args, block, seeds = made
        positions = [int(p) for p in self.rng.permutation(len(args))]
        n_acc = int(self.rng.integers(0, len(args) + 1))
        acc = tuple(sorted(positions[:n_acc]))
        rest = positions[n_acc:]
        wrt = tuple(sorted(rest[: int(self.rng.integers(0 if acc else 1, len(rest) + 1))]))
        steps = int(self.rng.integers(1, 4))
        outs = tuple(self.value(self.specs[args[p]], 1e3, None) for p in (*wrt, *acc))
        attrs = {"body": block, "wrt": wrt, "acc": acc, "steps": steps,
                 "recompute": bool(self.rng.random() < 0.5)}  # fmt: skip
        scope.nodes.append(Node("addons_grad", (*args, *seeds), outs, attrs))
        scope.pool.extend(outs)
        return True

    def grad_body(self: Generator, scope: Scope) -> tuple[list[int], Block, list[int]] | None:
        """Float32 arguments (tamed), a forward block of them, and a seed per block output."""
        args = list(dict.fromkeys(self.args(scope, int(self.rng.integers(1, 4)),
                                            lambda v: self.specs[v].dtype == "float32")))  # fmt: skip
        if not args:
            return None
        args = [self.tame(scope, a) for a in args]
        block, inner = self.body(scope, args, set(), int(self.rng.integers(1, 7)),
                                 in_grad=True, collectives=False, name="fwd")  # fmt: skip
        floats = [v for v in inner.pool if self.specs[v].dtype == "float32"]
        n_out = min(len(floats), int(self.rng.integers(1, 3)))
        block.outputs = [int(v) for v in self.rng.choice(floats[-6:], n_out, replace=False)]
        seeds = []
        for v in block.outputs:
            spec = self.specs[v]
            seed = self.pick(scope, lambda u, spec=spec: self.specs[u] == spec)
            seeds.append(self.tame(scope, seed) if seed is not None else self.const(scope, spec))
        return args, block, seeds

    # Batch serialisation ----------------------------------------------------------------------

    def batch_serial(self: Generator, scope: Scope) -> bool:
        loadable = ("float32", "float16", "int32")
        loads = list(dict.fromkeys(self.args(scope, int(self.rng.integers(1, 3)),
                                             lambda v: self.specs[v].dtype in loadable)))  # fmt: skip
        if not loads:
            return False
        loads = [self.tame(scope, v) for v in loads]
        passed = [v for v in dict.fromkeys(self.args(scope, int(self.rng.integers(0, 3))))
                  if v not in loads]  # fmt: skip
        steps = int(self.rng.integers(1, 4))
        saved = [(self.st(v), self.st(v).bound, self.st(v).bits) for v in loads]
        for v in loads:  # the body sees the shifted loads of every step
            st = self.st(v)
            st.bound += steps
            st.bits = None if st.bits is None else max(st.bits, 3)
        block, inner = self.body(scope, loads + passed, set(), int(self.rng.integers(1, 5)),
                                 collectives=False, name="bs")  # fmt: skip
        for st, bound, bits in saved:
            st.bound, st.bits = bound, bits
        n_out = min(len(inner.pool), int(self.rng.integers(1, 3)))
        block.outputs = [int(v) for v in self.rng.choice(inner.pool[-6:], n_out, replace=False)]
        outs = []
        for v in block.outputs:
            spec, st = self.specs[v], self.st(v)
            outs.append(self.value(Spec((steps, *spec.shape), spec.dtype), st.bound, st.bits))
        attrs = {"body": block, "n_load": len(loads), "steps": steps,
                 "io_mode": str(self.choice(list(IO_MODES[: 3 if steps > 1 else 2])))}  # fmt: skip
        scope.nodes.append(Node("batch_serial", (*loads, *passed), tuple(outs), attrs))
        scope.pool.extend(outs)
        return True

    # Placement ------------------------------------------------------------------------------

    def place(self: Generator, main: Block, ipus: int) -> None:
        """Put every leaf and main-graph op on an IPU; an op that writes or views a storage
        sits on that storage's IPU (a copy to another IPU would be written instead)."""
        where: dict[int, int] = {}
        for leaf in self.leaves:
            leaf.ipu = int(self.rng.integers(ipus))
            where[leaf.vid] = leaf.ipu
        for node in main.nodes:
            home = {where[self.root[node.args[p]]] for p in written_args(node)}
            if len(home) > 1:  # by-reference arguments on different IPUs: all on IPU 0
                for leaf in self.leaves:
                    leaf.ipu = 0
                for n in main.nodes:
                    n.attrs["ipu"] = 0
                return
            node.attrs["ipu"] = home.pop() if home else int(self.rng.integers(ipus))
            for vid in node.outs:
                where.setdefault(self.root[vid], node.attrs["ipu"])

    def stage(self: Generator, main: Block) -> None:
        """Pipeline stages: leaves in stage 0, each op in its arguments' latest stage or,
        sometimes, the next one."""
        stage_of = {leaf.vid: 0 for leaf in self.leaves}
        for leaf in self.leaves:
            leaf.ipu = 0
        for node in main.nodes:
            s = max((stage_of[self.root[v]] for v in node.args), default=0)
            if s == 0 and self.rng.random() < 0.35:
                s = 1
            node.attrs["ipu"] = s
            for vid in node.outs:
                stage_of.setdefault(self.root[vid], s)
        # Both stages need ops: the first op may always run in stage 0 and the last in 1.
        stages = {n.attrs["ipu"] for n in main.nodes}
        if main.nodes and 0 not in stages:
            main.nodes[0].attrs["ipu"] = 0
        if main.nodes and 1 not in stages:
            main.nodes[-1].attrs["ipu"] = 1


def written_args(node: Node) -> list[int]:
    """Argument positions whose storage ``node`` writes or views."""
    if node.op in INPLACE or node.op in VIEWS:
        return [0]
    if node.op in ("call", "repeat"):
        return sorted(node.attrs["body"].by_ref)
    if node.op == "cond":  # arguments: the predicate, the then inputs, the else inputs
        n_then = node.attrs["n_then"]
        then, other = node.attrs["then"].by_ref, node.attrs["else"].by_ref
        return sorted({1 + p for p in then} | {1 + n_then + p for p in other})
    if node.op in ("remote_store", "rts_store", "remote_load", "rts_load"):
        return [0]  # a remote buffer is used on the IPU of its variable
    return []
