"""A TaskSession checkpoint written under ``poprun``.

    poprun --num-instances 2 --num-replicas 2 python checkpoint_worker.py CKPT_DIR [--fail]

Every instance trains a replica-grouped variable one step and saves ``CKPT_DIR``; with
``--fail`` the dataloader's ``save`` raises on instance 0, so no checkpoint may appear and
every instance must report the failure.
"""

from __future__ import annotations

import sys

import numpy as np

import popxl
import popxl.ops as ops
from popxl_addons import NamedTensors, TaskSession


class Loader:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def save(self, path: str) -> None:
        if self.fail:
            raise OSError("disk full (simulated)")
        with open(path, "w") as f:
            f.write("position 1")

    def resume(self, filename: str) -> None:
        del filename


def main() -> None:
    target, fail = sys.argv[1], "--fail" in sys.argv
    ir = popxl.Ir(replication="popdist")
    with ir.main_graph:
        grouping = ir.replica_grouping(group_size=1)
        v = popxl.variable(
            np.arange(2 * 4, dtype=np.float32).reshape(2, 4), name="v", replica_grouping=grouping
        )
        ops.add_(v, popxl.constant(1.0))
    session = TaskSession([], [], NamedTensors(v=v), ir=ir, device_desc="cpu")
    session.dataloader = Loader(fail)
    with session:
        session.run()
    try:
        session.save_checkpoint(target)
    except Exception as err:
        print(f"checkpoint failed: {err}", flush=True)
        sys.exit(3)
    print("checkpoint saved", flush=True)


if __name__ == "__main__":
    main()
