"""One ``poptorch.trainingModel`` call vs the hand-written explicit program it stands for.

Both run deviceIterations 10 x gradient accumulation 4 x replicas 2 micro-batches of a
two-layer MLP with Adam per host call and stream back every micro-batch's loss. The
project figure includes everything a PopTorch user pays per call: the combined batch is
rearranged into the stream layout and the losses are flattened back. Throughput is host
calls per second, ratio = project / hand-written (target >= 0.95).

Run: python bench/poptorch_step.py
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import compare, device_name, report, set_matmul_precision  # noqa: E402
from tests.poptorch.handwritten import (  # noqa: E402
    handwritten,
    host_feeds,
    make_data,
    poptorch_model,
)

DI, GA, R, MB, LR = 10, 4, 2, 2, 0.01


def main() -> tuple[float, float]:
    x, t = make_data(DI * GA * R * MB)
    session, (xs, ts), _, _ = handwritten(MB, DI, GA, R, LR)
    model = poptorch_model(DI, GA, R, LR)
    model(x, t)  # compile

    def reference() -> None:
        xh, th = host_feeds(x, t, DI, GA, R, MB)
        session.run({xs: xh, ts: th})

    with session:
        project_s, reference_s = compare(lambda: model(x, t), reference, repeats=20)
    print(f"device: {device_name()}")
    report(
        [
            (
                "poptorch call (DI 10 x GA 4 x R 2, Adam), calls/s",
                1 / project_s,
                1 / reference_s,
                "higher is better",
            )
        ]
    )
    return 1 / project_s, 1 / reference_s


if __name__ == "__main__":
    set_matmul_precision()
    main()
