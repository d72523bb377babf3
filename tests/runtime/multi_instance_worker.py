"""One replicated program, run by several instances under ``poprun`` or by one process.

    poprun --num-instances N --num-replicas R python multi_instance_worker.py OUT_DIR
    python multi_instance_worker.py OUT_DIR --single R

Builds a program with every replicated feature (collectives with groups inside and across
instances, strided groups, grouped variables with both retrieval modes, a remote variable,
a replica-sharded variable), runs it twice with a variable written in between, and saves
this instance's stream outputs (its replicas only) and every variable's data (global) to
``OUT_DIR/instance<index>.npz``. ``--mismatch`` makes instance 1 build a different program;
``--die-after-compile`` makes instance 1 exit right after compiling.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import popdist
import popxl
import popxl.ops as ops
from popxl.ops import collectives as coll

SHAPE = (3,)


def build(ir: popxl.Ir, mismatch: bool) -> tuple[dict, dict, popxl.HostToDeviceStream]:
    """The program; returns (output streams, variables, input stream)."""
    r = ir.replication_factor
    half = ir.replica_grouping(group_size=2)  # pairs: inside an instance of 2+ replicas
    strided = ir.replica_grouping(stride=2, group_size=r // 2)  # across instances
    pairs_apart = ir.replica_grouping(stride=r // 2, group_size=2)  # orthogonal, across
    outs: dict = {}
    with ir.main_graph, popxl.in_sequence():
        x = popxl.h2d_stream(SHAPE, popxl.float32, "x")
        t = ops.host_load(x)
        if mismatch and popdist.getInstanceIndex() == 1:
            t = t * 2.0
        values = {
            "sum_all": coll.replicated_all_reduce(t),
            "sum_pairs": coll.replicated_all_reduce(t, group=half),
            "max_strided": coll.replicated_all_reduce(t, op="max", group=strided),
            "mean_apart": coll.replicated_all_reduce(t, op="mean", group=pairs_apart),
            "gather_apart": coll.replicated_all_gather(t, group=pairs_apart),
            "scatter_all": coll.replicated_reduce_scatter(ops.concat([t, t * 2.0, t * 3.0])),
        }
        grouped = popxl.variable(
            np.arange(r // 2 * 3, dtype=np.float32).reshape(r // 2, 3),
            replica_grouping=half,
            name="grouped",
        )
        per_replica = popxl.variable(
            np.full((2, *SHAPE), 5.0, np.float32) + np.arange(2, dtype=np.float32)[:, None],
            replica_grouping=strided,
            retrieval_mode="all_replicas",
            name="per_replica",
        )
        buffer = popxl.remote_buffer(SHAPE, popxl.float32, entries=1)
        remote = popxl.remote_variable(
            np.ones(SHAPE, np.float32), buffer, 0, replica_grouping=None, name="remote"
        )
        rts, shard = popxl.replica_sharded_variable(np.arange(2 * r, dtype=np.float32), name="rts")
        ops.add_(grouped, values["sum_pairs"])
        ops.add_(per_replica, t)
        loaded = ops.remote_load(buffer, 0)
        ops.add_(loaded, values["sum_all"])
        ops.remote_store(buffer, 0, loaded)
        gathered = coll.replicated_all_gather(shard)
        values["rts_gathered"] = gathered
        ops.add_(shard, coll.replicated_reduce_scatter(gathered * 0.5))
        for name, value in values.items():
            stream = popxl.d2h_stream(value.shape, value.dtype, name)
            ops.host_store(stream, value)
            outs[name] = stream
    variables = {"grouped": grouped, "per_replica": per_replica, "remote": remote, "rts": rts}
    return outs, variables, x


def inputs(step: int, first: int, count: int) -> np.ndarray:
    """Stream data of replicas ``first .. first+count`` (depends on the global replica)."""
    replicas = np.arange(first, first + count, dtype=np.float32)[:, None]
    data = replicas * 10.0 + np.arange(3, dtype=np.float32) + step * 100.0
    return data if count > 1 else data[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--single", type=int, default=None)
    p.add_argument("--mismatch", action="store_true")
    p.add_argument("--die-after-compile", action="store_true")
    args = p.parse_args()
    ir = popxl.Ir(replication="popdist" if args.single is None else args.single)
    outs, variables, x = build(ir, args.mismatch)
    session = popxl.Session(ir, "ipu_hw")
    if args.die_after_compile and popdist.getInstanceIndex() == 1:
        os._exit(7)
    local = ir.instance_replication_factor
    first = ir._pb_ir.getSessionOptions().globalReplicaOffset
    results: dict[str, np.ndarray] = {}
    with session:
        for step in range(2):
            got = session.run({x: inputs(step, first, local)})
            results.update({f"{name}/{step}": got[s] for name, s in outs.items()})
            if step == 0:
                grouped = variables["grouped"]
                results["grouped/before_write"] = session.get_tensor_data(grouped)
                session.write_variable_data(grouped, np.full(grouped.shape_on_host, -1, "f4"))
    for name, var in variables.items():
        results[f"var/{name}"] = session.get_tensor_data(var)
    opts = ir._pb_ir.getSessionOptions()
    results["layout"] = np.array(
        [ir.replication_factor, local, opts.globalReplicationFactor, first]
    )
    index = popdist.getInstanceIndex() if args.single is None else 0
    np.savez(os.path.join(args.out_dir, f"instance{index}.npz"), **results)
    print(f"instance {index} done", file=sys.stderr)


if __name__ == "__main__":
    main()
